//! Everything the service persists, behind one trait: `SqliteStore` (default) and `PgStore`.
//!
//! The trait is synchronous: SQLite is a blocking library whichever crate wraps it, and the
//! service calls it through `tokio::task::spawn_blocking`. Every state change is a
//! compare-and-set on the current state, so a late event (a child exiting after a cancel)
//! cannot overwrite a newer decision.

use serde_json::Value;

use crate::model::pathtest::{Schedule, TestResult, TestSpec};
use crate::model::{Job, JobSpec, JobState, Scope, TokenInfo, Totals};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("job database: {0}")]
    Db(String),
    /// Locked by someone else (another process holding a write lock, a long transaction)
    /// past the wait: nothing was changed, the same request can simply be made again.
    #[error("job database is locked: {0}; nothing was changed, try again shortly (or end whatever holds the lock)")]
    Busy(String),
    /// Out of space: nothing was changed.
    #[error("job database is full: {0}; nothing was changed, free space on the database's disk and try again")]
    Full(String),
    /// The database server cannot be reached (down, restarting, a network cut): it may come back.
    #[error("job database unreachable: {0}")]
    Unreachable(String),
    #[error("job database is at schema version {found}, newer than this tern knows ({known}); upgrade tern")]
    TooNew { found: i64, known: i64 },
    #[error("job database holds a record it cannot read: {0}")]
    Corrupt(String),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    /// Worth trying again later as is (the database will free up), as opposed to a bug or a
    /// corrupt record.
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Busy(_) | StoreError::Full(_) | StoreError::Unreachable(_))
    }
}

/// Opens the store `--db` names: a `postgres://` / `postgresql://` URL, else the SQLite file
/// `jobs.db` in the state directory.
/// `node`: this service is a cluster node, `(cluster, node)` (PostgreSQL only).
pub fn open(db: Option<&str>, state_dir: &std::path::Path, node: Option<(String, String)>) -> StoreResult<std::sync::Arc<dyn JobStore>> {
    Ok(match db {
        Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => std::sync::Arc::new(crate::pg::PgStore::open_as(url, node)?),
        Some(other) => return Err(StoreError::Db(format!("--db '{other}' is not a postgres:// URL; leave --db out for SQLite in the state directory"))),
        None => std::sync::Arc::new(crate::sqlite::SqliteStore::open(&state_dir.join("jobs.db"))?),
    })
}

/// A new token's stored part: the hash, never the secret.
pub struct NewToken<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub scope: Scope,
    pub hash: &'a [u8; 32],
    pub path_prefix: Option<&'a str>,
    pub created_by: Option<&'a str>,
    pub expires_at: Option<i64>,
    /// The local account this token's transfers run as (a root service only).
    pub run_as: Option<&'a str>,
}

