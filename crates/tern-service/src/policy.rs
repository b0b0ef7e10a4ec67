//! What a token may make the service do on its behalf (issue 10). Every field of a job that
//! names a program, a host, a file or an address is decided here, at submit and again when the
//! job starts (a token, a link or a file may have changed while it waited):
//!
//! | field | rule |
//! |---|---|
//! | `options.ssh`, `options.remote_bin`, `options.watch.on_arrival` (not on a daemon) | programs: admin tokens only |
//! | remote hosts in `src`/`dst` (`host:`, `tern://host`) | admin, or a host the operator allows (`--allow-host`) |
//! | local `src`/`dst`, `options.token_file`, `options.dst_token_file`, `options.watch.ready` `log:FILE` | beneath the operator's roots and the token's prefix, as the kernel resolves them (`confine.rs`); never the state directory |
//! | token files | owner-only (0600), else refused with the fix |
//! | `options.watch.until` | relative to the watched directory, no `..` |
//! | `notify` | public addresses unless the operator allows more (`netallow.rs`) |
//! | who the child runs as | a root service: the token's `--run-as` account, else refused unless `--allow-root-transfers` |

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use tern_engine::endpoint::Endpoint;

use crate::confine::Roots;
use crate::model::{JobSpec, Scope, TokenInfo};
use crate::netallow::Allow;
use crate::runas::{self, Account};

#[derive(Debug, Clone, Default)]
pub struct Policy {
    pub roots: Roots,
    /// `--allow-host`: hosts non-admin jobs may reach (`*`: any).
    pub allow_hosts: Vec<String>,
    pub webhook_allow: Vec<Allow>,
    /// `--allow-root-transfers`: a root service may run unmapped tokens' jobs as root.
    pub allow_root_transfers: bool,
}

/// Why a job may not run: `forbidden` (403) or malformed (400).
#[derive(Debug)]
pub struct Refusal {
    pub forbidden: bool,
    pub message: String,
}

fn no(m: impl Into<String>) -> Refusal {
    Refusal { forbidden: true, message: m.into() }
}

impl Policy {
    /// The directories a job's local source and destination must stay beneath while its child
    /// runs (`check_job` checked them at start; the child holds to it when it opens them).
    pub fn fences(&self, spec: &JobSpec, token: &TokenInfo) -> (Option<PathBuf>, Option<PathBuf>) {
        let fence = |e: &str| match Endpoint::parse(e) {
            Ok(Endpoint::Local(p)) => self.roots.fence(&p.to_string_lossy(), token.path_prefix.as_deref()),
            _ => None,
        };
        (fence(&spec.src), fence(&spec.dst))
    }

    /// Everything but the webhook (which resolves names: `check_notify`). Returns the account
    /// the child runs as, if it is to drop privileges.
    pub fn check_job(&self, spec: &JobSpec, token: &TokenInfo) -> Result<Option<Account>, Refusal> {
        let admin = token.scope >= Scope::Admin;
        let o = &spec.options;
        if !admin {
            if o.ssh.is_some() {
                return Err(no("options.ssh names a command the service runs; it needs an admin token"));
            }
            if o.remote_bin.is_some() {
                return Err(no("options.remote_bin names a program the service runs on the remote host; it needs an admin token (the remote host's own tern is found on its PATH)"));
            }
            if spec.runs_command() {
                return Err(no("options.watch.on_arrival is a command the service runs (only tern:// hooks are names); it needs an admin token"));
            }
        }
        for (what, e) in [("src", &spec.src), ("dst", &spec.dst)] {
            let ep = Endpoint::parse(e).map_err(|m| Refusal { forbidden: false, message: format!("{what}: {m}") })?;
            match &ep {
                Endpoint::Local(p) => {
                    self.roots.check(what, &p.to_string_lossy(), token.path_prefix.as_deref()).map_err(no)?;
                }
                Endpoint::Ssh { host, .. } | Endpoint::Daemon { host, .. } => {
                    if !admin && !self.host_allowed(host) {
                        return Err(no(format!(
                            "{what} host '{host}' is not one this service's jobs may reach; the operator allows hosts with tern serve --allow-host HOST (allowed: {})",
                            if self.allow_hosts.is_empty() { "none".to_string() } else { self.allow_hosts.join(", ") }
                        )));
                    }
                    if let Some(prefix) = &token.path_prefix
                        && !crate::tokens::path_allowed(prefix, &ep.path_str())
                    {
                        return Err(no(format!("{what} path '{}' is outside this token's prefix {prefix}", ep.path_str())));
                    }
                }
            }
        }
        for (what, f) in [("options.token_file", &o.token_file), ("options.dst_token_file", &o.dst_token_file)] {
            if let Some(f) = f {
                let real = self.roots.check(what, f, token.path_prefix.as_deref()).map_err(no)?;
                if let Ok(m) = std::fs::metadata(&real)
                    && m.permissions().mode() & 0o077 != 0
                {
                    return Err(no(format!("{what} {f} is readable by other users (mode {:o}); a token file must be private: chmod 600 {f}", m.permissions().mode() & 0o777)));
                }
            }
        }
        if let Some(file) = o.watch.as_ref().and_then(|w| w.ready.as_deref()).and_then(|r| r.strip_prefix("log:")).and_then(|r| r.rsplit_once(':')).map(|(f, _)| f) {
            // Relative names are inside the watched directory, which is checked above.
            if file.starts_with('/') {
                self.roots.check("options.watch.ready log file", file, token.path_prefix.as_deref()).map_err(no)?;
            } else if file.split('/').any(|c| c == "..") {
                return Err(no("options.watch.ready: the log file must not contain '..'"));
            }
        }
        if let Some(until) = o.watch.as_ref().and_then(|w| w.until.as_deref())
            && (until.starts_with('/') || until.split('/').any(|c| c == ".."))
        {
            // SRC/FILE: an absolute or `..` name would probe for files outside the roots.
            return Err(no("options.watch.until names a file inside the watched directory: relative, without '..'"));
        }
        self.account(token)
    }

