//! tern's managed transfer service (issue 4): durable jobs in SQLite or PostgreSQL, run as child `tern`
//! processes, driven through an HTTPS JSON API with scoped, hashed tokens. See
//! `docs/service.md`.

pub mod api;
pub mod client;
pub mod cluster;
pub mod confine;
pub mod dashboard;
pub mod mail;
pub mod model;
pub mod netallow;
pub mod notify;
pub mod pathtests;
pub mod pg;
pub mod policy;
pub mod runas;
pub mod runner;
pub mod sqlite;
pub mod store;
pub mod throughput;
pub mod tls;
pub mod tokens;
pub mod webhook;

use std::io::Write;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::model::{Job, Scope, now};
use crate::runner::{Runner, RunnerConfig};
use crate::store::{JobStore, NewToken};

#[derive(Debug, Clone)]
pub struct ServiceConfig {
    pub state_dir: PathBuf,
    pub http_listen: String,
    /// `postgres://...`, or None for SQLite in the state directory.
    pub db: Option<String>,
    /// SMTP relay `HOST:PORT` for `mailto:` notifications, and the sender address.
    pub smtp: Option<String>,
    pub smtp_from: Option<String>,
    pub runner: RunnerConfig,
    /// `--tls-cert` and `--tls-key`: the operator's certificate instead of STATE_DIR/tls.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// `--metrics-anonymous`.
    pub metrics_anonymous: bool,
    /// `(cluster, node)` when `tern serve --cluster` made this service a node.
    pub cluster_node: Option<(String, String)>,
    /// That node's self-fencing: while fenced its runner claims and runs nothing.
    pub fence: Option<Arc<cluster::Fence>>,
}

/// What `start` reports once the API is listening.
pub struct Started {
    pub addr: SocketAddr,
    /// Set on first start: where the first admin token was written.
    pub admin_token_file: Option<PathBuf>,
}

/// The default state directory: `$XDG_STATE_HOME/tern`, else `~/.local/state/tern`.
pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("tern");
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(|| PathBuf::from("/var/lib"));
    home.join(".local/state/tern")
}

/// Opens the state directory and database, binds the API and starts the service on its own
/// thread (with its own tokio runtime). Returns once it listens; errors are one line each.
pub fn start(cfg: ServiceConfig) -> Result<Started, String> {
    let dir = &cfg.state_dir;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| format!("cannot create state directory {}: {e}", dir.display()))?;
    private_dir(dir)?;
    let lock = lock_state_dir(dir)?;
    let store: Arc<dyn JobStore> = store::open(cfg.db.as_deref(), dir, cfg.cluster_node.clone()).map_err(|e| e.to_string())?;
    let admin_token_file = first_admin_token(store.as_ref(), dir)?;
    let recovered = store.recover_interrupted(now()).map_err(|e| e.to_string())?;
    if recovered > 0 {
        tracing::warn!("re-queued {recovered} job(s) that were running when the service stopped; they resume from their journals");
    }
    // Read here, outside the runtime: store calls block (PostgreSQL's client would refuse to
    // run inside an async context).
    let pending = store.pending_notifications().map_err(|e| e.to_string())?;
    let mut pending_alerts = Vec::new();
    for s in store.pending_test_alerts().map_err(|e| e.to_string())? {
        if let Some(r) = store.list_results(s.id, None, 1).map_err(|e| e.to_string())?.pop() {
            pending_alerts.push((s, r));
        }
    }
    let tls_config = match (&cfg.tls_cert, &cfg.tls_key) {
        (Some(c), Some(k)) => tls::load(c, k)?,
        (None, None) => tls::load_or_create(dir)?,
        _ => return Err("--tls-cert and --tls-key go together".into()),
    };
    let mailer = cfg.smtp.as_deref().map(|relay| mail::Mailer::new(relay, cfg.smtp_from.as_deref())).transpose()?.map(Arc::new);
    let mail_enabled = mailer.is_some();
    let listener = std::net::TcpListener::bind(&cfg.http_listen).map_err(|e| format!("cannot listen on {} for HTTPS: {e}", cfg.http_listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name("tern-service").enable_all().build().map_err(|e| format!("cannot start the service runtime: {e}"))?;
    std::thread::Builder::new()
        .name("tern-service".into())
        .spawn(move || {
            // Held for the life of the service: the kernel drops it when the process dies.
            let _lock = lock;
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => return tracing::error!("https listener: {e}"),
                };
                let notify_store = store.clone();
                let allow = Arc::new(cfg.runner.policy.webhook_allow.clone());
                let (alert_store, alert_mailer, alert_allow) = (store.clone(), mailer.clone(), allow.clone());
                let on_alert: pathtests::OnAlert = Arc::new(move |s, r| {
                    tokio::spawn(notify::deliver_test_alert(alert_store.clone(), alert_mailer.clone(), alert_allow.clone(), s, r));
                });
                let tester = pathtests::Tester::new(store.clone(), cfg.runner.clone(), on_alert.clone());
                tokio::spawn(tester.clone().run());
                for (s, r) in pending_alerts {
                    on_alert(s, r);
                }
                let on_done: Arc<dyn Fn(Job) + Send + Sync> = Arc::new(move |job: Job| {
                    if job.spec.notify.is_some() && !job.notified {
                        tokio::spawn(notify::deliver(notify_store.clone(), mailer.clone(), allow.clone(), job));
                    }
                });
                let od = on_done.clone();
                let policy = cfg.runner.policy.clone();
                let runner = Runner::new(store.clone(), cfg.runner.clone(), Box::new(move |j| od(j)));
                if let Some(f) = cfg.fence.clone() {
                    runner.follow_fence(f);
                }
                tokio::spawn(runner.clone().run());
                // Notifications that were pending when the service last stopped.
                for j in pending {
                    on_done(j);
                }
                let viewer = cfg.cluster_node.as_ref().zip(cfg.db.as_deref()).map(|((cluster, node), db)| cluster::Viewer::new(db, cluster, node));
                let state = api::AppState::new(store, runner, tester, on_done, policy, cfg.metrics_anonymous).with_mail(mail_enabled).with_cluster(viewer);
                tls::serve(listener, tls_config, api::router(state)).await;
            });
        })
        .map_err(|e| format!("cannot start the service thread: {e}"))?;
    Ok(Started { addr, admin_token_file })
}

