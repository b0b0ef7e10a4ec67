//! `--on-arrival`: the command run at the destination once a unit verified. Local: here.
//! ssh: the user's own command over the user's own ssh. Daemon: a name the operator registered.

use std::process::{Command, Stdio};

use tern_engine::client::session::ClientSpec;
use tern_engine::endpoint::Endpoint;

#[derive(Clone, Debug)]
pub enum Hook {
    Local(String),
    Ssh {
        spec: ClientSpec,
        host: String,
        command: String,
    },
    /// A hook registered on the daemon with `tern serve --hook NAME=CMD`.
    Daemon {
        spec: ClientSpec,
        name: String,
    },
}

impl Hook {
    /// The hook for a destination: what HOOK means depends on where it runs.
    pub fn for_destination(spec: &ClientSpec, hook: &str) -> Hook {
        match &spec.dest {
            Endpoint::Local(_) => Hook::Local(hook.to_string()),
            Endpoint::Ssh { host, .. } => Hook::Ssh { spec: spec.clone(), host: host.clone(), command: hook.to_string() },
            Endpoint::Daemon { .. } => Hook::Daemon { spec: spec.clone(), name: hook.to_string() },
        }
    }
}

/// What the hook learns about its unit.
#[derive(Clone, Debug)]
pub struct HookEnv {
    /// The unit's path at the destination, as the destination names it.
    pub unit_path: String,
    pub name: String,
    pub seq: u64,
    pub attempt: u32,
}

impl HookEnv {
    fn vars(&self) -> [(&'static str, String); 4] {
        [("TERN_UNIT_PATH", self.unit_path.clone()), ("TERN_UNIT_NAME", self.name.clone()), ("TERN_UNIT_SEQ", self.seq.to_string()), ("TERN_HOOK_ATTEMPT", self.attempt.to_string())]
    }
}

#[derive(Debug)]
pub struct HookError {
    pub message: String,
    /// The destination could not be reached: try again without counting an attempt.
    pub network: bool,
}

pub fn run(hook: &Hook, env: &HookEnv) -> Result<(), HookError> {
    match hook {
        Hook::Local(cmd) => {
            let mut c = Command::new("sh");
            c.arg("-c").arg(cmd).envs(env.vars()).stdin(Stdio::null());
            // stdout carries the watch's JSON: the hook's output goes to stderr.
            if let Ok(fd) = std::os::fd::AsFd::as_fd(&std::io::stderr()).try_clone_to_owned() {
                c.stdout(Stdio::from(fd));
            }
            let status = c.status().map_err(|e| HookError { message: format!("cannot run sh: {e}"), network: false })?;
            if status.success() { Ok(()) } else { Err(HookError { message: format!("hook exited with {status}"), network: false }) }
        }
        Hook::Ssh { spec, host, command } => {
            let mut script = String::new();
            for (k, v) in env.vars() {
                let v = if k == "TERN_UNIT_PATH" { home_relative(&v) } else { quote(&v) };
                script.push_str(&format!("{k}={v}; export {k}; "));
            }
            script.push_str(command);
            let port = match &spec.dest {
                Endpoint::Ssh { port, .. } => *port,
                _ => None,
            };
            let mut c = tern_engine::client::session::ssh_command(spec, host, port);
            c.arg(script).stdin(Stdio::null());
            if let Ok(fd) = std::os::fd::AsFd::as_fd(&std::io::stderr()).try_clone_to_owned() {
                c.stdout(Stdio::from(fd));
            }
            let status = c.status().map_err(|e| HookError { message: format!("cannot run ssh: {e} (set --ssh or TERN_SSH)"), network: false })?;
            match status.code() {
                Some(0) => Ok(()),
                Some(255) => Err(HookError { message: format!("ssh to {host} failed (exit 255)"), network: true }),
                _ => Err(HookError { message: format!("hook on {host} exited with {status}"), network: false }),
            }
        }
        Hook::Daemon { spec, name } => {
            tern_engine::client::hook::run_on_daemon(spec, name, &env.unit_path).map_err(|e| HookError { network: e.scope == tern_engine::error::Scope::Network, message: e.to_string() })
        }
    }
}

/// Single-quoted for a POSIX shell.
pub fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// A remote path as the shell should see it: relative and `~/` paths start at `$HOME`, like scp.
fn home_relative(p: &str) -> String {
    if let Some(rest) = p.strip_prefix("~/") {
        format!("\"$HOME\"/{}", quote(rest))
    } else if p.starts_with('/') {
        quote(p)
    } else {
        format!("\"$HOME\"/{}", quote(p))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(quote("a'b"), "'a'\\''b'");
        assert_eq!(home_relative("~/x y"), "\"$HOME\"/'x y'");
        assert_eq!(home_relative("/abs"), "'/abs'");
    }

    #[test]
    fn local_hook_gets_the_unit_and_reports_failure() {
        let t = tempfile::tempdir().unwrap();
        let out = t.path().join("out");
        let env = HookEnv { unit_path: "/dst/snap 1".into(), name: "snap 1".into(), seq: 3, attempt: 1 };
        run(&Hook::Local(format!("echo \"$TERN_UNIT_PATH|$TERN_UNIT_SEQ\" > {}", out.display())), &env).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "/dst/snap 1|3\n");
        let e = run(&Hook::Local("exit 3".into()), &env).unwrap_err();
        assert!(e.message.contains("exit status: 3") && !e.network, "{}", e.message);
    }
}
