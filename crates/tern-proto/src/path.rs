//! Relative paths as they travel on the wire, and the checks that keep a peer inside its root.
//!
//! Paths are raw bytes (file names need not be UTF-8) separated by `/`. A valid wire path is
//! relative, has no empty, `.` or `..` component and no NUL byte. The empty path names the
//! transfer root itself (a single-file transfer).

use crate::{ProtoError, limits};

/// Checks a relative path received from a peer.
pub fn validate_relative(path: &[u8]) -> Result<(), ProtoError> {
    let invalid = |why| Err(ProtoError::Invalid { what: "path", why });
    if path.len() > limits::MAX_PATH {
        return Err(ProtoError::TooLong { what: "path", len: path.len(), max: limits::MAX_PATH });
    }
    if path.is_empty() {
        return Ok(());
    }
    if path[0] == b'/' {
        return invalid("absolute path");
    }
    if path.contains(&0) {
        return invalid("NUL byte in path");
    }
    for component in path.split(|&b| b == b'/') {
        match component {
            b"" => return invalid("empty path component"),
            b"." => return invalid("'.' path component"),
            b".." => return invalid("'..' path component"),
            _ => {}
        }
    }
    Ok(())
}

/// Whether a symlink at `link_path` (a valid relative path) with `target` stays inside the tree
/// when resolved lexically. Absolute targets and `..` climbing above the root escape.
pub fn symlink_stays_inside(link_path: &[u8], target: &[u8]) -> bool {
    if target.is_empty() || target[0] == b'/' || target.contains(&0) {
        return false;
    }
    let parent_depth = link_path.split(|&b| b == b'/').filter(|c| !c.is_empty()).count();
    // The link itself sits in its parent directory: depth of that directory below the root.
    let mut depth = parent_depth as i64 - 1;
    if depth < 0 {
        // A symlink as the transfer root: its target is relative to the destination's parent.
        return false;
    }
    for component in target.split(|&b| b == b'/') {
        match component {
            b"" | b"." => {}
            b".." => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => depth += 1,
        }
    }
    true
}

/// The last component of a relative path (the whole path if it has no `/`).
pub fn file_name(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[i + 1..],
        None => path,
    }
}

/// Everything before the last `/`, or empty.
pub fn parent(path: &[u8]) -> &[u8] {
    match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[..i],
        None => b"",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_paths() {
        for p in [&b""[..], b"a", b"a/b/c", b"with space/\xff\xfe", b"..a/b..", b".hidden"] {
            validate_relative(p).unwrap();
        }
    }

    #[test]
    fn refuses_escapes() {
        for p in [&b"/etc/passwd"[..], b"..", b"a/../../b", b"a//b", b"a/./b", b"a/", b"a\0b"] {
            assert!(validate_relative(p).is_err(), "{:?}", String::from_utf8_lossy(p));
        }
        assert!(validate_relative(&vec![b'a'; limits::MAX_PATH + 1]).is_err());
    }

    #[test]
    fn symlink_escape_rules() {
        assert!(symlink_stays_inside(b"a/link", b"target"));
        assert!(symlink_stays_inside(b"a/link", b"../b/target"));
        assert!(symlink_stays_inside(b"a/b/link", b"../../c"));
        assert!(!symlink_stays_inside(b"a/link", b"../../etc"));
        assert!(!symlink_stays_inside(b"link", b"../x"));
        assert!(!symlink_stays_inside(b"a/link", b"/etc/passwd"));
        assert!(!symlink_stays_inside(b"a/link", b""));
        assert!(symlink_stays_inside(b"a/link", b"./x/../y"));
        assert!(!symlink_stays_inside(b"a/link", b"x/../../../y"));
    }

    #[test]
    fn name_and_parent() {
        assert_eq!(file_name(b"a/b/c"), b"c");
        assert_eq!(parent(b"a/b/c"), b"a/b");
        assert_eq!(file_name(b"c"), b"c");
        assert_eq!(parent(b"c"), b"");
    }
}
