//! The module graph has no cycle. Read from the source itself: every path a
//! file names (`crate::a::b`, `super::x`, `self::y`, `use` trees included)
//! is an edge from that file's module to the module it names, and
//!
//! - between the crate's top-level modules (`wire`, `iso8583`, `route`,
//!   `link`, `capture`, `ops`, ...) no cycle may exist: the layers point one
//!   way;
//! - inside a directory module (`link/`, `capture/`, ...) no cycle may exist
//!   between its files. A directory's `mod.rs` is its index: a name it only
//!   re-exports is resolved to the file that defines it. A file module's own
//!   children (`service.rs` with `service/peer.rs`) are one unit with it,
//!   since a module and its private children are one piece of code.
//!
//! Test modules (`#[cfg(test)]` to the end of a file) are left out: a test
//! may reach anywhere.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// A module path without `crate`: `["link", "service"]`.
type ModPath = Vec<String>;

struct Source {
    /// The module this file is.
    module: ModPath,
    /// Its code before any `#[cfg(test)]`, comments and strings removed.
    code: String,
    /// True for `mod.rs` and `lib.rs`: a directory's index.
    index: bool,
}

fn module_of(root: &Path, file: &Path) -> (ModPath, bool) {
    let rel = file.strip_prefix(root).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().expect("a file name");
    let stem = last.trim_end_matches(".rs").to_string();
    let index = stem == "mod" || stem == "lib" || stem == "main";
    if !index {
        parts.push(stem);
    }
    (parts, index)
}

/// Code without comments, string and char literals (so that a path in a doc
/// comment or a message is not an edge).
fn strip(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'r' && b.get(i + 1) == Some(&b'#') {
            // A raw string r#"..."#.
            let end = text[i..].find("\"#").map_or(b.len(), |e| i + e + 2);
            i = end;
            out.push_str("\"\"");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

fn read_sources(root: &Path) -> Vec<Source> {
    let mut files = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
        .into_iter()
        .map(|f: PathBuf| {
            let (module, index) = module_of(root, &f);
            let text = std::fs::read_to_string(&f).expect("read a source file");
            Source {
                module,
                code: strip(&text),
                index,
            }
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Every path the code names that starts with `crate`, `super` or `self`,
/// `use` trees expanded (`use crate::a::{b, c::d}` gives `a::b` and `a::c::d`),
/// as absolute module paths.
fn paths_named(src: &Source) -> Vec<ModPath> {
    let here = &src.module;
    // `super` in a file module is its parent; in an index file, the parent
    // of the directory's module.
    let base_of = |first: &str| -> Option<ModPath> {
        match first {
            "crate" => Some(Vec::new()),
            "self" => Some(here.clone()),
            "super" => {
                let mut p = here.clone();
                p.pop()?;
                Some(p)
            }
            _ => None,
        }
    };
    let mut out = Vec::new();
    let code = &src.code;
    let chars: Vec<char> = code.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let starts_word = i == 0 || !is_ident(chars[i - 1]) && chars[i - 1] != ':';
        if !starts_word || !is_ident(chars[i]) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < chars.len() && is_ident(chars[j]) {
            j += 1;
        }
        let first: String = chars[i..j].iter().collect();
        let Some(mut base) = base_of(&first) else {
            i = j;
            continue;
        };
        // Follow `::segment` (and `super::super`), then maybe a `{...}` tree.
        let mut k = j;
        loop {
            if chars.get(k) == Some(&':') && chars.get(k + 1) == Some(&':') {
                k += 2;
                while chars.get(k).is_some_and(|c| c.is_whitespace()) {
                    k += 1;
                }
                if chars.get(k) == Some(&'{') {
                    let end = matching_brace(&chars, k);
                    let tree: String = chars[k + 1..end].iter().collect();
                    for item in split_tree(&tree) {
                        let mut p = base.clone();
                        for seg in item.split("::").map(str::trim) {
                            if seg == "self" || seg.is_empty() || seg == "*" {
                                break;
                            }
                            p.push(seg.split_whitespace().next().unwrap_or("").to_string());
                        }
                        out.push(p);
                    }
                    k = end + 1;
                    break;
                }
                let s = k;
                while chars.get(k).is_some_and(|&c| is_ident(c)) {
                    k += 1;
                }
                let seg: String = chars[s..k].iter().collect();
                if seg == "super" {
                    base.pop();
                } else if !seg.is_empty() {
                    base.push(seg);
                }
            } else {
                out.push(base.clone());
                break;
            }
        }
        i = k.max(j);
    }
    out
}

fn matching_brace(chars: &[char], open: usize) -> usize {
    let mut depth = 0;
    for (k, &c) in chars.iter().enumerate().skip(open) {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return k;
                }
            }
            _ => {}
        }
    }
    chars.len() - 1
}

/// The items of a `use` tree's braces, nested trees flattened to paths.
fn split_tree(tree: &str) -> Vec<String> {
    let mut items = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in tree.chars() {
        match c {
            '{' => {
                depth += 1;
                cur.push(c);
            }
            '}' => {
                depth -= 1;
                cur.push(c);
            }
            ',' if depth == 0 => {
                items.push(std::mem::take(&mut cur));
            }
            _ => cur.push(c),
        }
    }
    items.push(cur);
    let mut out = Vec::new();
    for item in items {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        match (item.find('{'), item.rfind('}')) {
            (Some(a), Some(b)) if a < b => {
                let prefix = item[..a].trim_end_matches("::").trim();
                for inner in split_tree(&item[a + 1..b]) {
                    out.push(format!("{prefix}::{inner}"));
                }
            }
            _ => out.push(item.to_string()),
        }
    }
    out
}

/// Which file a name of directory module `dir` comes from: the one child
/// file that defines it, if exactly one does.
fn definer<'a>(sources: &'a [Source], dir: &ModPath, name: &str) -> Option<&'a ModPath> {
    let patterns = [
        format!("struct {name}"),
        format!("enum {name}"),
        format!("trait {name}"),
        format!("type {name}"),
        format!("fn {name}"),
        format!("const {name}"),
        format!("static {name}"),
    ];
    let defines = |code: &str| {
        patterns.iter().any(|p| {
            code.match_indices(p.as_str()).any(|(at, _)| {
                let end = at + p.len();
                !code[end..].starts_with(is_ident)
            })
        })
    };
    let mut found = sources.iter().filter(|s| {
        !s.index && s.module.len() == dir.len() + 1 && s.module.starts_with(dir) && defines(&s.code)
    });
    let first = found.next()?;
    found.next().is_none().then_some(&first.module)
}

