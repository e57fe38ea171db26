//! Docs that stand alone: what the repository's files cite is in the
//! repository. Over every text file of the tree (build outputs and fuzz
//! corpora left out), each failure named by file and line:
//!
//! - a Markdown link to a relative path that does not exist;
//! - a path into the tree that does not exist: a crate's file (such as
//!   `block/src/disk.rs`), a doc or a script;
//! - a section cited as `docs/NAME.md, "Heading"` (or `NAME.md
//!   ("Heading")`) that the page has no heading for;
//! - a mention of the team's own notes (the design and reference files
//!   kept outside the repository);
//! - an absolute folder of a development machine (under work, root or
//!   home);
//! - in Markdown, talk of other processes sharing the machine;
//! - in the docs, an environment variable `CH_...` that no code reads;
//! - a page of docs/ that README.md does not list;
//! - docs/performance.md over 400 lines.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// Names never read: git's own (a worktree's `.git` is a file), and the
/// folders of build outputs, fuzz corpora and seeds (what .gitignore
/// leaves out, and binary inputs).
const SKIPPED: &[&str] = &[
    ".git",
    "build",
    "corpus",
    "artifacts",
    "coverage",
    "seeds",
    "__pycache__",
];

/// Every text file of the tree, relative to the root.
fn text_files() -> Vec<PathBuf> {
    let root = repo();
    let mut out = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            let kind = entry.file_type().unwrap();
            if SKIPPED.contains(&name.as_str()) {
                continue;
            }
            if kind.is_dir() {
                if !name.starts_with("target") {
                    stack.push(path);
                }
            } else if kind.is_file()
                && ![".img", ".qcow2", ".lock", ".raw"]
                    .iter()
                    .any(|e| name.ends_with(e))
            {
                out.push(path.strip_prefix(&root).unwrap().to_path_buf());
            }
        }
    }
    out.sort();
    out
}

/// The headings of a Markdown file, without their `#`s.
fn headings(text: &str) -> Vec<String> {
    let mut inside_code = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with("```") {
            inside_code = !inside_code;
        } else if !inside_code && line.starts_with('#') {
            out.push(squash(line.trim_start_matches('#')));
        }
    }
    out
}

/// Whitespace runs to one space, trimmed.
fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn is_path_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_./-".contains(c)
}

