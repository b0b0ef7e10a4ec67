//! The cluster registry (issue 14, docs/cluster.md "Node registry"): the nodes of a site that
//! share a name, a PostgreSQL database, roots, version and secret. A node joins (refused with
//! one line naming it and the fix when it does not match the live nodes, or does not see their
//! file system), heartbeats on the database's clock, confirms the file system of nodes that join
//! after it, and leaves on a clean stop; `status` and `drain` serve `tern cluster`.
//!
//! Work units and leases are the next step (docs/cluster.md "Build order"); today a cluster is
//! its registry, and its nodes share the job table (`runner.rs`). A node whose heartbeats stop
//! landing fences itself (`Fence`) before the others may re-queue its jobs.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use sha2::{Digest, Sha256};

use crate::pg::{parse_url, pg_err};
use crate::store::StoreError;

/// A node silent for this many heartbeats is shown unreachable and no longer counts as live.
const SILENT_BEATS: i64 = 3;
/// A node fences itself this many heartbeats after the last one that landed was sent: a whole
/// heartbeat before the others may count it silent (docs/cluster.md "Jobs on a cluster").
const FENCE_BEATS: u32 = 2;
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
    watchdog: Option<JoinHandle<()>>,
    url: String,
    cluster: String,
    node: String,
    /// Changes when the node registers again after others counted it silent.
    incarnation: Arc<AtomicI64>,
    fence: Arc<Fence>,
}

/// Self-fencing: whether this node may run jobs, from when its last heartbeat that landed was
/// sent, on this node's monotonic clock.
///
/// The others count a node silent `SILENT_BEATS` heartbeats after its last `heartbeat_at`, which
/// the database stamps after the node sent that heartbeat; the node fences `FENCE_BEATS` after
/// the send, so network and database latency, and any offset between the clocks, only move its
/// fence earlier. What remains (one heartbeat) holds the grace between SIGTERM and SIGKILL
/// (a quarter heartbeat, at most 2 s) and the watchdog's lateness.
pub struct Fence {
    cluster: String,
    node: String,
    /// The database, for the fencing line: host and database, never the password.
    what: String,
    heartbeat: Duration,
    state: std::sync::Mutex<FenceState>,
    /// Called with true when the node fences (they return how many transfers they stopped),
    /// with false when it may take work again.
    listeners: std::sync::Mutex<Vec<FenceListener>>,
}

/// Told true when the node fences (returns how many transfers it stopped), false when it lifts.
pub type FenceListener = Box<dyn Fn(bool) -> usize + Send + Sync>;

struct FenceState {
    /// When the last heartbeat that landed was sent.
    last_ok: Instant,
    /// Why, while fenced.
    fenced: Option<String>,
}

impl std::fmt::Debug for Fence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fence").field("cluster", &self.cluster).field("node", &self.node).field("fenced", &self.fenced()).finish()
    }
}

