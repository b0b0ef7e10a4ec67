//! Answering a client's file-system request (`FsRequest`) on the control channel; the work is
//! `store/fs_request.rs`.

use tern_proto::{Control, FsEntry, FsOp};

use crate::error::TransferError;
use crate::net::control::CtrlWriter;
use crate::store::fs_request::{Sink, perform};
use crate::store::roots::Roots;

/// Server: answers one `FsRequest` with `FsEntries`... `FsEnd`, or `Fatal` naming the path.
pub(crate) fn serve(roots: &Roots, op: FsOp, flags: u8, wire: &[u8], writer: &CtrlWriter) -> Result<(), TransferError> {
    let mut send = |batch: Vec<FsEntry>| writer.send(&Control::FsEntries(batch));
    let mut sink = Sink::new(&mut send);
    let r = perform(roots, op, flags, wire, &mut sink).and_then(|_| sink.flush());
    let count = sink.count;
    match r {
        Ok(()) => writer.send(&Control::FsEnd { count }),
        Err(e) => {
            let _ = writer.send(&Control::Fatal { side: e.side, message: e.message_with_path() });
            Err(e)
        }
    }
}
