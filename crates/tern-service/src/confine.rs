//! Local paths a job may touch: beneath the operator's roots (`--job-root`) and the token's
//! prefix, judged on what the kernel resolves (`openat2` with `RESOLVE_BENEATH`), never on the
//! text: `alice/bobl -> ../bob` is refused for a token confined to `alice/`.
//!
//! Checked at submit and again when the job starts; then the child `tern cp` is started with
//! `--src-beneath/--dst-beneath` (`Roots::fence`), so it opens the paths beneath the same
//! directory with `RESOLVE_BENEATH` itself and a link swapped in after the start check leads
//! nowhere (docs/security-service.md).

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// The operator's roots (canonical) and the directories no job may reach whatever the roots
/// say (the service's state directory: its database and admin token).
#[derive(Debug, Clone, Default)]
pub struct Roots {
    pub roots: Vec<PathBuf>,
    pub forbidden: Vec<PathBuf>,
}

impl Roots {
    /// Canonicalises each directory (the operator's own links are trusted, once, at start).
    pub fn new(roots: &[PathBuf], forbidden: &[PathBuf]) -> Result<Self, String> {
        let canon = |p: &PathBuf| std::fs::canonicalize(p).map_err(|e| format!("--job-root {}: {e}", p.display()));
        let roots = roots.iter().map(canon).collect::<Result<Vec<_>, _>>()?;
        for r in &roots {
            if !r.is_dir() {
                return Err(format!("--job-root {}: not a directory", r.display()));
            }
        }
        let forbidden = forbidden.iter().filter_map(|p| std::fs::canonicalize(p).ok()).collect();
        Ok(Self { roots, forbidden })
    }

    fn list(&self) -> String {
        if self.roots.is_empty() { "none declared".into() } else { self.roots.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", ") }
    }

    /// The directory a job's child must keep `path` beneath when it opens it (`tern cp
    /// --src-beneath/--dst-beneath`): the token's prefix, or else the root holding the path.
    /// `check` has already said the path lies there.
    pub fn fence(&self, path: &str, prefix: Option<&str>) -> Option<PathBuf> {
        if let Some(pre) = prefix {
            return Some(PathBuf::from(pre));
        }
        let p: PathBuf = Path::new(path).components().filter(|c| *c != Component::CurDir).collect();
        self.roots.iter().filter(|r| p.starts_with(r)).max_by_key(|r| r.as_os_str().len()).cloned()
    }

    /// `what` ('src', 'options.token_file', ...) at `path` may be used by a token with `prefix`.
    /// Returns the resolved path of what exists of it.
    pub fn check(&self, what: &str, path: &str, prefix: Option<&str>) -> Result<PathBuf, String> {
        let p = Path::new(path);
        if !p.is_absolute() || p.components().any(|c| c == Component::ParentDir) {
            return Err(format!("{what} '{path}' must be an absolute path without '..'"));
        }
        let p: PathBuf = p.components().filter(|c| *c != Component::CurDir).collect();
        let Some(root) = self.roots.iter().filter(|r| p.starts_with(r)).max_by_key(|r| r.as_os_str().len()) else {
            return Err(format!("{what} '{path}' is outside the directories this service may use ({}); the operator declares them with tern serve --job-root DIR", self.list()));
        };
        let root_fd = rustix::fs::open(root, OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC, Mode::empty()).map_err(|e| format!("{what}: cannot open the service root {}: {e}", root.display()))?;
        // The token's prefix, opened beneath the root with no link anywhere in it: a user who
        // owns part of the prefix cannot point it elsewhere.
        let (base_fd, base) = match prefix {
            None => (root_fd, root.clone()),
            Some(pre) => {
                let pre = Path::new(pre);
                if !p.starts_with(pre) {
                    return Err(format!("{what} '{path}' is outside this token's prefix {}", pre.display()));
                }
                let Ok(rel) = pre.strip_prefix(root) else {
                    return Err(format!("this token's prefix {} is outside the service's roots ({}); ask an admin for a token with a prefix inside them", pre.display(), self.list()));
                };
                let fd = beneath(&root_fd, rel, OFlags::DIRECTORY, ResolveFlags::NO_SYMLINKS)
                    .map_err(|e| format!("this token's prefix {} is not a plain directory beneath {} ({e}); an admin must fix the prefix or the directory", pre.display(), root.display()))?;
                (fd, pre.to_path_buf())
            }
        };
        let rel = p.strip_prefix(&base).unwrap_or(Path::new(""));
        let mut comps: Vec<&std::ffi::OsStr> = rel.iter().collect();
        let fd = loop {
            let sub: PathBuf = comps.iter().collect();
            match beneath(&base_fd, &sub, OFlags::empty(), ResolveFlags::empty()) {
                Ok(fd) => break fd,
                Err(Errno::NOENT) if !comps.is_empty() => {
                    // Missing (the job creates it). A dangling link is not: the child would
                    // follow it wherever its target comes to exist.
                    let name = comps.pop().unwrap_or_default();
                    let parent: PathBuf = comps.iter().collect();
                    if let Ok(dir) = beneath(&base_fd, &parent, OFlags::empty(), ResolveFlags::empty())
                        && rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
                    {
                        return Err(format!("{what} '{path}' passes through a dangling symbolic link; remove it or name the target"));
                    }
                }
                Err(Errno::XDEV) => return Err(format!("{what} '{path}' resolves outside {} (a symbolic link or '..' leads out); the service follows links only within it", base.display())),
                Err(e) => return Err(format!("{what} '{path}': {e}")),
            }
        };
        let real = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd))).map_err(|e| format!("{what} '{path}': cannot tell where it resolves: {e}"))?;
        if let Some(f) = self.forbidden.iter().find(|f| real.starts_with(f)) {
            return Err(format!("{what} '{path}' is inside the service's state directory {}, which no job may use", f.display()));
        }
        Ok(real)
    }
}