impl Fence {
    fn new(spec: &NodeSpec, what: &str, last_ok: Instant) -> Self {
        Self {
            cluster: spec.cluster.clone(),
            node: spec.node.clone(),
            what: what.to_string(),
            heartbeat: spec.heartbeat,
            state: std::sync::Mutex::new(FenceState { last_ok, fenced: None }),
            listeners: std::sync::Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, FenceState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How long after the last heartbeat that landed the node fences.
    pub fn limit(&self) -> Duration {
        self.heartbeat * FENCE_BEATS
    }

    /// Between SIGTERM and SIGKILL of a fenced node's transfers.
    pub fn grace(&self) -> Duration {
        (self.heartbeat / 4).min(Duration::from_secs(2))
    }

    /// Since the last heartbeat that landed was sent.
    fn silent(&self) -> Duration {
        self.lock().last_ok.elapsed()
    }

    /// Why this node takes no work now; None while its heartbeats land. Also true the instant
    /// the limit passes, before the watchdog has noticed.
    pub fn fenced(&self) -> Option<String> {
        let st = self.lock();
        if let Some(why) = &st.fenced {
            return Some(why.clone());
        }
        let silent = st.last_ok.elapsed();
        (silent >= self.limit()).then(|| format!("node {} of cluster {} is fenced: no heartbeat has reached the cluster database for {:.1} s", self.node, self.cluster, silent.as_secs_f64()))
    }

    /// `f(true)` when the node fences (returning how many transfers it stopped), `f(false)` when
    /// it may take work again.
    pub fn on_change(&self, f: FenceListener) {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner()).push(f);
    }

    fn tell(&self, fenced: bool) -> usize {
        self.listeners.lock().unwrap_or_else(|p| p.into_inner()).iter().map(|f| f(fenced)).sum()
    }

    /// A heartbeat sent at `sent` landed. Does not un-fence: that takes `revive`'s checks.
    fn landed(&self, sent: Instant) {
        let mut st = self.lock();
        if st.fenced.is_none() && sent > st.last_ok {
            st.last_ok = sent;
        }
    }

    /// Fences now if not yet: says why in one line and stops the node's transfers.
    fn trip(&self, cause: &str) {
        let why = {
            let mut st = self.lock();
            if st.fenced.is_some() {
                return;
            }
            let why = format!("node {} of cluster {} is fenced: {cause}", self.node, self.cluster);
            st.fenced = Some(why.clone());
            why
        };
        let stopped = self.tell(true);
        tracing::error!(
            "{why}; the cluster database {} has not answered it, so it claims no jobs and stopped its {stopped} running transfer(s) (the other nodes re-queue them after {SILENT_BEATS} heartbeats; they resume from their journals); check this node's network path to PostgreSQL and the server; it takes work again by itself once heartbeats land",
            self.what
        );
    }

    /// The watchdog's check: fences once the limit has passed since the last heartbeat landed.
    fn check(&self) {
        let silent = self.lock().last_ok.elapsed();
        if silent >= self.limit() {
            self.trip(&format!("no heartbeat has reached the cluster database for {:.1} s ({FENCE_BEATS} heartbeats of {} ms)", silent.as_secs_f64(), self.heartbeat.as_millis()));
        }
    }

    /// Heartbeats land again (sent at `sent`), on a registration the node holds: it takes work.
    fn lift(&self, sent: Instant, how: &str) {
        let was = {
            let mut st = self.lock();
            st.last_ok = sent;
            st.fenced.take()
        };
        if was.is_some() {
            tracing::warn!("cluster {}: node {} reaches the cluster database {} again and {how}; it takes work again", self.cluster, self.node, self.what);
            self.tell(false);
        }
    }
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
    let (incarnation, registered) = register(&mut c, &what, &spec, &first_root)?;
    let stop = Arc::new(AtomicBool::new(false));
    let nodes = Arc::new(std::sync::Mutex::new(vec![spec.listen.clone()]));
    let fence = Arc::new(Fence::new(&spec, &what, registered));
    let incarnation = Arc::new(AtomicI64::new(incarnation));
    let thread = {
        let beat = Beat { url: url.to_string(), spec: spec.clone(), root: first_root, incarnation: incarnation.clone(), fence: fence.clone() };
        let (stop, nodes) = (stop.clone(), nodes.clone());
        std::thread::Builder::new().name("cluster-heartbeat".into()).spawn(move || heartbeat(c, &beat, &stop, &nodes)).map_err(|e| format!("cannot start the heartbeat thread: {e}"))?
    };
    // Apart from the heartbeats: a heartbeat blocked on a dead connection must not delay the fence.
    let watchdog = {
        let (stop, fence) = (stop.clone(), fence.clone());
        let every = (spec.heartbeat / 20).clamp(Duration::from_millis(5), Duration::from_millis(50));
        std::thread::Builder::new()
            .name("cluster-fence".into())
            .spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    fence.check();
                    std::thread::sleep(every);
                }
            })
            .map_err(|e| format!("cannot start the fencing thread: {e}"))?
    };
    Ok(Member { nodes, stop, thread: Some(thread), watchdog: Some(watchdog), url: url.to_string(), cluster: spec.cluster, node: spec.node, incarnation, fence })
}

/// Registers this node (at join, and again after the others counted it silent): the join's
/// checks, the row, the probe. Its incarnation, and when the statement that last stamped its
/// `heartbeat_at` was sent (where its fence starts).
fn register(c: &mut Client, what: &str, spec: &NodeSpec, first_root: &Path) -> Result<(i64, Instant), String> {
    let db = |e: postgres::Error| db_err(what, e);
    let (cluster, node) = (spec.cluster.as_str(), spec.node.as_str());
    let roots = roots_digest(&spec.roots);
    let secret = digest(&[b"tern cluster secret v1", cluster.as_bytes(), &spec.secret]);
    let beat_ms = spec.heartbeat.as_millis().clamp(100, 600_000) as i64;
    let incarnation = i64::from_le_bytes(random_bytes::<8>());
    let token = hex(&random_bytes::<16>());
    let probe_name = format!("{PROBE_PREFIX}{node}.{}", &token[..8]);
    let probe_path = first_root.join(&probe_name);
    let mut stamped = Instant::now();
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
        let verdict = await_probe(c, spec, incarnation, &db, &mut stamped);
        let _ = std::fs::remove_file(&probe_path);
        if let Err(e) = verdict {
            let _ = c.execute("UPDATE cluster_nodes SET state = 'left' WHERE cluster = $1 AND node = $2 AND incarnation = $3", &[&cluster, &node, &incarnation]);
            return Err(e);
        }
    }
    Ok((incarnation, stamped))
}

