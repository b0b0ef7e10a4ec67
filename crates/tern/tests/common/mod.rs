//! Shared test support: real daemons, a real sshd, deterministic trees, independent hashing.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

pub(crate) mod netns;

pub(crate) fn tern_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tern")
}

/// The far-side build, what a release `tern` installs on a host that lacks tern.
pub(crate) fn far_side_bin() -> &'static str {
    env!("CARGO_BIN_EXE_tern-remote")
}

/// A scratch directory on tmpfs when there is one (big files must not measure the disk).
pub(crate) fn scratch() -> tempfile::TempDir {
    share_the_machine();
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { tempfile::tempdir_in(shm).unwrap() } else { tempfile::tempdir().unwrap() }
}

/// Tests that measure a rate against a cap (`measuring`) run with no other test beside them:
/// the suite shares two cores, and a copy beside one took a 300 Mb/s link to 0.07 Gb/s. Every
/// test that makes a scratch directory (nearly all) holds the shared side until it ends (its
/// thread's end drops the guard: the test harness runs each test on a thread of its own); a
/// measuring test waits for those running to end, and the lock's waiting writer holds back new
/// ones.
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

enum Held {
    Shared(#[allow(dead_code)] std::sync::RwLockReadGuard<'static, ()>),
    Alone(#[allow(dead_code)] std::sync::RwLockWriteGuard<'static, ()>),
}

thread_local! {
    static HELD: std::cell::RefCell<Option<Held>> = const { std::cell::RefCell::new(None) };
}

fn share_the_machine() {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if h.is_none() {
            *h = Some(Held::Shared(MACHINE.read().unwrap_or_else(|e| e.into_inner())));
        }
    });
}

/// Call first in a test that measures a rate: it then runs alone (see `MACHINE`).
pub(crate) fn measuring() {
    HELD.with(|h| {
        let mut h = h.borrow_mut();
        if !matches!(*h, Some(Held::Alone(_))) {
            *h = None; // let go of our own shared hold first, or the write lock waits on it
            *h = Some(Held::Alone(MACHINE.write().unwrap_or_else(|e| e.into_inner())));
        }
    });
}

/// Deterministic incompressible bytes.
pub(crate) fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    let mut x = blake3::Hasher::new();
    x.update(&seed.to_le_bytes());
    let mut reader = x.finalize_xof();
    out.resize(len, 0);
    reader.fill(&mut out);
    out
}

pub(crate) fn write_file(path: &Path, seed: u64, len: usize) {
    if let Some(p) = path.parent() {
        fs::create_dir_all(p).unwrap();
    }
    fs::write(path, data(seed, len)).unwrap();
}

/// A scaled-down tree shaped like the Petascale DTN reference set: nested directories, empty
/// files, sizes over six decades, plus the awkward cases (spaces, non-UTF-8 names, symlinks, an
/// empty directory, a sparse file).
pub(crate) fn petascale_tree(root: &Path) -> u64 {
    // (count, min size, max size) per decade, the reference set's shape scaled to ~60 MB.
    let decades: [(usize, usize, usize); 8] =
        [(7, 0, 9), (1, 10, 99), (6, 100, 999), (317, 1_000, 9_999), (156, 10_000, 99_999), (28, 100_000, 999_999), (4, 1_000_000, 9_999_999), (1, 10_000_000, 20_000_000)];
    let dirs: Vec<PathBuf> = (0..21).map(|i| root.join(format!("d{}/s{}/t{}", i % 5, i % 3, i))).collect();
    let mut n = 0u64;
    let mut total = 0u64;
    for (count, lo, hi) in decades {
        for _ in 0..count {
            let size = lo + (n as usize * 7919) % (hi - lo + 1);
            let dir = &dirs[n as usize % dirs.len()];
            write_file(&dir.join(format!("f{n:05}.dat")), n, size);
            total += size as u64;
            n += 1;
        }
    }
    fs::create_dir_all(root.join("empty dir/inner")).unwrap();
    write_file(&root.join("d0/name with spaces.txt"), 999, 123);
    let odd = root.join(std::ffi::OsStr::from_bytes(b"d1/caf\xe9-latin1"));
    write_file(&odd, 998, 77);
    std::os::unix::fs::symlink("../d0/name with spaces.txt", root.join("d1/link")).unwrap();
    // 8 MiB with a 6 MiB hole in the middle.
    let sparse = fs::File::create(root.join("d2/sparse.img")).unwrap();
    sparse.set_len(8 << 20).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, &data(5, 1 << 20), 0).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&sparse, &data(6, 1 << 20), 7 << 20).unwrap();
    fs::set_permissions(root.join("d0/name with spaces.txt"), fs::Permissions::from_mode(0o640)).unwrap();
    total + 123 + 77 + (8 << 20)
}

