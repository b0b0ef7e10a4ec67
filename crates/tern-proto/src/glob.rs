//! Remote globs (`tern cp 'host:/dir/*.h5' .`): one pattern per path component, matched the way
//! scp's remote shell and rsync match them. `*`, `?` and `[...]` stay within the component; a
//! name starting with `.` is matched only by a pattern that starts with `.` (so `*` leaves
//! hidden files out, as a shell does). The matching itself is `globset`'s, on raw bytes.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{GlobBuilder, GlobMatcher};

/// Whether `s` holds a glob metacharacter (then a remote source is expanded on the far side).
pub fn has_meta(s: &[u8]) -> bool {
    s.iter().any(|b| matches!(b, b'*' | b'?' | b'['))
}

/// A compiled pattern for one path component.
#[derive(Debug, Clone)]
pub struct ComponentGlob {
    matcher: GlobMatcher,
    dot: bool,
}

impl ComponentGlob {
    /// `pattern` is one component (no `/`). An unbalanced `[` is an error naming it.
    pub fn new(pattern: &[u8]) -> Result<Self, String> {
        let text = std::str::from_utf8(pattern).map_err(|_| format!("{}: a glob pattern must be UTF-8", String::from_utf8_lossy(pattern)))?;
        let glob = GlobBuilder::new(text).literal_separator(true).backslash_escape(true).build().map_err(|e| format!("{text}: not a valid glob pattern: {}", e.kind()))?;
        Ok(Self { matcher: glob.compile_matcher(), dot: pattern.starts_with(b".") })
    }

    pub fn matches(&self, name: &[u8]) -> bool {
        if name == b"." || name == b".." || name.contains(&b'/') {
            return false;
        }
        if name.starts_with(b".") && !self.dot {
            return false;
        }
        self.matcher.is_match(Path::new(OsStr::from_bytes(name)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, name: &str) -> bool {
        ComponentGlob::new(p.as_bytes()).unwrap().matches(name.as_bytes())
    }

    #[test]
    fn matches_like_a_shell() {
        assert!(m("*.h5", "a.h5") && m("*.h5", "run.1.h5") && !m("*.h5", "a.h5.tmp"));
        assert!(m("run_??", "run_01") && !m("run_??", "run_1") && !m("run_??", "run_001"));
        assert!(m("[ab]*", "alpha") && m("[ab]*", "b") && !m("[ab]*", "c"));
        assert!(m("[!ab]*", "c") && !m("[!ab]*", "a"));
        assert!(m("x[0-9]", "x7") && !m("x[0-9]", "xa"));
        assert!(m("*", "\u{e9}t\u{e9}"));
    }

    #[test]
    fn hidden_names_need_a_leading_dot() {
        assert!(!m("*", ".hidden") && !m("*.h5", ".a.h5") && !m("?a", ".a"));
        assert!(m(".*", ".hidden") && m(".h*", ".hidden"));
        assert!(!m(".*", ".") && !m(".*", ".."), "never the directory itself or its parent");
    }

    #[test]
    fn stays_within_a_component_and_takes_raw_names() {
        assert!(!m("*", "a/b"));
        let g = ComponentGlob::new(b"*.h5").unwrap();
        assert!(g.matches(b"\xff\xfe.h5"), "names that are not UTF-8 still match");
        assert!(ComponentGlob::new(b"[a").is_err());
        assert!(has_meta(b"/d/*.h5") && has_meta(b"run_??") && has_meta(b"x[12]") && !has_meta(b"/plain/path.h5"));
    }
}
