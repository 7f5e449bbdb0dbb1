//! The library's top-level modules import one another one way only: no module reaches,
//! through any chain of `crate::` paths, back to itself, and none imports from a layer above its
//! own, as `src/lib.rs` lists them (docs/architecture.md, "Layers"). Read from the source text,
//! so a cycle or an upward import fails here before a reader trips over it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Each top-level module of `src/` and the top-level modules its files name with `crate::`.
fn imports() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let path = regex::Regex::new(r"\bcrate::(\w+)").unwrap();
    let group = regex::Regex::new(r"(?s)\bcrate::\{(.*?)\};").unwrap();
    let head = regex::Regex::new(r"(?:^|[{,])\s*(\w+)").unwrap();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = vec![src.clone()];
    while let Some(p) = files.pop() {
        if p.is_dir() {
            files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
            continue;
        }
        let rel = p.strip_prefix(&src).unwrap();
        let top = rel.components().next().unwrap().as_os_str().to_str().unwrap().trim_end_matches(".rs").to_string();
        if p.extension().is_none_or(|e| e != "rs") || ["bin", "lib", "main"].contains(&top.as_str()) {
            continue;
        }
        let text = std::fs::read_to_string(&p).unwrap();
        let text: Vec<&str> = text.lines().filter(|l| !l.trim_start().starts_with("//")).collect();
        let text = text.join("\n");
        let named = graph.entry(top.clone()).or_default();
        named.extend(path.captures_iter(&text).map(|c| c[1].to_string()));
        for g in group.captures_iter(&text) {
            named.extend(head.captures_iter(&g[1]).map(|c| c[1].to_string()));
        }
        named.remove(&top);
        named.remove("self");
    }
    graph
}

/// A cycle through `from`, if there is one: the modules along it.
fn cycle(graph: &BTreeMap<String, BTreeSet<String>>, from: &str) -> Option<Vec<String>> {
    let mut stack = vec![(from.to_string(), vec![from.to_string()])];
    let mut seen = BTreeSet::new();
    while let Some((at, trail)) = stack.pop() {
        for next in graph.get(&at).into_iter().flatten() {
            if next == from {
                return Some([trail.clone(), vec![next.clone()]].concat());
            }
            if seen.insert(next.clone()) {
                stack.push((next.clone(), [trail.clone(), vec![next.clone()]].concat()));
            }
        }
    }
    None
}

#[test]
fn top_level_modules_import_one_another_one_way() {
    let graph = imports();
    assert!(graph.len() > 20, "the source tree was read: {:?}", graph.keys());
    let cycles: Vec<String> = graph.keys().filter_map(|m| cycle(&graph, m)).map(|c| c.join(" → ")).collect();
    assert!(cycles.is_empty(), "import cycles between top-level modules:\n{}", cycles.join("\n"));
}

/// Each module `src/lib.rs` declares, with the rank of its `// layer:` section (0 lowest), and
/// the sections' names.
fn layers() -> (BTreeMap<String, usize>, Vec<String>) {
    let lib = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let header = regex::Regex::new(r"^// layer: (\w+)").unwrap();
    let module = regex::Regex::new(r"^pub (?:mod (\w+)|use \w+ as (\w+));").unwrap();
    let (mut rank, mut names) = (BTreeMap::new(), Vec::new());
    for line in lib.lines() {
        if let Some(c) = header.captures(line) {
            names.push(c[1].to_string());
        } else if let Some(c) = module.captures(line) {
            let name = c.get(1).or(c.get(2)).unwrap().as_str().to_string();
            assert!(!names.is_empty(), "`{line}` comes before the first `// layer:` line of src/lib.rs");
            assert!(rank.insert(name, names.len() - 1).is_none(), "`{line}` is declared twice");
        }
    }
    (rank, names)
}

/// Every import that goes up: (module, its layer, the module it imports, that one's layer).
fn upward(graph: &BTreeMap<String, BTreeSet<String>>, rank: &BTreeMap<String, usize>) -> Vec<String> {
    let mut up = Vec::new();
    for (from, named) in graph {
        for to in named.iter().filter(|to| rank.contains_key(*to)) {
            if rank[to] > rank[from] {
                up.push(format!("{from} (layer {}) imports {to} (layer {})", rank[from], rank[to]));
            }
        }
    }
    up
}

#[test]
fn no_module_imports_from_a_layer_above_its_own() {
    let graph = imports();
    let (rank, names) = layers();
    assert!(names.len() >= 5, "src/lib.rs names its layers: {names:?}");
    let undeclared: Vec<&String> = graph.keys().filter(|m| !rank.contains_key(*m)).collect();
    assert!(undeclared.is_empty(), "modules of src/ that src/lib.rs lists in no layer: {undeclared:?}");
    let up = upward(&graph, &rank);
    assert!(up.is_empty(), "imports that go up a layer (layers: {}):\n{}", names.join(" < "), up.join("\n"));
}

#[test]
fn the_layer_check_finds_an_import_that_goes_up() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("store".to_string(), BTreeSet::from(["config".to_string()])),
        ("config".to_string(), BTreeSet::from(["store".to_string(), "engine".to_string()])),
    ]
    .into();
    let rank: BTreeMap<String, usize> =
        [("engine".to_string(), 0), ("config".to_string(), 1), ("store".to_string(), 2)].into();
    assert_eq!(upward(&graph, &rank), ["config (layer 1) imports store (layer 2)"]);
}

#[test]
fn the_cycle_finder_finds_a_cycle() {
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a".to_string(), BTreeSet::from(["b".to_string()])),
        ("b".to_string(), BTreeSet::from(["c".to_string()])),
        ("c".to_string(), BTreeSet::from(["a".to_string()])),
        ("d".to_string(), BTreeSet::from(["a".to_string()])),
    ]
    .into();
    assert_eq!(cycle(&graph, "a").unwrap(), ["a", "b", "c", "a"]);
    assert_eq!(cycle(&graph, "d"), None);
}

/// The repository stands alone (docs/architecture.md): its code, tests and docs cite its own
/// `docs/`, never a document outside it or a section number of one, and no machine's absolute
/// paths. Applied migrations are left as they are: their checksums are checked at every start.
/// The patterns are spelled in pieces so that this file does not match itself.
#[test]
fn nothing_in_the_repository_points_outside_it() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let outside = [
        ["..", "/shared"].concat(),
        ["SPEC", " §"].concat(),
        ["SPEC", ".md"].concat(),
        ["TESTING", ".md"].concat(),
        ["/work", "/"].concat(),
        ["/root", "/"].concat(),
        ["/home", "/"].concat(),
    ];
    let skip = ["target", ".git", "node_modules", ".venv", ".venv-bench", "__pycache__", "migrations"];
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if skip.contains(&name.as_str()) {
                continue; // `.git` is a file in a worktree
            }
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            let Ok(text) = std::fs::read_to_string(&path) else { continue }; // not text
            for (i, line) in text.lines().enumerate() {
                if let Some(p) = outside.iter().find(|p| line.contains(p.as_str())) {
                    found.push(format!(
                        "{}:{}: `{p}` in {}",
                        path.strip_prefix(root).unwrap().display(),
                        i + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    assert!(found.is_empty(), "{} references outside the repository:\n{}", found.len(), found.join("\n"));
}
