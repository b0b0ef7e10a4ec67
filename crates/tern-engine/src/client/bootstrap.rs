//! Getting this exact tern running on the far side of an ssh login, with no extra round trip
//! when it is already there and no extra login when it is not (`docs/install.md`).
//!
//! The ssh command is a one-line POSIX `sh -c` script. It looks for this build in the remote
//! cache (`~/.cache/tern/VERSION-HASH/tern`, HASH = BLAKE3 of what would be installed), then for a
//! `tern` on PATH of the same version, prints `TERN-OK` and execs it. Otherwise it prints
//! `TERN-NEED` and waits: the client answers with `TERN-INSTALL-<tag> <len>` and a gzip of the
//! far-side build it carries (`tern-remote`, a third of `tern`; a development build sends
//! itself), the script unpacks it into the cache, checks that it runs, prints `TERN-INSTALLED`
//! and execs it. The client does not wait for the answer before speaking (the common case costs
//! nothing); what it wrote before `TERN-NEED` came is recorded and written again after the
//! binary, and the script discards it while it looks for the tagged line.

use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Side, TransferError};

/// Exit statuses of the script, read back by `SshConn::explain`.
pub const EXIT_CANNOT_WRITE: i32 = 97;
pub const EXIT_CANNOT_RUN: i32 = 98;
pub const EXIT_NOT_INSTALLED: i32 = 127;

/// At most this much of the client's early output is kept for a replay: Hello and Auth are a
/// few hundred bytes; anything beyond means the far side never answered and we stop recording.
const MAX_RECORD: usize = 1 << 20;
/// Noise a login shell may print before our status line (motd, rc files), skipped up to this.
const MAX_PREAMBLE: usize = 64 << 10;

/// What the client does when the far side has no matching tern.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Install {
    /// Install it (the default): once per version and host, one line says so.
    #[default]
    IfMissing,
    /// Always send this binary (`--install-remote`), e.g. to replace a damaged copy.
    Always,
    /// Never (`--no-install`): a missing tern is an error that says how to get one.
    Never,
}

/// The gzip of the far-side build this binary carries (release builds: `build.rs`).
static FAR_SIDE: OnceLock<&'static [u8]> = OnceLock::new();

/// Registers the far-side build (`tern-remote`, gzipped) that this binary carries: it is what
/// a first install sends, and its hash names the remote cache directory. Called by `main`
/// before anything else.
pub fn set_far_side_payload(gzip: &'static [u8]) {
    let _ = FAR_SIDE.set(gzip);
}

/// The gzip to install when it is not this binary: the far-side build carried inside, or in a
/// test build the program `TERN_DEBUG_FAR_SIDE` names (compressed once per process).
fn far_side() -> Option<&'static [u8]> {
    if let Some(gzip) = FAR_SIDE.get() {
        return Some(gzip);
    }
    static FROM_HOOK: OnceLock<Option<&'static [u8]>> = OnceLock::new();
    let path = crate::faults::faults().far_side.as_ref()?;
    *FROM_HOOK.get_or_init(|| Some(Box::leak(gzip(&std::fs::read(path).ok()?).ok()?.into_boxed_slice())))
}

/// `VERSION-HASH`, the cache directory's name: a different build is a different directory.
pub fn build_id() -> &'static str {
    static ID: OnceLock<String> = OnceLock::new();
    ID.get_or_init(|| {
        let hash = match far_side() {
            // 2-3 MB, hashed in about a millisecond: nothing to cache.
            Some(gzip) => blake3::hash(gzip).to_hex()[..16].to_string(),
            None => std::env::current_exe().ok().and_then(|exe| binary_hash(&exe, local_cache_dir().as_deref())).unwrap_or_else(|| "unknown".into()),
        };
        format!("{}-{hash}", env!("CARGO_PKG_VERSION"))
    })
}