    /// A scheduled path test (docs/security-service.md "Scheduled path tests"): `dest` and
    /// `token_file` as a job's destination and token file; a local dest (a self-test that
    /// writes a scratch file there) needs an admin token. Returns the account it runs as.
    pub fn check_test(&self, spec: &crate::model::pathtest::TestSpec, token: &TokenInfo) -> Result<Option<Account>, Refusal> {
        if spec.is_local() && token.scope < Scope::Admin {
            return Err(no("dest is a local path: a loopback self-test of the service's host needs an admin token; schedule tests to remote hosts (tern://HOST/DIR or HOST:DIR)"));
        }
        self.check_job(&spec.as_job(), token)
    }

    fn host_allowed(&self, host: &str) -> bool {
        let h = host.trim_start_matches('[').trim_end_matches(']');
        self.allow_hosts.iter().any(|a| a == "*" || a.eq_ignore_ascii_case(h))
    }

    /// The account a job of `token` runs as: its mapping on a root service; nobody else's.
    pub fn account(&self, token: &TokenInfo) -> Result<Option<Account>, Refusal> {
        match (&token.run_as, runas::is_root()) {
            (Some(user), true) => runas::lookup(user).map(Some).map_err(no),
            (Some(user), false) => {
                let a = runas::lookup(user).map_err(no)?;
                // SAFETY: plain syscall.
                if a.uid != unsafe { libc::geteuid() } {
                    return Err(no(format!(
                        "token {} runs as '{user}', but this service does not run as root and cannot switch users; start it as root or map the token to the service's own account",
                        token.id
                    )));
                }
                Ok(None)
            }
            (None, true) if !self.allow_root_transfers => Err(no(format!(
                "this service runs as root and token {} has no run-as mapping, so its transfers would run as root; an admin maps it to a local account (tern token create --run-as USER), or the operator starts tern serve with --allow-root-transfers",
                token.id
            ))),
            (None, _) => Ok(None),
        }
    }

    /// The webhook URL (blocking: resolves the host).
    pub fn check_notify(&self, spec: &JobSpec) -> Result<(), Refusal> {
        match spec.notify.as_deref() {
            Some(url) if !url.starts_with("mailto:") => crate::netallow::check_webhook(url, &self.webhook_allow).map(|_| ()).map_err(no),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::JobOptions;

    fn token(scope: Scope) -> TokenInfo {
        TokenInfo { id: "t1".into(), name: "t".into(), scope, path_prefix: None, created_by: None, created_at: 0, expires_at: None, revoked_at: None, last_used_at: None, run_as: None }
    }

    fn spec(src: &str, dst: &str) -> JobSpec {
        JobSpec { src: src.into(), dst: dst.into(), sync: false, label: None, notify: None, options: JobOptions::default() }
    }

    #[test]
    fn programs_and_hosts_need_admin_or_the_operator() {
        let p = Policy { allow_hosts: vec!["dtn2".into(), "[::1]".into(), "::1".into()], allow_root_transfers: true, ..Default::default() };
        let (t, a) = (token(Scope::Transfer), token(Scope::Admin));
        let ok = spec("tern://dtn2/x", "tern://dtn2:7701/y");
        assert!(p.check_job(&ok, &t).is_ok());
        let mut rb = ok.clone();
        rb.options.remote_bin = Some("/bin/sh -c 'id' #".into());
        assert!(p.check_job(&rb, &t).unwrap_err().message.contains("options.remote_bin"));
        assert!(p.check_job(&rb, &a).is_ok(), "admin may name programs");
        for host in ["tern://dtn3/x", "tern://DTN2.evil/x", "tern://169.254.169.254/x"] {
            let e = p.check_job(&spec(host, "tern://dtn2/y"), &t).unwrap_err();
            assert!(e.forbidden && e.message.contains("--allow-host"), "{host}: {}", e.message);
        }
        assert!(p.check_job(&spec("tern://DTN2/x", "tern://dtn2/y"), &t).is_ok(), "host names are case-insensitive");
        assert!(p.check_job(&spec("tern://dtn3/x", "tern://dtn2/y"), &a).is_ok(), "admin reaches any host");
        // No roots declared: no local path at all.
        assert!(p.check_job(&spec("/data/x", "tern://dtn2/y"), &a).unwrap_err().message.contains("--job-root"));
        let mut prefixed = token(Scope::Transfer);
        prefixed.path_prefix = Some("/alice".into());
        assert!(p.check_job(&spec("tern://dtn2/bob/x", "tern://dtn2/alice/y"), &prefixed).unwrap_err().message.contains("prefix"));
        let mut w = spec("tern://dtn2/x", "tern://dtn2/y");
        w.options.watch = Some(crate::model::WatchOptions { until: Some("../../etc/passwd".into()), ..Default::default() });
        assert!(p.check_job(&w, &a).unwrap_err().message.contains("options.watch.until"));
    }
}
