//! The engine's folders and the imports allowed between them (ARCHITECTURE.md, "Dependency
//! rules"). Every `.rs` file under `src/` is read; every path that reaches another folder,
//! `crate::net::…` in a `use` or in code, `use crate::{store::…, …}`, or `super::super::…` that
//! climbs out of its folder, is checked against the rules below. A failure names the file, the
//! line and the rule.

use std::path::{Path, PathBuf};

/// The folders of `src/`. Everything else (`error.rs`, `limits.rs`, `progress.rs`,
/// `endpoint.rs`, `faults.rs`) is the cross-cutting crate root, which any folder may import.
const FOLDERS: [&str; 5] = ["store", "net", "driver", "client", "server"];

/// Why `from` may not import `to`, or `None` where it may.
fn rule(from: &str, to: &str) -> Option<&'static str> {
    match (from, to) {
        ("client", "server") | ("server", "client") => Some("client never imports server and server never imports client"),
        ("net", "store") | ("store", "net") => Some("net and store never import each other"),
        ("net" | "store", "driver" | "client" | "server") => Some("net and store import neither driver, client nor server"),
        ("driver", "client" | "server") => Some("driver imports neither client nor server"),
        _ => None,
    }
}

/// One path in `file` that leads to the top-level module `target`.
#[derive(Debug, PartialEq)]
struct Reach {
    line: usize,
    target: String,
}

/// The code of a Rust file with comments and the contents of string and character literals
/// blanked out (newlines kept, so lines still count).
fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        let ch = c[i];
        let next = c.get(i + 1).copied();
        if ch == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if ch == '/' && next == Some('*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if ch == '"' {
            // A raw string: `r`, then hashes, right before the quote.
            let hashes = out.chars().rev().take_while(|&h| h == '#').count();
            let before: Vec<char> = out.chars().rev().skip(hashes).take(2).collect();
            let raw = before.first() == Some(&'r') && before.get(1).is_none_or(|p| !(p.is_alphanumeric() || *p == '_') || *p == 'b');
            out.push('"');
            i += 1;
            while i < c.len() {
                if !raw && c[i] == '\\' {
                    out.push(' ');
                    out.push(blank(*c.get(i + 1).unwrap_or(&' ')));
                    i += 2;
                } else if c[i] == '"' && (!raw || c[i + 1..].iter().take(hashes).filter(|&&h| h == '#').count() == hashes) {
                    out.push('"');
                    i += 1;
                    break;
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if ch == '\'' && (next == Some('\\') || c.get(i + 2) == Some(&'\'')) {
            // A character literal (a lifetime has no closing quote).
            out.push('\'');
            i += 1;
            while i < c.len() && c[i] != '\'' {
                let skip = if c[i] == '\\' { 2 } else { 1 };
                (0..skip).for_each(|_| out.push(' '));
                i += skip;
            }
            out.push('\'');
            i += 1;
        } else {
            out.push(ch);
            i += 1;
        }
    }
    out
}

#[derive(Debug, PartialEq)]
enum Tok {
    Ident(String),
    Colons,
    Open,
    Close,
    Comma,
    Other,
}

fn tokens(code: &str) -> Vec<(Tok, usize)> {
    let c: Vec<char> = code.chars().collect();
    let (mut toks, mut line, mut i) = (Vec::new(), 1, 0);
    while i < c.len() {
        let ch = c[i];
        if ch == '\n' {
            line += 1;
            i += 1;
        } else if ch.is_whitespace() {
            i += 1;
        } else if ch.is_alphanumeric() || ch == '_' {
            let start = i;
            while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                i += 1;
            }
            toks.push((Tok::Ident(c[start..i].iter().collect()), line));
        } else if ch == ':' && c.get(i + 1) == Some(&':') {
            toks.push((Tok::Colons, line));
            i += 2;
        } else {
            toks.push((
                match ch {
                    '{' => Tok::Open,
                    '}' => Tok::Close,
                    ',' => Tok::Comma,
                    _ => Tok::Other,
                },
                line,
            ));
            i += 1;
        }
    }
    toks
}

/// The module path of a file under `src/` (`net/transport.rs` → `[net, transport]`,
/// `store/mod.rs` → `[store]`, `lib.rs` → `[]`).
fn module_path(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" {
        parts.push(stem.to_string());
    }
    parts
}

