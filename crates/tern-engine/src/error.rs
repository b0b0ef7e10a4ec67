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

#[derive(Debug, Clone)]
pub struct TransferError {
    pub side: Side,
    pub scope: Scope,
    /// The file concerned, as the user would type it (lossy for non-UTF-8 names).
    pub path: Option<String>,
    pub message: String,
}

impl TransferError {
    pub fn new(side: Side, scope: Scope, path: Option<String>, message: impl Into<String>) -> Self {
        Self { side, scope, path, message: message.into() }
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
        Self::new(side, Scope::File, Some(path), format!("{what}: {}{}", err_text(err), hint(side, err)))
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

fn hint(side: Side, err: &io::Error) -> &'static str {
    match (side, err.raw_os_error()) {
        (_, Some(libc::ENOSPC)) | (_, Some(libc::EDQUOT)) => " (free space or raise the quota, then re-run the same command: verified data is kept and the transfer resumes)",
        (Side::Source, Some(libc::EACCES)) | (Side::Source, Some(libc::EPERM)) => " (check read permission on the source, then re-run)",
        (Side::Destination, Some(libc::EACCES)) | (Side::Destination, Some(libc::EPERM)) => " (check write permission on the destination directory, then re-run)",
        (Side::Source, Some(libc::ENOENT)) => " (check the source path)",
        (Side::Destination, Some(libc::ENOTDIR)) => " (a file stands where a directory is needed at the destination; move it away)",
        (Side::Destination, Some(libc::EXDEV)) => " (the path leaves the destination root through a symlink; refused)",
        _ => "",
    }
}

impl fmt::Display for TransferError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.path {
            Some(p) => write!(f, "{}: {}: {}", self.side.as_str(), p, self.message),
            None => write!(f, "{}: {}", self.side.as_str(), self.message),
        }
    }
}

impl std::error::Error for TransferError {}

pub type Result<T, E = TransferError> = std::result::Result<T, E>;

/// Lossy display of a raw path.
pub fn show(path: &[u8]) -> String {
    String::from_utf8_lossy(path).into_owned()
}