/// Waits for a live node to read this node's probe: its verdict, or a refusal when none comes.
fn await_probe(c: &mut Client, spec: &NodeSpec, incarnation: i64, db: &dyn Fn(postgres::Error) -> String, stamped: &mut Instant) -> Result<(), String> {
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
                // Its heartbeat too: the probe's wait may have been longer than it is silent for.
                *stamped = Instant::now();
                c.execute("UPDATE cluster_nodes SET state = 'active', heartbeat_at = now() WHERE cluster = $1 AND node = $2 AND incarnation = $3", &[&cluster, &node, &incarnation]).map_err(db)?;
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

/// What the heartbeat thread needs.
struct Beat {
    url: String,
    spec: NodeSpec,
    root: PathBuf,
    incarnation: Arc<AtomicI64>,
    fence: Arc<Fence>,
}

/// Every `spec.heartbeat`: marks this node alive, and reads the probes of nodes joining after it.
/// A failed heartbeat drops its connection and is retried on a new one at a tenth of the
/// interval (until others may count it silent, then once an interval), so a database restart
/// shorter than about a heartbeat never fences; a lost database is said once a minute. Once fenced, it revives the registration, or registers again where the
/// others counted it silent or another process took it over.
fn heartbeat(c: Client, b: &Beat, stop: &AtomicBool, nodes: &std::sync::Mutex<Vec<String>>) {
    let (cluster, node, spec) = (b.spec.cluster.as_str(), b.spec.node.as_str(), &b.spec);
    let mut conn = Some(c);
    let mut said = None::<Instant>;
    let retry = (spec.heartbeat / 10).max(Duration::from_millis(50));
    while !stop.load(Ordering::SeqCst) {
        let sent = Instant::now();
        let outcome = match conn.as_mut() {
            Some(c) => Ok(c),
            None => beat_connect(&b.url, spec.heartbeat).map(|c| conn.insert(c)),
        }
        .and_then(|c| {
            let db = |e: postgres::Error| db_err(&b.fence.what, e);
            let incarnation = b.incarnation.load(Ordering::SeqCst);
            if b.fence.fenced().is_none() {
                match beat_once(c, cluster, node, incarnation, &b.root).map_err(db)? {
                    true => {
                        b.fence.landed(sent);
                        if let Ok(live) = working_nodes(c, cluster) {
                            *nodes.lock().unwrap() = live;
                        }
                    }
                    false => b.fence.trip("its registration was taken over by another process (or marked left)"),
                }
                return Ok(());
            }
            // Fenced: take work again only on a registration that nobody counted silent (then
            // nobody re-queued its jobs), else register again with the join's checks.
            b.fence.trip("its heartbeats stopped landing");
            if revive(c, cluster, node, incarnation).map_err(db)? {
                b.fence.lift(sent, "its registration is still live");
            } else {
                let (fresh, stamped) = register(c, &b.fence.what, spec, &b.root)?;
                b.incarnation.store(fresh, Ordering::SeqCst);
                b.fence.lift(stamped, "registered again (the other nodes had counted it silent)");
            }
            Ok(())
        });
        let wait = match outcome {
            Ok(()) => {
                said = None;
                spec.heartbeat
            }
            Err(e) => {
                if said.is_none_or(|t| t.elapsed() > Duration::from_secs(60)) {
                    tracing::warn!("cluster {cluster}: node {node} cannot reach the database or rejoin ({e}); retrying");
                    said = Some(Instant::now());
                }
                // A connection that failed once is not trusted again: it may be half dead.
                conn = None;
                // Quickly while its registration may still be live (a fenced node back by then
                // keeps its jobs' queue places and needs no join), then once a heartbeat.
                if b.fence.silent() < spec.heartbeat * SILENT_BEATS as u32 { retry } else { spec.heartbeat }
            }
        };
        let until = Instant::now() + wait;
        while !stop.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50).min(wait));
        }
    }
}

