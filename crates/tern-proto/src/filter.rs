//! Include/exclude rules (`--exclude`, `--include`, `--filter`), with rsync's matching rules so
//! that a user's existing patterns mean the same thing here. Both ends apply them: the sender
//! while it walks the source, the receiver when `--delete` looks for extras (an excluded file at
//! the destination is protected, as in rsync). See `docs/protocol.md`, "Filters".
//!
//! Matching, for a path relative to the transfer root (`dir/sub/name`):
//! * rules are tried in order and the first that matches decides; no match means included;
//! * `*` matches within one path component, `**` across components, `?` one character,
//!   `[...]` a class; `\` escapes;
//! * a trailing `/` matches directories only;
//! * a leading `/` anchors the pattern at the transfer root;
//! * otherwise a pattern with a `/` (or `**`) matches the end of the path at a component
//!   boundary, and a pattern without one matches the last component;
//! * an excluded directory is not descended into.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{Glob, GlobBuilder, GlobMatcher};

/// Most rules one transfer may carry (bounds the `Filters` message).
pub const MAX_FILTER_RULES: usize = 1024;
/// Longest pattern.
pub const MAX_PATTERN: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    Include,
    Exclude,
}

/// One rule as the user gave it and as it travels on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterRule {
    pub kind: RuleKind,
    pub pattern: String,
}

impl FilterRule {
    pub fn exclude(pattern: &str) -> Self {
        FilterRule { kind: RuleKind::Exclude, pattern: pattern.to_string() }
    }
    pub fn include(pattern: &str) -> Self {
        FilterRule { kind: RuleKind::Include, pattern: pattern.to_string() }
    }

    /// rsync's short rule syntax: `- PATTERN` excludes, `+ PATTERN` includes.
    pub fn parse(rule: &str) -> Result<Self, String> {
        match rule.split_once(' ') {
            Some(("-", p)) | Some(("exclude", p)) => Ok(FilterRule::exclude(p)),
            Some(("+", p)) | Some(("include", p)) => Ok(FilterRule::include(p)),
            _ => Err(format!("filter rule '{rule}': write '- PATTERN' to exclude or '+ PATTERN' to include")),
        }
    }
}

impl std::fmt::Display for FilterRule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sign = if self.kind == RuleKind::Include { '+' } else { '-' };
        write!(f, "{sign} {}", self.pattern)
    }
}

#[derive(Debug, Clone)]
struct Compiled {
    kind: RuleKind,
    matcher: GlobMatcher,
    dir_only: bool,
    anchored: bool,
    /// Matched against the whole path as `**/PATTERN` (the path ends with a match, starting at
    /// a component boundary) instead of against the last component.
    whole_path: bool,
}

/// Compiled rules; the default filter includes everything.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    rules: Vec<Compiled>,
}

