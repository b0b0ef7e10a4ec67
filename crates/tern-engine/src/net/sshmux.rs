//! ssh connection reuse. An ssh login costs 16 round trips (1.1 s on a 68 ms path, 0.3 s on
//! loopback here) and `tern watch`, the service's jobs and scripted copies log in again and
//! again. With ssh's own multiplexing (ControlMaster, kept for a minute after the last session)
//! the later sessions open a channel on the live connection instead. A user whose ssh setup
//! already multiplexes (often for one-time-password logins) keeps theirs: overriding it would
//! force a fresh login.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Mutex;

/// How long an idle shared connection stays up (seconds).
const PERSIST_SECS: u32 = 60;
/// Unix socket paths are limited to 108 bytes; `%C` expands to 40 hex digits.
const MAX_SOCKET_PATH: usize = 100;

/// The `-o` options that turn reuse on for `host`, or none where the user's command or config
/// already decides about multiplexing, or no private socket directory can be had.
pub(crate) fn options(argv: &[String], host: &str) -> Vec<String> {
    if argv.iter().any(|a| a.to_ascii_lowercase().contains("control") || a == "-S") || user_config_multiplexes(argv, host) {
        return Vec::new();
    }
    let Some(dir) = socket_dir() else { return Vec::new() };
    vec!["-oControlMaster=auto".into(), format!("-oControlPath={}/%C", dir.display()), format!("-oControlPersist={PERSIST_SECS}")]
}

/// What `ssh -G` said, per ssh command and host, for this process's lifetime.
type Answers = HashMap<(Vec<String>, String), bool>;

/// `ssh -G` prints the configuration ssh would use for `host` without connecting.
fn user_config_multiplexes(argv: &[String], host: &str) -> bool {
    static SEEN: Mutex<Option<Answers>> = Mutex::new(None);
    let key = (argv.to_vec(), host.to_string());
    if let Some(&known) = SEEN.lock().unwrap().get_or_insert_with(HashMap::new).get(&key) {
        return known;
    }
    let out = Command::new(&argv[0]).args(&argv[1..]).args(["-G", "--", host]).stdin(Stdio::null()).stderr(Stdio::null()).output();
    // If ssh cannot even say, stay out of its way.
    let multiplexes = out.map_or(true, |o| !o.status.success() || configured(&String::from_utf8_lossy(&o.stdout)));
    SEEN.lock().unwrap().get_or_insert_with(HashMap::new).insert(key, multiplexes);
    multiplexes
}

/// True if the effective config (`ssh -G` output) sets a control master or path.
fn configured(config: &str) -> bool {
    config.lines().any(|l| match l.split_once(' ') {
        Some(("controlmaster", v)) => v.trim() != "false",
        Some(("controlpath", v)) => v.trim() != "none",
        _ => false,
    })
}

/// A directory only this user can enter: `$XDG_RUNTIME_DIR/tern-ssh` or `~/.cache/tern/ssh`
/// (overridable with `TERN_SSH_CONTROL_DIR`).
fn socket_dir() -> Option<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    let dir = match std::env::var_os("TERN_SSH_CONTROL_DIR") {
        Some(d) => PathBuf::from(d),
        None => match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(r) => PathBuf::from(r).join("tern-ssh"),
            None => PathBuf::from(std::env::var_os("HOME")?).join(".cache/tern/ssh"),
        },
    };
    if dir.as_os_str().len() + 1 + 40 > MAX_SOCKET_PATH {
        return None;
    }
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).ok()?;
    let md = std::fs::metadata(&dir).ok()?;
    // Someone else's directory, or one others can enter, would let them use our logins.
    if md.uid() != unsafe { libc::geteuid() } || md.permissions().mode() & 0o077 != 0 {
        return None;
    }
    Some(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_with_a_master_or_path_counts_as_multiplexing() {
        assert!(!configured("user root\ncontrolmaster false\ncontrolpath none\nport 22\n"));
        assert!(configured("controlmaster auto\ncontrolpath none\n"));
        assert!(configured("controlmaster false\ncontrolpath ~/.ssh/cm-%C\n"));
    }

    #[test]
    fn the_users_own_control_options_are_left_alone() {
        let argv: Vec<String> = ["ssh", "-o", "ControlPath=none"].map(String::from).to_vec();
        assert!(options(&argv, "example.org").is_empty());
        let argv: Vec<String> = ["ssh", "-S", "/tmp/sock"].map(String::from).to_vec();
        assert!(options(&argv, "example.org").is_empty());
    }
}