/// The heartbeat's connection: a dead peer is noticed by TCP keepalives within a few
/// heartbeats even while a statement waits (the fence does not wait for it; recovery does).
fn beat_connect(url: &str, heartbeat: Duration) -> Result<Client, String> {
    let (mut config, what) = parse_url(url, "tern-cluster").map_err(store_err)?;
    let probe = heartbeat.max(Duration::from_secs(1));
    config.keepalives(true).keepalives_idle(probe).keepalives_interval(probe).keepalives_retries(2);
    let mut c = config.connect(NoTls).map_err(|e| db_err(&what, e))?;
    c.batch_execute("SET lock_timeout = '5s'; SET statement_timeout = '30s'").map_err(|e| db_err(&what, e))?;
    crate::pg::migrate(&mut c).map_err(|e| db_err(&what, e))?.map_err(store_err)?;
    Ok(c)
}

/// A fenced node's heartbeat: lands only while its registration is its own and live (younger
/// than `SILENT_BEATS` heartbeats), i.e. while no other node may yet have re-queued its jobs.
fn revive(c: &mut Client, cluster: &str, node: &str, incarnation: i64) -> Result<bool, postgres::Error> {
    let n = c.execute(
        "UPDATE cluster_nodes SET heartbeat_at = now() WHERE cluster = $1 AND node = $2 AND incarnation = $3 AND state <> 'left'
           AND now() - heartbeat_at < (heartbeat_ms * $4)::float8 * interval '1 millisecond'",
        &[&cluster, &node, &incarnation, &SILENT_BEATS],
    )?;
    Ok(n == 1)
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

    /// Whether this node may run jobs (the runner asks, `/healthz` says).
    pub fn fence(&self) -> Arc<Fence> {
        self.fence.clone()
    }

    /// Leaves the cluster: heartbeats stop and the node shows `left`.
    pub fn leave(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        for t in [self.thread.take(), self.watchdog.take()].into_iter().flatten() {
            let _ = t.join();
        }
        if let Ok((mut c, _)) = connect(&self.url) {
            let incarnation = self.incarnation.load(Ordering::SeqCst);
            let _ = c.execute("UPDATE cluster_nodes SET state = 'left' WHERE cluster = $1 AND node = $2 AND incarnation = $3", &[&self.cluster, &self.node, &incarnation]);
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

    fn spec(heartbeat_ms: u64) -> NodeSpec {
        NodeSpec {
            cluster: "site".into(),
            node: "dtn01".into(),
            host: "h".into(),
            version: "0".into(),
            roots: vec![],
            secret: vec![],
            listen: "127.0.0.1:1".into(),
            heartbeat: Duration::from_millis(heartbeat_ms),
        }
    }

    #[test]
    fn a_node_fences_two_heartbeats_after_the_last_that_landed_and_only_lifting_unfences_it() {
        let fence = Fence::new(&spec(40), "at db:5432 (database tern)", Instant::now());
        let told = Arc::new(std::sync::Mutex::new(Vec::new()));
        let t = told.clone();
        fence.on_change(Box::new(move |on| {
            t.lock().unwrap().push(on);
            1
        }));
        assert_eq!((fence.limit(), fence.grace()), (Duration::from_millis(80), Duration::from_millis(10)));
        fence.landed(Instant::now());
        fence.check();
        assert!(fence.fenced().is_none());
        std::thread::sleep(Duration::from_millis(90));
        // Past the limit it is fenced before the watchdog looks, and the watchdog says it once.
        assert!(fence.fenced().is_some_and(|w| w.contains("node dtn01 of cluster site is fenced")));
        fence.check();
        fence.check();
        assert_eq!(*told.lock().unwrap(), [true]);
        // A heartbeat that lands does not un-fence (that takes the registration's checks).
        fence.landed(Instant::now());
        assert!(fence.fenced().is_some());
        fence.lift(Instant::now(), "test");
        assert!(fence.fenced().is_none());
        assert_eq!(*told.lock().unwrap(), [true, false]);
        assert_eq!(Fence::new(&spec(60_000), "", Instant::now()).grace(), Duration::from_secs(2));
    }

    #[test]
    fn digests_separate_their_parts_and_secrets_are_salted_by_cluster() {
        assert_ne!(digest(&[b"ab", b"c"]), digest(&[b"a", b"bc"]));
        let s = b"0123456789abcdef";
        assert_ne!(digest(&[b"tern cluster secret v1", b"one", s]), digest(&[b"tern cluster secret v1", b"two", s]));
    }
}
