//! Errors a user can act on: each names the side, the file when there is one, and what to do.

use std::fmt;
use std::io;

pub use tern_proto::Side;

/// How far an error reaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// One file failed; the rest of the transfer goes on.
    File,
    /// The session cannot continue (bad arguments, authentication, protocol).
    Fatal,
    /// The connection broke; the client reconnects and resumes.
    Network,
}

/// What went wrong, for code to decide on; `message` is for people and may be reworded freely.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorKind {
    #[default]
    Other,
    /// The destination's file system or quota is full: every later file would fail the same way.
    NoSpace,
    NotFound,
    PermissionDenied,
    /// Out of descriptors, memory or threads: a limit, not a fault of the file.
    ResourceLimit,
    /// Every chunk verified but the whole-file hash did not (a partial of an older version).
    WholeFileMismatch,
    /// The control channel ended or failed (ssh died, the peer closed, a network cut).
    ControlClosed,
}

impl ErrorKind {
    /// Stable name for `--json` (scripts decide on it; the message may change).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Other => "other",
            Self::NoSpace => "no_space",
            Self::NotFound => "not_found",
            Self::PermissionDenied => "permission_denied",
            Self::ResourceLimit => "resource_limit",
            Self::WholeFileMismatch => "whole_file_mismatch",
            Self::ControlClosed => "control_closed",
        }
    }

    pub fn of_io(err: &io::Error) -> Self {
        match err.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => Self::NoSpace,
            Some(libc::ENOENT) => Self::NotFound,
            Some(libc::EACCES) | Some(libc::EPERM) => Self::PermissionDenied,
            Some(libc::EMFILE) | Some(libc::ENFILE) | Some(libc::ENOMEM) | Some(libc::EAGAIN) => Self::ResourceLimit,
            _ => Self::Other,
        }
    }
}

#[derive(Debug, Clone)]
pub struct TransferError {
    pub side: Side,
    pub scope: Scope,
    pub kind: ErrorKind,
    /// The file concerned, as the user would type it (lossy for non-UTF-8 names).
    pub path: Option<String>,
    pub message: String,
    /// The remote endpoint the side is (`host:path`, `tern://host:port/path`), set by the client
    /// so an error from the far end names the host it happened on.
    pub at: Option<String>,
}

impl TransferError {
    pub fn new(side: Side, scope: Scope, path: Option<String>, message: impl Into<String>) -> Self {
        Self { side, scope, kind: ErrorKind::Other, path, message: message.into(), at: None }
    }
    pub fn with_kind(mut self, kind: ErrorKind) -> Self {
        self.kind = kind;
        self
    }
    pub fn fatal(side: Side, message: impl Into<String>) -> Self {
        Self::new(side, Scope::Fatal, None, message)
    }
    pub fn network(message: impl Into<String>) -> Self {
        Self::new(Side::Network, Scope::Network, None, message)
    }
    pub fn file(side: Side, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::new(side, Scope::File, Some(path.into()), message)
    }
    /// A file-level I/O error with a hint chosen from the error kind.
    pub fn io(side: Side, path: impl Into<String>, what: &str, err: &io::Error) -> Self {
        let path = path.into();
        Self::new(side, Scope::File, Some(path), format!("{what}: {}{}", err_text(err), hint(side, what, err))).with_kind(ErrorKind::of_io(err))
    }
}

/// The OS message without Rust's "(os error N)" suffix.
pub fn err_text(err: &io::Error) -> String {
    let s = err.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

fn hint(side: Side, what: &str, err: &io::Error) -> &'static str {
    let naming = what.starts_with("cannot create") || what.starts_with("cannot rename");
    match (side, err.raw_os_error()) {
        (_, Some(libc::ENOSPC)) | (_, Some(libc::EDQUOT)) => " (free space or raise the quota, then re-run the same command: verified data is kept and the transfer resumes)",
        (Side::Source, Some(libc::EACCES)) | (Side::Source, Some(libc::EPERM)) => " (check read permission on the source, then re-run)",
        (Side::Destination, Some(libc::EACCES)) | (Side::Destination, Some(libc::EPERM)) => " (check write permission on the destination directory, then re-run)",
        // Only a listed file is opened: one that is gone changed after the walk saw it.
        (Side::Source, Some(libc::ENOENT | libc::ENOTDIR)) if what == "cannot open" => {
            " (gone since the tree was listed: removed, moved, or a directory on its path replaced; re-run to copy the tree as it is now)"
        }
        (Side::Source, Some(libc::ENOENT)) => " (check the source path)",
        (Side::Destination, Some(libc::ENOTDIR)) => " (a file stands where a directory is needed at the destination; move it away)",
        (Side::Destination, Some(libc::EXDEV)) => " (the path leaves the destination root through a symlink; refused)",
        (Side::Destination, Some(libc::EINVAL | libc::EILSEQ | libc::ENAMETOOLONG)) if naming => {
            " (the destination file system refuses this name: rename it at the source or leave it out with --exclude; the rest is copied)"
        }
        _ => "",
    }
}

impl fmt::Display for TransferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.side.as_str())?;
        if let Some(at) = &self.at {
            write!(f, " ({at})")?;
        }
        match &self.path {
            Some(p) => write!(f, ": {}: {}", p, self.message),
            None => write!(f, ": {}", self.message),
        }
    }
}

impl std::error::Error for TransferError {}

pub type Result<T, E = TransferError> = std::result::Result<T, E>;

/// Lossy display of a raw path.
pub fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_name_says_so_only_where_a_name_is_made() {
        let einval = io::Error::from_raw_os_error(libc::EINVAL);
        let made = TransferError::io(Side::Destination, "a:b", "cannot create temporary file", &einval).to_string();
        assert!(made.starts_with("destination: a:b: cannot create temporary file: Invalid argument") && made.contains("refuses this name") && made.contains("--exclude"), "{made}");
        let other = TransferError::io(Side::Destination, "a", "cannot preallocate", &einval).to_string();
        assert!(!other.contains("refuses this name"), "{other}");
        let long = TransferError::io(Side::Destination, "n", "cannot rename into place", &io::Error::from_raw_os_error(libc::ENAMETOOLONG)).to_string();
        assert!(long.contains("refuses this name"), "{long}");
    }
}