/// What a tree holds, computed independently of tern (SHA-256): kind, content hash, mode, mtime.
pub(crate) fn snapshot(root: &Path) -> BTreeMap<Vec<u8>, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().as_os_str().as_bytes().to_vec();
            let md = fs::symlink_metadata(&p).unwrap();
            let desc = if md.is_symlink() {
                format!("link {}", fs::read_link(&p).unwrap().display())
            } else if md.is_dir() {
                stack.push(p.clone());
                format!("dir {:o}", md.mode() & 0o7777)
            } else {
                let mut h = Sha256::new();
                let mut f = fs::File::open(&p).unwrap();
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = f.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    h.update(&buf[..n]);
                }
                format!("file {:x} {:o} {}.{}", h.finalize(), md.mode() & 0o7777, md.mtime(), md.mtime_nsec())
            };
            out.insert(rel, desc);
        }
    }
    out
}

pub(crate) fn assert_same_tree(a: &Path, b: &Path) {
    let (sa, sb) = (snapshot(a), snapshot(b));
    for (k, v) in &sa {
        assert_eq!(sb.get(k), Some(v), "{} differs", String::from_utf8_lossy(k));
    }
    assert_eq!(sa.len(), sb.len(), "destination has extra entries: {:?}", sb.keys().filter(|k| !sa.contains_key(*k)).map(|k| String::from_utf8_lossy(k)).collect::<Vec<_>>());
}

/// Whether a file name is one of tern's temporaries, journals or markers (docs/journal.md).
pub(crate) fn is_tern_name(name: &str) -> bool {
    name.starts_with(".tern.") && (name.ends_with(".part") || name.ends_with(".journal") || name.ends_with(".incomplete"))
}

/// The journal tern keeps in `dir` for a file `name` being received there.
pub(crate) fn journal_path(dir: &Path, name: &str) -> PathBuf {
    let fd = fs::File::open(dir).unwrap();
    dir.join(std::ffi::OsStr::from_bytes(&tern_engine::store::fsops::Tag::of(&fd).unwrap().temp_names(name.as_bytes()).1))
}

/// No temporaries or markers left anywhere under `root`.
pub(crate) fn assert_no_leftovers(root: &Path) {
    for (k, _) in snapshot(root) {
        let name = String::from_utf8_lossy(&k);
        let last = name.rsplit('/').next().unwrap();
        assert!(!is_tern_name(last), "leftover {name}");
    }
}

pub(crate) struct Run {
    pub out: Output,
    pub json: serde_json::Value,
}

impl Run {
    pub(crate) fn ok(&self) -> bool {
        self.out.status.success()
    }
    pub(crate) fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    pub(crate) fn u64(&self, k: &str) -> u64 {
        self.json[k].as_u64().unwrap_or_else(|| panic!("no {k} in {}", self.json))
    }
}

/// Runs `tern ARGS --json` with a time limit; returns the parsed summary.
pub(crate) fn tern(args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(tern_bin());
    cmd.args(args).arg("--json").stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = run_bounded(cmd, Duration::from_secs(300));
    let json = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    Run { out, json }
}

