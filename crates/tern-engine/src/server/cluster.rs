//! What a daemon that is a cluster node says about its cluster (`ClusterRequest`): the live nodes
//! that take work, as the registry's heartbeat last saw them. The registry lives in the service
//! crate; `tern serve` hands its view in with [`set_view`].

use std::sync::OnceLock;

use tern_proto::Control;
use tern_proto::msg::{MAX_ADDR, MAX_CLUSTER_NAME, MAX_CLUSTER_NODES};

use crate::error::TransferError;
use crate::net::control::CtrlWriter;

/// The cluster's name and its nodes' addresses, now.
pub type View = Box<dyn Fn() -> (String, Vec<String>) + Send + Sync>;

static VIEW: OnceLock<View> = OnceLock::new();

/// Makes this daemon answer cluster requests from `view` (once per process; later calls are
/// ignored).
pub fn set_view(view: View) {
    let _ = VIEW.set(view);
}

/// The answer: a daemon outside any cluster names no nodes, and clients then use it alone.
pub(crate) fn serve(writer: &CtrlWriter) -> Result<(), TransferError> {
    let (cluster, nodes) = VIEW.get().map(|v| v()).unwrap_or_default();
    let cluster = if cluster.len() > MAX_CLUSTER_NAME { String::new() } else { cluster };
    let nodes = nodes.into_iter().filter(|n| !n.is_empty() && n.len() <= MAX_ADDR).take(MAX_CLUSTER_NODES).map(String::into_bytes).collect();
    writer.send(&Control::ClusterNodes { cluster, nodes })
}
