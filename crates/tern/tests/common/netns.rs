//! Two private network namespaces joined by a veth pair, for tests of multi-host paths.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::{run_bounded, tern_bin};

/// Namespaces A (`PREFIX.1`) and B (`PREFIX.2`) on a /24 of 198.19.0.0/16 a test file owns,
/// named by this process's id so parallel runs and the bench bed (`bench/netns.sh`'s
/// tern-a/tern-b) are left alone; removed on drop with the daemon started in B. `None` (with a
/// note) where namespaces cannot be made.
pub(crate) struct Netns {
    pub a: String,
    pub b: String,
    prefix: String,
    daemon: Option<Child>,
}

impl Netns {
    pub(crate) fn up(tag: &str, prefix: &str) -> Option<Self> {
        let id = std::process::id();
        let (a, b, va, vb) = (format!("tna{tag}{id}"), format!("tnb{tag}{id}"), format!("tnva{tag}{id}"), format!("tnvb{tag}{id}"));
        let ip = |args: &[&str]| Command::new("ip").args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
        if !ip(&["netns", "add", &a]) {
            eprintln!("SKIP: cannot make network namespaces (needs root and iproute2)");
            return None;
        }
        let me = Netns { a: a.clone(), b: b.clone(), prefix: prefix.to_string(), daemon: None };
        assert!(ip(&["netns", "add", &b]));
        assert!(ip(&["link", "add", &va, "type", "veth", "peer", "name", &vb]));
        assert!(ip(&["link", "set", &va, "netns", &a]) && ip(&["link", "set", &vb, "netns", &b]));
        assert!(ip(&["-n", &a, "addr", "add", &format!("{prefix}.1/24"), "dev", &va]) && ip(&["-n", &b, "addr", "add", &format!("{prefix}.2/24"), "dev", &vb]));
        for (ns, dev) in [(&a, &va), (&b, &vb)] {
            assert!(ip(&["-n", ns, "link", "set", dev, "up"]) && ip(&["-n", ns, "link", "set", "lo", "up"]));
        }
        Some(me)
    }

    /// `sysctl -w SETTINGS` in A (`a`) or B: the per-namespace ones (net.ipv4.tcp_*).
    pub(crate) fn sysctl(&self, a: bool, settings: &[&str]) {
        let ns = if a { &self.a } else { &self.b };
        let st = Command::new("ip").args(["netns", "exec", ns, "sysctl", "-q", "-w"]).args(settings).status().unwrap();
        assert!(st.success(), "sysctl {settings:?} in {ns}");
    }

    /// `tern serve` in B on PREFIX.2:7788 for `root`, once it listens.
    pub(crate) fn serve(&mut self, root: &Path, token: &Path) {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.b, tern_bin(), "serve", "--listen", &format!("{}.2:7788", self.prefix), "--root"])
            .arg(root)
            .arg("--token-file")
            .arg(token)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            use std::io::BufRead;
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                if line.contains("listening on") {
                    let _ = tx.send(());
                }
            }
        });
        self.daemon = Some(child);
        rx.recv_timeout(Duration::from_secs(10)).expect("the daemon in the namespace did not start");
    }

    /// The daemon's URL for `path`.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("tern://{}.2:7788/{path}", self.prefix)
    }

    /// `tern ARGS` run in A.
    pub(crate) fn tern(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.a, tern_bin()]).args(args).stdin(Stdio::null());
        run_bounded(cmd, Duration::from_secs(120))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        for ns in [&self.a, &self.b] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}
