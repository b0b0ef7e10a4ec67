//! Network namespaces joined by a veth pair, for tests of multi-host paths: two private ones
//! (`Netns::up`), or one beside this process's own (`Netns::up_from_here`, for a service that
//! runs here and reaches a daemon there).

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use super::{run_bounded, tern_bin};

/// A (`PREFIX.1`) and B (`PREFIX.2`) on a /24 of 198.19.0.0/16 a test file owns, named by this
/// process's id so parallel runs and the bench bed (`bench/netns.sh`'s tern-a/tern-b) are left
/// alone; removed on drop with the daemon started in B. `None` (with a note) where namespaces
/// cannot be made.
pub(crate) struct Netns {
    /// A's namespace; None: this process's own.
    pub a: Option<String>,
    pub b: String,
    dev_a: String,
    dev_b: String,
    prefix: String,
    daemon: Option<Child>,
}

fn ip(args: &[&str]) -> bool {
    Command::new("ip").args(args).stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success())
}

impl Netns {
    /// Two private namespaces.
    pub(crate) fn up(tag: &str, prefix: &str) -> Option<Self> {
        Self::make(tag, prefix, true)
    }

    /// B private, A this process's own namespace.
    pub(crate) fn up_from_here(tag: &str, prefix: &str) -> Option<Self> {
        Self::make(tag, prefix, false)
    }

    fn make(tag: &str, prefix: &str, private_a: bool) -> Option<Self> {
        let id = std::process::id();
        let (a, b, dev_a, dev_b) = (format!("tna{tag}{id}"), format!("tnb{tag}{id}"), format!("tnva{tag}{id}"), format!("tnvb{tag}{id}"));
        if !ip(&["netns", "add", &b]) {
            eprintln!("SKIP: cannot make network namespaces (needs root and iproute2)");
            return None;
        }
        let me = Netns { a: private_a.then(|| a.clone()), b: b.clone(), dev_a: dev_a.clone(), dev_b: dev_b.clone(), prefix: prefix.to_string(), daemon: None };
        if private_a {
            assert!(ip(&["netns", "add", &a]));
        }
        assert!(ip(&["link", "add", &dev_a, "type", "veth", "peer", "name", &dev_b]));
        assert!(ip(&["link", "set", &dev_b, "netns", &b]));
        if private_a {
            assert!(ip(&["link", "set", &dev_a, "netns", &a]));
        }
        for (ns, dev, addr) in [(me.a.as_deref(), &dev_a, format!("{prefix}.1/24")), (Some(b.as_str()), &dev_b, format!("{prefix}.2/24"))] {
            let n: Vec<&str> = ns.map_or(vec![], |ns| vec!["-n", ns]);
            let run = |rest: &[&str]| ip(&[n.as_slice(), rest].concat());
            assert!(run(&["addr", "add", &addr, "dev", dev]) && run(&["link", "set", dev, "up"]) && run(&["link", "set", "lo", "up"]));
        }
        Some(me)
    }

    /// `tc qdisc VERB dev DEV root ARGS` on A's (`a`) or B's side of the link (its egress).
    pub(crate) fn qdisc(&self, verb: &str, a: bool, args: &[&str]) {
        let (ns, dev) = if a { (self.a.as_deref(), &self.dev_a) } else { (Some(self.b.as_str()), &self.dev_b) };
        let n: Vec<&str> = ns.map_or(vec![], |ns| vec!["-n", ns]);
        let st = Command::new("tc").args(n).args(["qdisc", verb, "dev", dev, "root"]).args(args).status().unwrap();
        assert!(st.success(), "tc qdisc {verb} {args:?}");
    }

    /// Cuts the link: A's end goes down, and every packet between A and B is lost.
    pub(crate) fn cut(&self) {
        let n: Vec<&str> = self.a.as_deref().map_or(vec![], |ns| vec!["-n", ns]);
        assert!(ip(&[n.as_slice(), &["link", "set", &self.dev_a, "down"]].concat()));
    }

    /// `sysctl -w SETTINGS` in A (`a`) or B: the per-namespace ones (net.ipv4.tcp_*).
    pub(crate) fn sysctl(&self, a: bool, settings: &[&str]) {
        let ns = if a { self.a.as_deref().expect("A is private") } else { &self.b };
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
        let mut cmd = match &self.a {
            Some(a) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", a, tern_bin()]);
                c
            }
            None => Command::new(tern_bin()),
        };
        cmd.args(args).stdin(Stdio::null());
        run_bounded(cmd, Duration::from_secs(120))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        // Deleting a namespace deletes its end of the veth pair, and with it the pair.
        for ns in self.a.iter().chain([&self.b]) {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
        if self.a.is_none() {
            let _ = Command::new("ip").args(["link", "del", &self.dev_a]).stderr(Stdio::null()).status();
        }
    }
}
