//! The managed-service side of the command line (issue 4): `tern serve --http-listen` flags and
//! the client subcommands `submit`, `jobs`, `status`, `wait`, `cancel`, `retry`, `token`.
//! Kept apart from `cli.rs`, which only flattens these types in and dispatches to `run`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand};
use serde_json::{Value, json};
use tern_engine::endpoint::Endpoint;
use tern_service::client::Client;

/// Flags `tern serve` gains for the service.
#[derive(Args)]
pub(crate) struct ServeService {
    /// Also serve the managed-transfer API over HTTPS here, e.g. 0.0.0.0:7443 (off by default).
    #[arg(long, value_name = "ADDR")]
    http_listen: Option<String>,
    /// The service's database, TLS certificate and first admin token
    /// [default: $XDG_STATE_HOME/tern or ~/.local/state/tern].
    #[arg(long, env = "TERN_STATE_DIR", value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The job database: a postgres://USER@HOST[:PORT]/DB URL [default: SQLite, STATE_DIR/jobs.db].
    #[arg(long, env = "TERN_DB", value_name = "URL", hide_env_values = true)]
    db: Option<String>,
    /// Mail relay for `--notify mailto:ADDR`, e.g. localhost:25 (STARTTLS when it offers it).
    #[arg(long, value_name = "HOST:PORT")]
    smtp: Option<String>,
    /// Sender address of notification mails [default: tern@HOSTNAME].
    #[arg(long, value_name = "ADDR", requires = "smtp")]
    smtp_from: Option<String>,
    /// Transfers run at once; more wait in the queue, shared fairly between tokens.
    #[arg(long, default_value = "4")]
    max_jobs: usize,
    /// Attempts per job when failures are transient (network), with exponential backoff.
    #[arg(long, default_value = "4")]
    max_attempts: u32,
    /// First retry delay in milliseconds (doubles per attempt, capped at 5 minutes).
    #[arg(long, default_value = "2000", hide = true)]
    retry_base_ms: u64,
    /// A directory jobs may read and write local paths under, repeatable (resolved by the
    /// kernel: links may not lead out) [default: the daemon's --root directories].
    #[arg(long, value_name = "DIR")]
    job_root: Vec<PathBuf>,
    /// A host non-admin jobs may reach (ssh `HOST:` or `tern://HOST`), repeatable; `*` for any
    /// [default: none].
    #[arg(long, value_name = "HOST")]
    allow_host: Vec<String>,
    /// Webhook targets allowed besides public addresses: a host name, IP or CIDR, repeatable.
    #[arg(long, value_name = "HOST|CIDR")]
    webhook_allow: Vec<String>,
    /// A service running as root runs jobs of tokens without --run-as as root (off: refused).
    #[arg(long)]
    allow_root_transfers: bool,
    /// The shortest interval a scheduled path test may have, in seconds (tern test --every).
    #[arg(long, value_name = "SECS", default_value = "600", value_parser = clap::value_parser!(u64).range(1..))]
    test_min_interval: u64,
    /// Serve /metrics without a token (for a Prometheus scraper on a trusted network).
    #[arg(long)]
    metrics_anonymous: bool,
    /// The API's certificate chain (PEM) [default: a self-signed one in STATE_DIR/tls].
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Join this daemon to cluster NAME: the data transfer nodes of a site that share --db (a
    /// PostgreSQL server), the same --root paths on one file system, one tern version and one
    /// token file (docs/cluster.md). Refused in one line when this node does not match.
    #[arg(long, value_name = "NAME", requires = "db")]
    cluster: Option<String>,
    /// This node's name in the cluster [default: the host name].
    #[arg(long, value_name = "NAME", requires = "cluster")]
    node_name: Option<String>,
    /// Milliseconds between a cluster node's heartbeats (2 missed: it fences itself; 3 missed:
    /// unreachable, and the others re-queue its jobs).
    #[arg(long, default_value = "5000", hide = true)]
    cluster_heartbeat_ms: u64,
}

/// Joins `--cluster` if given: the membership, which heartbeats until `leave`.
pub(crate) fn join_cluster(a: &ServeService, roots: &[PathBuf], secret: &[u8], listen: &str) -> Result<Option<tern_service::cluster::Member>> {
    let Some(cluster) = &a.cluster else { return Ok(None) };
    let db = a.db.as_deref().unwrap_or_default();
    if !(db.starts_with("postgres://") || db.starts_with("postgresql://") || db.contains("host=")) {
        bail!("--cluster {cluster}: the nodes of a cluster share one PostgreSQL database; pass --db postgres://USER@HOST[:PORT]/DB");
    }
    let host = hostname();
    let version = tern_engine::faults::faults().version.clone().unwrap_or_else(|| env!("CARGO_PKG_VERSION").to_string());
    let spec = tern_service::cluster::NodeSpec {
        cluster: cluster.clone(),
        node: node_name(a),
        host,
        version,
        roots: roots.to_vec(),
        secret: secret.to_vec(),
        listen: listen.to_string(),
        heartbeat: Duration::from_millis(a.cluster_heartbeat_ms.max(100)),
    };
    let node = spec.node.clone();
    let member = tern_service::cluster::join(db, spec).map_err(|e| anyhow!("{e}"))?;
    eprintln!("tern serve: node {node} joined cluster {cluster}");
    Ok(Some(member))
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "localhost".into())
}