/// The unit a module path belongs to: the longest file module that is a
/// prefix of it, with a file module's own children folded into it; `None`
/// for a directory index.
fn unit_of(sources: &[Source], path: &ModPath) -> Option<ModPath> {
    let file_modules: BTreeSet<&ModPath> = sources
        .iter()
        .filter(|s| !s.index)
        .map(|s| &s.module)
        .collect();
    let dirs: BTreeSet<&ModPath> = sources
        .iter()
        .filter(|s| s.index)
        .map(|s| &s.module)
        .collect();
    // The first prefix that is a file module (not a directory index) is the
    // unit: deeper files under it are its private children.
    for len in 1..=path.len() {
        let prefix = path[..len].to_vec();
        if file_modules.contains(&prefix) && !dirs.contains(&prefix) {
            return Some(prefix);
        }
        if !dirs.contains(&prefix) {
            // A name inside the directory index `path[..len-1]`.
            let dir = path[..len - 1].to_vec();
            return definer(sources, &dir, &path[len - 1]).cloned();
        }
    }
    None
}

/// The cycles of `graph`, as its strongly connected components of more than
/// one node (Tarjan).
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Tarjan<'g> {
        graph: &'g BTreeMap<String, BTreeSet<String>>,
        index: HashMap<&'g str, usize>,
        low: HashMap<&'g str, usize>,
        on_stack: BTreeSet<&'g str>,
        stack: Vec<&'g str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    impl<'g> Tarjan<'g> {
        fn visit(&mut self, v: &'g str) {
            self.index.insert(v, self.next);
            self.low.insert(v, self.next);
            self.next += 1;
            self.stack.push(v);
            self.on_stack.insert(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let w = w.as_str();
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let lw = self.low[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if self.on_stack.contains(w) {
                    let iw = self.index[w];
                    let lv = self.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
            if self.low[v] == self.index[v] {
                let mut scc = Vec::new();
                while let Some(w) = self.stack.pop() {
                    self.on_stack.remove(w);
                    scc.push(w.to_string());
                    if w == v {
                        break;
                    }
                }
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan {
        graph,
        index: HashMap::new(),
        low: HashMap::new(),
        on_stack: BTreeSet::new(),
        stack: Vec::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !t.index.contains_key(v.as_str()) {
            t.visit(v);
        }
    }
    t.out
}

fn graphs() -> (
    BTreeMap<String, BTreeSet<String>>,
    BTreeMap<String, BTreeSet<String>>,
) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let sources = read_sources(&root);
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for src in &sources {
        let from_unit = if src.index {
            None
        } else {
            unit_of(&sources, &src.module)
        };
        for path in paths_named(src) {
            let (Some(a), Some(b)) = (src.module.first(), path.first()) else {
                continue;
            };
            if a != b {
                top.entry(a.clone()).or_default().insert(b.clone());
                continue;
            }
            let (Some(from), Some(to)) = (&from_unit, unit_of(&sources, &path)) else {
                continue;
            };
            if *from != to {
                files
                    .entry(from.join("::"))
                    .or_default()
                    .insert(to.join("::"));
            }
        }
    }
    (top, files)
}

#[test]
fn the_layers_point_one_way() {
    let (top, _) = graphs();
    let found = cycles(&top);
    assert!(
        found.is_empty(),
        "top-level modules in a cycle: {found:?}\nedges: {top:#?}"
    );
}

/// The pure layers, lowest first: each is a crate under `crates/` and may
/// depend only on those before it.
const PURE: [&str; 4] = ["util", "wire", "iso8583", "route"];

/// The `[dependencies]` of `crates/NAME/Cargo.toml` (not dev-dependencies:
/// a test may use anything).
fn crate_dependencies(name: &str) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("crates/{name}/Cargo.toml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut in_deps = false;
    let mut deps = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_deps = line == "[dependencies]";
        } else if in_deps && let Some((key, _)) = line.split_once('=') {
            deps.push(key.trim().to_string());
        }
    }
    deps
}

#[test]
fn the_pure_crates_depend_on_no_runtime_and_only_on_crates_below() {
    const RUNTIME: [&str; 9] = [
        "tokio",
        "tokio-util",
        "mio",
        "hyper",
        "axum",
        "rusqlite",
        "tokio-postgres",
        "tracing",
        "libc",
    ];
    for (i, name) in PURE.iter().enumerate() {
        for dep in crate_dependencies(name) {
            assert!(
                !RUNTIME.contains(&dep.as_str()),
                "isoswitch-{name} depends on {dep}"
            );
            if let Some(layer) = dep.strip_prefix("isoswitch-") {
                let below = PURE[..i].contains(&layer);
                assert!(
                    below,
                    "isoswitch-{name} depends on isoswitch-{layer}, not below it"
                );
            }
        }
    }
}

#[test]
fn the_pure_crates_do_no_io() {
    const IO: [&str; 6] = [
        "std::fs",
        "std::net",
        "std::process",
        "TcpStream",
        "std::thread",
        "SystemTime::now",
    ];
    for name in PURE {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("crates/{name}/src"));
        for path in rust_files(&dir) {
            // Tests may do anything: test modules (to the end of a file) and
            // files of their own (`tests.rs`).
            if path.file_name().is_some_and(|f| f == "tests.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("source");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for needle in IO {
                assert!(!code.contains(needle), "{} names {needle}", path.display());
            }
        }
    }
    // And none of them is a module of the switch's crate again.
    for name in PURE {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(name);
        assert!(!dir.exists(), "{} is back in src/", dir.display());
    }
}

