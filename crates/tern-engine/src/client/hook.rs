//! Asking a daemon to run one of its arrival hooks (`tern cp --hook NAME`); the daemon's side
//! is `server/hook.rs`.

use tern_proto::Control;

use crate::client::session::ClientSpec;
use crate::error::{Side, TransferError};

/// Client: asks the daemon of `spec.dest` to run its hook `name` for the unit at `path`.
pub fn run_on_daemon(spec: &ClientSpec, name: &str, path: &str) -> Result<(), TransferError> {
    let crate::endpoint::Endpoint::Daemon { host, port, .. } = &spec.dest else {
        return Err(TransferError::fatal(Side::Destination, "a named hook needs a tern:// destination"));
    };
    let token = crate::client::session::read_token(spec)?;
    let key = tern_proto::auth::token_key(&token);
    let addr = format!("{}:{port}", crate::client::session::bracket(host));
    let sock = crate::client::session::connect(&addr)?;
    let (mut reader, writer, _, _) = crate::client::session::daemon_handshake(sock, &addr, &key)?;
    writer.send(&Control::Hook { name: name.to_string(), path: path.as_bytes().to_vec() })?;
    match reader.recv()? {
        Control::HookDone { status: 0, .. } => Ok(()),
        Control::HookDone { status, output } => {
            let tail = output.lines().last().unwrap_or("").trim();
            Err(TransferError::fatal(Side::Destination, format!("{path}: hook '{name}' on the daemon at {addr} exited with {status}: {tail}")))
        }
        Control::Fatal { side, message } => Err(TransferError::fatal(side, message)),
        _ => Err(TransferError::fatal(Side::Network, "the daemon answered the hook request with something else")),
    }
}
