//! The cluster registry (issue 14, docs/cluster.md "Node registry"): the nodes of a site that
//! share a name, a PostgreSQL database, roots, version and secret. A node joins (refused with
//! one line naming it and the fix when it does not match the live nodes, or does not see their
//! file system), heartbeats on the database's clock, confirms the file system of nodes that join
//! after it, and leaves on a clean stop; `status` and `drain` serve `tern cluster`.
//!
//! Work units and leases are the next step (docs/cluster.md "Build order"); today a cluster is
//! its registry.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use sha2::{Digest, Sha256};

use crate::pg::{parse_url, pg_err};
use crate::store::StoreError;

/// A node silent for this many heartbeats is shown unreachable and no longer counts as live.
const SILENT_BEATS: i64 = 3;
/// Probe files a joining node writes under the first root; its name follows.
const PROBE_PREFIX: &str = ".tern.cluster-probe.";

/// What a node is, as it joins.
#[derive(Clone, Debug)]
pub struct NodeSpec {
    pub cluster: String,
    pub node: String,
    /// The machine, for people (hostname).
    pub host: String,
    pub version: String,
    /// The daemon's roots, in order (the first holds the file-system probe).
    pub roots: Vec<PathBuf>,
    /// The daemon's token: only a salted digest reaches the database.
    pub secret: Vec<u8>,
    /// Where its daemon listens.
    pub listen: String,
    pub heartbeat: Duration,
}

/// One node as `tern cluster status` shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct NodeStatus {
    pub cluster: String,
    pub node: String,
    pub host: String,
    pub version: String,
    pub listen: String,
    /// joining, active, draining, left, or unreachable (silent for 3 heartbeats).
    pub state: String,
    /// Seconds since its last heartbeat, by the database's clock.
    pub heartbeat_age_s: f64,
    /// Seconds since it joined.
    pub up_s: f64,
    /// Jobs its runner had at its last heartbeat (0 once it left).
    pub running_jobs: i64,
    /// Bytes per second those jobs moved at its last heartbeat (0 once it left).
    pub rate_bps: f64,
    /// The host's 1-minute load average at its last heartbeat, where it could be read.
    pub load1: Option<f64>,
}

/// What this process's service runs now, for its heartbeats: written by the throughput sampler
/// (`report_load`); a daemon without the service runs no jobs and reports zeros.
static RUNNING_JOBS: AtomicU64 = AtomicU64::new(0);
/// Bytes per second, as f64 bits.
static RATE_BPS: AtomicU64 = AtomicU64::new(0);

/// Records the jobs this node runs now and the bytes/s they move; the next heartbeat stores them.
pub fn report_load(running_jobs: usize, rate_bps: f64) {
    RUNNING_JOBS.store(running_jobs as u64, Ordering::Relaxed);
    RATE_BPS.store(if rate_bps.is_finite() && rate_bps > 0.0 { rate_bps } else { 0.0 }.to_bits(), Ordering::Relaxed);
}

/// (running jobs, bytes/s, 1-minute load average) as a heartbeat stores them.
fn local_load() -> (i64, f64, Option<f64>) {
    let load1 = std::fs::read_to_string("/proc/loadavg").ok().and_then(|s| s.split_whitespace().next()?.parse::<f64>().ok());
    (RUNNING_JOBS.load(Ordering::Relaxed) as i64, f64::from_bits(RATE_BPS.load(Ordering::Relaxed)), load1)
}

/// A name a cluster or node may have: it lands in file names and log lines.
fn check_name(what: &str, s: &str) -> Result<(), String> {
    if s.is_empty() || s.len() > 64 || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)) || s.starts_with('.') {
        return Err(format!("{what} '{s}': use 1-64 letters, digits, '.', '_' or '-' (not starting with '.')"));
    }
    Ok(())
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn digest(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex(&h.finalize()[..16])
}

/// The roots as every node must have them: resolved, in order.
fn roots_digest(roots: &[PathBuf]) -> String {
    let resolved: Vec<Vec<u8>> = roots.iter().map(|r| std::fs::canonicalize(r).unwrap_or_else(|_| r.clone()).into_os_string().into_encoded_bytes()).collect();
    digest(&resolved.iter().map(Vec::as_slice).collect::<Vec<_>>())
}

fn random_bytes<const N: usize>() -> [u8; N] {
    let mut b = [0u8; N];
    // The OS source failing leaves zeros: the probe then still works, only less unique.
    let _ = getrandom::fill(&mut b);
    b
}

