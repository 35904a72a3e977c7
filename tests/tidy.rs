//! The shape of the source, checked as tests (as rust-analyzer's `tidy`): no module circles, no file too long,
//! no agent named outside `src/agents/`, every file saying what it is for, every relative link of the docs
//! leading somewhere.
//!
//! Dependencies are read from the paths in the code (`crate::x::…`, `super::…`, `self::…`, one level of braces),
//! outside comments, strings and `#[cfg(test)]` modules: what `use` and inline paths name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file of `src/`: its module path and its code without tests, comments and strings.
struct Source {
    file: PathBuf,
    module: Vec<String>,
    code: String,
    lines: usize,
}

fn sources() -> Vec<Source> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    let mut stack = vec![root.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
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
        .map(|file| {
            let text = std::fs::read_to_string(&file).unwrap();
            let relative = file.strip_prefix(&root).unwrap().with_extension("");
            let mut module: Vec<String> = relative.iter().map(|part| part.to_string_lossy().into_owned()).collect();
            if matches!(module.last().map(String::as_str), Some("mod" | "lib" | "main")) {
                module.pop();
            }
            // A file that is a test module of its parent (`mod tests;`) is all tests.
            let is_tests = module.last().is_some_and(|name| name == "tests" || name.ends_with("_tests"));
            let body = if is_tests { "" } else { without_tests(&text) };
            Source { file, module, lines: body.lines().count(), code: strip(body) }
        })
        .collect()
}

/// The file up to its first `#[cfg(test)]` at the start of a line (test modules come last, by house style).
fn without_tests(text: &str) -> &str {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if line.trim_end() == "#[cfg(test)]" {
            return &text[..at];
        }
        at += line.len();
    }
    text
}

/// The code with comments and the contents of string and char literals blanked out.
fn strip(code: &str) -> String {
    let bytes = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                while i < bytes.len() && bytes[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if bytes.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i + 1 < bytes.len() && !(bytes[i] == b'*' && bytes[i + 1] == b'/') {
                    i += 1;
                }
                i += 2;
            }
            b'r' if matches!(bytes.get(i + 1), Some(b'#' | b'"')) && !ident_byte(bytes, i.wrapping_sub(1)) => {
                let hashes = bytes[i + 1..].iter().take_while(|b| **b == b'#').count();
                if bytes.get(i + 1 + hashes) != Some(&b'"') {
                    out.push('r');
                    i += 1;
                    continue;
                }
                let end: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                let start = i + 2 + hashes;
                i = code[start..].find(&end).map_or(bytes.len(), |at| start + at + end.len());
                out.push_str("\"\"");
            }
            b'"' => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("\"\"");
            }
            // A char literal (not a lifetime): `'x'`, `'\n'`, `'\''`.
            b'\'' if bytes.get(i + 2) == Some(&b'\'') || bytes.get(i + 1) == Some(&b'\\') => {
                i += 1;
                while i < bytes.len() && bytes[i] != b'\'' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
                out.push_str("' '");
            }
            _ => {
                let c = code[i..].chars().next().unwrap();
                out.push(c);
                i += c.len_utf8();
            }
        }
    }
    out
}

fn ident_byte(bytes: &[u8], at: usize) -> bool {
    bytes.get(at).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// Every module path the code names, absolute (`crate::a::b::…`), from `crate::`, `super::` and `self::` paths,
/// with one level of braces (`use super::{a, b::c}`).
fn named_paths(source: &Source) -> Vec<Vec<String>> {
    let code = &source.code;
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(at) = code[from..].find(start) {
            let at = from + at;
            from = at + start.len();
            if ident_byte(bytes, at.wrapping_sub(1)) || (at > 0 && bytes[at - 1] == b':') {
                continue;
            }
            let mut base: Vec<String> = match start {
                "crate::" => Vec::new(),
                "self::" => source.module.clone(),
                _ => {
                    let mut base = source.module.clone();
                    // `super` of a file module is its parent; `mod.rs` is the module itself.
                    base.pop();
                    base
                }
            };
            let mut rest = &code[at + start.len()..];
            while let Some(after) = rest.strip_prefix("super::") {
                base.pop();
                rest = after;
            }
            let segments = |text: &str| -> Vec<String> {
                text.split("::")
                    .map(|s| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>())
                    .take_while(|s| !s.is_empty())
                    .collect()
            };
            if let Some(list) = rest.strip_prefix('{') {
                let list = &list[..list.find('}').unwrap_or(list.len())];
                for item in list.split(',') {
                    let mut path = base.clone();
                    path.extend(segments(item.trim()));
                    found.push(path);
                }
            } else {
                let mut path = base;
                let taken: String =
                    rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
                path.extend(segments(&taken));
                found.push(path);
            }
        }
    }
    found
}