pub trait JobStore: Send + Sync + 'static {
    fn insert_job(&self, spec: &JobSpec, owner: Option<&str>, now: i64) -> StoreResult<Job>;
    fn get_job(&self, id: i64) -> StoreResult<Option<Job>>;
    /// Newest first; `owner` restricts to one token's jobs.
    fn list_jobs(&self, state: Option<JobState>, owner: Option<&str>, limit: u32) -> StoreResult<Vec<Job>>;
    /// A runnable job (queued, or retrying with its backoff over) becomes `running`, with one
    /// more attempt counted. Fair between owners: the owner with the fewest running jobs,
    /// then the one claimed from longest ago, then the oldest job (FIFO within an owner).
    fn claim_next(&self, now: i64) -> StoreResult<Option<Job>>;
    /// Moves `id` to `to` only if it is in one of `from`; false if it was not.
    fn transition(&self, id: i64, from: &[JobState], to: JobState, now: i64) -> StoreResult<bool>;
    /// Latest progress of a running job.
    fn save_progress(&self, id: i64, progress: &Value, now: i64) -> StoreResult<()>;
    /// Ends an attempt of a running job: terminal state, or `retrying` until `not_before`.
    /// False if the job was no longer running (e.g. canceled meanwhile).
    fn finish_attempt(&self, id: i64, to: JobState, summary: Option<&Value>, error: Option<&str>, not_before: i64, now: i64) -> StoreResult<bool>;
    /// Fails a job that is in one of `from` with `error` (a passed deadline), keeping `progress`
    /// as its last progress when given. False if it was in another state.
    fn fail_job(&self, id: i64, from: &[JobState], error: &str, progress: Option<&Value>, now: i64) -> StoreResult<bool>;
    /// Queued or retrying jobs that have a deadline (`options.deadline`), for the runner to
    /// fail those past it.
    fn waiting_with_deadline(&self) -> StoreResult<Vec<Job>>;
    /// Replaces the spec of a failed or canceled job (a retry with a new deadline); false if
    /// the job is in another state.
    fn set_spec(&self, id: i64, spec: &JobSpec) -> StoreResult<bool>;
    /// An explicit retry: failed/canceled → queued with attempts reset.
    fn requeue(&self, id: i64, now: i64) -> StoreResult<bool>;
    /// At start-up: attempts that were running when the service died go back to the queue.
    fn recover_interrupted(&self, now: i64) -> StoreResult<u64>;
    /// Attempts of `ids` that this service claimed and gave up without an outcome (a fenced
    /// cluster node's) go back to the queue, uncounted; those another node re-queued or claimed
    /// meanwhile are left alone.
    fn hand_back(&self, ids: &[i64], now: i64) -> StoreResult<u64> {
        let mut n = 0;
        for &id in ids {
            n += u64::from(self.transition(id, &[JobState::Running], JobState::Queued, now)?);
        }
        Ok(n)
    }
    /// Whether other nodes' services share this job table (a cluster node's PostgreSQL).
    fn shared_with_other_nodes(&self) -> bool {
        false
    }
    /// On a cluster: attempts of nodes that left or fell silent go back to the queue.
    fn recover_orphans(&self, _now: i64) -> StoreResult<u64> {
        Ok(0)
    }
    /// Terminal jobs with a webhook not yet delivered.
    fn pending_notifications(&self) -> StoreResult<Vec<Job>>;
    fn mark_notified(&self, id: i64) -> StoreResult<()>;
    fn totals(&self) -> StoreResult<Totals>;

    fn insert_token(&self, t: &NewToken<'_>, now: i64) -> StoreResult<TokenInfo>;
    fn token_by_hash(&self, hash: &[u8; 32]) -> StoreResult<Option<TokenInfo>>;
    fn list_tokens(&self) -> StoreResult<Vec<TokenInfo>>;
    /// False if there is no such token (revoking twice is fine and returns true).
    fn revoke_token(&self, id: &str, now: i64) -> StoreResult<bool>;
    fn touch_token(&self, id: &str, now: i64) -> StoreResult<()>;
    /// Tokens of this scope that are neither revoked nor expired.
    fn live_tokens(&self, scope: Scope, now: i64) -> StoreResult<u64>;

    // ---------- scheduled path tests (docs/service.md "Scheduled path tests") ----------

    /// A new schedule, due at `now`.
    fn insert_schedule(&self, spec: &TestSpec, owner: Option<&str>, now: i64) -> StoreResult<Schedule>;
    fn get_schedule(&self, id: i64) -> StoreResult<Option<Schedule>>;
    /// Oldest first; `owner` restricts to one token's schedules.
    fn list_schedules(&self, owner: Option<&str>) -> StoreResult<Vec<Schedule>>;
    /// Removes the schedule and its results; false if there was none.
    fn delete_schedule(&self, id: i64) -> StoreResult<bool>;
    /// The schedule due longest ago (`next_at <= now`), if any.
    fn due_schedule(&self, now: i64) -> StoreResult<Option<Schedule>>;
    /// Stores a run's result (returned with its id), sets the schedule's next run and regressed
    /// state, marks a notification pending when `alert`, and keeps only the newest `keep`
    /// results. False-free: a schedule deleted meanwhile just drops the result (`None`).
    fn record_result(&self, schedule_id: i64, r: &TestResult, next_at: i64, regressed: bool, alert: bool, keep: u32) -> StoreResult<Option<TestResult>>;
    /// Oldest first: the newest `limit` results with id below `before` (all when None).
    fn list_results(&self, schedule_id: i64, before: Option<i64>, limit: u32) -> StoreResult<Vec<TestResult>>;
    /// Schedules with a regression notification not yet delivered.
    fn pending_test_alerts(&self) -> StoreResult<Vec<Schedule>>;
    fn mark_test_alert_sent(&self, id: i64) -> StoreResult<()>;
}
