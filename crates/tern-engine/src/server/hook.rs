//! Arrival hooks on a daemon (`tern serve --hook NAME=CMD`): the client names a registered hook
//! and a unit path; the daemon resolves the path inside its roots and runs only the operator's
//! command. A client can never make the daemon run a command of its choosing.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use tern_proto::Control;

use crate::error::{Side, TransferError};
use crate::net::control::CtrlWriter;
use crate::store::roots::Roots;

/// Registered hooks: name → shell command.
pub type Hooks = Arc<HashMap<String, String>>;

/// Parses `NAME=CMD`.
pub fn parse_hook(s: &str) -> Result<(String, String), String> {
    let (name, cmd) = s.split_once('=').ok_or_else(|| format!("--hook {s}: expected NAME=CMD"))?;
    let ok = !name.is_empty() && name.len() <= tern_proto::limits::MAX_HOOK_NAME && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
    if !ok || cmd.trim().is_empty() {
        return Err(format!("--hook {s}: NAME is 1-64 of [A-Za-z0-9._-] and CMD is not empty"));
    }
    Ok((name.to_string(), cmd.to_string()))
}

/// Daemon: runs the registered hook, answers `HookDone`, or `Fatal` naming why it refused.
pub(crate) fn serve(hooks: &Hooks, roots: &Roots, name: &str, wire_path: &[u8], writer: &CtrlWriter) -> Result<(), TransferError> {
    let refuse = |msg: String| {
        let _ = writer.send(&Control::Fatal { side: Side::Destination, message: msg.clone() });
        Err(TransferError::fatal(Side::Destination, msg))
    };
    let Some(cmd) = hooks.get(name) else {
        return refuse(format!("no hook '{name}' is registered on this daemon (its operator adds one with tern serve --hook {name}=CMD); refused"));
    };
    if !matches!(roots, Roots::Confined(_)) {
        return refuse("hooks run only on daemons".into());
    }
    let path = match roots.resolve(wire_path) {
        Ok(p) => p,
        Err(e) => return refuse(e.message),
    };
    // The whole path, symlinks followed, must stay in a root (resolve checked the deepest
    // existing part; the unit must exist, so that is all of it).
    if std::fs::symlink_metadata(&path).is_err() {
        return refuse(format!("{}: no such unit on this daemon; refused", String::from_utf8_lossy(wire_path)));
    }
    let (status, output) = run_local(cmd, &path);
    tracing::info!("hook {name} for {}: exit {status}", path.display());
    writer.send(&Control::HookDone { status, output })
}

/// Runs `sh -c CMD` with the unit's path in the environment; exit status (-1 for a signal) and
/// the tail of what it printed.
fn run_local(cmd: &str, unit: &Path) -> (i32, String) {
    let name = unit.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let child = Command::new("sh").arg("-c").arg(cmd).env("TERN_UNIT_PATH", unit).env("TERN_UNIT_NAME", name).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return (127, format!("cannot run sh: {e}")),
    };
    // Both pipes are read to the end so a chatty hook cannot block on a full pipe.
    let mut err = child.stderr.take().unwrap();
    // Without a thread for it, stderr is closed unread (the hook's writes there fail) rather
    // than read after stdout, which a full stderr pipe would block forever.
    let errs = crate::threads::spawn("tern-hook-err", move || {
        let mut b = Vec::new();
        let _ = err.read_to_end(&mut b);
        b
    })
    .ok();
    let mut out = Vec::new();
    let _ = child.stdout.take().unwrap().read_to_end(&mut out);
    out.extend(errs.and_then(|h| h.join().ok()).unwrap_or_default());
    let status = child.wait().ok().and_then(|s| s.code()).unwrap_or(-1);
    let text = String::from_utf8_lossy(&out);
    let tail = &text[text.len().saturating_sub(tern_proto::limits::MAX_MESSAGE)..];
    (status, tail.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hook_names() {
        assert_eq!(parse_hook("analyze=run.sh \"$TERN_UNIT_PATH\"").unwrap().0, "analyze");
        assert!(parse_hook("bad name=x").is_err());
        assert!(parse_hook("x=").is_err());
        assert!(parse_hook("noequals").is_err());
    }
}