/// The path-like words of a line with the byte offset each starts at.
fn path_words(line: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, c) in line.char_indices().chain([(line.len(), ' ')]) {
        match (start, is_path_char(c)) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                out.push((s, &line[s..i]));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// A placeholder such as `tests/tests/ch_img_VERB.rs` or `DIR/x`.
fn is_placeholder(word: &str) -> bool {
    let mut run = 0;
    for c in word.chars() {
        run = if c.is_ascii_uppercase() { run + 1 } else { 0 };
        if run >= 3 {
            return true;
        }
    }
    false
}

/// Paths of other projects' trees that share a first folder with ours
/// (QEMU's `docs/interop/nbd.rst`).
const OTHER_PROJECTS: &[&str] = &["docs/interop/"];

struct Checker {
    root: PathBuf,
    /// The tree's top folders (crates, docs, scripts, fuzz, ...).
    tops: BTreeSet<String>,
    headings: HashMap<PathBuf, Vec<String>>,
    problems: Vec<String>,
}

impl Checker {
    fn problem(&mut self, file: &Path, line: usize, what: String) {
        self.problems
            .push(format!("{}:{}: {what}", file.display(), line + 1));
    }

    /// A path into the tree: a top folder, then (for a crate) one of the
    /// folders a crate keeps its files in.
    fn is_tree_path(&self, word: &str) -> bool {
        let mut parts = word.splitn(3, '/');
        let (Some(top), Some(second)) = (parts.next(), parts.next()) else {
            return false;
        };
        if !self.tops.contains(top) || second.is_empty() {
            return false;
        }
        matches!(top, "docs" | "scripts")
            || ["src", "tests", "examples", "benches", "fuzz", "bench"].contains(&second)
                && parts.next().is_some()
    }

    fn check_paths(&mut self, file: &Path, n: usize, line: &str) {
        for (at, word) in path_words(line) {
            let word = word.trim_end_matches(['.', ',']);
            let before = line[..at].chars().next_back();
            let after = line[at + word.len()..].chars().next();
            if !self.is_tree_path(word)
                || is_placeholder(word)
                || OTHER_PROJECTS.iter().any(|p| word.starts_with(p))
                // `git show REV:path`, a glob `prefix*`
                || before == Some(':')
                || after == Some('*')
            {
                continue;
            }
            if !self.root.join(word).exists() {
                self.problem(
                    file,
                    n,
                    format!("names {word}, which the tree does not have"),
                );
            }
        }
    }

    fn check_links(&mut self, file: &Path, n: usize, line: &str) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let target = rest.split([')', ' ']).next().unwrap_or_default();
            let target = target.split('#').next().unwrap_or_default();
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let dir = file.parent().unwrap_or(Path::new(""));
            if !self.root.join(dir).join(target).exists() {
                self.problem(file, n, format!("links to {target}, which does not exist"));
            }
        }
    }

    /// `NAME.md, "Heading"`, `NAME.md ("A", "B")`: each quoted name must start
    /// a heading of X.md (headings may go on: "Polling" cites
    /// "Polling (`poll_max_us`)").
    fn check_sections(&mut self, file: &Path, text: &str) {
        let mut from = 0;
        while let Some(found) = text[from..].find(".md") {
            let end = from + found + 3;
            from = end;
            let start = text[..end - 3]
                .rfind(|c: char| !is_path_char(c))
                .map_or(0, |i| i + 1);
            let name = &text[start..end];
            let Some(doc) = self.resolve_doc(file, name) else {
                continue;
            };
            // The citation runs to the closing bracket or the sentence's end.
            let tail: String = text[end..].chars().take(300).collect();
            let lead = tail.trim_start();
            let Some(after) = lead.strip_prefix(',').or(lead.strip_prefix('(')) else {
                continue;
            };
            if !after.trim_start().starts_with('"') {
                continue;
            }
            let cited = tail.split([')', ';']).next().unwrap_or_default();
            let cited = cited.split(". ").next().unwrap_or_default();
            let cited: String = cited
                .lines()
                .map(|l| {
                    l.trim_start()
                        .trim_start_matches("//!")
                        .trim_start_matches("///")
                        .trim_start_matches("//")
                        .trim_start_matches('#')
                })
                .collect::<Vec<_>>()
                .join(" ");
            let line = text[..start].matches('\n').count();
            for quoted in cited.split('"').skip(1).step_by(2) {
                let quoted = squash(quoted);
                if quoted.is_empty() {
                    continue;
                }
                let heads = &self.headings[&doc];
                if !heads.iter().any(|h| {
                    h == &quoted
                        || h.strip_prefix(quoted.as_str())
                            .is_some_and(|r| r.starts_with([' ', ':', ',']))
                }) {
                    self.problem(
                        file,
                        line,
                        format!(
                            "cites \"{quoted}\" of {}, which has no such heading",
                            doc.display()
                        ),
                    );
                }
            }
        }
    }

    /// The Markdown file a mention names: one beside the citing file,
    /// else a path from the root.
    fn resolve_doc(&self, file: &Path, name: &str) -> Option<PathBuf> {
        let dir = file.parent().unwrap_or(Path::new(""));
        [dir.join(name), PathBuf::from(name)]
            .into_iter()
            .find(|p| self.headings.contains_key(p))
    }
}