/// One entry of a directory listing (the dashboard's file browser).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Listed {
    pub name: String,
    /// "dir", "file", "symlink" or "other".
    pub kind: &'static str,
    pub size: u64,
    pub mtime: i64,
}

/// Most entries one listing returns (the rest are counted).
pub const MAX_LISTED: usize = 5000;

impl Roots {
    /// The directories a token may start browsing from: its prefix, else the roots.
    pub fn starts(&self, prefix: Option<&str>) -> Vec<PathBuf> {
        match prefix {
            Some(p) => vec![PathBuf::from(p)],
            None => self.roots.clone(),
        }
    }

    /// Lists directory `path` as the kernel resolves it beneath the roots and the token's prefix
    /// (the same judgement as `check`), through the descriptor it opened: directories first,
    /// then by name, at most `MAX_LISTED` (the count of the rest is returned too).
    pub fn list_dir(&self, path: &str, prefix: Option<&str>) -> Result<(PathBuf, Vec<Listed>, usize), String> {
        let real = self.check("path", path, prefix)?;
        let want: PathBuf = Path::new(path).components().filter(|c| *c != Component::CurDir).collect();
        // `check` answers for the deepest part that exists; a listing needs all of it.
        let fd = rustix::fs::open(&real, OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW, Mode::empty()).map_err(|e| format!("'{path}': cannot list it: {e}"))?;
        let opened = std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd))).map_err(|e| format!("'{path}': {e}"))?;
        if opened != real {
            return Err(format!("'{path}' changed while it was opened; try again"));
        }
        if !want.exists() {
            return Err(format!("'{path}': no such directory"));
        }
        let mut dir = rustix::fs::Dir::read_from(&fd).map_err(|e| format!("'{path}': cannot list it: {e}"))?;
        let mut out = Vec::new();
        let mut more = 0usize;
        while let Some(entry) = dir.read() {
            let Ok(entry) = entry else { break };
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            if out.len() >= MAX_LISTED {
                more += 1;
                continue;
            }
            let Ok(st) = rustix::fs::statat(&fd, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW) else { continue };
            let kind = match st.st_mode & libc::S_IFMT {
                libc::S_IFDIR => "dir",
                libc::S_IFREG => "file",
                libc::S_IFLNK => "symlink",
                _ => "other",
            };
            out.push(Listed { name, kind, size: st.st_size as u64, mtime: st.st_mtime });
        }
        out.sort_by(|a, b| (a.kind != "dir", &a.name).cmp(&(b.kind != "dir", &b.name)));
        Ok((real, out, more))
    }
}