/// The submodules of `parent` (a module path), from the files.
fn children(sources: &[Source], parent: &[String]) -> BTreeSet<String> {
    sources
        .iter()
        .filter(|s| s.module.len() > parent.len() && s.module[..parent.len()] == *parent)
        .map(|s| s.module[parent.len()].clone())
        .collect()
}

/// The edges between the submodules of `parent`: which names which, and in which files.
fn edges(sources: &[Source], parent: &[String]) -> BTreeMap<(String, String), BTreeSet<String>> {
    let known = children(sources, parent);
    let mut edges: BTreeMap<(String, String), BTreeSet<String>> = BTreeMap::new();
    for source in sources.iter().filter(|s| s.module.len() > parent.len() && s.module[..parent.len()] == *parent) {
        let from = &source.module[parent.len()];
        for path in named_paths(source) {
            if path.len() <= parent.len() || path[..parent.len()] != *parent {
                continue;
            }
            let to = &path[parent.len()];
            if to != from && known.contains(to) {
                let file = source.file.to_string_lossy();
                let file = file[file.find("/src/").map_or(0, |at| at + 1)..].to_string();
                edges.entry((from.clone(), to.clone())).or_default().insert(file);
            }
        }
    }
    edges
}

/// The circles among the submodules of `parent`, each with the files that close it.
fn circles(sources: &[Source], parent: &[String]) -> Vec<String> {
    let edges = edges(sources, parent);
    let nodes = children(sources, parent);
    let reaches = |from: &str, to: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.to_string()];
        while let Some(node) = stack.pop() {
            if node == to {
                return true;
            }
            if seen.insert(node.clone()) {
                stack.extend(edges.keys().filter(|(a, _)| *a == node).map(|(_, b)| b.clone()));
            }
        }
        false
    };
    let mut found = Vec::new();
    for ((from, to), files) in &edges {
        if nodes.contains(from) && reaches(to, from) {
            found.push(format!("{from} -> {to} ({}) and back", files.iter().cloned().collect::<Vec<_>>().join(", ")));
        }
    }
    found
}

#[test]
fn no_circle_between_the_top_level_modules() {
    assert_eq!(circles(&sources(), &[]), Vec::<String>::new());
}

#[test]
fn no_circle_inside_the_session_the_turn_loop_or_the_agents() {
    let sources = sources();
    for parent in [&["session"][..], &["session", "turn"], &["agents"], &["agents", "opencode"]] {
        let parent: Vec<String> = parent.iter().map(|s| s.to_string()).collect();
        assert_eq!(circles(&sources, &parent), Vec::<String>::new(), "inside {}", parent.join("::"));
    }
}

#[test]
fn no_source_file_is_too_long() {
    let long: Vec<String> = sources()
        .iter()
        .filter(|s| s.lines > if s.module.first().is_some_and(|m| m == "session") { 600 } else { 1000 })
        .map(|s| format!("{} ({} lines without tests)", s.file.display(), s.lines))
        .collect();
    assert_eq!(long, Vec::<String>::new(), "src/ files stay under 1,000 lines, session/ under 600");
}

#[test]
fn no_agent_is_named_outside_its_folder() {
    let agents: Vec<String> =
        children(&sources(), &["agents".to_string()]).into_iter().filter(|name| is_agent_folder(name)).collect();
    assert!(
        ["amp", "opencode"].iter().all(|agent| agents.iter().any(|found| found == agent)),
        "the agents: {agents:?}"
    );
    let mut named = Vec::new();
    for source in sources().iter().filter(|s| s.module.first().is_none_or(|m| m != "agents")) {
        for path in named_paths(source) {
            if path.len() > 1 && path[0] == "agents" && agents.contains(&path[1]) {
                named.push(format!("{}: crate::{}", source.file.display(), path.join("::")));
            }
        }
    }
    assert_eq!(named, Vec::<String>::new());
}

/// Whether a folder of `src/agents/` is an agent's (it has its own `mod.rs` with an `AGENT`).
fn is_agent_folder(name: &str) -> bool {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agents").join(name).join("mod.rs");
    std::fs::read_to_string(file)
        .is_ok_and(|text| text.contains("pub static AGENT") || text.contains("pub const AGENT"))
}

#[test]
fn every_source_file_says_what_it_is_for() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let silent: Vec<String> = sources()
        .iter()
        .filter(|s| !std::fs::read_to_string(&s.file).unwrap().starts_with("//!"))
        .map(|s| s.file.strip_prefix(&root).unwrap().display().to_string())
        .collect();
    assert_eq!(silent, Vec::<String>::new());
}

