//! Executes the tern-proto machines' actions and owns the data-plane threads: the sending and
//! the receiving side of a session, whoever set it up. Imports neither `client` nor `server`.

pub mod receiver;
pub mod sender;

use crate::error::TransferError;
use crate::net::control::CtrlWriter;
use crate::net::transport::Closer;

/// A side that cannot start (no thread for a stream, its control reader, the walker or the
/// finalizer) tells the peer why and closes its streams: a peer left waiting on a channel that
/// nobody will write to again would wait forever (found with `prlimit --nproc=12`).
pub(crate) fn could_not_start(writer: &CtrlWriter, closers: &[Closer], e: TransferError) -> TransferError {
    let _ = writer.send(&tern_proto::msg::Control::Fatal { side: e.side, message: e.message_with_path() });
    for c in closers {
        c.close();
    }
    e
}
