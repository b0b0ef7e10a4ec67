//! The child `tern` command line the runner executes for a job: `tern cp|sync|watch --json
//! --progress-json`, one flag per option, endpoints after `--`.

use super::types::JobSpec;

impl JobSpec {
    /// Whether the job names a command the service's child runs on a host (an ssh command, or
    /// a watch hook anywhere but on a daemon, where hooks are names the operator registered).
    pub fn runs_command(&self) -> bool {
        let hook_is_command = self.options.watch.as_ref().is_some_and(|w| w.on_arrival.is_some()) && !self.dst.starts_with("tern://");
        self.options.ssh.is_some() || hook_is_command
    }

    /// The child's arguments after the binary name. Endpoints come after `--`, so they can
    /// never be taken for flags.
    pub fn child_args(&self) -> Vec<String> {
        let mut a: Vec<String> = match (&self.options.watch, self.sync) {
            (Some(_), _) => vec!["watch".into()],
            (None, true) => vec!["sync".into()],
            (None, false) => vec!["cp".into(), "-r".into()],
        };
        a.extend(["--json", "--progress-json", "--quiet"].map(String::from));
        if let Some(w) = &self.options.watch {
            for (flag, v) in [("--ready", &w.ready), ("--on-arrival", &w.on_arrival), ("--until", &w.until)] {
                if let Some(v) = v {
                    a.extend([flag.to_string(), v.clone()]);
                }
            }
            if let Some(n) = w.max_units {
                a.extend(["--max-units".into(), n.to_string()]);
            }
            for (on, flag) in [(w.in_order, "--in-order"), (w.delete_after_verified, "--delete-after-verified")] {
                if on {
                    a.push(flag.into());
                }
            }
        }
        let o = &self.options;
        let mut opt = |flag: &str, v: Option<String>| {
            if let Some(v) = v {
                a.push(flag.into());
                a.push(v);
            }
        };
        opt("--streams", o.streams.map(|s| s.to_string()));
        opt("--chunk-size", o.chunk_size.clone());
        opt("--bwlimit", o.bwlimit.clone());
        opt("--retry-for", o.retry_for.map(|s| s.to_string()));
        opt("--token-file", o.token_file.clone());
        opt("--dst-token-file", o.dst_token_file.clone());
        opt("--remote-bin", o.remote_bin.clone());
        opt("--ssh", o.ssh.clone());
        if o.fail_fast && o.watch.is_none() {
            a.push("--fail-fast".into());
        }
        if o.verify_full {
            a.extend(["--verify".into(), "full".into()]);
        }
        for rule in &o.filters {
            a.extend(["--filter".into(), rule.clone()]);
        }
        for (on, flag) in [(o.no_encrypt, "--no-encrypt"), (o.checksum, "--checksum"), (o.delete, "--delete"), (o.ignore_existing, "--ignore-existing")] {
            if on {
                a.push(flag.into());
            }
        }
        a.extend(["--".into(), self.src.clone(), self.dst.clone()]);
        a
    }
}

#[cfg(test)]
mod tests {
    use crate::model::{WatchOptions, spec};

    #[test]
    fn endpoints_come_after_double_dash() {
        let a = spec("/a", "h:/b").child_args();
        let i = a.iter().position(|x| x == "--").unwrap();
        assert_eq!(&a[i + 1..], ["/a", "h:/b"]);
        assert_eq!(&a[..2], ["cp", "-r"]);
    }

    #[test]
    fn a_third_party_jobs_dst_token_file_is_confined_and_passed_on() {
        let mut tp = spec("tern://a/x", "tern://b/y");
        tp.options.dst_token_file = Some("/etc/tern/b.token".into());
        assert!(tp.paths().contains(&"/etc/tern/b.token".to_string()));
        let args = tp.child_args();
        assert!(args.windows(2).any(|w| w == ["--dst-token-file", "/etc/tern/b.token"]), "{args:?}");
    }

    #[test]
    fn options_become_flags_and_the_deadline_stays_with_the_service() {
        let mut s = spec("/a", "/b");
        s.options.deadline = Some("2001-09-09T07:46:40Z".into());
        s.options.fail_fast = true;
        s.options.filters = vec!["+ */".into(), "- *.tmp".into()];
        assert!(s.child_args().contains(&"--fail-fast".to_string()) && !s.child_args().iter().any(|a| a.contains("deadline")));
        assert!(s.child_args().windows(4).any(|w| w == ["--filter", "+ */", "--filter", "- *.tmp"]));
    }

    #[test]
    fn watch_jobs_run_tern_watch() {
        let mut s = spec("/sim/out", "tern://dtn/incoming");
        s.options.watch = Some(WatchOptions { ready: Some("marker:*.done".into()), on_arrival: Some("analyze".into()), in_order: true, ..Default::default() });
        assert!(s.validate().is_ok());
        assert!(!s.runs_command(), "a daemon hook is a registered name");
        let a = s.child_args();
        assert_eq!(a[0], "watch");
        assert!(a.windows(2).any(|w| w == ["--ready", "marker:*.done"]) && a.contains(&"--in-order".to_string()));
        assert_eq!(&a[a.len() - 3..], ["--", "/sim/out", "tern://dtn/incoming"]);
        s.dst = "/local/dst".into();
        assert!(s.runs_command(), "a local hook is a shell command");
        s.options.watch.as_mut().unwrap().until = Some("--x".into());
        assert!(s.validate().is_err());
        s.options.watch.as_mut().unwrap().until = None;
        s.src = "h:/remote".into();
        assert!(s.validate().is_err());
    }
}