/// The store's words name the job database; here it is the cluster's.
fn store_err(e: StoreError) -> String {
    e.to_string().replacen("job database", "cluster database", 1)
}

/// A database error in the cluster's words (the store's name the job database).
fn db_err(what: &str, e: postgres::Error) -> String {
    store_err(pg_err(what, e))
}

/// Connects and brings the schema up to date (the cluster table is a migration), on the one
/// connection.
fn connect(url: &str) -> Result<(Client, String), String> {
    let (config, what) = parse_url(url, "tern-cluster").map_err(store_err)?;
    let mut c = config.connect(NoTls).map_err(|e| db_err(&what, e))?;
    c.batch_execute("SET lock_timeout = '5s'; SET statement_timeout = '30s'").map_err(|e| db_err(&what, e))?;
    crate::pg::migrate(&mut c).map_err(|e| db_err(&what, e))?.map_err(store_err)?;
    Ok((c, what))
}

/// A node's membership: heartbeats until `leave` (or the process ends).
pub struct Member {
    /// The live nodes that take work (`active`), as the last heartbeat read them.
    nodes: Arc<std::sync::Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    url: String,
    cluster: String,
    node: String,
    incarnation: i64,
}

/// Joins `spec.cluster` in the database at `url`. Refused, with one line naming the node and the
/// fix, when another live node has this name, or the live nodes run another version, serve other
/// roots or hold another secret, or none of them can read the probe this node writes under its
/// first root (not the same file system). The first node of a cluster is admitted alone.
pub fn join(url: &str, spec: NodeSpec) -> Result<Member, String> {
    check_name("--cluster", &spec.cluster)?;
    check_name("--node-name", &spec.node)?;
    let first_root = spec.roots.first().ok_or("a cluster node needs a --root")?.clone();
    let (mut c, what) = connect(url)?;
    let db = |e: postgres::Error| db_err(&what, e);
    let (cluster, node) = (spec.cluster.as_str(), spec.node.as_str());
    let roots = roots_digest(&spec.roots);
    let secret = digest(&[b"tern cluster secret v1", cluster.as_bytes(), &spec.secret]);
    let beat_ms = spec.heartbeat.as_millis().clamp(100, 600_000) as i64;
    let incarnation = i64::from_le_bytes(random_bytes::<8>());
    let token = hex(&random_bytes::<16>());
    let probe_name = format!("{PROBE_PREFIX}{node}.{}", &token[..8]);
    let probe_path = first_root.join(&probe_name);
    let mut tx = c.transaction().map_err(db)?;
    tx.execute("SELECT pg_advisory_xact_lock(hashtext('tern cluster ' || $1))", &[&cluster]).map_err(db)?;
    let live = tx
        .query(
            "SELECT node, host, version, roots_digest, secret_digest, state FROM cluster_nodes
             WHERE cluster = $1 AND state <> 'left' AND now() - heartbeat_at < (heartbeat_ms * $2)::float8 * interval '1 millisecond'",
            &[&cluster, &SILENT_BEATS],
        )
        .map_err(db)?;
    let mut members = 0;
    for r in &live {
        let (other, host, version, r_digest, s_digest, state): (String, String, String, String, String, String) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
        if other == node {
            return Err(format!(
                "node {node} of cluster {cluster} is already live on {host}; give this one another --node-name, or stop that one (it is unreachable after {SILENT_BEATS} missed heartbeats)"
            ));
        }
        if state == "joining" {
            continue;
        }
        members += 1;
        if version != spec.version {
            return Err(format!("node {node} runs tern {}, cluster {cluster} runs {version} (node {other}): run one version on every node", spec.version));
        }
        if r_digest != roots {
            return Err(format!("node {node}'s --root directories differ from node {other}'s in cluster {cluster}: every node serves the same roots, in the same order"));
        }
        if s_digest != secret {
            return Err(format!("node {node}'s token file holds another secret than node {other}'s in cluster {cluster}: copy the same --token-file to every node"));
        }
    }
    if members > 0 {
        std::fs::write(&probe_path, &token).map_err(|e| format!("node {node}: cannot write the cluster's file-system probe {}: {e}; the first --root must be writable", probe_path.display()))?;
    }
    let state = if members > 0 { "joining" } else { "active" };
    let probe_hash = digest(&[token.as_bytes()]);
    tx.execute(
        "INSERT INTO cluster_nodes (cluster, node, host, version, roots_digest, secret_digest, listen, state, incarnation, heartbeat_ms, probe_name, probe_hash, probe_verdict)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, NULL)
         ON CONFLICT (cluster, node) DO UPDATE SET host = $3, version = $4, roots_digest = $5, secret_digest = $6, listen = $7, state = $8,
           incarnation = $9, heartbeat_ms = $10, probe_name = $11, probe_hash = $12, probe_verdict = NULL, started_at = now(), heartbeat_at = now()",
        &[&cluster, &node, &spec.host, &spec.version, &roots, &secret, &spec.listen, &state, &incarnation, &beat_ms, &probe_name, &probe_hash],
    )
    .map_err(db)?;
    tx.commit().map_err(db)?;
    if members > 0 {
        let verdict = await_probe(&mut c, &spec, incarnation, &db);
        let _ = std::fs::remove_file(&probe_path);
        if let Err(e) = verdict {
            let _ = c.execute("UPDATE cluster_nodes SET state = 'left' WHERE cluster = $1 AND node = $2 AND incarnation = $3", &[&cluster, &node, &incarnation]);
            return Err(e);
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let nodes = Arc::new(std::sync::Mutex::new(vec![spec.listen.clone()]));
    let thread = {
        let (stop, url, spec, root, nodes) = (stop.clone(), url.to_string(), spec.clone(), first_root, nodes.clone());
        std::thread::Builder::new()
            .name("cluster-heartbeat".into())
            .spawn(move || heartbeat(c, &url, &spec, incarnation, &root, &stop, &nodes))
            .map_err(|e| format!("cannot start the heartbeat thread: {e}"))?
    };
    Ok(Member { nodes, stop, thread: Some(thread), url: url.to_string(), cluster: spec.cluster, node: spec.node, incarnation })
}

/// Waits for a live node to read this node's probe: its verdict, or a refusal when none comes.
fn await_probe(c: &mut Client, spec: &NodeSpec, incarnation: i64, db: &dyn Fn(postgres::Error) -> String) -> Result<(), String> {
    let (cluster, node) = (spec.cluster.as_str(), spec.node.as_str());
    // Live nodes look at joiners once per heartbeat of theirs; theirs may be longer than ours.
    let longest: i64 = c.query_one("SELECT COALESCE(MAX(heartbeat_ms), 0) FROM cluster_nodes WHERE cluster = $1 AND state IN ('active', 'draining')", &[&cluster]).map_err(db)?.get(0);
    let wait = Duration::from_millis(2 * longest.max(spec.heartbeat.as_millis() as i64) as u64) + Duration::from_secs(2);
    let until = Instant::now() + wait;
    loop {
        let verdict: Option<String> =
            c.query_one("SELECT probe_verdict FROM cluster_nodes WHERE cluster = $1 AND node = $2 AND incarnation = $3", &[&cluster, &node, &incarnation]).map_err(db)?.get(0);
        match verdict.as_deref() {
            Some(v) if v.starts_with("ok ") => {
                c.execute("UPDATE cluster_nodes SET state = 'active' WHERE cluster = $1 AND node = $2 AND incarnation = $3", &[&cluster, &node, &incarnation]).map_err(db)?;
                return Ok(());
            }
            Some(v) => {
                let (other, why) = v.strip_prefix("bad ").and_then(|r| r.split_once(' ')).unwrap_or(("?", v));
                return Err(format!(
                    "node {node} does not share node {other}'s file system (its probe under {} {why} there): every node of cluster {cluster} must mount the same file system at the same --root paths",
                    spec.roots[0].display()
                ));
            }
            None if Instant::now() >= until => {
                return Err(format!("node {node}: no live node of cluster {cluster} read its file-system probe within {} s; are the other nodes' heartbeats reaching the database?", wait.as_secs()));
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Every `spec.heartbeat`: marks this node alive, and reads the probes of nodes joining after it.
/// A lost database is retried (said once a minute); a registration another process took over
/// ends the loop.
fn heartbeat(mut c: Client, url: &str, spec: &NodeSpec, incarnation: i64, root: &Path, stop: &AtomicBool, nodes: &std::sync::Mutex<Vec<String>>) {
    let (cluster, node) = (spec.cluster.as_str(), spec.node.as_str());
    let mut said = None::<Instant>;
    while !stop.load(Ordering::SeqCst) {
        match beat_once(&mut c, cluster, node, incarnation, root) {
            Ok(true) => {
                said = None;
                if let Ok(live) = working_nodes(&mut c, cluster) {
                    *nodes.lock().unwrap() = live;
                }
            }
            Ok(false) => {
                tracing::warn!("cluster {cluster}: node {node}'s registration was taken over by another process; this one stops heartbeating");
                return;
            }
            Err(e) => {
                if said.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    tracing::warn!("cluster {cluster}: node {node} cannot reach the database ({e}); retrying every heartbeat");
                    said = Some(Instant::now());
                }
                if c.is_closed()
                    && let Ok((fresh, _)) = connect(url)
                {
                    c = fresh;
                }
            }
        }
        let until = Instant::now() + spec.heartbeat;
        while !stop.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50).min(spec.heartbeat));
        }
    }
}

/// One heartbeat; false if this registration is no longer ours.
fn beat_once(c: &mut Client, cluster: &str, node: &str, incarnation: i64, root: &Path) -> Result<bool, postgres::Error> {
    let (jobs, rate, load1) = local_load();
    let mine = c.query_opt(
        "UPDATE cluster_nodes SET heartbeat_at = now(), running_jobs = $4, rate_bps = $5, load1 = $6 WHERE cluster = $1 AND node = $2 AND incarnation = $3 AND state <> 'left' RETURNING state",
        &[&cluster, &node, &incarnation, &jobs, &rate, &load1],
    )?;
    let Some(row) = mine else { return Ok(false) };
    let state: String = row.get(0);
    if state == "joining" {
        return Ok(true);
    }
    let joiners = c.query("SELECT node, probe_name, probe_hash FROM cluster_nodes WHERE cluster = $1 AND state = 'joining' AND probe_verdict IS NULL AND node <> $2", &[&cluster, &node])?;
    for j in joiners {
        let (other, name, hash): (String, Option<String>, Option<String>) = (j.get(0), j.get(1), j.get(2));
        let verdict = match (name, hash) {
            // Only a probe's own name, in the root itself: a row cannot point this node elsewhere.
            (Some(name), Some(hash)) if name.starts_with(PROBE_PREFIX) && !name.contains('/') && name.len() <= 128 => match read_probe(&root.join(&name)) {
                Ok(token) if digest(&[token.as_bytes()]) == hash => format!("ok {node}"),
                Ok(_) => format!("bad {node} differs"),
                Err(_) => format!("bad {node} is missing"),
            },
            _ => format!("bad {node} is not a probe"),
        };
        c.execute("UPDATE cluster_nodes SET probe_verdict = $1 WHERE cluster = $2 AND node = $3 AND state = 'joining' AND probe_verdict IS NULL", &[&verdict, &cluster, &other])?;
    }
    Ok(true)
}

/// The addresses of the nodes that take work now: active (not draining, joining or left) and
/// heard from within their last 3 heartbeats, by name.
fn working_nodes(c: &mut Client, cluster: &str) -> Result<Vec<String>, postgres::Error> {
    let rows = c.query(
        "SELECT listen FROM cluster_nodes WHERE cluster = $1 AND state = 'active'
           AND now() - heartbeat_at < (heartbeat_ms * $2)::float8 * interval '1 millisecond' ORDER BY node",
        &[&cluster, &SILENT_BEATS],
    )?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// A probe's token: at most 64 bytes of it.
fn read_probe(path: &Path) -> std::io::Result<String> {
    use std::io::Read;
    let mut buf = Vec::new();
    std::fs::File::open(path)?.take(64).read_to_end(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

impl Member {
    /// The cluster's name and the addresses of its nodes that take work, as the last heartbeat
    /// saw them (what the daemon answers a `ClusterRequest` with).
    pub fn view(&self) -> impl Fn() -> (String, Vec<String>) + Send + Sync + 'static {
        let (name, nodes) = (self.cluster.clone(), self.nodes.clone());
        move || (name.clone(), nodes.lock().unwrap().clone())
    }

    /// Leaves the cluster: heartbeats stop and the node shows `left`.
    pub fn leave(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Ok((mut c, _)) = connect(&self.url) {
            let _ = c.execute("UPDATE cluster_nodes SET state = 'left' WHERE cluster = $1 AND node = $2 AND incarnation = $3", &[&self.cluster, &self.node, &self.incarnation]);
        }
    }
}

/// Every node of `cluster` (or of every cluster), by cluster and name.
pub fn status(url: &str, cluster: Option<&str>) -> Result<Vec<NodeStatus>, String> {
    let (mut c, what) = connect(url)?;
    nodes(&mut c, cluster, i64::MAX).map_err(|e| db_err(&what, e))
}

/// At most `limit` nodes of `cluster` (or of every cluster), by cluster and name.
fn nodes(c: &mut Client, cluster: Option<&str>, limit: i64) -> Result<Vec<NodeStatus>, postgres::Error> {
    let rows = c.query(
        "SELECT cluster, node, host, version, listen, state, heartbeat_ms,
                EXTRACT(EPOCH FROM now() - heartbeat_at)::float8, EXTRACT(EPOCH FROM now() - started_at)::float8,
                running_jobs, rate_bps, load1
         FROM cluster_nodes WHERE $1::text IS NULL OR cluster = $1 ORDER BY cluster, node LIMIT $2",
        &[&cluster, &limit],
    )?;
    Ok(rows
        .iter()
        .map(|r| {
            let (state, beat_ms, age): (String, i64, f64) = (r.get(5), r.get(6), r.get(7));
            let silent = state != "left" && age * 1000.0 >= (beat_ms * SILENT_BEATS) as f64;
            let left = state == "left";
            NodeStatus {
                cluster: r.get(0),
                node: r.get(1),
                host: r.get(2),
                version: r.get(3),
                listen: r.get(4),
                state: if silent { "unreachable".into() } else { state },
                heartbeat_age_s: age,
                up_s: r.get(8),
                running_jobs: if left { 0 } else { r.get(9) },
                rate_bps: if left { 0.0 } else { r.get(10) },
                load1: r.get(11),
            }
        })
        .collect())
}

/// A cluster node's own view of its cluster, for the API, the dashboard and `/metrics`: one
/// connection, opened on first use and again after the server dropped it.
pub struct Viewer {
    url: String,
    pub cluster: String,
    pub node: String,
    conn: std::sync::Mutex<Option<(Client, String)>>,
}

/// The most nodes a view lists: a cluster is a site's DTNs, tens at most.
pub const MAX_NODES: i64 = 256;

impl Viewer {
    pub fn new(url: &str, cluster: &str, node: &str) -> Self {
        Self { url: url.to_string(), cluster: cluster.to_string(), node: node.to_string(), conn: std::sync::Mutex::new(None) }
    }

    /// The cluster's nodes (at most `MAX_NODES`), by name. Blocks: call it off the async runtime.
    pub fn nodes(&self) -> Result<Vec<NodeStatus>, String> {
        let mut conn = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if conn.as_ref().is_none_or(|(c, _)| c.is_closed()) {
            *conn = Some(connect(&self.url)?);
        }
        let (c, what) = conn.as_mut().expect("connected above");
        let r = nodes(c, Some(&self.cluster), MAX_NODES).map_err(|e| db_err(what, e));
        if r.is_err() {
            // A fresh connection next time: this one may be broken.
            *conn = None;
        }
        r
    }
}

/// Drains `node` of `cluster` (it finishes its work and takes no more), or with `undo` makes a
/// draining node active again. False if there was no such node in the state to change.
pub fn drain(url: &str, cluster: &str, node: &str, undo: bool) -> Result<bool, String> {
    let (mut c, what) = connect(url)?;
    let (from, to) = if undo { ("draining", "active") } else { ("active", "draining") };
    let n = c.execute("UPDATE cluster_nodes SET state = $1 WHERE cluster = $2 AND node = $3 AND state = $4", &[&to, &cluster, &node, &from]).map_err(|e| db_err(&what, e))?;
    Ok(n == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_would_reach_file_names_or_logs_are_refused() {
        for bad in ["", ".hidden", "a/b", "a b", "x\n", &"n".repeat(65)] {
            assert!(check_name("--node-name", bad).is_err(), "{bad:?}");
        }
        for good in ["dtn01", "site-b.dtn_2", "A9"] {
            assert!(check_name("--node-name", good).is_ok(), "{good}");
        }
    }

    #[test]
    fn digests_separate_their_parts_and_secrets_are_salted_by_cluster() {
        assert_ne!(digest(&[b"ab", b"c"]), digest(&[b"a", b"bc"]));
        let s = b"0123456789abcdef";
        assert_ne!(digest(&[b"tern cluster secret v1", b"one", s]), digest(&[b"tern cluster secret v1", b"two", s]));
    }
}