/// This node's name in its cluster: `--node-name`, else the host's name.
fn node_name(a: &ServeService) -> String {
    a.node_name.clone().unwrap_or_else(hostname)
}

/// Starts the service thread if `--http-listen` was given; otherwise does nothing at all.
/// `daemon_roots`: the daemon's `--root` directories, the default job roots.
/// `fence`: a cluster node's self-fencing, which its runner follows.
pub(crate) fn start(a: &ServeService, daemon_roots: &[PathBuf], fence: Option<std::sync::Arc<tern_service::cluster::Fence>>) -> Result<()> {
    let Some(listen) = &a.http_listen else { return Ok(()) };
    let state_dir = a.state_dir.clone().unwrap_or_else(tern_service::default_state_dir);
    std::fs::create_dir_all(&state_dir).with_context(|| format!("cannot create state directory {}", state_dir.display()))?;
    let job_roots = if a.job_root.is_empty() { daemon_roots } else { &a.job_root };
    let roots = tern_service::confine::Roots::new(job_roots, std::slice::from_ref(&state_dir)).map_err(|e| anyhow!(e))?;
    let webhook_allow = a.webhook_allow.iter().map(|w| tern_service::netallow::Allow::parse(w)).collect::<Result<Vec<_>, _>>().map_err(|e| anyhow!(e))?;
    let policy = tern_service::policy::Policy { roots, allow_hosts: a.allow_host.clone(), webhook_allow, allow_root_transfers: a.allow_root_transfers };
    if tern_service::runas::is_root() && !a.allow_root_transfers {
        eprintln!("tern serve: the service runs as root: only tokens mapped to a local account (tern token create --run-as USER) can run jobs");
    }
    let mut runner = tern_service::runner_config(a.max_jobs, a.max_attempts, Duration::from_millis(a.retry_base_ms), policy).map_err(|e| anyhow!(e))?;
    runner.test_min_every_s = a.test_min_interval;
    let started = tern_service::start(tern_service::ServiceConfig {
        state_dir: state_dir.clone(),
        http_listen: listen.clone(),
        db: a.db.clone(),
        smtp: a.smtp.clone(),
        smtp_from: a.smtp_from.clone(),
        runner,
        tls_cert: a.tls_cert.clone(),
        tls_key: a.tls_key.clone(),
        metrics_anonymous: a.metrics_anonymous,
        cluster_node: a.cluster.clone().map(|c| (c, node_name(a))),
        fence,
    })
    .map_err(|e| anyhow!(e))?;
    eprintln!("tern serve: service API on https://{} (state in {}, certificate {})", started.addr, state_dir.display(), state_dir.join("tls/cert.pem").display());
    eprintln!("tern serve: dashboard on https://{}/ (sign in with a token)", started.addr);
    if let Some(p) = started.admin_token_file {
        eprintln!("tern serve: first start: admin token written to {} (export TERN_TOKEN=$(cat {}))", p.display(), p.display());
    }
    Ok(())
}

