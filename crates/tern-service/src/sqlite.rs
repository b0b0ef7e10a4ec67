//! `SqliteStore`: the default job store, one SQLite file in the state directory.
//!
//! One connection behind a mutex is the "one writer" rule made structural: no two statements of
//! this process ever contend, so `SQLITE_BUSY` can only come from outside readers (the sqlite3
//! CLI, a backup), which `busy_timeout` absorbs. WAL keeps such readers from blocking us.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use crate::model::pathtest::{Schedule, TestResult, TestSpec};
use crate::model::{Job, JobSpec, JobState, Scope, TokenInfo, Totals};
use crate::store::{JobStore, NewToken, StoreError, StoreResult};

/// Applied in order; `PRAGMA user_version` records how many ran. Never edit a shipped one: add
/// the next file instead.
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/sqlite/0001_init.sql"),
    include_str!("../migrations/sqlite/0002_fair_share.sql"),
    include_str!("../migrations/sqlite/0003_run_as.sql"),
    include_str!("../migrations/sqlite/0004_path_tests.sql"),
    include_str!("../migrations/sqlite/0005_cluster.sql"),
    include_str!("../migrations/sqlite/0006_job_nodes.sql"),
    include_str!("../migrations/sqlite/0007_node_load.sql"),
];

const JOB_COLUMNS: &str = "id, state, spec, owner, created_at, updated_at, started_at, finished_at, not_before, attempts, retries, progress, summary, error, notified";
const SCHEDULE_COLUMNS: &str = "id, spec, owner, created_at, next_at, regressed, alert_pending";
const RESULT_COLUMNS: &str = "id, at, ok, rtt_ms, one_gbps, many_gbps, streams, verdict, expected_gbps, error, baseline_gbps, regressed";
const TOKEN_COLUMNS: &str = "id, name, scope, path_prefix, created_by, created_at, expires_at, revoked_at, last_used_at, run_as";

/// How long a write waits for another process's lock before the request fails with "locked".
const BUSY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

pub struct SqliteStore {
    conn: Mutex<Connection>,
}

/// Locked and full are told apart (503/507 with what to do); the rest names the file's dir.
fn db(e: rusqlite::Error) -> StoreError {
    match e.sqlite_error_code() {
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked) => StoreError::Busy(format!("SQLite: {e} (another process holds a write lock on jobs.db)")),
        Some(rusqlite::ErrorCode::DiskFull) => StoreError::Full(format!("SQLite: {e}")),
        _ => StoreError::Db(format!("SQLite: {e} (check the state directory's free space and permissions)")),
    }
}

impl SqliteStore {
    pub fn open(path: &Path) -> StoreResult<Self> {
        owner_only(path)?;
        let conn = Connection::open(path).map_err(|e| StoreError::Db(format!("cannot open {}: {e}", path.display())))?;
        conn.busy_timeout(BUSY_TIMEOUT).map_err(db)?;
        // WAL: outside readers never block the writer. FULL: a commit survives power loss, so
        // a job reported done stays done (re-running a finished `cp -r` would nest the copy).
        conn.pragma_update(None, "journal_mode", "WAL").map_err(db)?;
        conn.pragma_update(None, "synchronous", "FULL").map_err(db)?;
        conn.pragma_update(None, "foreign_keys", "ON").map_err(db)?;
        let store = Self { conn: Mutex::new(conn) };
        store.migrate()?;
        Ok(store)
    }

