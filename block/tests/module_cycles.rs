//! No module of the block crate imports one that imports it back.
//!
//! Every file under `block/src` is a node (a module: `lib.rs` the crate
//! root, `a/mod.rs` module `a`, `a/b.rs` module `a::b`; inline modules
//! such as `mod tests { .. }` belong to their file). An edge A -> B is a
//! path in A's code that names B or an item of B: a `use crate::..`,
//! `use super::..`, `use self::..` or `use child::..` import, or the same
//! path written inline (`super::check::check_qcow2(..)`). A `pub use`
//! re-export is a name, not a dependency: it makes no edge of its own,
//! but a path through it is followed to the module that defines the
//! item (so `crate::BlockError` is an edge to `error.rs`, not to
//! `lib.rs`). A strongly connected set of more than one file is a cycle:
//! the test prints each one with the imports that close it, and fails.
//!
//! Hand-written: it needs a few hundred lines of tokenising, not a Rust
//! parser (`syn` would be a new dependency for one test). Comments,
//! strings and character literals are skipped; macros' bodies are
//! scanned like code.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Semi,
    Star,
    Other,
}

/// Tokens of Rust source with comments, strings and chars removed, each
/// with its line number.
fn tokens(src: &str) -> Vec<(Tok, usize)> {
    let b = src.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    let ident_char = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let c = b[i];
        match c {
            b'\n' => {
                line += 1;
                i += 1;
            }
            _ if c.is_ascii_whitespace() => i += 1,
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                let mut depth = 0;
                while i < b.len() {
                    if b[i..].starts_with(b"/*") {
                        depth += 1;
                        i += 2;
                    } else if b[i..].starts_with(b"*/") {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        line += usize::from(b[i] == b'\n');
                        i += 1;
                    }
                }
            }
            b'"' => i = skip_string(b, i + 1, 0, &mut line),
            b'r' if matches!(b.get(i + 1), Some(b'"' | b'#')) && !prev_ident(b, i) => {
                let mut hashes = 0;
                let mut j = i + 1;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                if b.get(j) == Some(&b'"') {
                    i = skip_string(b, j + 1, hashes, &mut line);
                } else {
                    i += 1; // r#ident
                }
            }
            b'b' if b.get(i + 1) == Some(&b'"') && !prev_ident(b, i) => {
                i = skip_string(b, i + 2, 0, &mut line)
            }
            b'\'' => {
                // A char literal ('a', '\n', '\u{..}') or a lifetime ('a).
                if b.get(i + 1) == Some(&b'\\') {
                    let mut j = i + 2;
                    while j < b.len() && b[j] != b'\'' {
                        j += 1;
                    }
                    i = j + 1;
                } else if b.get(i + 2) == Some(&b'\'') {
                    i += 3;
                } else {
                    i += 1;
                }
            }
            b':' if b.get(i + 1) == Some(&b':') => {
                out.push((Tok::PathSep, line));
                i += 2;
            }
            b'{' => {
                out.push((Tok::Open, line));
                i += 1;
            }
            b'}' => {
                out.push((Tok::Close, line));
                i += 1;
            }
            b',' => {
                out.push((Tok::Comma, line));
                i += 1;
            }
            b';' => {
                out.push((Tok::Semi, line));
                i += 1;
            }
            b'*' => {
                out.push((Tok::Star, line));
                i += 1;
            }
            _ if ident_char(c) => {
                let start = i;
                while i < b.len() && ident_char(b[i]) {
                    i += 1;
                }
                out.push((Tok::Ident(src[start..i].to_string()), line));
            }
            _ => {
                out.push((Tok::Other, line));
                i += 1;
            }
        }
    }
    out
}

fn prev_ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// The index after a string's closing quote (`hashes` for raw strings).
fn skip_string(b: &[u8], mut i: usize, hashes: usize, line: &mut usize) -> usize {
    while i < b.len() {
        match b[i] {
            b'\\' if hashes == 0 => i += 2,
            b'"' if b[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == b'#')
                .count()
                == hashes =>
            {
                return i + 1 + hashes
            }
            c => {
                *line += usize::from(c == b'\n');
                i += 1;
            }
        }
    }
    i
}