/// The state directory holds the database and the admin token: owner only. An existing one
/// that others can enter is tightened, with a warning.
fn private_dir(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir).map_err(|e| format!("cannot stat state directory {}: {e}", dir.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("state directory {} is open to other users (mode {:o}) and cannot be made 0700: {e}", dir.display(), mode & 0o777))?;
        tracing::warn!("state directory {} was open to other users (mode {:o}); made it 0700", dir.display(), mode & 0o777);
    }
    Ok(())
}

/// One service per state directory: a second would run every job twice.
fn lock_state_dir(dir: &std::path::Path) -> Result<std::fs::File, String> {
    let path = dir.join("service.lock");
    let f = std::fs::OpenOptions::new().create(true).truncate(false).write(true).mode(0o600).open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(format!("another tern service is using {}; stop it or choose another --state-dir", dir.display()));
    }
    Ok(f)
}

/// At first start (no tokens at all) make an admin token and write it to `DIR/admin.token`.
fn first_admin_token(store: &dyn JobStore, dir: &std::path::Path) -> Result<Option<PathBuf>, String> {
    if !store.list_tokens().map_err(|e| e.to_string())?.is_empty() {
        return Ok(None);
    }
    let path = dir.join("admin.token");
    let (id, token) = tokens::generate()?;
    // Written before it is stored: a crash in between leaves an unusable file, never a
    // usable token nobody can read. A leftover file from such a crash is replaced.
    let _ = std::fs::remove_file(&path);
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    f.write_all(format!("{token}\n").as_bytes()).and_then(|_| f.sync_all()).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let hash = tokens::hash(&token);
    store
        .insert_token(&NewToken { id: &id, name: "first admin", scope: Scope::Admin, hash: &hash, path_prefix: None, created_by: None, expires_at: None, run_as: None }, now())
        .map_err(|e| e.to_string())?;
    Ok(Some(path))
}

/// Defaults for `tern serve`.
pub fn runner_config(max_jobs: usize, max_attempts: u32, retry_base: Duration, policy: policy::Policy) -> Result<RunnerConfig, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find the tern binary to run jobs with: {e}"))?;
    Ok(RunnerConfig { exe, max_jobs: max_jobs.max(1), max_attempts: max_attempts.max(1), retry_base, policy: Arc::new(policy), test_min_every_s: model::pathtest::DEFAULT_MIN_EVERY_S })
}