#[test]
fn docs_cite_only_what_the_repository_holds() {
    let root = repo();
    let files = text_files();
    let texts: Vec<(PathBuf, String)> = files
        .into_iter()
        .filter_map(|f| Some((f.clone(), std::fs::read_to_string(root.join(&f)).ok()?)))
        .collect();
    assert!(texts.len() > 300, "only {} text files found", texts.len());
    let tops = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .filter(|e| e.file_type().unwrap().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && !n.starts_with("target"))
        .collect();
    let headings = texts
        .iter()
        .filter(|(f, _)| f.extension().is_some_and(|e| e == "md"))
        .map(|(f, t)| (f.clone(), headings(t)))
        .collect();
    let mut checker = Checker {
        root: root.clone(),
        tops,
        headings,
        problems: Vec::new(),
    };

    let notes: Vec<String> = ["DESIGN", "REFERENCE"]
        .iter()
        .map(|n| format!("{n}.md"))
        .collect();
    let machine_folders: Vec<String> = ["work", "root", "home"]
        .iter()
        .map(|d| format!("/{d}/"))
        .collect();
    let other_processes = [
        "agent",
        "other builds",
        "other jobs",
        "other processes",
        "shared machine",
        "machine shared",
    ];

    for (file, text) in &texts {
        let markdown = file.extension().is_some_and(|e| e == "md");
        for (n, line) in text.lines().enumerate() {
            for note in &notes {
                if line.contains(note.as_str()) {
                    checker.problem(
                        file,
                        n,
                        format!("cites {note}, which the repository does not have"),
                    );
                }
            }
            for folder in &machine_folders {
                for (at, _) in line.match_indices(folder.as_str()) {
                    // `$(BUILD)/root/` is a folder of the build, not a machine's.
                    let before = line[..at].chars().next_back();
                    if !before.is_some_and(|c| c.is_ascii_alphanumeric() || "_)}.$-".contains(c)) {
                        checker.problem(file, n, format!("names a machine's folder {folder}"));
                    }
                }
            }
            if markdown {
                let lower = line.to_lowercase();
                for talk in other_processes {
                    if lower.contains(talk) {
                        checker.problem(
                            file,
                            n,
                            format!("talks of other processes on the machine (\"{talk}\")"),
                        );
                    }
                }
                checker.check_links(file, n, line);
            }
            checker.check_paths(file, n, line);
        }
        checker.check_sections(file, text);
    }

    // Environment variables the docs set: each is read somewhere.
    let code: String = texts
        .iter()
        .filter(|(f, _)| f.extension().is_none_or(|e| e != "md"))
        .map(|(_, t)| t.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    for (file, text) in texts
        .iter()
        .filter(|(f, _)| f.starts_with("docs") || f == Path::new("README.md"))
    {
        for (n, line) in text.lines().enumerate() {
            for (at, _) in line.match_indices("CH_") {
                if line[..at]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                {
                    continue;
                }
                let var: String = line[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if var.len() > 3 && !code.contains(&var) {
                    checker.problem(file, n, format!("names {var}, which no code reads"));
                }
            }
        }
    }

    // The README's list of docs names every page.
    let readme = &texts
        .iter()
        .find(|(f, _)| f == Path::new("README.md"))
        .expect("README.md")
        .1;
    for (file, _) in texts
        .iter()
        .filter(|(f, _)| f.parent() == Some(Path::new("docs")))
    {
        if file.extension().is_some_and(|e| e == "md") && !readme.contains(&*file.to_string_lossy())
        {
            checker
                .problems
                .push(format!("README.md: its docs list lacks {}", file.display()));
        }
    }

    let perf = texts
        .iter()
        .find(|(f, _)| f == Path::new("docs/performance.md"))
        .map(|(_, t)| t.lines().count())
        .expect("docs/performance.md");
    if perf > 400 {
        checker
            .problems
            .push(format!("docs/performance.md: {perf} lines, more than 400"));
    }

    assert!(
        checker.problems.is_empty(),
        "{} problems:\n{}",
        checker.problems.len(),
        checker.problems.join("\n")
    );
}
