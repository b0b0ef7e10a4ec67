//! File-system requests from the client: `tern ls`, `stat`, `mkdir`, `rm`, and the expansion
//! of remote globs. A local path is answered in this process (`store/fs_request.rs`); a remote
//! one over a control session without data streams (`FsRequest`).

use std::os::unix::ffi::OsStrExt;
use std::sync::Arc;

use tern_proto::glob::has_meta;
use tern_proto::msg::{FEATURE_FS_OPS, MAX_FS_BYTES, MAX_FS_ENTRIES};
use tern_proto::{Control, FsEntry, FsOp};

use crate::client::session::ClientSpec;
use crate::endpoint::Endpoint;
use crate::error::{Side, TransferError, show};
use crate::progress::Progress;
use crate::store::fs_request::{Sink, entry_bytes, perform, side_of, too_many};
use crate::store::roots::Roots;

/// Client: asks the side of `ep` (a local path here, an ssh host or a daemon) to do `op` on its
/// path; the entries of the answer. `spec` carries the ssh and token settings.
pub fn request(spec: &ClientSpec, ep: &Endpoint, op: FsOp, flags: u8) -> Result<Vec<FsEntry>, TransferError> {
    let mut out = Vec::new();
    let mut collect = |batch: Vec<FsEntry>| {
        out.extend(batch);
        Ok(())
    };
    let path = match ep {
        Endpoint::Local(p) => {
            let cwd = std::env::current_dir().map_err(|e| TransferError::io(side_of(op), ".", "cannot read the working directory", &e).into_fatal())?;
            let mut sink = Sink::new(&mut collect);
            perform(&Roots::Home(cwd), op, flags, p.as_os_str().as_bytes(), &mut sink)?;
            sink.flush()?;
            return Ok(out);
        }
        Endpoint::Ssh { path, .. } | Endpoint::Daemon { path, .. } => path.as_bytes().to_vec(),
    };
    if path.len() > tern_proto::limits::MAX_PATH {
        return Err(TransferError::fatal(side_of(op), format!("{}...: longer than {} bytes", show(&path[..64]), tern_proto::limits::MAX_PATH)));
    }
    let progress = Arc::new(Progress::default());
    let mut s = crate::client::session::ControlSession::open(spec, ep, &progress)?;
    let mut bytes = 0usize;
    let r = (|| {
        if s.features & FEATURE_FS_OPS == 0 {
            return Err(TransferError::fatal(Side::Network, format!("{} runs an older tern without remote ls/stat/mkdir/rm or globs; upgrade it there (or pass --install-remote over ssh)", s.peer)));
        }
        s.writer.send(&Control::FsRequest { op, flags, path })?;
        loop {
            match s.reader.recv()? {
                Control::FsEntries(batch) => {
                    bytes += batch.iter().map(entry_bytes).sum::<usize>();
                    if out.len() + batch.len() > MAX_FS_ENTRIES || bytes > MAX_FS_BYTES {
                        return Err(too_many());
                    }
                    out.extend(batch);
                }
                Control::FsEnd { count } if count == out.len() as u64 => return Ok(()),
                Control::FsEnd { count } => return Err(TransferError::fatal(Side::Network, format!("{} announced {count} entries but sent {}; a broken or hostile peer", s.peer, out.len()))),
                Control::Fatal { side, message } => return Err(TransferError::fatal(side, format!("{message} (on {})", s.peer))),
                _ => return Err(TransferError::fatal(Side::Network, format!("{} answered a file-system request with something else (is it a compatible tern?)", s.peer))),
            }
        }
    })();
    r.map_err(|e| s.explain(e))?;
    Ok(out)
}

/// Remote sources whose path holds a glob (`*`, `?`, `[`) are expanded on their side, as scp
/// and rsync do; local sources were the user's shell's to expand and are left alone. The
/// matches replace the pattern in place, sorted.
pub fn expand_sources(spec: &mut ClientSpec) -> Result<(), TransferError> {
    if !spec.sources.iter().any(|s| !s.is_local() && has_meta(s.path_str().as_bytes())) {
        return Ok(());
    }
    let mut out = Vec::new();
    for src in &spec.sources {
        let (Endpoint::Ssh { path, .. } | Endpoint::Daemon { path, .. }) = src else {
            out.push(src.clone());
            continue;
        };
        if !has_meta(path.as_bytes()) {
            out.push(src.clone());
            continue;
        }
        for e in request(spec, src, FsOp::Glob, 0)? {
            let name = String::from_utf8(e.name).map_err(|e| TransferError::fatal(Side::Source, format!("{}: a match for {path} is not UTF-8; copy its directory instead", show(e.as_bytes()))))?;
            out.push(match src {
                Endpoint::Ssh { host, port, .. } => Endpoint::Ssh { host: host.clone(), port: *port, path: name },
                Endpoint::Daemon { host, port, .. } => Endpoint::Daemon { host: host.clone(), port: *port, path: name },
                Endpoint::Local(_) => unreachable!(),
            });
        }
    }
    spec.sources = out;
    Ok(())
}