/// The first 16 hex digits of BLAKE3 over `exe`. Reading and hashing a 15-20 MB binary takes
/// 20-30 ms, and every ssh copy needs the hash before it can start its login, so it is kept in
/// `cache/build-id` under the binary's identity (device, inode, size, modification and change
/// times): a rebuilt or replaced binary has another identity (ctime cannot be set back), so a
/// stale hash is never used. The cache is best effort; without it the hash is computed.
fn binary_hash(exe: &std::path::Path, cache: Option<&std::path::Path>) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(exe).ok()?;
    let identity = format!("{}:{}:{}:{}.{}:{}.{}", m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec());
    let record = cache.map(|d| d.join("build-id"));
    if let Some(cached) = record.as_ref().and_then(|r| std::fs::read_to_string(r).ok())
        && let Some((who, hash)) = cached.trim_end().split_once(' ')
        && who == identity
        && hash.len() == 16
        && hash.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return Some(hash.to_string());
    }
    let hash = blake3::hash(&std::fs::read(exe).ok()?).to_hex()[..16].to_string();
    if let Some(r) = record
        && let Some(dir) = r.parent()
        && std::fs::create_dir_all(dir).is_ok()
    {
        // Written under a temporary name and renamed: a concurrent reader sees the old or the new.
        let tmp = r.with_extension(format!("{}", std::process::id()));
        if std::fs::write(&tmp, format!("{identity} {hash}\n")).is_ok() && std::fs::rename(&tmp, &r).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Some(hash)
}

/// The remote command: `sh -c '<script>' tern-bootstrap ARGS…` (ARGS go to `tern _remote`).
/// The script holds no single quote, `!` or newline, so csh, fish and bash login shells all
/// pass it to sh unchanged.
/// `env`: `NAME=VALUE` exported to the remote tern (or empty).
pub fn remote_command(install: Install, env: &str, remote_args: &str) -> String {
    let version = env!("CARGO_PKG_VERSION");
    let id = build_id();
    let find = format!(
        "c=${{XDG_CACHE_HOME:-$HOME/.cache}}/tern/{id}; b=$c/tern; \
         if [ -x \"$b\" ]; then printf \"TERN-OK\\n\"; exec \"$b\" _remote \"$@\"; fi; \
         p=$(command -v tern 2>/dev/null) && [ \"$(\"$p\" --version 2>/dev/null)\" = \"tern {version}\" ] && \
         {{ printf \"TERN-OK\\n\"; exec \"$p\" _remote \"$@\"; }}; "
    );
    let install_part = format!(
        "printf \"TERN-NEED\\n\"; \
         while IFS= read -r l; do case $l in *TERN-INSTALL-*) break;; esac; done; \
         n=${{l##* }}; \
         mkdir -p \"$c\" 2>/dev/null && t=\"$c/.tern.$$\" && \
         head -c \"$n\" | gzip -dc > \"$t\" && chmod 755 \"$t\" && mv -f \"$t\" \"$b\" \
         || {{ rm -f \"$t\"; echo \"tern: cannot write $c\" >&2; exit {EXIT_CANNOT_WRITE}; }}; \
         \"$b\" --version >/dev/null 2>&1 || {{ echo \"tern: cannot run $b\" >&2; exit {EXIT_CANNOT_RUN}; }}; \
         printf \"TERN-INSTALLED %s\\n\" \"$b\"; exec \"$b\" _remote \"$@\""
    );
    let script = match install {
        Install::IfMissing => format!("{find}{install_part}"),
        Install::Always => {
            format!("c=${{XDG_CACHE_HOME:-$HOME/.cache}}/tern/{id}; b=$c/tern; {install_part}")
        }
        Install::Never => format!("{find}echo \"tern: not found on PATH nor in $c\" >&2; exit {EXIT_NOT_INSTALLED}"),
    };
    let script = match env.split_once('=') {
        Some((name, _)) => format!("{env}; export {name}; {script}"),
        None => script,
    };
    debug_assert!(!script.contains('\'') && !script.contains('!') && !script.contains('\n'));
    format!("sh -c '{script}' tern-bootstrap {remote_args}")
}

/// What a first install sends: the far-side build's gzip, or else the gzip of this binary,
/// made once per process ([`prepare_payload`] may have started making it while ssh logged in).
fn payload() -> io::Result<&'static [u8]> {
    if let Some(gzip) = far_side() {
        return Ok(gzip);
    }
    static PAYLOAD: OnceLock<Result<Vec<u8>, String>> = OnceLock::new();
    PAYLOAD.get_or_init(|| make_payload().map_err(|e| e.to_string())).as_deref().map_err(|e| io::Error::other(e.clone()))
}