pub(crate) fn run_bounded(mut cmd: Command, limit: Duration) -> Output {
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    // Read both pipes meanwhile: a child writing more than a pipe holds (64 KiB: fish's
    // completions) would otherwise wait on us forever.
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(child.stdout.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let err = drain(child.stderr.take().map(|r| Box::new(r) as Box<dyn Read + Send>));
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() };
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            panic!("command ran over {limit:?}: {cmd:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Waits until `child`, a `tern serve` with a service, says in its log (from byte `from` on)
/// that it serves, and returns the service API's and the daemon's ports from its own lines.
/// Start it on port 0: the kernel's pick cannot be another test's, while a port `free_port`
/// found and let go of can be taken by another test's server first. `Err` carries what the log
/// said if the child exited before.
pub(crate) fn wait_for_serving(child: &mut Child, log: &Path, from: usize) -> Result<(u16, u16), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let said = std::fs::read(log).ok().and_then(|b| b.get(from..).map(|b| String::from_utf8_lossy(b).into_owned())).unwrap_or_default();
        if let (Some(http), Some(data)) = (port_after(&said, "service API on https://127.0.0.1:"), port_after(&said, "listening on 127.0.0.1:")) {
            return Ok((http, data));
        }
        if child.try_wait().unwrap().is_some() {
            return Err(said);
        }
        assert!(Instant::now() < deadline, "not serving within 20 s: {said}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The port right after `prefix` in `said`, once its line is complete.
fn port_after(said: &str, prefix: &str) -> Option<u16> {
    let rest = &said[said.find(prefix)? + prefix.len()..];
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    rest[..digits].parse().ok()
}

/// A real `tern serve` on a loopback port; killed (by PID) on drop.
pub(crate) struct Daemon {
    pub child: Child,
    pub port: u16,
    pub root: PathBuf,
    pub token: PathBuf,
}

impl Daemon {
    /// On a port the daemon picks itself: a port chosen here and released before the daemon
    /// binds it can be taken in between by another test's listener (seen in CI).
    pub(crate) fn start(root: &Path, token: &Path) -> Self {
        Self::start_on(root, token, 0, &[])
    }
    pub(crate) fn start_on(root: &Path, token: &Path, port: u16, env: &[(&str, &str)]) -> Self {
        Self::start_with(root, token, port, env, &[])
    }
    /// With extra `tern serve` arguments (e.g. `--hook NAME=CMD`). Port 0: the daemon's choice,
    /// read from its "listening on" line.
    pub(crate) fn start_with(root: &Path, token: &Path, port: u16, env: &[(&str, &str)], extra: &[&str]) -> Self {
        let mut cmd = Command::new(tern_bin());
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--root"]).arg(root).arg("--token-file").arg(token).args(extra);
        cmd.stdout(Stdio::null()).stderr(Stdio::piped());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        // Reads the listening line, then keeps draining so the daemon never blocks on a full pipe.
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on 127.0.0.1:").nth(1)
                    && let Some(p) = rest.split_whitespace().next().and_then(|p| p.parse::<u16>().ok())
                {
                    let _ = tx.send(p);
                }
            }
        });
        let port = rx.recv_timeout(Duration::from_secs(10)).unwrap_or_else(|_| panic!("daemon did not start (exit: {:?})", child.try_wait()));
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "daemon did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Self { child, port, root: root.to_path_buf(), token: token.to_path_buf() }
    }
    pub(crate) fn url(&self, path: &str) -> String {
        format!("tern://127.0.0.1:{}/{}", self.port, path.trim_start_matches('/'))
    }
    pub(crate) fn token_arg(&self) -> String {
        self.token.display().to_string()
    }
    pub(crate) fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A real OpenSSH server on a loopback port with generated keys and a clean environment whose
/// PATH finds the far-side build of the tern under test. `None` (with a note) where sshd is not installed.
pub(crate) struct Sshd {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
}

impl Sshd {
    pub(crate) fn start() -> Option<Self> {
        let sshd = ["/usr/sbin/sshd", "/usr/bin/sshd"].into_iter().find(|p| Path::new(p).exists())?;
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for k in ["hostkey", "userkey"] {
            let st = Command::new("ssh-keygen").args(["-q", "-t", "ed25519", "-N", "", "-f"]).arg(d.join(k)).status().unwrap();
            assert!(st.success());
        }
        let port = free_port();
        // The `tern` that logins find on PATH is the far-side build, as on a host where a
        // release tern installed itself: every ssh-mode test runs what ships there.
        let bin_dir = d.join("bin");
        fs::create_dir_all(&bin_dir).unwrap();
        std::os::unix::fs::symlink(far_side_bin(), bin_dir.join("tern")).unwrap();
        let bin_dir = bin_dir.display().to_string();
        let cfg = format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/hostkey\nAuthorizedKeysFile {d}/userkey.pub\nPasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\nPermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPidFile {d}/sshd.pid\nSetEnv PATH={bin_dir}:/usr/bin:/bin\n",
            d = d.display()
        );
        fs::write(d.join("sshd_config"), cfg).unwrap();
        let _ = fs::create_dir_all("/run/sshd");
        let child = Command::new(sshd).arg("-D").arg("-e").arg("-f").arg(d.join("sshd_config")).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "sshd did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(Self { child, port, dir })
    }
    /// The ssh command tern should use (`--ssh`). No connection reuse: each test's sshd goes
    /// away with the test, and a shared connection kept for a minute would carry the next
    /// test that gets the same port to the old one.
    pub(crate) fn ssh_cmd(&self) -> String {
        format!("{} -o ControlPath=none", self.ssh_cmd_reusable())
    }
    /// The same, leaving tern free to share one connection between sessions.
    pub(crate) fn ssh_cmd_reusable(&self) -> String {
        format!("ssh -p {} -i {}/userkey -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR", self.port, self.dir.path().display())
    }
}

impl Sshd {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Every process below `pid` (children, their children, ...), from /proc.
pub(crate) fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = fs::read_to_string(e.path().join("stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so parse after the last ')'.
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let (Ok(p), Some(pp)) = (e.file_name().to_string_lossy().parse::<u32>(), rest.split_whitespace().nth(1).and_then(|p| p.parse::<u32>().ok())) else { continue };
        parent_of.push((p, pp));
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(c, pp) in &parent_of {
            if pp == p {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn require_sshd() -> Option<Sshd> {
    let s = Sshd::start();
    if s.is_none() {
        // CI installs openssh-server, so this only skips on a developer machine without it.
        eprintln!("SKIP: no sshd on this machine (apt-get install openssh-server)");
    }
    s
}

pub(crate) fn touch(path: &Path, bytes: &[u8]) {
    let mut f = fs::File::create(path).unwrap();
    f.write_all(bytes).unwrap();
}
