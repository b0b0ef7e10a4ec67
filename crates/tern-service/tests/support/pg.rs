//! A real PostgreSQL server for tests: `initdb` into a temporary directory, `postgres` on a
//! free loopback port, stopped by PID when dropped. PostgreSQL refuses to run as root, so as
//! root it runs as `nobody` through `setpriv`. `None` (with a note) where PostgreSQL is not
//! installed; scripts/test.sh installs it, so that only happens on a developer machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub(crate) struct Postgres {
    child: Child,
    pub port: u16,
    bin: PathBuf,
    _dir: tempfile::TempDir,
}

/// The newest installed server's bin directory (Debian: /usr/lib/postgresql/VERSION/bin).
fn bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql").ok()?.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).filter(|b| b.join("initdb").exists()).collect();
    dirs.sort_by_key(|d| d.parent().and_then(|v| v.file_name()).and_then(|v| v.to_str()).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0));
    dirs.pop()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A command run as `nobody` when we are root (PostgreSQL will not run as root).
fn as_pg_user(program: &Path) -> Command {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn run(mut cmd: Command, what: &str) {
    let out = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what} failed: {}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
}

impl Postgres {
    pub(crate) fn start() -> Option<Self> {
        let Some(bin) = bin_dir() else {
            eprintln!("SKIP: PostgreSQL is not installed (apt-get install postgresql; scripts/test.sh does)");
            return None;
        };
        let dir = tempfile::Builder::new().prefix("tern-pg").tempdir().unwrap();
        // SAFETY: geteuid has no preconditions; chown of a directory we just made.
        if unsafe { libc::geteuid() } == 0 {
            let c = std::ffi::CString::new(dir.path().as_os_str().as_encoded_bytes()).unwrap();
            assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0, "chown the PostgreSQL test directory");
        }
        let data = dir.path().join("data");
        let mut init = as_pg_user(&bin.join("initdb"));
        // trust on loopback: a throwaway cluster nobody else can reach; no fsync: it is scratch.
        init.arg("-D").arg(&data).args(["-U", "tern", "--auth=trust", "-E", "UTF8", "--no-sync", "--no-instructions"]);
        run(init, "initdb");
        let port = free_port();
        let mut pg = as_pg_user(&bin.join("postgres"));
        pg.arg("-D").arg(&data).arg("-k").arg(dir.path()).args(["-h", "127.0.0.1", "-p", &port.to_string(), "-F", "-c", "max_connections=50"]);
        let child = pg.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).spawn().expect("start postgres");
        let mut me = Self { child, port, bin, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ok = Command::new(me.bin.join("pg_isready")).args(["-q", "-h", "127.0.0.1", "-p", &port.to_string()]).status().is_ok_and(|s| s.success());
            if ok {
                break;
            }
            assert!(me.child.try_wait().unwrap().is_none(), "postgres exited at start");
            assert!(Instant::now() < deadline, "postgres did not become ready in 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(me)
    }

    /// A fresh, empty database; its URL.
    pub(crate) fn create_db(&self, name: &str) -> String {
        let mut c = Command::new(self.bin.join("createdb"));
        c.args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "tern", name]);
        run(c, "createdb");
        self.url(name)
    }

    pub(crate) fn url(&self, db: &str) -> String {
        format!("postgres://tern@127.0.0.1:{}/{db}", self.port)
    }

    /// Runs SQL through psql (for tests that lock tables from outside the service).
    pub(crate) fn psql(&self, db: &str) -> Command {
        let mut c = Command::new(self.bin.join("psql"));
        c.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p", &self.port.to_string(), "-U", "tern", "-d", db]);
        c
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        // SIGINT is PostgreSQL's "fast shutdown": it ends its own backends, then exits.
        // SAFETY: signalling our own child by PID.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