/// Starts compressing this binary in the background when it carries no far-side build and no
/// compressed copy is cached, so a first install waits for the ssh login (about a second at
/// 68 ms), not for the compression after it. Once per build and machine; later runs find the
/// cache and do nothing here.
pub(crate) fn prepare_payload() {
    if far_side().is_some() {
        // Nothing to compress; what an older build that shipped itself left is never sent again.
        if let Some(dir) = local_cache_dir() {
            prune_other_builds(&dir, None);
        }
    } else if !cached_payload_path().is_some_and(|p| p.is_file()) {
        let _ = std::thread::Builder::new().name("tern-payload".into()).spawn(|| drop(payload()));
    }
}

/// The gzip of this binary, made once per build and kept in the local cache (compressing
/// 16 MB takes most of a second; sending it on a 1 Gb/s path a tenth of that). The far side
/// unpacks it as it arrives, so the unpacking overlaps the transfer.
fn make_payload() -> io::Result<Vec<u8>> {
    let cache = cached_payload_path();
    if let Some(p) = &cache
        && let Ok(bytes) = std::fs::read(p)
    {
        return Ok(bytes);
    }
    let bytes = gzip(&std::fs::read(std::env::current_exe()?)?)?;
    if let Some(p) = cache
        && let Some(dir) = p.parent()
        && std::fs::create_dir_all(dir).is_ok()
    {
        // Best effort: written under a temporary name and renamed, so a reader never sees half.
        let tmp = p.with_extension(format!("gz.{}", std::process::id()));
        if std::fs::write(&tmp, &bytes).is_ok() && std::fs::rename(&tmp, &p).is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        prune_other_builds(dir, Some(&p));
    }
    Ok(bytes)
}

fn gzip(program: &[u8]) -> io::Result<Vec<u8>> {
    let mut gz = flate2::write::GzEncoder::new(Vec::with_capacity(program.len() / 2), flate2::Compression::new(6));
    gz.write_all(program)?;
    gz.finish()
}

/// Another build's payload is never sent by this one: without pruning, every upgrade (or every
/// rebuild of a developer's tree) would leave 5–70 MB behind for good.
fn prune_other_builds(dir: &std::path::Path, keep: Option<&std::path::Path>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let path = e.path();
        if Some(path.as_path()) != keep && is_payload_name(&e.file_name()) && e.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// `VERSION-HASH.gz` as [`payload`] names it (HASH: 16 hex digits); nothing else in the
/// directory is ours to remove.
fn is_payload_name(name: &std::ffi::OsStr) -> bool {
    let Some(stem) = name.to_str().and_then(|n| n.strip_suffix(".gz")) else { return false };
    let Some((version, hash)) = stem.rsplit_once('-') else { return false };
    !version.is_empty() && hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Where this build's compressed payload is kept: `~/.cache/tern/bootstrap/VERSION-HASH.gz`.
fn cached_payload_path() -> Option<PathBuf> {
    local_cache_dir().map(|d| d.join(format!("{}.gz", build_id())))
}

fn local_cache_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("tern").join("bootstrap"))
}

enum Gate {
    /// No status line yet: what the client writes is recorded for a replay after an install.
    Pending(Vec<u8>),
    Open,
}

struct Shared<W> {
    pipe: W,
    gate: Gate,
}

/// The ssh child's stdin as the client writes it.
pub struct GatedStdin<W: Write> {
    shared: Arc<Mutex<Shared<W>>>,
}

impl<W: Write> Write for GatedStdin<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let mut s = self.shared.lock().unwrap();
        s.pipe.write_all(buf)?;
        if let Gate::Pending(rec) = &mut s.gate {
            if rec.len() + buf.len() <= MAX_RECORD {
                rec.extend_from_slice(buf);
            } else {
                s.gate = Gate::Open;
            }
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.shared.lock().unwrap().pipe.flush()
    }
}

/// The ssh child's stdout: the first read consumes the status line (installing if asked).
pub struct StatusStdout<R: Read, W: Write> {
    pipe: R,
    shared: Arc<Mutex<Shared<W>>>,
    host: String,
    notice: Arc<dyn Fn(String) + Send + Sync>,
    settled: bool,
}