    fn migrate(&self) -> StoreResult<()> {
        let mut c = self.lock();
        let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).map_err(db)?;
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(StoreError::TooNew { found: version, known });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            // IMMEDIATE takes the write lock up front: a deferred transaction that upgrades
            // to a writer fails with SQLITE_BUSY instead of waiting.
            let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(db)?;
            tx.execute_batch(sql).map_err(|e| StoreError::Db(format!("migration {}: {e}", i + 1)))?;
            tx.pragma_update(None, "user_version", (i + 1) as i64).map_err(db)?;
            tx.commit().map_err(db)?;
        }
        Ok(())
    }

    /// For bookkeeping that may be skipped (progress snapshots, a token's last use): no wait
    /// for an outside lock, so it never holds the connection — and every request behind it —
    /// for the whole busy timeout.
    fn best_effort(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<usize>) -> StoreResult<()> {
        let c = self.lock();
        c.busy_timeout(std::time::Duration::ZERO).map_err(db)?;
        let r = f(&c);
        c.busy_timeout(BUSY_TIMEOUT).map_err(db)?;
        r.map(drop).map_err(db)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic while holding the lock leaves a usable connection (SQLite rolls back any
        // open statement), so poisoning carries no information here.
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn json_col(r: &Row<'_>, i: usize) -> rusqlite::Result<Option<Value>> {
    let s: Option<String> = r.get(i)?;
    Ok(s.and_then(|s| serde_json::from_str(&s).ok()))
}

fn job_row(r: &Row<'_>) -> rusqlite::Result<Result<Job, StoreError>> {
    let id: i64 = r.get(0)?;
    let state: String = r.get(1)?;
    let spec: String = r.get(2)?;
    let Some(state) = JobState::parse(&state) else { return Ok(Err(StoreError::Corrupt(format!("job {id}: state '{state}'")))) };
    let spec: JobSpec = match serde_json::from_str(&spec) {
        Ok(s) => s,
        Err(e) => return Ok(Err(StoreError::Corrupt(format!("job {id}: spec: {e}")))),
    };
    Ok(Ok(Job {
        id,
        state,
        spec,
        owner: r.get(3)?,
        created_at: r.get(4)?,
        updated_at: r.get(5)?,
        started_at: r.get(6)?,
        finished_at: r.get(7)?,
        not_before: r.get(8)?,
        attempts: r.get(9)?,
        retries: r.get(10)?,
        progress: json_col(r, 11)?,
        summary: json_col(r, 12)?,
        error: r.get(13)?,
        notified: r.get::<_, i64>(14)? != 0,
    }))
}

/// The database holds token hashes and every job's paths: 0600, made so before SQLite opens it
/// (SQLite gives the -wal and -shm files the database file's mode).
fn owner_only(path: &Path) -> StoreResult<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(path).map_err(|e| StoreError::Db(format!("cannot open {}: {e}", path.display())))?;
    let meta = f.metadata().map_err(|e| StoreError::Db(format!("cannot stat {}: {e}", path.display())))?;
    if meta.permissions().mode() & 0o077 != 0 {
        tracing::warn!("{} was readable by others (mode {:o}); made it 0600", path.display(), meta.permissions().mode() & 0o777);
        f.set_permissions(std::fs::Permissions::from_mode(0o600)).map_err(|e| StoreError::Db(format!("cannot chmod 600 {}: {e}", path.display())))?;
        for side in ["-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(side);
            let _ = std::fs::set_permissions(std::path::PathBuf::from(p), std::fs::Permissions::from_mode(0o600));
        }
    }
    Ok(())
}

fn token_row(r: &Row<'_>) -> rusqlite::Result<Result<TokenInfo, StoreError>> {
    let id: String = r.get(0)?;
    let scope: String = r.get(2)?;
    let Some(scope) = Scope::parse(&scope) else { return Ok(Err(StoreError::Corrupt(format!("token {id}: scope '{scope}'")))) };
    Ok(Ok(TokenInfo {
        id,
        name: r.get(1)?,
        scope,
        path_prefix: r.get(3)?,
        created_by: r.get(4)?,
        created_at: r.get(5)?,
        expires_at: r.get(6)?,
        revoked_at: r.get(7)?,
        last_used_at: r.get(8)?,
        run_as: r.get(9)?,
    }))
}

fn schedule_row(r: &Row<'_>) -> rusqlite::Result<Result<Schedule, StoreError>> {
    let id: i64 = r.get(0)?;
    let spec: String = r.get(1)?;
    let spec: TestSpec = match serde_json::from_str(&spec) {
        Ok(s) => s,
        Err(e) => return Ok(Err(StoreError::Corrupt(format!("path test {id}: spec: {e}")))),
    };
    Ok(Ok(Schedule { id, spec, owner: r.get(2)?, created_at: r.get(3)?, next_at: r.get(4)?, regressed: r.get::<_, i64>(5)? != 0, alert_pending: r.get::<_, i64>(6)? != 0 }))
}

fn result_row(r: &Row<'_>) -> rusqlite::Result<TestResult> {
    Ok(TestResult {
        id: r.get(0)?,
        at: r.get(1)?,
        ok: r.get::<_, i64>(2)? != 0,
        rtt_ms: r.get(3)?,
        one_gbps: r.get(4)?,
        many_gbps: r.get(5)?,
        streams: r.get::<_, Option<i64>>(6)?.and_then(|n| u16::try_from(n).ok()),
        verdict: r.get(7)?,
        expected_gbps: r.get(8)?,
        error: r.get(9)?,
        baseline_gbps: r.get(10)?,
        regressed: r.get::<_, i64>(11)? != 0,
    })
}

fn states_sql(states: &[JobState]) -> String {
    states.iter().map(|s| format!("'{}'", s.as_str())).collect::<Vec<_>>().join(",")
}

impl JobStore for SqliteStore {
    fn insert_job(&self, spec: &JobSpec, owner: Option<&str>, now: i64) -> StoreResult<Job> {
        let spec_json = serde_json::to_string(spec).map_err(|e| StoreError::Db(e.to_string()))?;
        let c = self.lock();
        // A job without a webhook counts as notified, so only real deliveries stay pending.
        c.query_row(
            &format!("INSERT INTO jobs (state, spec, label, owner, created_at, updated_at, notified) VALUES ('queued', ?1, ?2, ?3, ?4, ?4, ?5) RETURNING {JOB_COLUMNS}"),
            params![spec_json, spec.label, owner, now, spec.notify.is_none() as i64],
            job_row,
        )
        .map_err(db)?
    }

    fn get_job(&self, id: i64) -> StoreResult<Option<Job>> {
        let c = self.lock();
        c.query_row(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = ?1"), [id], job_row).optional().map_err(db)?.transpose()
    }

    fn list_jobs(&self, state: Option<JobState>, owner: Option<&str>, limit: u32) -> StoreResult<Vec<Job>> {
        let c = self.lock();
        let mut st = c.prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE (?1 IS NULL OR state = ?1) AND (?2 IS NULL OR owner = ?2) ORDER BY id DESC LIMIT ?3")).map_err(db)?;
        let rows = st.query_map(params![state.map(JobState::as_str), owner, limit], job_row).map_err(db)?;
        rows.map(|r| r.map_err(db).and_then(|x| x)).collect()
    }

    fn claim_next(&self, now: i64) -> StoreResult<Option<Job>> {
        // Fair share between owners (tokens): the owner with the fewest running jobs, then the
        // one whose last job was claimed longest ago, then the oldest job; each owner's own
        // jobs stay FIFO. See docs/service.md.
        let c = self.lock();
        c.query_row(
            &format!(
                "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = ?1, updated_at = ?1, progress = NULL,
                                 claim_seq = (SELECT COALESCE(MAX(claim_seq), 0) + 1 FROM jobs)
                 WHERE id = (
                   SELECT j.id FROM jobs j WHERE j.state IN ('queued','retrying') AND j.not_before <= ?1
                   ORDER BY (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running' AND r.owner IS j.owner),
                            (SELECT COALESCE(MAX(claim_seq), 0) FROM jobs s WHERE s.owner IS j.owner),
                            j.id
                   LIMIT 1)
                 RETURNING {JOB_COLUMNS}"
            ),
            [now],
            job_row,
        )
        .optional()
        .map_err(db)?
        .transpose()
    }

    fn transition(&self, id: i64, from: &[JobState], to: JobState, now: i64) -> StoreResult<bool> {
        let c = self.lock();
        let fin = if to.is_terminal() { Some(now) } else { None };
        let n = c
            .execute(
                &format!("UPDATE jobs SET state = ?1, updated_at = ?2, finished_at = COALESCE(?3, finished_at) WHERE id = ?4 AND state IN ({})", states_sql(from)),
                params![to.as_str(), now, fin, id],
            )
            .map_err(db)?;
        Ok(n == 1)
    }

    fn save_progress(&self, id: i64, progress: &Value, now: i64) -> StoreResult<()> {
        self.best_effort(|c| c.execute("UPDATE jobs SET progress = ?1, updated_at = ?2 WHERE id = ?3 AND state = 'running'", params![progress.to_string(), now, id]))
    }

    fn finish_attempt(&self, id: i64, to: JobState, summary: Option<&Value>, error: Option<&str>, not_before: i64, now: i64) -> StoreResult<bool> {
        let c = self.lock();
        let fin = if to.is_terminal() { Some(now) } else { None };
        let retry = (to == JobState::Retrying) as i64;
        let n = c
            .execute(
                "UPDATE jobs SET state = ?1, summary = COALESCE(?2, summary), error = ?3, not_before = ?4, updated_at = ?5,
                        finished_at = ?6, retries = retries + ?7
                 WHERE id = ?8 AND state = 'running'",
                params![to.as_str(), summary.map(|s| s.to_string()), error, not_before, now, fin, retry, id],
            )
            .map_err(db)?;
        Ok(n == 1)
    }

    fn fail_job(&self, id: i64, from: &[JobState], error: &str, progress: Option<&Value>, now: i64) -> StoreResult<bool> {
        let c = self.lock();
        let n = c
            .execute(
                &format!(
                    "UPDATE jobs SET state = 'failed', error = ?1, progress = COALESCE(?2, progress), updated_at = ?3, finished_at = ?3
                     WHERE id = ?4 AND state IN ({})",
                    states_sql(from)
                ),
                params![error, progress.map(|p| p.to_string()), now, id],
            )
            .map_err(db)?;
        Ok(n == 1)
    }

    fn set_spec(&self, id: i64, spec: &JobSpec) -> StoreResult<bool> {
        let spec_json = serde_json::to_string(spec).map_err(|e| StoreError::Db(e.to_string()))?;
        let c = self.lock();
        let n = c.execute("UPDATE jobs SET spec = ?1 WHERE id = ?2 AND state IN ('failed','canceled')", params![spec_json, id]).map_err(db)?;
        Ok(n == 1)
    }

    fn waiting_with_deadline(&self) -> StoreResult<Vec<Job>> {
        let c = self.lock();
        let mut st = c.prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ('queued','retrying') AND json_extract(spec, '$.options.deadline') IS NOT NULL")).map_err(db)?;
        let rows = st.query_map([], job_row).map_err(db)?;
        rows.map(|r| r.map_err(db).and_then(|x| x)).collect()
    }

    fn requeue(&self, id: i64, now: i64) -> StoreResult<bool> {
        let c = self.lock();
        let n = c
            .execute(
                "UPDATE jobs SET state = 'queued', attempts = 0, not_before = 0, error = NULL, finished_at = NULL, updated_at = ?1,
                        notified = (SELECT json_extract(spec, '$.notify') IS NULL)
                 WHERE id = ?2 AND state IN ('failed','canceled')",
                params![now, id],
            )
            .map_err(db)?;
        Ok(n == 1)
    }

    fn recover_interrupted(&self, now: i64) -> StoreResult<u64> {
        let c = self.lock();
        // The interrupted attempt does not count: the service died, not the transfer.
        let n = c.execute("UPDATE jobs SET state = 'queued', attempts = MAX(attempts - 1, 0), updated_at = ?1 WHERE state = 'running'", [now]).map_err(db)?;
        Ok(n as u64)
    }

    fn pending_notifications(&self) -> StoreResult<Vec<Job>> {
        let c = self.lock();
        let mut st = c.prepare_cached(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE notified = 0 AND state IN ('succeeded','failed','canceled') ORDER BY id LIMIT 1000")).map_err(db)?;
        let rows = st.query_map([], job_row).map_err(db)?;
        rows.map(|r| r.map_err(db).and_then(|x| x)).collect()
    }

    fn mark_notified(&self, id: i64) -> StoreResult<()> {
        self.lock().execute("UPDATE jobs SET notified = 1 WHERE id = ?1", [id]).map_err(db)?;
        Ok(())
    }

    fn totals(&self) -> StoreResult<Totals> {
        let c = self.lock();
        let mut t = Totals::default();
        {
            let mut st = c.prepare_cached("SELECT state, COUNT(*) FROM jobs GROUP BY state").map_err(db)?;
            let rows = st.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))).map_err(db)?;
            let mut counts = std::collections::HashMap::new();
            for r in rows {
                let (s, n) = r.map_err(db)?;
                counts.insert(s, n as u64);
            }
            t.jobs_by_state = JobState::ALL.iter().map(|s| (*s, counts.get(s.as_str()).copied().unwrap_or(0))).collect();
        }
        let (bytes, files, failed, retries): (i64, i64, i64, i64) = c
            .query_row(
                "SELECT COALESCE(SUM(json_extract(summary, '$.bytes')), 0), COALESCE(SUM(json_extract(summary, '$.files')), 0),
                        COALESCE(SUM(json_extract(summary, '$.files_failed')), 0), COALESCE(SUM(retries), 0) FROM jobs",
                [],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .map_err(db)?;
        (t.bytes, t.files, t.files_failed, t.retries) = (bytes as u64, files as u64, failed as u64, retries as u64);
        Ok(t)
    }

    fn insert_token(&self, t: &NewToken<'_>, now: i64) -> StoreResult<TokenInfo> {
        let c = self.lock();
        c.query_row(
            &format!("INSERT INTO tokens (id, name, scope, hash, path_prefix, created_by, created_at, expires_at, run_as) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) RETURNING {TOKEN_COLUMNS}"),
            params![t.id, t.name, t.scope.as_str(), &t.hash[..], t.path_prefix, t.created_by, now, t.expires_at, t.run_as],
            token_row,
        )
        .map_err(db)?
    }

    fn token_by_hash(&self, hash: &[u8; 32]) -> StoreResult<Option<TokenInfo>> {
        let c = self.lock();
        c.query_row(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = ?1"), [&hash[..]], token_row).optional().map_err(db)?.transpose()
    }

    fn list_tokens(&self) -> StoreResult<Vec<TokenInfo>> {
        let c = self.lock();
        let mut st = c.prepare_cached(&format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id")).map_err(db)?;
        let rows = st.query_map([], token_row).map_err(db)?;
        rows.map(|r| r.map_err(db).and_then(|x| x)).collect()
    }

    fn revoke_token(&self, id: &str, now: i64) -> StoreResult<bool> {
        let n = self.lock().execute("UPDATE tokens SET revoked_at = COALESCE(revoked_at, ?1) WHERE id = ?2", params![now, id]).map_err(db)?;
        Ok(n == 1)
    }

    fn touch_token(&self, id: &str, now: i64) -> StoreResult<()> {
        self.best_effort(|c| c.execute("UPDATE tokens SET last_used_at = ?1 WHERE id = ?2", params![now, id]))
    }

    fn live_tokens(&self, scope: Scope, now: i64) -> StoreResult<u64> {
        let n: i64 = self
            .lock()
            .query_row("SELECT COUNT(*) FROM tokens WHERE scope = ?1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > ?2)", params![scope.as_str(), now], |r| r.get(0))
            .map_err(db)?;
        Ok(n as u64)
    }

    fn insert_schedule(&self, spec: &TestSpec, owner: Option<&str>, now: i64) -> StoreResult<Schedule> {
        let spec_json = serde_json::to_string(spec).map_err(|e| StoreError::Db(e.to_string()))?;
        let c = self.lock();
        c.query_row(&format!("INSERT INTO path_tests (spec, owner, created_at, next_at) VALUES (?1, ?2, ?3, ?3) RETURNING {SCHEDULE_COLUMNS}"), params![spec_json, owner, now], schedule_row)
            .map_err(db)?
    }

    fn get_schedule(&self, id: i64) -> StoreResult<Option<Schedule>> {
        let c = self.lock();
        c.query_row(&format!("SELECT {SCHEDULE_COLUMNS} FROM path_tests WHERE id = ?1"), [id], schedule_row).optional().map_err(db)?.transpose()
    }

    fn list_schedules(&self, owner: Option<&str>) -> StoreResult<Vec<Schedule>> {
        let c = self.lock();
        let mut st = c.prepare_cached(&format!("SELECT {SCHEDULE_COLUMNS} FROM path_tests WHERE (?1 IS NULL OR owner = ?1) ORDER BY id")).map_err(db)?;
        let rows = st.query_map(params![owner], schedule_row).map_err(db)?;
        rows.map(|r| r.map_err(db).and_then(|x| x)).collect()
    }

    fn delete_schedule(&self, id: i64) -> StoreResult<bool> {
        let mut c = self.lock();
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(db)?;
        tx.execute("DELETE FROM path_test_results WHERE schedule_id = ?1", [id]).map_err(db)?;
        let n = tx.execute("DELETE FROM path_tests WHERE id = ?1", [id]).map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(n == 1)
    }

    fn due_schedule(&self, now: i64) -> StoreResult<Option<Schedule>> {
        let c = self.lock();
        c.query_row(&format!("SELECT {SCHEDULE_COLUMNS} FROM path_tests WHERE next_at <= ?1 ORDER BY next_at, id LIMIT 1"), [now], schedule_row).optional().map_err(db)?.transpose()
    }

    fn record_result(&self, schedule_id: i64, r: &TestResult, next_at: i64, regressed: bool, alert: bool, keep: u32) -> StoreResult<Option<TestResult>> {
        let mut c = self.lock();
        let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate).map_err(db)?;
        let n = tx
            .execute("UPDATE path_tests SET next_at = ?1, regressed = ?2, alert_pending = MAX(alert_pending, ?3) WHERE id = ?4", params![next_at, regressed as i64, alert as i64, schedule_id])
            .map_err(db)?;
        if n == 0 {
            return Ok(None);
        }
        let row = tx
            .query_row(
                &format!(
                    "INSERT INTO path_test_results (schedule_id, at, ok, rtt_ms, one_gbps, many_gbps, streams, verdict, expected_gbps, error, baseline_gbps, regressed)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12) RETURNING {RESULT_COLUMNS}"
                ),
                params![schedule_id, r.at, r.ok as i64, r.rtt_ms, r.one_gbps, r.many_gbps, r.streams.map(i64::from), r.verdict, r.expected_gbps, r.error, r.baseline_gbps, r.regressed as i64],
                result_row,
            )
            .map_err(db)?;
        tx.execute(
            "DELETE FROM path_test_results WHERE schedule_id = ?1 AND id <= (SELECT id FROM path_test_results WHERE schedule_id = ?1 ORDER BY id DESC LIMIT 1 OFFSET ?2)",
            params![schedule_id, keep],
        )
        .map_err(db)?;
        tx.commit().map_err(db)?;
        Ok(Some(row))
    }

    fn list_results(&self, schedule_id: i64, before: Option<i64>, limit: u32) -> StoreResult<Vec<TestResult>> {
        let c = self.lock();
        let mut st = c.prepare_cached(&format!("SELECT {RESULT_COLUMNS} FROM path_test_results WHERE schedule_id = ?1 AND (?2 IS NULL OR id < ?2) ORDER BY id DESC LIMIT ?3")).map_err(db)?;
        let rows = st.query_map(params![schedule_id, before, limit], result_row).map_err(db)?;
        let mut out = rows.collect::<rusqlite::Result<Vec<_>>>().map_err(db)?;
        out.reverse();
        Ok(out)
    }

    fn pending_test_alerts(&self) -> StoreResult<Vec<Schedule>> {
        let c = self.lock();
        let mut st = c.prepare_cached(&format!("SELECT {SCHEDULE_COLUMNS} FROM path_tests WHERE alert_pending = 1 ORDER BY id")).map_err(db)?;
        let rows = st.query_map([], schedule_row).map_err(db)?;
        rows.map(|r| r.map_err(db).and_then(|x| x)).collect()
    }

    fn mark_test_alert_sent(&self, id: i64) -> StoreResult<()> {
        self.lock().execute("UPDATE path_tests SET alert_pending = 0 WHERE id = ?1", [id]).map_err(db)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    // The backend-neutral contract is tests/store.rs (run on SQLite and PostgreSQL).
    use super::*;
    use crate::model::JobOptions;

    fn spec() -> JobSpec {
        JobSpec { src: "/a".into(), dst: "/b".into(), sync: false, label: Some("l".into()), notify: None, options: JobOptions::default() }
    }

    #[test]
    fn reopening_recovers_running_jobs_and_keeps_schema_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jobs.db");
        let id = {
            let s = SqliteStore::open(&path).unwrap();
            let j = s.insert_job(&spec(), None, 1).unwrap();
            s.claim_next(1).unwrap();
            j.id
        };
        let s = SqliteStore::open(&path).unwrap();
        assert_eq!(s.recover_interrupted(2).unwrap(), 1);
        let j = s.get_job(id).unwrap().unwrap();
        assert_eq!((j.state, j.attempts), (JobState::Queued, 0));
        assert_eq!(s.lock().query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0)).unwrap(), MIGRATIONS.len() as i64);
    }
}