/// `openat2(dir, rel, O_PATH | extra, RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS | resolve)`.
fn beneath(dir: &impl AsFd, rel: &Path, extra: OFlags, resolve: ResolveFlags) -> Result<OwnedFd, Errno> {
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    rustix::fs::openat2(dir, rel, OFlags::PATH | OFlags::CLOEXEC | extra, Mode::empty(), ResolveFlags::BENEATH | ResolveFlags::NO_MAGICLINKS | resolve)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_are_judged_by_where_they_resolve() {
        let t = tempfile::tempdir().unwrap();
        let data = t.path().join("data");
        for d in ["alice/in", "bob", "state"] {
            std::fs::create_dir_all(data.join(d)).unwrap();
        }
        std::fs::write(data.join("bob/secret"), "x").unwrap();
        std::os::unix::fs::symlink("../bob", data.join("alice/bobl")).unwrap();
        std::os::unix::fs::symlink("in", data.join("alice/inl")).unwrap();
        std::os::unix::fs::symlink("nowhere/../../bob", data.join("alice/dangling")).unwrap();
        std::os::unix::fs::symlink("/etc", data.join("etcl")).unwrap();
        let r = Roots::new(std::slice::from_ref(&data), &[data.join("state")]).unwrap();
        let d = data.canonicalize().unwrap();
        let a = d.join("alice");
        let s = |p: &str| format!("{}/{p}", d.display());
        let alice = Some(a.to_str().unwrap());
        assert!(r.check("src", &s("alice/in"), alice).is_ok());
        assert!(r.check("dst", &s("alice/new/deeper"), alice).is_ok(), "missing parts are created by the job");
        assert!(r.check("src", &s("alice/inl"), alice).is_ok(), "a link within the prefix");
        assert!(r.check("src", &s("alice/bobl/secret"), alice).unwrap_err().contains("resolves outside"));
        assert!(r.check("dst", &s("alice/bobl/new"), alice).unwrap_err().contains("resolves outside"));
        assert!(r.check("dst", &s("alice/dangling"), alice).unwrap_err().contains("dangling"));
        assert!(r.check("src", &s("bob/secret"), alice).unwrap_err().contains("prefix"));
        assert!(r.check("src", &s("bob/secret"), None).is_ok(), "no prefix: the whole root");
        assert!(r.check("src", &s("etcl/shadow"), None).unwrap_err().contains("resolves outside"));
        assert!(r.check("src", "/etc/shadow", None).unwrap_err().contains("--job-root"));
        assert!(r.check("src", &s("state/jobs.db"), None).unwrap_err().contains("state directory"));
        assert!(r.check("src", &s("alice/../bob"), None).unwrap_err().contains("'..'"));
        // A prefix that is itself a link is refused, not followed.
        let al = d.join("alice/bobl");
        assert!(r.check("src", &s("alice/bobl/secret"), Some(al.to_str().unwrap())).unwrap_err().contains("not a plain directory"));
        // What the child is kept beneath: the token's prefix, else the root holding the path.
        assert_eq!(r.fence(&s("alice/in/x"), alice), alice.map(PathBuf::from));
        assert_eq!(r.fence(&s("bob/secret"), None), Some(d.clone()));
        assert_eq!(r.fence("/etc/shadow", None), None);
    }
}