/// Where the service is and the token to use (every client subcommand, and `tern test --every`).
#[derive(Args)]
pub(crate) struct ServerArgs {
    /// The service, e.g. https://dtn1:7443.
    #[arg(long, env = "TERN_SERVER")]
    server: Option<String>,
    /// API token, or @FILE to read it from a file.
    #[arg(long, env = "TERN_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// PEM certificate(s) to trust for the service (its STATE_DIR/tls/cert.pem).
    #[arg(long, env = "TERN_CA_FILE")]
    ca_file: Option<PathBuf>,
}

impl ServerArgs {
    pub(crate) fn client(&self) -> Result<Client> {
        let server = self.server.as_deref().ok_or_else(|| anyhow!("no service given: pass --server https://HOST:PORT or set TERN_SERVER"))?;
        let token = match self.token.as_deref() {
            None => bail!("no token given: pass --token T (or @FILE) or set TERN_TOKEN"),
            Some(t) => match t.strip_prefix('@') {
                Some(f) => read_private(f)?,
                None => t.to_string(),
            },
        };
        Client::new(server, &token, self.ca_file.as_deref()).map_err(|e| anyhow!(e))
    }
}

#[derive(Args)]
pub(crate) struct Conn {
    #[command(flatten)]
    server: ServerArgs,
    /// Machine-readable output on stdout.
    #[arg(long)]
    json: bool,
}

impl Conn {
    fn client(&self) -> Result<Client> {
        self.server.client()
    }
}

/// A token file must be the owner's alone, as ssh and rsyncd require of theirs.
fn read_private(f: &str) -> Result<String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(f).with_context(|| format!("cannot read token file {f}"))?.permissions().mode();
    if mode & 0o077 != 0 {
        bail!("token file {f} is readable by other users (mode {:o}); a token must be private: chmod 600 {f}", mode & 0o777);
    }
    std::fs::read_to_string(f).with_context(|| format!("cannot read token file {f}"))
}

