//! Collects the paths a file writes, and its modules' `use` bindings:
//! a `syn` visitor over the whole file (function bodies, types,
//! patterns, attributes' paths) that also reads macro arguments as
//! tokens, where `a::b::c` sequences are taken as paths.

use proc_macro2::{Spacing, TokenStream, TokenTree};
use syn::visit::{self, Visit};

use crate::tree::{ModId, PathRef, Tree};

/// Scans `file`, whose top module is `id`, into `tree`.
pub(crate) fn scan_file(tree: &mut Tree, id: ModId, file: &syn::File) {
    let mut scanner = Scanner {
        tree,
        stack: vec![id],
    };
    for item in &file.items {
        scanner.visit_item(item);
    }
}

struct Scanner<'t> {
    tree: &'t mut Tree,
    /// The module being read: the file's, then inline modules inside it.
    stack: Vec<ModId>,
}

impl Scanner<'_> {
    fn module(&self) -> ModId {
        *self.stack.last().expect("a module")
    }

    fn push(&mut self, segments: Vec<String>, line: usize, global: bool, glob: bool) {
        if segments.is_empty() {
            return;
        }
        self.tree.refs.push(PathRef {
            module: self.module(),
            segments,
            line,
            global,
            glob,
        });
    }

    /// Records each leaf of a use tree: its binding, and the path.
    fn use_tree(&mut self, tree: &syn::UseTree, mut prefix: Vec<String>, global: bool) {
        let m = self.module();
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix, global);
            }
            syn::UseTree::Name(n) => {
                let line = n.ident.span().start().line;
                let (path, name) = leaf(prefix, n.ident.to_string());
                if let (false, Some(name)) = (global, name) {
                    self.tree.modules[m].imports.push((name, path.clone()));
                }
                self.push(path, line, global, false);
            }
            syn::UseTree::Rename(r) => {
                let line = r.ident.span().start().line;
                let (path, _) = leaf(prefix, r.ident.to_string());
                let name = r.rename.to_string();
                if !global && name != "_" {
                    self.tree.modules[m].imports.push((name, path.clone()));
                }
                self.push(path, line, global, false);
            }
            syn::UseTree::Glob(g) => {
                let line = g.star_token.spans[0].start().line;
                if !global {
                    self.tree.modules[m].globs.push(prefix.clone());
                }
                self.push(prefix, line, global, true);
            }
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix.clone(), global);
                }
            }
        }
    }

    /// Paths in a macro's arguments: `a::b(::c)*` runs of tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let mut run: Vec<String> = Vec::new();
        let mut line = 0;
        let mut global = false;
        // What the previous tokens were: `::` just closed, `$` just seen.
        let mut after_sep = false;
        let mut colon = false;
        let mut dollar = false;
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        for t in trees {
            match t {
                TokenTree::Ident(i) => {
                    let name = i.to_string();
                    if after_sep && !run.is_empty() {
                        run.push(name);
                    } else {
                        self.flush(&mut run, line, global);
                        // `$x::y` is a macro variable's path; `$crate` is
                        // the crate.
                        if !dollar || name == "crate" {
                            global = after_sep;
                            line = i.span().start().line;
                            run.push(name);
                        }
                    }
                    after_sep = false;
                    colon = false;
                    dollar = false;
                }
                TokenTree::Punct(p) if p.as_char() == ':' => {
                    if colon {
                        after_sep = true;
                        colon = false;
                    } else {
                        colon = p.spacing() == Spacing::Joint;
                        if !colon {
                            self.flush(&mut run, line, global);
                        }
                    }
                    dollar = false;
                }
                TokenTree::Punct(p) => {
                    self.flush(&mut run, line, global);
                    after_sep = false;
                    colon = false;
                    dollar = p.as_char() == '$';
                }
                TokenTree::Group(g) => {
                    self.flush(&mut run, line, global);
                    after_sep = false;
                    colon = false;
                    dollar = false;
                    self.tokens(g.stream());
                }
                TokenTree::Literal(_) => {
                    self.flush(&mut run, line, global);
                    after_sep = false;
                    colon = false;
                    dollar = false;
                }
            }
        }
        self.flush(&mut run, line, global);
    }

    /// Records a run of two or more segments (a single name in a macro's
    /// arguments is as likely a local as an item).
    fn flush(&mut self, run: &mut Vec<String>, line: usize, global: bool) {
        let segments = std::mem::take(run);
        if segments.len() >= 2 {
            self.push(segments, line, global, false);
        }
    }
}

/// A use leaf's full path and the name it binds (`self` binds the last
/// segment of the prefix).
fn leaf(mut prefix: Vec<String>, ident: String) -> (Vec<String>, Option<String>) {
    if ident == "self" {
        let name = prefix.last().cloned();
        (prefix, name)
    } else {
        prefix.push(ident.clone());
        (prefix, Some(ident))
    }
}

impl<'ast> Visit<'ast> for Scanner<'_> {
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        let Some((_, items)) = &m.content else {
            return; // scanned as its own file
        };
        let parent = self.module();
        let id = self.tree.modules[parent].children[&m.ident.to_string()];
        self.stack.push(id);
        for item in items {
            self.visit_item(item);
        }
        self.stack.pop();
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&u.tree, Vec::new(), u.leading_colon.is_some());
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments = p.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = p
            .segments
            .first()
            .map_or(0, |s| s.ident.span().start().line);
        self.push(segments, line, p.leading_colon.is_some(), false);
        visit::visit_path(self, p);
    }

    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        self.visit_path(&m.path);
        self.tokens(m.tokens.clone());
    }
}
