//! Follows a path to what it names: a module of the crate, an item
//! defined in one, or something outside the crate. Names are looked up
//! the way the compiler does for the cases this workspace writes: a
//! module's children, its items, its `use` bindings (re-exports
//! included, followed to their source), then its globs; `crate`, `self`
//! and `super` move through the tree.

use std::collections::BTreeSet;

use crate::tree::{ModId, Tree};

/// What a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    Module(ModId),
    /// An item of this module, or something inside one (a variant, an
    /// associated function).
    Item(ModId),
}

/// Bounds following `use` chains (a glob loop, say).
const MAX_HOPS: usize = 32;

/// What `segments`, written in module `at`, names; `None` when it leaves
/// the crate or names a local, a generic or a prelude name.
pub(crate) fn resolve(tree: &Tree, at: ModId, segments: &[String]) -> Option<Target> {
    Resolver {
        tree,
        seen: BTreeSet::new(),
        hops: 0,
    }
    .path(at, segments)
}

struct Resolver<'t> {
    tree: &'t Tree,
    /// (module, name) lookups under way: a name a glob leads back to.
    seen: BTreeSet<(ModId, String)>,
    hops: usize,
}

impl Resolver<'_> {
    fn path(&mut self, at: ModId, segments: &[String]) -> Option<Target> {
        self.hops += 1;
        if self.hops > MAX_HOPS {
            return None;
        }
        let (first, rest) = segments.split_first()?;
        let mut current = match first.as_str() {
            "crate" => self.tree.modules[at].root,
            "self" => at,
            "super" => self.tree.modules[at].parent?,
            "Self" => return None,
            name => match self.lookup(at, name)? {
                Target::Module(m) => m,
                item => return Some(item),
            },
        };
        for seg in rest {
            if seg == "super" {
                current = self.tree.modules[current].parent?;
                continue;
            }
            match self.lookup(current, seg) {
                Some(Target::Module(m)) => current = m,
                Some(item) => return Some(item),
                // Not declared where we can see it: made by a macro of
                // this module, which is where it lives.
                None => return Some(Target::Item(current)),
            }
        }
        Some(Target::Module(current))
    }

    /// `name` in module `m`'s namespace.
    fn lookup(&mut self, m: ModId, name: &str) -> Option<Target> {
        if !self.seen.insert((m, name.to_string())) {
            return None;
        }
        let found = self.lookup_fresh(m, name);
        self.seen.remove(&(m, name.to_string()));
        found
    }

    fn lookup_fresh(&mut self, m: ModId, name: &str) -> Option<Target> {
        let module = &self.tree.modules[m];
        if let Some(&child) = module.children.get(name) {
            return Some(Target::Module(child));
        }
        if module.items.contains(name) {
            return Some(Target::Item(m));
        }
        if let Some(&def) = module.exported_macros.get(name) {
            return Some(Target::Item(def));
        }
        if module.externs.contains(name) {
            return None;
        }
        // A binding shadows globs; one that leaves the crate (`use
        // std::io;`) names nothing here.
        let bound: Vec<Vec<String>> = module
            .imports
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, p)| p.clone())
            .collect();
        if !bound.is_empty() {
            // Two bindings of one name live in different namespaces (a
            // type and a function, say); prefer one that stays here.
            return bound.iter().find_map(|p| self.path(m, p));
        }
        let globs = module.globs.clone();
        for glob in globs {
            if let Some(Target::Module(g)) = self.path(m, &glob) {
                if g != m {
                    if let Some(t) = self.lookup(g, name) {
                        return Some(t);
                    }
                }
            }
        }
        None
    }
}
