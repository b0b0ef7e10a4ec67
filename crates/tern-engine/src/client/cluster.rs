//! Asking a daemon which nodes serve its cluster (`ClusterRequest`), so that one transfer can be
//! spread over all of them (docs/cluster.md "Spreading a transfer").

use std::sync::Arc;

use tern_proto::Control;
use tern_proto::msg::FEATURE_CLUSTER;

use crate::client::session::{ClientSpec, ControlSession};
use crate::endpoint::Endpoint;
use crate::error::{Side, TransferError};
use crate::progress::Progress;

/// A cluster as one of its daemons described it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cluster {
    pub name: String,
    /// `host:port` of each node that takes work, the asked one included.
    pub nodes: Vec<String>,
}

/// The cluster the daemon at `ep` belongs to; `None` for a daemon outside any cluster, an older
/// one, or an endpoint that is no daemon.
pub fn of(spec: &ClientSpec, ep: &Endpoint) -> Result<Option<Cluster>, TransferError> {
    if !matches!(ep, Endpoint::Daemon { .. }) {
        return Ok(None);
    }
    let progress = Arc::new(Progress::default());
    let mut s = ControlSession::open(spec, ep, &progress)?;
    if s.features & FEATURE_CLUSTER == 0 {
        return Ok(None);
    }
    let answer = (|| {
        s.writer.send(&Control::ClusterRequest)?;
        match s.reader.recv()? {
            Control::ClusterNodes { cluster, nodes } => Ok((cluster, nodes)),
            Control::Fatal { side, message } => Err(TransferError::fatal(side, format!("{message} (on {})", s.peer))),
            _ => Err(TransferError::fatal(Side::Network, format!("{} answered a cluster request with something else (is it a compatible tern?)", s.peer))),
        }
    })();
    let (name, nodes) = answer.map_err(|e| s.explain(e))?;
    if name.is_empty() || nodes.is_empty() {
        return Ok(None);
    }
    let nodes = nodes.into_iter().filter_map(|n| String::from_utf8(n).ok()).collect();
    Ok(Some(Cluster { name, nodes }))
}