#[derive(Subcommand)]
pub(crate) enum ServiceCommand {
    /// Hand a transfer to a tern service and return; prints the job id.
    Submit(Box<SubmitArgs>),
    /// List jobs, newest first.
    Jobs {
        /// Only jobs in this state (queued, running, retrying, succeeded, failed, canceled).
        #[arg(long)]
        state: Option<String>,
        #[arg(long, default_value = "50")]
        limit: u32,
        #[command(flatten)]
        conn: Conn,
    },
    /// A job's state, progress, rate, ETA and per-file errors.
    Status {
        id: u64,
        #[command(flatten)]
        conn: Conn,
    },
    /// Block until a job ends; exit 0 if it succeeded, 1 if it failed, 3 if canceled, 4 on --timeout.
    Wait {
        id: u64,
        /// Give up after this many seconds (default: wait as long as it takes).
        #[arg(long)]
        timeout: Option<u64>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Cancel a queued or running job (its transfer is stopped; verified data stays).
    Cancel {
        id: u64,
        #[command(flatten)]
        conn: Conn,
    },
    /// Queue a failed or canceled job again (it resumes: verified data is not re-sent).
    Retry {
        id: u64,
        /// A new deadline (RFC 3339 or 90m, 6h, 2d from now), for a job whose deadline passed.
        #[arg(long)]
        deadline: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// Create, list and revoke API tokens (admin).
    #[command(subcommand)]
    Token(TokenCommand),
}

#[derive(Args)]
pub(crate) struct SubmitArgs {
    /// Source: a path on the service's host, [user@]host:path or tern://host[:port]/path.
    src: String,
    /// Destination, same forms.
    dst: String,
    /// Mirror SRC's contents into DST (tern sync) instead of copying (tern cp -r).
    #[arg(long)]
    sync: bool,
    /// A name to recognise the job by.
    #[arg(long)]
    label: Option<String>,
    /// When the job ends: POST it as JSON to this http(s) URL, or mail mailto:ADDR (service needs --smtp).
    #[arg(long)]
    notify: Option<String>,
    /// Passed to the transfer: parallel streams.
    #[arg(long)]
    streams: Option<u16>,
    /// Passed to the transfer: chunk size, e.g. 4M.
    #[arg(long)]
    chunk_size: Option<String>,
    /// Passed to the transfer: rate cap, e.g. 800Mbit.
    #[arg(long)]
    bwlimit: Option<String>,
    /// Passed to the transfer.
    #[arg(long)]
    no_encrypt: bool,
    /// Passed to the transfer: re-read written data before declaring success.
    #[arg(long)]
    verify_full: bool,
    /// With --sync: compare content hashes.
    #[arg(long)]
    checksum: bool,
    /// With --sync: delete extras at the destination.
    #[arg(long)]
    delete: bool,
    /// Passed to the transfer: reconnect window in seconds.
    #[arg(long)]
    retry_for: Option<u64>,
    /// Token file for tern:// endpoints, as seen by the service.
    #[arg(long)]
    token_file: Option<String>,
    /// tern:// to tern:// jobs: the destination daemon's token file, when it differs from
    /// --token-file (then the source daemon's).
    #[arg(long)]
    dst_token_file: Option<String>,
    /// The ssh command for host: endpoints (admin tokens only).
    #[arg(long)]
    ssh: Option<String>,
    /// Passed to the transfer: the first file that fails fails the whole job.
    #[arg(long)]
    fail_fast: bool,
    /// Passed to the transfer: keep destination files that already exist.
    #[arg(long)]
    ignore_existing: bool,
    /// Fail the job if it has not finished by then: an RFC 3339 time (2026-11-22T06:00:00Z) or
    /// a duration from now (90m, 6h, 2d). A running transfer is stopped at the deadline.
    #[arg(long)]
    deadline: Option<String>,
    /// tern's path on the remote host.
    #[arg(long)]
    remote_bin: Option<String>,
    /// A watch job: ship each unit of the SRC directory as it is produced (tern watch).
    #[arg(long)]
    watch: bool,
    /// With --watch: the ready rule (close, marker:GLOB, log:FILE:REGEX, stable:SECONDS).
    #[arg(long, requires = "watch")]
    ready: Option<String>,
    /// With --watch: the hook run at the destination for each unit.
    #[arg(long, requires = "watch")]
    on_arrival: Option<String>,
    /// With --watch: hooks in production order.
    #[arg(long, requires = "watch")]
    in_order: bool,
    /// With --watch: delete each unit at the source once verified.
    #[arg(long, requires = "watch")]
    delete_after_verified: bool,
    /// With --watch: end once SRC/FILE exists and every unit is done.
    #[arg(long, requires = "watch")]
    until: Option<String>,
    /// With --watch: end after N units.
    #[arg(long, requires = "watch")]
    max_units: Option<u64>,
    /// Passed to the transfer: --exclude, --include, --filter ... (checked here, applied by the job).
    #[command(flatten)]
    pub(crate) filters: crate::filter_args::FilterArgs,
    #[command(flatten)]
    conn: Conn,
}

#[derive(Subcommand)]
pub(crate) enum TokenCommand {
    /// Create a token; its secret is printed once.
    Create {
        #[arg(long, value_parser = ["read", "transfer", "admin"])]
        scope: String,
        /// Lifetime: 90d, 12h, 30m or never.
        #[arg(long, default_value = "90d")]
        expires: String,
        #[arg(long)]
        name: Option<String>,
        /// Restrict the token's jobs to paths under this absolute prefix.
        #[arg(long)]
        path: Option<String>,
        /// Run this token's transfers as this local account (a service running as root).
        #[arg(long, value_name = "USER")]
        run_as: Option<String>,
        #[command(flatten)]
        conn: Conn,
    },
    /// List tokens (never their secrets).
    List {
        #[command(flatten)]
        conn: Conn,
    },
    /// Revoke a token by id; effective at its next request.
    Revoke {
        id: String,
        #[command(flatten)]
        conn: Conn,
    },
}

pub(crate) fn run(c: ServiceCommand) -> Result<ExitCode> {
    match c {
        ServiceCommand::Submit(a) => submit(*a),
        ServiceCommand::Jobs { state, limit, conn } => {
            let mut path = format!("/v1/jobs?limit={limit}");
            if let Some(s) = state {
                path.push_str(&format!("&state={}", s.trim()));
            }
            let v = call(&conn, "GET", &path, None)?;
            if conn.json {
                println!("{v}");
            } else {
                println!("{:>6}  {:<10} {:>8}  {:<20} SRC -> DST", "ID", "STATE", "DONE", "LABEL");
                for j in v["jobs"].as_array().into_iter().flatten() {
                    println!("{:>6}  {:<10} {:>8}  {:<20} {} -> {}", j["id"].as_u64().unwrap_or(0), s(&j["state"]), percent(j), s(&j["spec"]["label"]), s(&j["spec"]["src"]), s(&j["spec"]["dst"]));
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        ServiceCommand::Status { id, conn } => {
            let v = call(&conn, "GET", &format!("/v1/jobs/{id}"), None)?;
            if conn.json {
                println!("{v}")
            } else {
                print_status(&v)
            }
            Ok(ExitCode::SUCCESS)
        }
        ServiceCommand::Wait { id, timeout, conn } => wait(id, timeout, &conn),
        ServiceCommand::Cancel { id, conn } => simple(&conn, &format!("/v1/jobs/{id}/cancel")),
        ServiceCommand::Retry { id, deadline: None, conn } => simple(&conn, &format!("/v1/jobs/{id}/retry")),
        ServiceCommand::Retry { id, deadline: Some(d), conn } => {
            let v = call(&conn, "POST", &format!("/v1/jobs/{id}/retry"), Some(&json!({ "deadline": d })))?;
            if conn.json {
                println!("{v}")
            } else {
                println!("job {} is {}", v["id"], s(&v["state"]))
            }
            Ok(ExitCode::SUCCESS)
        }
        ServiceCommand::Token(t) => token(t),
    }
}

fn call(conn: &Conn, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
    conn.client()?.call(method, path, body).map_err(|e| anyhow!("{e}"))
}

fn s(v: &Value) -> String {
    v.as_str().map(str::to_string).unwrap_or_default()
}

fn percent(j: &Value) -> String {
    let p = &j["progress"];
    let (done, total) = (p["bytes"].as_f64().unwrap_or(0.0) + p["bytes_skipped"].as_f64().unwrap_or(0.0), p["bytes_total"].as_f64().unwrap_or(0.0));
    match s(&j["state"]).as_str() {
        "succeeded" => "100%".into(),
        _ if total > 0.0 => format!("{:.0}%", (100.0 * done / total).min(100.0)),
        _ => "-".into(),
    }
}

/// The units every tern display uses (`output::units`).
fn gb(b: f64) -> String {
    crate::output::units::size(b.max(0.0) as u64)
}

fn print_status(j: &Value) {
    println!("job {}  {}  (attempt {}{})", j["id"], s(&j["state"]), j["attempts"], j["spec"]["label"].as_str().map(|l| format!(", label {l}")).unwrap_or_default());
    println!("  {} -> {}{}", s(&j["spec"]["src"]), s(&j["spec"]["dst"]), if j["spec"]["sync"] == json!(true) { " (sync)" } else { "" });
    if let Some(d) = j["spec"]["options"]["deadline"].as_str() {
        println!("  deadline: {d}");
    }
    let (p, sum) = (&j["progress"], &j["summary"]);
    // A finished attempt's summary supersedes its last progress sample.
    if p.is_object() && !(sum.is_object() && j["state"] != "running") {
        let f = |k: &str| p[k].as_f64().unwrap_or(0.0);
        let rate = j["rate_bytes_per_s"].as_f64().unwrap_or(0.0);
        let eta = j["eta_s"].as_f64().map(|e| format!(", ETA {e:.0} s")).unwrap_or_default();
        let rate = format!("{} ({})", crate::output::units::rate(rate), crate::output::units::bits(rate));
        println!("  {} of {} ({}), {rate}{eta}", gb(f("bytes") + f("bytes_skipped")), gb(f("bytes_total")), percent(j));
        println!("  files: {} done, {} skipped, {} failed of {}", f("files_done"), f("files_skipped"), f("files_failed"), f("files_total"));
    }
    if sum.is_object() {
        println!(
            "  result: {} files, {} skipped, {} failed, {} in {:.1} s",
            sum["files"],
            sum["files_skipped"],
            sum["files_failed"],
            gb(sum["bytes"].as_f64().unwrap_or(0.0)),
            sum["seconds"].as_f64().unwrap_or(0.0)
        );
        for e in sum["errors"].as_array().into_iter().flatten().take(20) {
            println!("  error: {}: {}: {}", s(&e["side"]), s(&e["path"]), s(&e["message"]));
        }
    }
    if let Some(e) = j["error"].as_str() {
        println!("  reason: {e}");
    }
}

fn outcome(state: &str) -> ExitCode {
    match state {
        "succeeded" => ExitCode::SUCCESS,
        "canceled" => ExitCode::from(3),
        _ => ExitCode::from(1),
    }
}

fn wait(id: u64, timeout: Option<u64>, conn: &Conn) -> Result<ExitCode> {
    let client = conn.client()?;
    let deadline = timeout.map(|t| Instant::now() + Duration::from_secs(t));
    let mut failures = 0u32;
    let mut last = Value::Null;
    loop {
        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()).as_secs()).unwrap_or(30).min(30);
        match client.call("GET", &format!("/v1/jobs/{id}/wait?timeout_s={left}"), None) {
            Ok(j) => {
                failures = 0;
                let state = s(&j["state"]);
                last = j.clone();
                if matches!(state.as_str(), "succeeded" | "failed" | "canceled") {
                    if conn.json {
                        println!("{j}")
                    } else if state != "succeeded" {
                        print_status(&j)
                    }
                    return Ok(outcome(&state));
                }
            }
            // The service restarting (or a network blip) is no reason to give up on a job
            // that survives it: retry a few times, a few seconds apart.
            Err(e) if e.status == 0 && failures < 10 => {
                failures += 1;
                eprintln!("tern wait: {e}; retrying");
                std::thread::sleep(Duration::from_secs(2));
            }
            Err(e) => bail!("{e}"),
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            eprintln!("tern wait: job {id} still not finished after --timeout");
            if conn.json {
                // A script still gets one object: the job as it stands, and why wait ended.
                let mut j = if last.is_object() { last } else { json!({ "id": id }) };
                j["wait_timed_out"] = json!(true);
                println!("{j}");
            }
            return Ok(ExitCode::from(4));
        }
    }
}

fn simple(conn: &Conn, path: &str) -> Result<ExitCode> {
    let v = call(conn, "POST", path, None)?;
    if conn.json {
        println!("{v}")
    } else {
        println!("job {} is {}", v["id"], s(&v["state"]))
    }
    Ok(ExitCode::SUCCESS)
}

/// Relative local paths are made absolute here, where the user's working directory means
/// something; the service has none. Text is kept as written (a trailing `/.` matters).
fn absolute(e: &str) -> Result<String> {
    match Endpoint::parse(e).map_err(|m| anyhow!(m))? {
        Endpoint::Local(p) if p.is_relative() => {
            let cwd = std::env::current_dir().context("cannot read the current directory")?;
            Ok(format!("{}/{e}", cwd.display()))
        }
        _ => Ok(e.to_string()),
    }
}

fn submit(a: SubmitArgs) -> Result<ExitCode> {
    let mut options = serde_json::Map::new();
    let mut put = |k: &str, v: Value| {
        if !v.is_null() && v != json!(false) {
            options.insert(k.into(), v);
        }
    };
    put("streams", json!(a.streams));
    put("chunk_size", json!(a.chunk_size));
    put("bwlimit", json!(a.bwlimit));
    put("no_encrypt", json!(a.no_encrypt));
    put("verify_full", json!(a.verify_full));
    put("checksum", json!(a.checksum));
    put("delete", json!(a.delete));
    put("retry_for", json!(a.retry_for));
    put("token_file", json!(a.token_file));
    put("dst_token_file", json!(a.dst_token_file));
    put("ssh", json!(a.ssh));
    put("remote_bin", json!(a.remote_bin));
    put("fail_fast", json!(a.fail_fast));
    put("ignore_existing", json!(a.ignore_existing));
    put("deadline", json!(a.deadline));
    if !a.filters.rules.is_empty() {
        put("filters", json!(a.filters.rules.iter().map(ToString::to_string).collect::<Vec<_>>()));
    }
    if a.watch {
        let w = json!({ "ready": a.ready, "on_arrival": a.on_arrival, "in_order": a.in_order, "delete_after_verified": a.delete_after_verified, "until": a.until, "max_units": a.max_units });
        let w: serde_json::Map<String, Value> = w.as_object().unwrap().iter().filter(|(_, v)| !v.is_null() && **v != json!(false)).map(|(k, v)| (k.clone(), v.clone())).collect();
        put("watch", Value::Object(w));
    }
    let mut body = json!({ "src": absolute(&a.src)?, "dst": absolute(&a.dst)?, "sync": a.sync, "options": options });
    if let Some(l) = a.label {
        body["label"] = json!(l);
    }
    if let Some(n) = a.notify {
        body["notify"] = json!(n);
    }
    let v = call(&a.conn, "POST", "/v1/jobs", Some(&body))?;
    if a.conn.json {
        println!("{v}")
    } else {
        println!("{}", v["id"])
    }
    Ok(ExitCode::SUCCESS)
}

fn token(t: TokenCommand) -> Result<ExitCode> {
    match t {
        TokenCommand::Create { scope, expires, name, path, run_as, conn } => {
            let mut body = json!({ "scope": scope, "expires": expires });
            if let Some(n) = name {
                body["name"] = json!(n);
            }
            if let Some(p) = path {
                body["path_prefix"] = json!(p);
            }
            if let Some(u) = run_as {
                body["run_as"] = json!(u);
            }
            let v = call(&conn, "POST", "/v1/tokens", Some(&body))?;
            if conn.json {
                println!("{v}");
            } else {
                println!("{}", s(&v["token"]));
                eprintln!("tern: token {} ({}) created; this is the only time its secret is shown", s(&v["id"]), s(&v["scope"]));
            }
        }
        TokenCommand::List { conn } => {
            let v = call(&conn, "GET", "/v1/tokens", None)?;
            if conn.json {
                println!("{v}");
            } else {
                println!("{:<16}  {:<8}  {:<8}  {:<20}  {:<12}  PATH", "ID", "SCOPE", "STATUS", "NAME", "RUN-AS");
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
                for t in v["tokens"].as_array().into_iter().flatten() {
                    let status = if !t["revoked_at"].is_null() {
                        "revoked"
                    } else if t["expires_at"].as_i64().is_some_and(|e| e <= now) {
                        "expired"
                    } else {
                        "live"
                    };
                    println!("{:<16}  {:<8}  {:<8}  {:<20}  {:<12}  {}", s(&t["id"]), s(&t["scope"]), status, s(&t["name"]), s(&t["run_as"]), s(&t["path_prefix"]));
                }
            }
        }
        TokenCommand::Revoke { id, conn } => {
            let v = call(&conn, "DELETE", &format!("/v1/tokens/{id}"), None)?;
            if conn.json { println!("{v}") } else { println!("revoked {id}") }
        }
    }
    Ok(ExitCode::SUCCESS)
}
