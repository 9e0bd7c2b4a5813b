//! The documentation the packages ship, as it reads once installed: README.md, CHANGELOG.md
//! and the user's documents of docs/, copied into `DIR/doc` (the packages put it in
//! `/usr/share/doc/locked-run/`, in the same tree, so links between them stay as written).
//! A link to an example unit is pointed at `examples/systemd/`, where the packages put the
//! units; a link to a file that is not shipped (CONTRIBUTING.md, bench/RESULTS.md) becomes
//! text that names it, so no link in an installed document leads nowhere.

use std::path::{Component, Path, PathBuf};

/// The shipped documents, as paths in the source tree and under `/usr/share/doc/locked-run/`.
pub const SHIPPED: [&str; 6] = [
    "README.md",
    "CHANGELOG.md",
    "docs/guide.md",
    "docs/how-it-works.md",
    "docs/faq.md",
    "docs/upgrading.md",
];

/// Where the source's `systemd/` example units are in the packages.
const UNITS: &str = "examples/systemd";

/// Copies the shipped documents from the source tree at `root` into `out`, links rewritten.
pub fn write(root: &Path, out: &Path) -> std::io::Result<()> {
    for file in SHIPPED {
        let text = std::fs::read_to_string(root.join(file))?;
        let dest = out.join(file);
        std::fs::create_dir_all(dest.parent().expect("a file in a directory"))?;
        std::fs::write(dest, installed(file, &text))?;
    }
    Ok(())
}

/// `text`, the document at `file` (a path in the source tree), with its relative links made
/// to fit the installed tree. Fenced code blocks are left as they are.
fn installed(file: &str, text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut prose = String::new();
    let mut in_code = false;
    for line in text.split_inclusive('\n') {
        if line.trim_start().starts_with("```") {
            if !in_code {
                out.push_str(&links_rewritten(file, &std::mem::take(&mut prose)));
            }
            in_code = !in_code;
            out.push_str(line);
        } else if in_code {
            out.push_str(line);
        } else {
            prose.push_str(line);
        }
    }
    out.push_str(&links_rewritten(file, &prose));
    out
}

/// Every inline link `[text](target)` of `prose`, its target made to fit the installed tree.
fn links_rewritten(file: &str, prose: &str) -> String {
    let mut out = String::with_capacity(prose.len());
    let mut rest = prose;
    while let Some(at) = rest.find("](") {
        let Some(open) = opening_bracket(&rest[..at]) else {
            out.push_str(&rest[..at + 2]);
            rest = &rest[at + 2..];
            continue;
        };
        let Some(close) = rest[at + 2..].find(')') else {
            break;
        };
        let text = &rest[open + 1..at];
        let target = &rest[at + 2..at + 2 + close];
        out.push_str(&rest[..open]);
        out.push_str(&link(file, text, target));
        rest = &rest[at + 2 + close + 1..];
    }
    out.push_str(rest);
    out
}

/// Where the `[` that the `]` ending `before` closes is, brackets nested inside counted.
fn opening_bracket(before: &str) -> Option<usize> {
    let mut depth = 0;
    for (i, c) in before.char_indices().rev() {
        match c {
            ']' => depth += 1,
            '[' if depth == 0 => return Some(i),
            '[' => depth -= 1,
            _ => {}
        }
    }
    None
}

/// One link as the installed document has it.
fn link(file: &str, text: &str, target: &str) -> String {
    let kept = format!("[{text}]({target})");
    if target.contains("://") || target.starts_with('#') || target.starts_with("mailto:") {
        return kept;
    }
    let (path, anchor) = target.split_once('#').map_or((target, ""), |(p, a)| (p, a));
    let from = Path::new(file).parent().unwrap_or(Path::new(""));
    let Some(in_source) = normalized(&from.join(path)) else {
        return kept;
    };
    let in_source = in_source.to_string_lossy().into_owned();
    if SHIPPED.contains(&in_source.as_str()) {
        return kept;
    }
    if let Some(unit) = in_source
        .strip_prefix("systemd")
        .filter(|u| u.is_empty() || u.starts_with('/'))
    {
        let up = "../".repeat(from.components().count());
        let hash = if anchor.is_empty() { "" } else { "#" };
        return format!("[{text}]({up}{UNITS}{unit}{hash}{anchor})");
    }
    if text.trim_matches('`') == in_source {
        format!("{text} in the source")
    } else {
        format!("{text} ({in_source} in the source)")
    }
}

/// `path` without `.` and `..`, or None if it leaves the tree. A trailing `/` is kept.
fn normalized(path: &Path) -> Option<PathBuf> {
    let mut parts: Vec<&std::ffi::OsStr> = Vec::new();
    for part in path.components() {
        match part {
            Component::Normal(p) => parts.push(p),
            Component::ParentDir => {
                parts.pop()?;
            }
            Component::CurDir => {}
            _ => return None,
        }
    }
    let mut out: PathBuf = parts.iter().collect();
    if path.to_string_lossy().ends_with('/') {
        out.as_mut_os_string().push("/");
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_fit_the_installed_tree() {
        let readme = "See [the guide](docs/guide.md#options), [`systemd/a.service`](systemd/a.service),\n\
                      [CONTRIBUTING.md](CONTRIBUTING.md) and [the\nbenchmark](bench/RESULTS.md).\n\
                      ```sh\n[x](CONTRIBUTING.md)\n```\n[web](https://example.org/x)\n";
        assert_eq!(
            installed("README.md", readme),
            "See [the guide](docs/guide.md#options), [`systemd/a.service`](examples/systemd/a.service),\n\
             CONTRIBUTING.md in the source and the\nbenchmark (bench/RESULTS.md in the source).\n\
             ```sh\n[x](CONTRIBUTING.md)\n```\n[web](https://example.org/x)\n"
        );
        let guide = "[units](../systemd/), [faq](faq.md), [readme](../README.md#install)";
        assert_eq!(
            installed("docs/guide.md", guide),
            "[units](../examples/systemd/), [faq](faq.md), [readme](../README.md#install)"
        );
    }

    /// Every relative link of every shipped document, as written into `DIR/doc`, leads to a
    /// shipped document or an example unit.
    #[test]
    fn no_installed_link_leads_nowhere() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let out = tempfile::tempdir().unwrap();
        write(root, out.path()).unwrap();
        let mut broken = Vec::new();
        for file in SHIPPED {
            let text = std::fs::read_to_string(out.path().join(file)).unwrap();
            let from = Path::new(file).parent().unwrap();
            for target in relative_links(&text) {
                let path = target.split('#').next().unwrap();
                let resolved = normalized(&from.join(path)).unwrap();
                let resolved = resolved.to_string_lossy();
                let shipped = SHIPPED.contains(&resolved.as_ref());
                let unit = resolved
                    .strip_prefix(UNITS)
                    .is_some_and(|u| root.join(format!("systemd{u}")).exists());
                if !(shipped || unit) {
                    broken.push(format!("{file}: {target}"));
                }
            }
        }
        assert!(
            broken.is_empty(),
            "links that lead nowhere once installed: {broken:?}"
        );
    }

    /// The targets of the inline links outside code blocks that are not URLs or anchors.
    fn relative_links(text: &str) -> Vec<String> {
        let mut targets = Vec::new();
        let mut in_code = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
                continue;
            }
            if in_code {
                continue;
            }
            for (at, _) in line.match_indices("](") {
                let rest = &line[at + 2..];
                let target = &rest[..rest.find(')').unwrap_or(rest.len())];
                if !target.contains("://") && !target.starts_with('#') {
                    targets.push(target.to_owned());
                }
            }
        }
        targets
    }
}
