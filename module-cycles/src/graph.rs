//! The file graph and its cycles: an edge per (file, file) with the
//! lines that make it, strongly connected sets of files found with
//! Tarjan's algorithm, and a report that names each cycle's files, one
//! loop through it, and every edge inside it with its line and path.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::path::Path;

use crate::resolve::{resolve, Target};
use crate::tree::Tree;

/// What the checker found in one package.
#[derive(Debug)]
pub struct Report {
    /// The package folder, as given.
    pub package: String,
    pub files: usize,
    pub edges: usize,
    pub cycles: Vec<Cycle>,
}

/// A set of files each of which reaches every other through imports.
#[derive(Debug)]
pub struct Cycle {
    /// Relative to the package folder, sorted.
    pub files: Vec<String>,
    /// A shortest loop from the first file back to itself.
    pub shortest_loop: Vec<String>,
    /// Every edge between two files of the set.
    pub edges: Vec<Edge>,
}

/// One file's dependency on another: the first line that makes it.
#[derive(Debug)]
pub struct Edge {
    pub from: String,
    pub to: String,
    pub line: usize,
    /// The path written at that line (`crate::a::B`, `super::c::*`).
    pub path: String,
    /// How many more lines make the same edge.
    pub more_lines: usize,
}

/// (from file, to file) -> (line, path) of each reference.
type Edges = BTreeMap<(usize, usize), Vec<(usize, String)>>;

pub(crate) fn report(package: &Path, tree: &Tree) -> Report {
    let edges = edges(tree);
    let name = |f: usize| {
        let p = &tree.files[f];
        p.strip_prefix(package).unwrap_or(p).display().to_string()
    };
    let mut adjacency: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    for &(from, to) in edges.keys() {
        adjacency.entry(from).or_default().insert(to);
    }
    let cycles = strongly_connected(tree.files.len(), &adjacency)
        .into_iter()
        .map(|set| {
            let members: BTreeSet<usize> = set.iter().copied().collect();
            let mut files: Vec<String> = set.iter().map(|&f| name(f)).collect();
            files.sort();
            files.dedup();
            let first = *set.iter().min_by_key(|&&f| name(f)).expect("non-empty");
            let shortest_loop = shortest_loop(first, &adjacency, &members)
                .into_iter()
                .map(name)
                .collect();
            let edges = edges
                .iter()
                .filter(|((a, b), _)| members.contains(a) && members.contains(b))
                .map(|(&(a, b), refs)| Edge {
                    from: name(a),
                    to: name(b),
                    line: refs[0].0,
                    path: refs[0].1.clone(),
                    more_lines: refs.len() - 1,
                })
                .collect();
            Cycle {
                files,
                shortest_loop,
                edges,
            }
        })
        .collect();
    Report {
        package: package.display().to_string(),
        files: tree.files.len(),
        edges: edges.len(),
        cycles,
    }
}

fn edges(tree: &Tree) -> Edges {
    let mut edges = Edges::new();
    for r in tree.refs.iter().filter(|r| !r.global) {
        let to = match resolve(tree, r.module, &r.segments) {
            Some(Target::Item(m)) => m,
            Some(Target::Module(m)) if r.glob => m,
            _ => continue,
        };
        let (from, to) = (tree.modules[r.module].file, tree.modules[to].file);
        if from != to && tree.files[from] != tree.files[to] {
            let mut text = r.segments.join("::");
            if r.glob {
                text += "::*";
            }
            edges.entry((from, to)).or_default().push((r.line, text));
        }
    }
    for refs in edges.values_mut() {
        refs.sort();
        refs.dedup();
    }
    edges
}

/// Sets of more than one node that reach each other (Tarjan).
fn strongly_connected(
    nodes: usize,
    adjacency: &BTreeMap<usize, BTreeSet<usize>>,
) -> Vec<Vec<usize>> {
    struct State<'a> {
        adjacency: &'a BTreeMap<usize, BTreeSet<usize>>,
        index: Vec<Option<usize>>,
        low: Vec<usize>,
        stack: Vec<usize>,
        on_stack: Vec<bool>,
        next: usize,
        out: Vec<Vec<usize>>,
    }
    fn visit(s: &mut State, v: usize) {
        s.index[v] = Some(s.next);
        s.low[v] = s.next;
        s.next += 1;
        s.stack.push(v);
        s.on_stack[v] = true;
        let targets: Vec<usize> = s.adjacency.get(&v).into_iter().flatten().copied().collect();
        for w in targets {
            match s.index[w] {
                None => {
                    visit(s, w);
                    s.low[v] = s.low[v].min(s.low[w]);
                }
                Some(iw) if s.on_stack[w] => s.low[v] = s.low[v].min(iw),
                Some(_) => {}
            }
        }
        if Some(s.low[v]) == s.index[v] {
            let mut set = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack[w] = false;
                set.push(w);
                if w == v {
                    break;
                }
            }
            if set.len() > 1 {
                s.out.push(set);
            }
        }
    }
    let mut s = State {
        adjacency,
        index: vec![None; nodes],
        low: vec![0; nodes],
        stack: Vec::new(),
        on_stack: vec![false; nodes],
        next: 0,
        out: Vec::new(),
    };
    for v in 0..nodes {
        if s.index[v].is_none() {
            visit(&mut s, v);
        }
    }
    s.out
}

/// A shortest path from `start` back to itself inside `members` (BFS).
fn shortest_loop(
    start: usize,
    adjacency: &BTreeMap<usize, BTreeSet<usize>>,
    members: &BTreeSet<usize>,
) -> Vec<usize> {
    let mut came_from: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in adjacency.get(&v).into_iter().flatten() {
            if !members.contains(&w) {
                continue;
            }
            if w == start {
                let mut back = Vec::new();
                let mut at = v;
                while at != start {
                    back.push(at);
                    at = came_from[&at];
                }
                back.reverse();
                let mut path = vec![start];
                path.extend(back);
                path.push(start);
                return path;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = came_from.entry(w) {
                e.insert(v);
                queue.push_back(w);
            }
        }
    }
    vec![start]
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        writeln!(
            f,
            "{}: {} files, {} import edges, {} cycles",
            self.package,
            self.files,
            self.edges,
            self.cycles.len()
        )?;
        for c in &self.cycles {
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        writeln!(
            f,
            "a cycle of {} files: {}",
            self.files.len(),
            self.files.join(", ")
        )?;
        writeln!(f, "  one loop: {}", self.shortest_loop.join(" -> "))?;
        for e in &self.edges {
            write!(f, "  {}:{} -> {} ({})", e.from, e.line, e.to, e.path)?;
            if e.more_lines > 0 {
                write!(f, " and {} more lines", e.more_lines)?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}