impl Filter {
    /// Compiles rules; the error is one line naming the bad rule.
    pub fn new(rules: &[FilterRule]) -> Result<Self, String> {
        if rules.len() > MAX_FILTER_RULES {
            return Err(format!("{} filter rules given; at most {MAX_FILTER_RULES} are allowed", rules.len()));
        }
        rules.iter().map(compile).collect::<Result<Vec<_>, _>>().map(|rules| Filter { rules })
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// True if the entry at `rel` (relative to the transfer root) is filtered out.
    pub fn excludes(&self, rel: &[u8], is_dir: bool) -> bool {
        if self.rules.is_empty() || rel.is_empty() {
            return false;
        }
        let last = rel.rsplit(|&b| b == b'/').next().unwrap_or(rel);
        for r in &self.rules {
            if r.dir_only && !is_dir {
                continue;
            }
            let hit = if r.anchored {
                is_match(&r.matcher, rel)
            } else if r.whole_path {
                // One match of `**/PATTERN`, linear in the path: trying each suffix took time
                // quadratic in its components (seconds for a deep path and a few rules).
                is_match(&r.matcher, rel)
            } else {
                is_match(&r.matcher, last)
            };
            if hit {
                return r.kind == RuleKind::Exclude;
            }
        }
        false
    }
}

fn compile(rule: &FilterRule) -> Result<Compiled, String> {
    let bad = |why: &str| format!("filter pattern '{}': {why}", rule.pattern);
    if rule.pattern.len() > MAX_PATTERN {
        return Err(bad(&format!("longer than {MAX_PATTERN} bytes")));
    }
    let mut p = rule.pattern.as_str();
    let dir_only = p.ends_with('/');
    p = p.trim_end_matches('/');
    let anchored = p.starts_with('/');
    p = p.trim_start_matches('/');
    if p.is_empty() {
        return Err(bad("matches nothing; give a name or a glob"));
    }
    let build = |p: &str| -> Result<Glob, String> { GlobBuilder::new(p).literal_separator(true).backslash_escape(true).build().map_err(|e| bad(&e.kind().to_string())) };
    let glob = build(p)?;
    let whole_path = !anchored && (p.contains('/') || p.contains("**"));
    let matcher = if whole_path { build(&format!("**/{p}"))?.compile_matcher() } else { glob.compile_matcher() };
    Ok(Compiled { kind: rule.kind, matcher, dir_only, anchored, whole_path })
}

fn is_match(m: &GlobMatcher, path: &[u8]) -> bool {
    m.is_match(Path::new(OsStr::from_bytes(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(rules: &[&str]) -> Filter {
        Filter::new(&rules.iter().map(|r| FilterRule::parse(r).unwrap()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn no_rules_include_everything() {
        assert!(!Filter::default().excludes(b"a/b", false));
    }

    #[test]
    fn name_patterns_match_the_last_component_at_any_depth() {
        let x = f(&["- *.tmp"]);
        assert!(x.excludes(b"a.tmp", false));
        assert!(x.excludes(b"d/e/a.tmp", false));
        assert!(!x.excludes(b"a.tmp.keep", false));
        assert!(!x.excludes(b"a.tmp/keep", false), "only the last component is matched");
    }

    #[test]
    fn star_stays_within_a_component_and_double_star_crosses() {
        let x = f(&["- /run*/out"]);
        assert!(x.excludes(b"run1/out", true));
        assert!(!x.excludes(b"run1/x/out", true));
        let y = f(&["- /run*/**/out"]);
        assert!(y.excludes(b"run1/x/y/out", true));
    }

    #[test]
    fn leading_slash_anchors_at_the_root() {
        let x = f(&["- /logs"]);
        assert!(x.excludes(b"logs", true));
        assert!(!x.excludes(b"a/logs", true));
        let y = f(&["- logs"]);
        assert!(y.excludes(b"a/logs", true));
    }

    #[test]
    fn inner_slash_matches_the_end_of_the_path() {
        let x = f(&["- cache/tmp"]);
        assert!(x.excludes(b"cache/tmp", true));
        assert!(x.excludes(b"a/cache/tmp", true));
        assert!(!x.excludes(b"acache/tmp", true), "suffixes start at a component boundary");
    }

    #[test]
    fn trailing_slash_matches_directories_only() {
        let x = f(&["- scratch/"]);
        assert!(x.excludes(b"a/scratch", true));
        assert!(!x.excludes(b"a/scratch", false));
    }

    #[test]
    fn first_match_wins_so_includes_can_carve_out_of_excludes() {
        // The rsync idiom: every directory, the HDF5 files, nothing else.
        let x = f(&["+ */", "+ *.h5", "- *"]);
        assert!(!x.excludes(b"run/a.h5", false));
        assert!(!x.excludes(b"run", true));
        assert!(x.excludes(b"run/a.log", false));
    }

    #[test]
    fn non_utf8_names_are_matched_on_their_bytes() {
        let x = f(&["- *.tmp"]);
        assert!(x.excludes(b"d/\xff\xfe.tmp", false));
        assert!(!x.excludes(b"d/\xff\xfe.dat", false));
    }

    /// The rule as the docs state it: some suffix of the path starting at a component boundary
    /// (`a/b/c`, `b/c`, `c`) matches the pattern.
    fn suffix_rule_matches(pattern: &str, rel: &[u8]) -> bool {
        let m = GlobBuilder::new(pattern).literal_separator(true).backslash_escape(true).build().unwrap().compile_matcher();
        std::iter::once(rel).chain(rel.iter().enumerate().filter(|&(_, &b)| b == b'/').map(|(i, _)| &rel[i + 1..])).any(|s| is_match(&m, s))
    }

    #[test]
    fn path_patterns_match_suffixes_at_component_boundaries() {
        for (pattern, rel) in [
            ("cache/tmp", &b"a/cache/tmp"[..]),
            ("cache/tmp", b"acache/tmp"),
            ("**/x", b"x"),
            ("a/**/b", b"z/a/q/r/b"),
            ("a/*", b"a/b/a/c"),
            ("\\*/x", b"y/*/x"),
            ("{a,b}/c", b"q/b/c"),
            ("a**", b"a/ab"),
        ] {
            let x = Filter::new(&[FilterRule::exclude(pattern)]).unwrap();
            assert_eq!(x.excludes(rel, false), suffix_rule_matches(pattern, rel), "{pattern} {:?}", String::from_utf8_lossy(rel));
        }
    }

    /// Regression (found by the `filter_rules` fuzz target's input bounds): a path of 2048
    /// components against rules with a `/` tried every suffix, quadratic in the components:
    /// 16 such rules took seconds on one path.
    #[test]
    fn deep_paths_are_matched_in_linear_time() {
        let rules: Vec<_> = (0..16).map(|_| FilterRule::exclude("**/a*a*a*/b")).collect();
        let x = Filter::new(&rules).unwrap();
        let deep = [&b"a/".repeat(2047)[..], b"c"].concat();
        for _ in 0..16 {
            assert!(!x.excludes(&deep, false));
        }
        assert!(x.excludes(b"q/aaa/b", false));
    }

    #[test]
    fn bad_rules_are_refused_with_the_rule_named() {
        assert!(FilterRule::parse("*.tmp").unwrap_err().contains("'*.tmp'"));
        let e = Filter::new(&[FilterRule::exclude("a[")]).unwrap_err();
        assert!(e.contains("'a['"), "{e}");
        assert!(Filter::new(&[FilterRule::exclude("/")]).unwrap_err().contains("matches nothing"));
        let many = vec![FilterRule::exclude("x"); MAX_FILTER_RULES + 1];
        assert!(Filter::new(&many).is_err());
    }
}