/// Every path in a file's code that reaches a top-level module of the crate: `crate::X`,
/// `crate::{X, Y}`, and `super::…` that climbs to the crate root (counting inline `mod`s).
fn reaches(module: &[String], src: &str) -> Vec<Reach> {
    let toks = tokens(&code_only(src));
    let ident = |k: usize| match toks.get(k) {
        Some((Tok::Ident(s), _)) => Some(s.as_str()),
        _ => None,
    };
    let is = |k: usize, t: Tok| toks.get(k).is_some_and(|(x, _)| *x == t);
    let mut found = Vec::new();
    // The names the path at `k` (just past `crate::`, or past enough `super::`) leads to.
    let targets = |k: usize, found: &mut Vec<Reach>| {
        if let Some(name) = ident(k) {
            found.push(Reach { line: toks[k].1, target: name.to_string() });
        } else if is(k, Tok::Open) {
            let (mut depth, mut j, mut first) = (0, k, true);
            while j < toks.len() {
                match &toks[j].0 {
                    Tok::Open => {
                        depth += 1;
                        first = depth == 1;
                    }
                    Tok::Close => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    Tok::Comma if depth == 1 => first = true,
                    Tok::Ident(s) if first && depth == 1 => {
                        found.push(Reach { line: toks[j].1, target: s.clone() });
                        first = false;
                    }
                    _ => first = false,
                }
                j += 1;
            }
        }
    };
    let (mut depth, mut inline): (usize, Vec<usize>) = (0, Vec::new());
    let mut k = 0;
    while k < toks.len() {
        match &toks[k].0 {
            Tok::Open => depth += 1,
            Tok::Close => {
                depth = depth.saturating_sub(1);
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
            }
            Tok::Ident(s) if s == "mod" && ident(k + 1).is_some() && is(k + 2, Tok::Open) => {
                inline.push(depth);
            }
            Tok::Ident(s) if s == "crate" && is(k + 1, Tok::Colons) && !(k > 0 && is(k - 1, Tok::Colons)) => targets(k + 2, &mut found),
            Tok::Ident(s) if s == "super" && !(k > 0 && is(k - 1, Tok::Colons)) => {
                let mut n = 0;
                while ident(k + 2 * n) == Some("super") && is(k + 2 * n + 1, Tok::Colons) {
                    n += 1;
                }
                if n > 0 && n >= module.len() + inline.len() {
                    targets(k + 2 * n, &mut found);
                }
                k += (2 * n).saturating_sub(1);
            }
            _ => {}
        }
        k += 1;
    }
    found
}

/// The broken rules in one file: `file:line: …` each.
fn violations(rel: &Path, src: &str) -> Vec<String> {
    let module = module_path(rel);
    let Some(from) = module.first().filter(|m| FOLDERS.contains(&m.as_str()) && rel.components().count() > 1) else {
        return Vec::new();
    };
    reaches(&module, src)
        .into_iter()
        .filter_map(|r| {
            let why = rule(from, &r.target)?;
            Some(format!("src/{}:{}: {from} reaches crate::{}: {why}", rel.display(), r.line, r.target))
        })
        .collect()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn folders_import_only_what_the_rules_allow() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut dirs: Vec<String> = std::fs::read_dir(&src).unwrap().map(|e| e.unwrap().path()).filter(|p| p.is_dir()).map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    dirs.sort();
    let mut known = FOLDERS.map(String::from).to_vec();
    known.sort();
    assert_eq!(dirs, known, "src/ has a folder the rules do not know (or lost one): give it rules here and in ARCHITECTURE.md");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let (mut broken, mut checked) = (Vec::new(), 0);
    for f in &files {
        let rel = f.strip_prefix(&src).unwrap();
        let text = std::fs::read_to_string(f).unwrap();
        checked += reaches(&module_path(rel), &text).len();
        broken.extend(violations(rel, &text));
    }
    assert!(files.len() > 20 && checked > 100, "read {} files and {checked} paths: is src/ where this test looks?", files.len());
    assert!(broken.is_empty(), "imports that break the engine's dependency rules (ARCHITECTURE.md):\n{}", broken.join("\n"));
}

/// The checker itself catches each form of a bad import, and only those.
#[test]
fn the_checker_sees_every_form_of_import() {
    let src = r#"//! crate::server in a doc comment is no import
use std::io;
use crate::error::TransferError;
use crate::store::fsops::Beneath;
use crate::{
    progress::Progress,
    client::session::ClientSpec,
};
fn f() {
    let s = "crate::server::x and a lifetime-looking 'a' char";
    let _ = crate::driver::sender::REPLACEMENT_INDEX; /* crate::client */
    let _ = super::super::server::session::run();
}
mod tests {
    use super::*;
    use super::super::super::client::hook;
}
"#;
    let got = violations(Path::new("net/thing.rs"), src);
    let lines: Vec<&str> = got.iter().map(|v| v.split(": ").next().unwrap()).collect();
    assert_eq!(lines, ["src/net/thing.rs:4", "src/net/thing.rs:7", "src/net/thing.rs:11", "src/net/thing.rs:12", "src/net/thing.rs:16"], "{got:#?}");
    assert!(got[0].contains("net reaches crate::store: net and store never import each other"), "{got:#?}");
    assert!(violations(Path::new("client/x.rs"), "use crate::driver::sender::Sending;\nuse super::session;\n").is_empty());
    assert_eq!(violations(Path::new("server/mod.rs"), "fn f() { super::client::run() }\n").len(), 1, "mod.rs sits one level higher");
    assert!(violations(Path::new("endpoint.rs"), "use crate::server::x;\n").is_empty(), "the crate root is not a folder");
}
