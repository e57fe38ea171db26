//! The module tree of a crate target, read from its root file by
//! following `mod` declarations, and what each module declares: its
//! child modules, its items, its `use` bindings and globs, and the paths
//! written in it (the last three filled by [`crate::scan`] from the
//! syntax kept here).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub(crate) type ModId = usize;

/// One module: a file, or an inline `mod x { .. }` inside one.
#[derive(Default)]
pub(crate) struct Module {
    pub file: usize,
    pub parent: Option<ModId>,
    pub root: ModId,
    pub children: BTreeMap<String, ModId>,
    /// Names of the items defined here (types, functions, constants, ..).
    pub items: BTreeSet<String>,
    /// `use` bindings: the bound name and the path it stands for.
    pub imports: Vec<(String, Vec<String>)>,
    /// Paths of `use ..::*`.
    pub globs: Vec<Vec<String>>,
    /// `extern crate x (as y)` bindings: names that leave the crate.
    pub externs: BTreeSet<String>,
    /// At a crate root: `#[macro_export]` macros (`crate::name!`) and the
    /// module that defines each.
    pub exported_macros: BTreeMap<String, ModId>,
}

/// A path written in a module.
pub(crate) struct PathRef {
    pub module: ModId,
    pub segments: Vec<String>,
    pub line: usize,
    /// Written `::a::b`: another crate.
    pub global: bool,
    /// The leaf of `use a::b::*`.
    pub glob: bool,
}

/// Every module of the targets loaded so far.
#[derive(Default)]
pub(crate) struct Tree {
    pub files: Vec<PathBuf>,
    pub modules: Vec<Module>,
    pub refs: Vec<PathRef>,
    /// Each file's syntax and its top module, for [`crate::scan`].
    pub parsed: Vec<(ModId, syn::File)>,
}

impl Tree {
    /// Loads the target whose root file is `root`.
    pub fn load_root(&mut self, root: &Path) -> Result<(), String> {
        let id = self.modules.len();
        self.modules.push(Module {
            root: id,
            ..Module::default()
        });
        // A crate root's children sit beside it, like a mod.rs's.
        self.load_file(id, root, true)
    }

    /// Parses `path` as module `id`, then loads its children and scans it.
    fn load_file(&mut self, id: ModId, path: &Path, mod_rs: bool) -> Result<(), String> {
        if self.files.iter().filter(|f| f.as_path() == path).count() > 64 {
            return Err(format!(
                "{}: loaded too often (a #[path] loop?)",
                path.display()
            ));
        }
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("read {}: {e}", path.display()))?;
        let file = syn::parse_file(&text).map_err(|e| {
            let at = e.span().start();
            format!("parse {}:{}:{}: {e}", path.display(), at.line, at.column)
        })?;
        let file_idx = self.files.len();
        self.files.push(path.to_path_buf());
        self.modules[id].file = file_idx;
        let dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
        let child_dir = if mod_rs {
            dir.clone()
        } else {
            dir.join(path.file_stem().unwrap_or_default())
        };
        self.declare(id, &file.items, &dir, &child_dir, false)?;
        self.parsed.push((id, file));
        Ok(())
    }

    /// Registers `items` as module `id`'s, loading out-of-line children.
    /// `dir` is the declaring file's folder, `child_dir` where `mod x;`
    /// looks for `x.rs` and `x/mod.rs`; `inline` is true inside an inline
    /// module (where `#[path]` is relative to `child_dir`).
    fn declare(
        &mut self,
        id: ModId,
        items: &[syn::Item],
        dir: &Path,
        child_dir: &Path,
        inline: bool,
    ) -> Result<(), String> {
        for item in items {
            match item {
                syn::Item::Mod(m) => self.declare_mod(id, m, dir, child_dir, inline)?,
                syn::Item::ExternCrate(e) => {
                    let name = e.rename.as_ref().map_or(&e.ident, |r| &r.1);
                    self.modules[id].externs.insert(name.to_string());
                }
                syn::Item::ForeignMod(f) => {
                    for fi in &f.items {
                        let name = match fi {
                            syn::ForeignItem::Fn(x) => &x.sig.ident,
                            syn::ForeignItem::Static(x) => &x.ident,
                            syn::ForeignItem::Type(x) => &x.ident,
                            _ => continue,
                        };
                        self.modules[id].items.insert(name.to_string());
                    }
                }
                syn::Item::Macro(x) if exported_macro(x) => {
                    if let Some(name) = &x.ident {
                        let root = self.modules[id].root;
                        let defs = &mut self.modules[root].exported_macros;
                        defs.insert(name.to_string(), id);
                    }
                }
                other => {
                    if let Some(name) = item_name(other) {
                        self.modules[id].items.insert(name);
                    }
                }
            }
        }
        Ok(())
    }

    fn declare_mod(
        &mut self,
        parent: ModId,
        m: &syn::ItemMod,
        dir: &Path,
        child_dir: &Path,
        inline: bool,
    ) -> Result<(), String> {
        let name = m.ident.to_string();
        let id = self.modules.len();
        let root = self.modules[parent].root;
        self.modules.push(Module {
            parent: Some(parent),
            root,
            ..Module::default()
        });
        self.modules[parent].children.insert(name.clone(), id);
        if let Some((_, items)) = &m.content {
            self.modules[id].file = self.modules[parent].file;
            return self.declare(id, items, dir, &child_dir.join(&name), true);
        }
        let path = match path_attr(&m.attrs) {
            Some(p) if inline => child_dir.join(p),
            Some(p) => dir.join(p),
            None => {
                let flat = child_dir.join(format!("{name}.rs"));
                if flat.is_file() {
                    flat
                } else {
                    child_dir.join(&name).join("mod.rs")
                }
            }
        };
        let mod_rs = path.file_name().is_some_and(|f| f == "mod.rs");
        self.load_file(id, &path, mod_rs)
    }
}

/// The name an item defines in its module's namespace, if any (`use`,
/// `impl`, `mod` and macros are handled elsewhere or define none).
fn item_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(x) => &x.ident,
        syn::Item::Enum(x) => &x.ident,
        syn::Item::Fn(x) => &x.sig.ident,
        syn::Item::Static(x) => &x.ident,
        syn::Item::Struct(x) => &x.ident,
        syn::Item::Trait(x) => &x.ident,
        syn::Item::TraitAlias(x) => &x.ident,
        syn::Item::Type(x) => &x.ident,
        syn::Item::Union(x) => &x.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// A `#[macro_export] macro_rules!`: named `crate::name!` from anywhere,
/// defined in the file that writes it.
fn exported_macro(m: &syn::ItemMacro) -> bool {
    m.ident.is_some() && m.attrs.iter().any(|a| a.path().is_ident("macro_export"))
}

/// The value of `#[path = ".."]`.
fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}