#[test]
fn the_reader_sees_paths_as_the_compiler_does() {
    let source = Source {
        file: PathBuf::from("src/session/turn/drive.rs"),
        module: ["session", "turn", "drive"].map(String::from).to_vec(),
        code: strip(
            "use super::{Turn, emitter::Emitter};\nuse crate::agents::engine::Step; // crate::x::y\n\
             let s = \"crate::quoted::path\"; let c = '\"'; super::super::review::Review::of();\n",
        ),
        lines: 3,
    };
    let named: Vec<String> = named_paths(&source).iter().map(|p| p.join("::")).collect();
    assert_eq!(
        named,
        [
            "agents::engine::Step",
            "session::turn::Turn",
            "session::turn::emitter::Emitter",
            "session::review::Review::of"
        ]
    );
}

/// The docs a reader follows links through: every relative link of theirs must resolve.
fn doc_files() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> =
        ["README.md", "ARCHITECTURE.md", "CONTRIBUTING.md"].iter().map(|f| root.join(f)).collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

/// The lines of a Markdown text outside fenced code blocks, with inline code spans blanked (a `](` or a `#` in
/// code is no link and no heading).
fn prose(text: &str) -> Vec<String> {
    let mut fenced = false;
    let mut out = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            out.push(String::new());
            continue;
        }
        if fenced {
            out.push(String::new());
            continue;
        }
        let mut kept = String::new();
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                kept.push(c);
            }
        }
        out.push(kept);
    }
    out
}

/// The anchors GitHub gives a file's headings: the text lowercased, what is not a letter, digit, space, `-` or
/// `_` dropped, spaces made `-`; a repeated slug gets `-1`, `-2`, ….
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let Some(heading) = line.strip_prefix('#').filter(|_| !fenced) else { continue };
        let heading = heading.trim_start_matches('#');
        if !heading.starts_with(' ') {
            continue;
        }
        // A link in a heading shows its text only.
        let shown = heading.replace(['`', '*'], "");
        let shown = shown.split("](").enumerate().fold(String::new(), |acc, (i, part)| {
            if i == 0 { acc + part } else { acc + part.split_once(')').map_or(part, |(_, rest)| rest) }
        });
        let slug: String = shown
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let count = seen.entry(slug.clone()).or_insert(0);
        out.insert(if *count == 0 { slug.clone() } else { format!("{slug}-{count}") });
        *count += 1;
    }
    out
}

/// Every relative link of a Markdown file (`[text](target)`) that does not resolve: its file or folder is missing,
/// or its `#anchor` names no heading of the file it points into.
fn broken_links(file: &Path, text: &str) -> Vec<String> {
    let dir = file.parent().unwrap();
    let mut broken = Vec::new();
    for (number, line) in prose(text).iter().enumerate() {
        for (_, rest) in line.match_indices("](").map(|(at, _)| ((), &line[at + 2..])) {
            let Some((target, _)) = rest.split_once(')') else { continue };
            let target = target.split_whitespace().next().unwrap_or("");
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (path, anchor) = target.split_once('#').map_or((target, None), |(p, a)| (p, Some(a)));
            let linked = if path.is_empty() { file.to_path_buf() } else { dir.join(path) };
            let at = format!("{}:{}: {target}", file.display(), number + 1);
            if !linked.exists() {
                broken.push(format!("{at} (no such file)"));
                continue;
            }
            if let Some(anchor) = anchor {
                let linked_text = if path.is_empty() {
                    text.to_string()
                } else {
                    std::fs::read_to_string(&linked).unwrap_or_default()
                };
                if !anchors(&linked_text).contains(anchor) {
                    broken.push(format!("{at} (no such heading)"));
                }
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_of_the_docs_resolves() {
    let mut broken = Vec::new();
    for file in doc_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        broken.extend(broken_links(&file, &text));
    }
    assert!(broken.is_empty(), "links that lead nowhere:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_sees_a_missing_file_and_a_missing_heading() {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md");
    let text = "# Top\n## A `code` heading, too!\n\nSee [here](#a-code-heading-too), [there](#top), [src](src/lib.rs).\n\
                Broken: [gone](no/such.md) and [lost](#nowhere) and [far](ARCHITECTURE.md#no-such-heading).\n\
                ```sh\n# Not a heading\n[not a link](no/where)\n```\n`[code](no/where)`\n";
    let broken: Vec<String> =
        broken_links(&file, text).into_iter().map(|b| b.split_once(": ").unwrap().1.to_string()).collect();
    assert_eq!(
        broken,
        [
            "no/such.md (no such file)",
            "#nowhere (no such heading)",
            "ARCHITECTURE.md#no-such-heading (no such heading)"
        ]
    );
    assert!(!anchors(text).contains("not-a-heading"));
}