impl<R: Read, W: Write> StatusStdout<R, W> {
    fn read_line(&mut self) -> io::Result<Option<String>> {
        let mut line = Vec::new();
        let mut b = [0u8; 1];
        loop {
            if self.pipe.read(&mut b)? == 0 {
                return Ok(None);
            }
            if b[0] == b'\n' {
                return Ok(Some(String::from_utf8_lossy(&line).into_owned()));
            }
            if line.len() < 4096 {
                line.push(b[0]);
            }
        }
    }

    fn settle(&mut self) -> io::Result<()> {
        let mut skipped = 0;
        loop {
            let Some(line) = self.read_line()? else {
                // The script exited (its status says why); the caller sees EOF.
                return Ok(());
            };
            skipped += line.len() + 1;
            match line.trim_end() {
                "TERN-OK" => {
                    self.shared.lock().unwrap().gate = Gate::Open;
                    return Ok(());
                }
                "TERN-NEED" => self.install()?,
                l if l.starts_with("TERN-INSTALLED ") => {
                    let at = l["TERN-INSTALLED ".len()..].to_string();
                    (self.notice)(format!("installed tern {} on {} at {at} (once per version; --no-install to refuse)", env!("CARGO_PKG_VERSION"), self.host));
                    return Ok(());
                }
                _ if skipped > MAX_PREAMBLE => {
                    return Err(io::Error::other(format!("{}: the login shell printed {skipped} bytes before tern started; make it quiet for non-interactive logins", self.host)));
                }
                // A chatty rc file: not ours, skip it.
                _ => {}
            }
        }
    }

    fn install(&mut self) -> io::Result<()> {
        let bytes = payload()?;
        let tag = crate::client::session::hex(&rand_tag());
        let mut s = self.shared.lock().unwrap();
        let replay = match std::mem::replace(&mut s.gate, Gate::Open) {
            Gate::Pending(rec) => rec,
            Gate::Open => {
                return Err(io::Error::other("the client spoke too much before the far side answered"));
            }
        };
        s.pipe.write_all(format!("\nTERN-INSTALL-{tag} {}\n", bytes.len()).as_bytes())?;
        s.pipe.write_all(bytes)?;
        s.pipe.write_all(&replay)?;
        s.pipe.flush()
    }
}

fn rand_tag() -> [u8; 8] {
    let mut t = [0u8; 8];
    let _ = getrandom::fill(&mut t);
    t
}

impl<R: Read, W: Write> Read for StatusStdout<R, W> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.settled {
            self.settled = true;
            self.settle()?;
        }
        self.pipe.read(buf)
    }
}

/// Wraps the ssh child's pipes for a bootstrap script.
pub fn wrap<R: Read, W: Write>(stdin: W, stdout: R, host: &str, notice: Arc<dyn Fn(String) + Send + Sync>) -> (GatedStdin<W>, StatusStdout<R, W>) {
    let shared = Arc::new(Mutex::new(Shared { pipe: stdin, gate: Gate::Pending(Vec::new()) }));
    (GatedStdin { shared: shared.clone() }, StatusStdout { pipe: stdout, shared, host: host.to_string(), notice, settled: false })
}

