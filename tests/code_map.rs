//! docs/architecture.md and CONTRIBUTING.md's code map against the code: every folder and file
//! at `src/`'s root stands on one layer of architecture.md's list, and every `crate::` path in
//! it names a module on a lower layer; the code map names each of them, each file it names
//! exists, and each file directly in a folder is named in that folder's row.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `src/`'s root: its folders as `NAME/`, its files as `NAME.rs` (a folder beside a file of
/// the same name, `lease/` beside `lease.rs`, holds that file's tests: it is the file's).
fn src_entries() -> Vec<String> {
    let mut entries: Vec<String> = std::fs::read_dir(root().join("src"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = e.file_name().into_string().unwrap();
            match e.file_type().unwrap().is_dir() {
                true => format!("{name}/"),
                false => name,
            }
        })
        .collect();
    let files = entries.clone();
    entries.retain(|e| {
        !e.strip_suffix('/')
            .is_some_and(|dir| files.contains(&format!("{dir}.rs")))
    });
    entries.sort();
    entries
}

/// The layer list of architecture.md (the `text` block under `## Layers`): entry -> layer.
fn layers() -> BTreeMap<String, u32> {
    let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let section = doc.split("## Layers").nth(1).expect("a Layers section");
    let block = section
        .split("```text")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("the layer list, in a text block");
    let mut layers = BTreeMap::new();
    for line in block.lines().filter(|l| !l.trim().is_empty()) {
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("layer"), "{line}");
        let n: u32 = words.next().unwrap().parse().unwrap();
        for entry in words {
            assert!(
                layers.insert(entry.to_owned(), n).is_none(),
                "{entry} is on two layers"
            );
        }
    }
    layers
}

/// The module an entry of `src/`'s root is: `cli/` and `open.rs` are `cli` and `open`.
fn module(entry: &str) -> &str {
    entry.trim_end_matches('/').trim_end_matches(".rs")
}

/// Every `.rs` file under `path` (itself, when it is one).
fn rust_files(path: &Path) -> Vec<PathBuf> {
    if path.is_file() {
        return vec![path.to_owned()];
    }
    let mut files = Vec::new();
    for e in std::fs::read_dir(path).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            files.extend(rust_files(&p));
        } else if p.extension().is_some_and(|x| x == "rs") {
            files.push(p);
        }
    }
    files
}

/// The modules of the crate's root that `code` names through `crate::` (comments aside).
fn used_modules(code: &str) -> Vec<String> {
    let mut used = Vec::new();
    for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
        for (i, _) in line.match_indices("crate::") {
            if line[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                continue; // `locked_run_crate::`, not ours
            }
            let rest = &line[i + "crate::".len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group
                    .split('}')
                    .next()
                    .unwrap()
                    .split(',')
                    .map(|part| part.trim().split("::").next().unwrap())
                    .collect(),
                None => vec![
                    rest.split(|c: char| !c.is_alphanumeric() && c != '_')
                        .next()
                        .unwrap(),
                ],
            };
            used.extend(
                names
                    .into_iter()
                    .filter(|n| !n.is_empty())
                    .map(str::to_owned),
            );
        }
    }
    used
}

#[test]
fn every_module_stands_on_one_layer_and_uses_only_lower_ones() {
    let layers = layers();
    let entries = src_entries();
    for entry in &entries {
        assert!(
            layers.contains_key(entry),
            "src/{entry} is on no layer of docs/architecture.md"
        );
    }
    for entry in layers.keys() {
        assert!(
            entries.contains(entry),
            "docs/architecture.md's layers name src/{entry}, which is not there"
        );
    }
    let layer_of: BTreeMap<&str, u32> = layers.iter().map(|(e, n)| (module(e), *n)).collect();
    let mut upward = Vec::new();
    for entry in &entries {
        let own = layer_of[module(entry)];
        let mut files = rust_files(&root().join("src").join(entry));
        if let Some(dir) = entry.strip_suffix(".rs") {
            // A file's tests beside it (`lease/tests.rs`).
            if root().join("src").join(dir).is_dir() {
                files.extend(rust_files(&root().join("src").join(dir)));
            }
        }
        for file in files {
            let code = std::fs::read_to_string(&file).unwrap();
            for used in used_modules(&code) {
                if used == module(entry) {
                    continue;
                }
                match layer_of.get(used.as_str()) {
                    Some(&n) if n > own => {}
                    Some(&n) => upward.push(format!(
                        "{} (layer {own}) uses crate::{used} (layer {n})",
                        file.strip_prefix(root()).unwrap().display()
                    )),
                    None => upward.push(format!(
                        "{} uses crate::{used}, on no layer",
                        file.strip_prefix(root()).unwrap().display()
                    )),
                }
            }
        }
    }
    assert!(upward.is_empty(), "{upward:#?}");
}

/// The code map's table: its rows, each as (what its first cell names, the whole row).
fn code_map() -> Vec<(Vec<String>, String)> {
    let doc = std::fs::read_to_string(root().join("CONTRIBUTING.md")).unwrap();
    let section = doc.split("## Code map").nth(1).expect("a Code map section");
    section
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| `"))
        .map(|row| {
            let first = row.split(" | ").next().unwrap();
            (ticked(first), row.to_owned())
        })
        .collect()
}

/// What a piece of Markdown puts in backticks.
fn ticked(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_code_map_names_every_folder_and_file_of_src_and_nothing_gone() {
    let rows = code_map();
    let mut wrong = Vec::new();
    let named: Vec<&String> = rows.iter().flat_map(|(first, _)| first).collect();
    for entry in src_entries() {
        let path = format!("src/{entry}");
        if !(named.contains(&&path)) {
            wrong.push(format!("CONTRIBUTING's code map has no row for {path}"));
        }
    }
    for (first, row) in &rows {
        for path in first.iter().filter(|p| p.starts_with("src/")) {
            if !(root().join(path).exists()) {
                wrong.push(format!("the code map names {path}, which is not there"));
            }
        }
        // A folder's row: every file it names is in it, and every file directly in it is named.
        let Some(dir) = first
            .iter()
            .find(|p| p.starts_with("src/") && p.ends_with('/'))
        else {
            continue;
        };
        let said = ticked(row);
        let in_dir = rust_files(&root().join(dir));
        let file_names = said
            .iter()
            .filter(|w| (w.ends_with(".rs") || w.ends_with('/')) && !w.contains("://"));
        for name in file_names {
            if *name == *dir {
                continue;
            }
            if name.starts_with("src/") {
                // Another folder's part, named whole.
                if !root().join(name).exists() {
                    wrong.push(format!("{dir}'s row names {name}, which is not there"));
                }
                continue;
            }
            let found = in_dir.iter().any(|f| {
                let rel = f
                    .strip_prefix(root().join(dir))
                    .unwrap()
                    .to_string_lossy()
                    .into_owned();
                rel == **name
                    || rel.starts_with(name.as_str())
                    || rel.ends_with(&format!("/{name}"))
            });
            if !found {
                wrong.push(format!("{dir}'s row names {name}, which is not in it"));
            }
        }
        for file in std::fs::read_dir(root().join(dir)).unwrap() {
            let file = file.unwrap();
            let name = file.file_name().into_string().unwrap();
            if name == "tests.rs" || name == "mod.rs" {
                continue; // the folder's own tests, and the folder itself
            }
            let name = match file.file_type().unwrap().is_dir() {
                true => format!("{name}/"),
                false => name,
            };
            if !(said.contains(&name) || said.contains(&format!("{dir}{name}"))) {
                wrong.push(format!("{dir}'s row in the code map does not name {name}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}