/// One path written in a file: the module it was written in, its
/// segments, and whether it is the target of a `pub use` (a re-export).
#[derive(Clone, Debug)]
struct PathRef {
    module: Vec<String>,
    segments: Vec<String>,
    line: usize,
    reexport: bool,
}

/// A file's paths, and the names its `pub use`s bind (per module).
#[derive(Default)]
struct FileScan {
    paths: Vec<PathRef>,
    /// (module, bound name) -> the re-exported path as written.
    reexports: Vec<(Vec<String>, String, PathRef)>,
    /// Inline modules declared in the file (`mod x { .. }`).
    inline_modules: Vec<Vec<String>>,
}

fn ident(t: Option<&(Tok, usize)>) -> Option<&str> {
    match t {
        Some((Tok::Ident(s), _)) => Some(s),
        _ => None,
    }
}

fn scan(src: &str, file_module: &[String]) -> FileScan {
    let toks = tokens(src);
    let mut scan = FileScan::default();
    // Inline modules: (segments, brace depth at which they close).
    let mut stack: Vec<(Vec<String>, usize)> = vec![(file_module.to_vec(), 0)];
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        let module = stack.last().map(|s| s.0.clone()).unwrap_or_default();
        match &toks[i].0 {
            Tok::Open => depth += 1,
            Tok::Close => {
                if stack.len() > 1 && stack.last().is_some_and(|s| s.1 == depth) {
                    stack.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(k) if k == "mod" => {
                if let (Some(name), Some((Tok::Open, _))) =
                    (ident(toks.get(i + 1)), toks.get(i + 2))
                {
                    let mut m = module.clone();
                    m.push(name.to_string());
                    scan.inline_modules.push(m.clone());
                    depth += 1;
                    stack.push((m, depth));
                    i += 3;
                    continue;
                }
            }
            Tok::Ident(k) if k == "use" => {
                let reexport = is_pub(&toks, i);
                let mut j = i + 1;
                let mut found = Vec::new();
                use_tree(&toks, &mut j, Vec::new(), &mut found);
                for (segments, binding, line) in found {
                    let r = PathRef {
                        module: module.clone(),
                        segments,
                        line,
                        reexport,
                    };
                    if let (true, Some(name)) = (reexport, binding) {
                        scan.reexports.push((module.clone(), name, r.clone()));
                    }
                    scan.paths.push(r);
                }
                i = j;
                continue;
            }
            Tok::Ident(k) if matches!(k.as_str(), "crate" | "super" | "self") => {
                let after_sep = i > 0 && toks[i - 1].0 == Tok::PathSep;
                if !after_sep && toks.get(i + 1).map(|t| &t.0) == Some(&Tok::PathSep) {
                    let mut segments = vec![k.clone()];
                    let mut j = i + 1;
                    while toks.get(j).map(|t| &t.0) == Some(&Tok::PathSep) {
                        match ident(toks.get(j + 1)) {
                            Some(s) => segments.push(s.to_string()),
                            None => break,
                        }
                        j += 2;
                    }
                    scan.paths.push(PathRef {
                        module: module.clone(),
                        segments,
                        line: toks[i].1,
                        reexport: false,
                    });
                    i = j;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    scan
}

/// Whether the `use` at `i` is preceded by `pub` or `pub(..)`.
fn is_pub(toks: &[(Tok, usize)], i: usize) -> bool {
    let mut j = i;
    while j > 0 {
        j -= 1;
        match &toks[j].0 {
            Tok::Ident(s) if s == "pub" => return true,
            Tok::Ident(s) if matches!(s.as_str(), "crate" | "super" | "self" | "in") => {}
            Tok::Other => {} // the parentheses of pub(crate)
            _ => return false,
        }
    }
    false
}

/// Parses a use tree from `j`, pushing (full path, bound name, line).
fn use_tree(
    toks: &[(Tok, usize)],
    j: &mut usize,
    prefix: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>, usize)>,
) {
    let mut path = prefix;
    loop {
        match toks.get(*j) {
            Some((Tok::Ident(s), line)) => {
                let line = *line;
                path.push(s.clone());
                *j += 1;
                if toks.get(*j).map(|t| &t.0) == Some(&Tok::PathSep) {
                    *j += 1;
                    continue;
                }
                let mut binding = path.last().cloned();
                if ident(toks.get(*j)) == Some("as") {
                    binding = ident(toks.get(*j + 1)).map(String::from);
                    *j += 2;
                }
                if binding.as_deref() == Some("self") {
                    path.pop();
                    binding = path.last().cloned();
                }
                out.push((path, binding, line));
                return;
            }
            Some((Tok::Star, line)) => {
                out.push((path, None, *line));
                *j += 1;
                return;
            }
            Some((Tok::Open, _)) => {
                *j += 1;
                loop {
                    match toks.get(*j).map(|t| &t.0) {
                        Some(Tok::Close) => {
                            *j += 1;
                            return;
                        }
                        Some(Tok::Comma) => *j += 1,
                        None => return,
                        _ => use_tree(toks, j, path.clone(), out),
                    }
                }
            }
            _ => return,
        }
    }
}

/// The crate's modules: path -> file (inline modules map to their file).
struct Crate {
    modules: BTreeMap<Vec<String>, PathBuf>,
    scans: BTreeMap<PathBuf, FileScan>,
}

impl Crate {
    fn load(src: &Path) -> Crate {
        let mut files = Vec::new();
        collect(src, &mut files);
        let mut modules = BTreeMap::new();
        let mut scans = BTreeMap::new();
        for f in files {
            let rel = f.strip_prefix(src).expect("under src");
            let mut m: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if m.last().is_some_and(|l| l == "mod" || l == "lib") {
                m.pop();
            }
            let text = std::fs::read_to_string(&f).expect("readable source");
            let s = scan(&text, &m);
            for inline in &s.inline_modules {
                modules.insert(inline.clone(), f.clone());
            }
            modules.insert(m, f.clone());
            scans.insert(f, s);
        }
        Crate { modules, scans }
    }

    /// Absolute segments of `r` (`None`: outside the crate).
    fn absolute(&self, r: &PathRef) -> Option<Vec<String>> {
        let mut base = r.module.clone();
        let mut segs = r.segments.iter().peekable();
        match segs.peek().map(|s| s.as_str()) {
            Some("crate") => {
                base.clear();
                segs.next();
            }
            Some("super") => {
                while segs.peek().map(|s| s.as_str()) == Some("super") {
                    base.pop()?;
                    segs.next();
                }
            }
            Some("self") => {
                segs.next();
            }
            Some(first) => {
                // 2018 paths: a child module of this one, else a crate.
                let mut child = base.clone();
                child.push(first.to_string());
                if !self.modules.contains_key(&child) {
                    return None;
                }
            }
            None => return None,
        }
        base.extend(segs.cloned());
        Some(base)
    }

    /// The file that defines what `abs` names, following re-exports.
    fn target(&self, abs: &[String], hops: usize) -> Option<PathBuf> {
        let k = (0..=abs.len())
            .rev()
            .find(|&k| self.modules.contains_key(&abs[..k]))?;
        let module = &abs[..k];
        let file = self.modules.get(module)?;
        if let (Some(name), true) = (abs.get(k), hops < 16) {
            let scan = self.scans.get(file)?;
            let via = scan
                .reexports
                .iter()
                .find(|(m, n, _)| m == module && n == name);
            if let Some((_, _, r)) = via {
                let mut next = self.absolute(r)?;
                next.extend(abs[k + 1..].iter().cloned());
                return self.target(&next, hops + 1);
            }
        }
        Some(file.clone())
    }

    /// Edges between files, each with the lines that make it.
    fn edges(&self) -> BTreeMap<(PathBuf, PathBuf), Vec<usize>> {
        let mut edges: BTreeMap<(PathBuf, PathBuf), Vec<usize>> = BTreeMap::new();
        for (file, scan) in &self.scans {
            for r in scan.paths.iter().filter(|r| !r.reexport) {
                let Some(to) = self.absolute(r).and_then(|a| self.target(&a, 0)) else {
                    continue;
                };
                if &to != file {
                    edges.entry((file.clone(), to)).or_default().push(r.line);
                }
            }
        }
        edges
    }
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("readable source folder")
        .map(|e| e.expect("entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            collect(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Strongly connected components of more than one node (Tarjan).
fn cycles(nodes: &BTreeSet<PathBuf>, adj: &BTreeMap<PathBuf, Vec<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct St<'a> {
        adj: &'a BTreeMap<PathBuf, Vec<PathBuf>>,
        index: BTreeMap<PathBuf, usize>,
        low: BTreeMap<PathBuf, usize>,
        stack: Vec<PathBuf>,
        on: BTreeSet<PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    fn visit(s: &mut St, v: &PathBuf) {
        let n = s.index.len();
        s.index.insert(v.clone(), n);
        s.low.insert(v.clone(), n);
        s.stack.push(v.clone());
        s.on.insert(v.clone());
        for w in s.adj.get(v).cloned().unwrap_or_default() {
            if !s.index.contains_key(&w) {
                visit(s, &w);
                let lw = s.low[&w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on.contains(&w) {
                let iw = s.index[&w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(&w);
                let done = &w == v;
                comp.push(w);
                if done {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = St {
        adj,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// Cycles of the crate at `src`, described for a reader (empty: none).
fn report(src: &Path) -> (usize, usize, Vec<String>) {
    let krate = Crate::load(src);
    let edges = krate.edges();
    let nodes: BTreeSet<PathBuf> = krate.scans.keys().cloned().collect();
    let mut adj: BTreeMap<PathBuf, Vec<PathBuf>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        adj.entry(from.clone()).or_default().push(to.clone());
    }
    let name = |p: &PathBuf| p.strip_prefix(src).unwrap_or(p).display().to_string();
    let found = cycles(&nodes, &adj)
        .into_iter()
        .map(|comp| {
            let members: BTreeSet<&PathBuf> = comp.iter().collect();
            let mut text = format!(
                "a cycle of {} files: {}\n",
                comp.len(),
                comp.iter().map(name).collect::<Vec<_>>().join(", ")
            );
            for ((from, to), lines) in &edges {
                if members.contains(from) && members.contains(to) {
                    text += &format!("  {} -> {} (line {})\n", name(from), name(to), lines[0]);
                }
            }
            text
        })
        .collect();
    (nodes.len(), edges.len(), found)
}

/// `MODULE_CYCLES_SRC=DIR` checks another tree's `src` (say, an older
/// commit's, to compare).
#[test]
fn no_module_of_the_block_crate_imports_one_that_imports_it_back() {
    let src = std::env::var_os("MODULE_CYCLES_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let (files, edges, found) = report(&src);
    println!(
        "module_cycles: {files} files, {edges} import edges, {} cycles",
        found.len()
    );
    assert!(files > 100, "the checker found only {files} files");
    assert!(
        found.is_empty(),
        "module cycles in {}:\n{}",
        src.display(),
        found.concat()
    );
}

#[test]
fn the_checker_sees_a_cycle_through_inline_paths_and_reexports() {
    let dir = std::env::temp_dir().join(format!("module-cycles-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("a")).unwrap();
    let write = |p: &str, s: &str| std::fs::write(dir.join(p), s).unwrap();
    write("lib.rs", "pub mod a;\npub mod b;\npub use b::Thing;\n");
    write(
        "a/mod.rs",
        "pub mod c;\n/// crate::b::x in a comment\nfn f() { let s = \"super::b\"; }\n",
    );
    // c -> lib.rs's re-export -> b, and b -> c written inline.
    write("a/c.rs", "use crate::Thing;\n");
    write("b.rs", "pub struct Thing;\nfn g() { crate::a::c::h(); }\n");
    let (_, _, found) = report(&dir);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].contains("a/c.rs, b.rs"), "{}", found[0]);
    // Comments and strings are not paths; without b's call, no cycle.
    write("b.rs", "pub struct Thing;\n");
    let (_, _, found) = report(&dir);
    assert!(found.is_empty(), "{found:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