#[test]
fn no_module_cycle_between_files() {
    let (_, files) = graphs();
    let found = cycles(&files);
    // Each cycle with its edges, to say which `use` to move.
    let edges: Vec<String> = found
        .iter()
        .flat_map(|scc| {
            scc.iter().flat_map(|a| {
                files
                    .get(a)
                    .into_iter()
                    .flatten()
                    .filter(|b| scc.contains(*b))
                    .map(move |b| format!("{a} -> {b}"))
            })
        })
        .collect();
    assert!(
        found.is_empty(),
        "files in a cycle: {found:?}\n{}",
        edges.join("\n")
    );
}

/// `link/io/` is a link's bytes whoever is at the other end: tokio, but no
/// `Service`, no front and no back, so it can leave for a crate of its own.
#[test]
fn the_io_room_knows_no_service_front_or_back() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let sources = read_sources(&root);
    let io: ModPath = vec!["link".into(), "io".into()];
    let files: Vec<&Source> = sources
        .iter()
        .filter(|s| s.module.starts_with(&io))
        .collect();
    assert!(!files.is_empty(), "no file under link/io");
    let mut found = Vec::new();
    for src in files {
        for path in paths_named(src) {
            let room = path.get(1).map(String::as_str);
            if path.first().map(String::as_str) == Some("link")
                && matches!(room, Some("service" | "front" | "back" | "Service"))
            {
                found.push(format!("{} -> {}", src.module.join("::"), path.join("::")));
            }
        }
    }
    assert!(found.is_empty(), "link/io reaches up: {found:#?}");
}

#[test]
fn a_cycle_is_found() {
    let g: BTreeMap<String, BTreeSet<String>> = [
        ("a", vec!["b"]),
        ("b", vec!["c"]),
        ("c", vec!["a"]),
        ("d", vec!["a"]),
    ]
    .into_iter()
    .map(|(k, v)| {
        (
            k.to_string(),
            v.into_iter().map(str::to_string).collect::<BTreeSet<_>>(),
        )
    })
    .collect();
    assert_eq!(cycles(&g), vec![vec!["a", "b", "c"]]);
}

#[test]
fn use_trees_are_expanded() {
    let src = Source {
        module: vec!["link".into(), "front".into()],
        code: "use super::{client::ClientLink, writer::{Outbound, Patch}};\n\
               use crate::route::Router; fn f() { super::super::util::x(); }"
            .into(),
        index: false,
    };
    let named: Vec<String> = paths_named(&src).iter().map(|p| p.join("::")).collect();
    assert!(
        named.contains(&"link::client::ClientLink".into()),
        "{named:?}"
    );
    assert!(
        named.contains(&"link::writer::Outbound".into()),
        "{named:?}"
    );
    assert!(named.contains(&"route::Router".into()), "{named:?}");
    assert!(named.contains(&"util::x".into()), "{named:?}");
}

/// Every `.rs` file under `dir`, subdirectories included.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("a source directory") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}
