//! `tern cluster status|drain`: a cluster's nodes as its database knows them (docs/cluster.md),
//! readable from any machine that reaches the database.

use std::process::ExitCode;

use anyhow::{Result, anyhow};
use clap::{Args, Subcommand};

use crate::output::units;

#[derive(Subcommand)]
pub(crate) enum ClusterCommand {
    /// Every node of the cluster (or of every cluster): state, rate, jobs, load, version, address, heartbeat age.
    Status(StatusArgs),
    /// Let NODE finish its work and take no more (maintenance); --undo makes it active again.
    Drain(DrainArgs),
}

#[derive(Args)]
pub(crate) struct Db {
    /// The cluster's database, as given to `tern serve --db`.
    #[arg(long, env = "TERN_DB", value_name = "URL", hide_env_values = true)]
    db: String,
}

#[derive(Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    db: Db,
    /// Only this cluster's nodes.
    #[arg(long, value_name = "NAME")]
    cluster: Option<String>,
    /// One JSON object on stdout.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub(crate) struct DrainArgs {
    /// The node, as `tern cluster status` names it.
    node: String,
    #[arg(long, value_name = "NAME")]
    cluster: String,
    #[command(flatten)]
    db: Db,
    /// Make a draining node active again.
    #[arg(long)]
    undo: bool,
}

pub(crate) fn run(cmd: ClusterCommand) -> Result<ExitCode> {
    match cmd {
        ClusterCommand::Status(a) => {
            let nodes = tern_service::cluster::status(&a.db.db, a.cluster.as_deref()).map_err(|e| anyhow!(e))?;
            if a.json {
                println!("{}", serde_json::json!({ "type": "cluster_status", "nodes": nodes }));
                return Ok(ExitCode::SUCCESS);
            }
            if nodes.is_empty() {
                println!("no nodes{}", a.cluster.map(|c| format!(" in cluster {c}")).unwrap_or_default());
            }
            for n in &nodes {
                // Rate, jobs and load as of the node's last heartbeat, beside its state.
                let load = n.load1.map_or("load –".into(), |l| format!("load {l:.2}"));
                println!(
                    "{:<16} {:<16} {:<11} {:>11} {:>7} {:<10} {:<10} {:<22} heartbeat {:.1} s ago, up {:.0} s, on {}",
                    n.cluster,
                    n.node,
                    n.state,
                    units::rate(n.rate_bps),
                    format!("{} jobs", n.running_jobs),
                    load,
                    n.version,
                    n.listen,
                    n.heartbeat_age_s,
                    n.up_s,
                    n.host
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        ClusterCommand::Drain(a) => {
            if tern_service::cluster::drain(&a.db.db, &a.cluster, &a.node, a.undo).map_err(|e| anyhow!(e))? {
                eprintln!("tern: node {} of cluster {} is {}", a.node, a.cluster, if a.undo { "active again" } else { "draining: it finishes its work and takes no more" });
                Ok(ExitCode::SUCCESS)
            } else {
                let want = if a.undo { "draining" } else { "active" };
                eprintln!("tern: cluster {} has no {want} node {}; see tern cluster status", a.cluster, a.node);
                Ok(ExitCode::from(1))
            }
        }
    }
}