/// The one-line error for a script that exited with `code`, or `None` if the code is not ours.
pub fn explain_exit(code: i32, host: &str) -> Option<TransferError> {
    let cache = format!("~/.cache/tern/{}", build_id());
    let msg = match code {
        EXIT_NOT_INSTALLED => format!("{host}: tern is not installed there (and --no-install was given); drop --no-install to have tern install itself in {cache}, or pass --remote-bin PATH"),
        EXIT_CANNOT_WRITE => format!(
            "{host}: cannot install tern in {cache} (read-only or full home?); install tern there by hand and pass --remote-bin PATH, or set XDG_CACHE_HOME on that host to a writable directory"
        ),
        EXIT_CANNOT_RUN => format!("{host}: tern was copied to {cache} but cannot run there (home mounted noexec?); install tern on an executable file system and pass --remote-bin PATH"),
        _ => return None,
    };
    Some(TransferError::fatal(Side::Network, msg))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn script_survives_any_login_shell() {
        for i in [Install::IfMissing, Install::Always, Install::Never] {
            let cmd = remote_command(i, "TERN_EARLY_HELLO=1", "--port-range 1-2");
            let inner = &cmd["sh -c '".len()..cmd.rfind('\'').unwrap()];
            assert!(!inner.contains('\'') && !inner.contains('!') && !inner.contains('\n'));
        }
    }

    #[test]
    fn the_binary_hash_is_cached_under_its_identity_and_recomputed_when_it_changes() {
        let t = tempfile::tempdir().unwrap();
        let (exe, cache) = (t.path().join("tern"), t.path().join("cache"));
        std::fs::write(&exe, b"build one").unwrap();
        let first = binary_hash(&exe, Some(&cache)).unwrap();
        assert_eq!(first, blake3::hash(b"build one").to_hex()[..16]);
        assert!(std::fs::read_to_string(cache.join("build-id")).unwrap().ends_with(&format!(" {first}\n")));
        // Read back from the cache, not recomputed: a planted hash under the same identity wins.
        let planted = std::fs::read_to_string(cache.join("build-id")).unwrap().replace(&first, "00000000000000aa");
        std::fs::write(cache.join("build-id"), planted).unwrap();
        assert_eq!(binary_hash(&exe, Some(&cache)).unwrap(), "00000000000000aa");
        // Rewritten in place (same inode, same size) a tick later (file times may be as coarse as
        // a scheduler tick): another modification time, so hashed again.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&exe, b"build two").unwrap();
        assert_eq!(binary_hash(&exe, Some(&cache)).unwrap(), blake3::hash(b"build two").to_hex()[..16]);
        // No cache directory at all: still the hash.
        assert_eq!(binary_hash(&exe, None).unwrap(), blake3::hash(b"build two").to_hex()[..16]);
    }

    #[test]
    fn only_other_builds_payloads_are_pruned() {
        let dir = tempfile::tempdir().unwrap();
        let names = ["0.1.0-5a0a2f1424d54680.gz", "0.1.0-47cba97c9a944d96.gz", "0.1.0-5a19b8be54110608.gz.4242", "notes.gz", "0.1.0-xyz.gz", "keep.txt"];
        for n in names {
            std::fs::write(dir.path().join(n), b"x").unwrap();
        }
        let keep = dir.path().join("0.1.0-47cba97c9a944d96.gz");
        prune_other_builds(dir.path(), Some(&keep));
        let mut left: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["0.1.0-47cba97c9a944d96.gz", "0.1.0-5a19b8be54110608.gz.4242", "0.1.0-xyz.gz", "keep.txt", "notes.gz"]);
        // A build that carries its far side keeps none of them.
        prune_other_builds(dir.path(), None);
        let mut left: Vec<String> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        left.sort();
        assert_eq!(left, ["0.1.0-5a19b8be54110608.gz.4242", "0.1.0-xyz.gz", "keep.txt", "notes.gz"]);
    }

    #[test]
    fn script_runs_in_sh_and_reports_missing() {
        let home = tempfile::tempdir().unwrap();
        let cmd = remote_command(Install::Never, "", "");
        let out = std::process::Command::new("sh").arg("-c").arg(&cmd).env("HOME", home.path()).env("PATH", "/usr/bin:/bin").env_remove("XDG_CACHE_HOME").output().unwrap();
        assert_eq!(out.status.code(), Some(EXIT_NOT_INSTALLED), "{}", String::from_utf8_lossy(&out.stderr));
    }

    #[test]
    fn early_writes_are_replayed_after_the_binary() {
        // A fake far side: the script's view of stdin is what the client writes.
        let sink = Vec::new();
        let (mut w, mut r) = wrap(sink, &b"motd line\nTERN-OK\nrest"[..], "h", Arc::new(|_| {}));
        w.write_all(b"TERN-SECRET x\n").unwrap();
        let mut out = String::new();
        r.read_to_string(&mut out).unwrap();
        assert_eq!(out, "rest");
        w.write_all(b"later").unwrap();
        let s = w.shared.lock().unwrap();
        assert_eq!(s.pipe, b"TERN-SECRET x\nlater");
        assert!(matches!(s.gate, Gate::Open));
    }
}
