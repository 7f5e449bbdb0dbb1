//! The binary crate's top-level modules import one another one way only: no module reaches,
//! through any chain of `crate::` paths, back to itself (docs/architecture.md). Read from the
//! source text, so a cycle fails here before a reader trips over it.

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
    let skip = ["target", ".git", "node_modules", ".venv", "__pycache__", "migrations"];
    let mut found = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            if path.is_dir() {
                if !skip.contains(&name.as_str()) {
                    dirs.push(path);
                }
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
