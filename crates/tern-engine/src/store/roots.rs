//! Where a server may read and write, and how a client's wire path resolves there. Shared by
//! the serving side and by the file-system requests a client answers itself for a local path.

use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::error::{Side, TransferError};

/// Where a server may read and write.
#[derive(Clone, Debug)]
pub enum Roots {
    /// ssh mode: the user's own account; relative paths start at `$HOME`, like scp.
    Home(PathBuf),
    /// daemon mode: only under these roots. One root appears as `/`; several as `/NAME`.
    Confined(Vec<(String, PathBuf)>),
}

impl Roots {
    /// Resolves a client's path. Refuses `..` and anything that leaves the roots through a
    /// symlink (checked on the deepest part that exists).
    pub fn resolve(&self, wire: &[u8]) -> Result<PathBuf, TransferError> {
        let s = std::ffi::OsStr::from_bytes(wire);
        match self {
            Roots::Home(home) => {
                let p = Path::new(s);
                if let Ok(rest) = p.strip_prefix("~") {
                    return Ok(home.join(rest));
                }
                Ok(if p.is_absolute() { p.to_path_buf() } else { home.join(p) })
            }
            Roots::Confined(roots) => {
                let mut parts = Vec::new();
                for c in Path::new(s).components() {
                    match c {
                        Component::Normal(n) => parts.push(n.to_os_string()),
                        Component::RootDir | Component::CurDir => {}
                        Component::ParentDir | Component::Prefix(_) => {
                            return Err(refuse(wire, "'..' is not allowed in daemon paths"));
                        }
                    }
                }
                let (root, rest) = if roots.len() == 1 {
                    (&roots[0].1, &parts[..])
                } else {
                    let Some(first) = parts.first() else {
                        let names: Vec<_> = roots.iter().map(|r| format!("/{}", r.0)).collect();
                        return Err(refuse(wire, &format!("this daemon serves several roots; name one of {}", names.join(", "))));
                    };
                    match roots.iter().find(|r| r.0.as_bytes() == first.as_bytes()) {
                        Some(r) => (&r.1, &parts[1..]),
                        None => return Err(refuse(wire, "no such root on this daemon")),
                    }
                };
                let mut path = root.clone();
                path.extend(rest);
                let canon_root = root.canonicalize().map_err(|e| TransferError::io(Side::Destination, root.display().to_string(), "daemon root unavailable", &e).into_fatal())?;
                let mut probe = path.clone();
                loop {
                    if let Ok(c) = probe.canonicalize() {
                        if !c.starts_with(&canon_root) {
                            return Err(refuse(wire, "leaves the daemon's root through a symlink"));
                        }
                        break;
                    }
                    if !probe.pop() {
                        break;
                    }
                }
                Ok(path)
            }
        }
    }
}

impl Roots {
    /// Daemon mode: each root's real path (as given and canonical) and the name clients use for
    /// it (`` for a single root, shown as `/`; `/NAME` for several).
    pub fn public_names(&self) -> Vec<(String, String)> {
        let Roots::Confined(roots) = self else { return Vec::new() };
        let mut names = Vec::new();
        // A root of `/` hides nothing.
        for (name, real) in roots.iter().filter(|r| r.1.parent().is_some()) {
            let shown = if roots.len() == 1 { String::new() } else { format!("/{name}") };
            names.push((real.display().to_string(), shown.clone()));
            if let Ok(canon) = real.canonicalize()
                && canon != *real
            {
                names.push((canon.display().to_string(), shown));
            }
        }
        names
    }

    /// Daemon mode: the root a resolved path lies under, opened for confinement
    /// (fsops::Beneath); ssh mode: none, the user's own account has no fence.
    pub fn beneath(&self, path: &Path) -> std::io::Result<Option<crate::store::fsops::Beneath>> {
        match self {
            Roots::Home(_) => Ok(None),
            Roots::Confined(roots) => match roots.iter().map(|r| &r.1).filter(|r| path.starts_with(r)).max_by_key(|r| r.as_os_str().len()) {
                Some(root) => crate::store::fsops::Beneath::open(root).map(Some),
                None => Err(std::io::Error::from_raw_os_error(libc::EXDEV)),
            },
        }
    }
}

fn refuse(wire: &[u8], why: &str) -> TransferError {
    TransferError::fatal(Side::Network, format!("{}: {why}; refused", String::from_utf8_lossy(wire)))
}
