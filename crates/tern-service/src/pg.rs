//! `PgStore`: the job store in PostgreSQL (`tern serve --db postgres://...`).
//!
//! The same schema and the same compare-and-set statements as `SqliteStore`, in PostgreSQL's
//! dialect. One connection behind a mutex (the service's database traffic is a few small
//! statements per job state change), reconnected when the server dropped it. `lock_timeout`
//! makes a locked table an error after 5 s instead of a hang; `claim_next` uses
//! `FOR UPDATE SKIP LOCKED` so two services on one database never claim the same job.
//!
//! Plain TCP or a Unix socket, no TLS: point it at a server on the same host or a trusted
//! network (`host=/run/postgresql` works too).

use std::sync::Mutex;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::{Client, NoTls, Row};
use serde_json::Value;

use crate::model::pathtest::{Schedule, TestResult, TestSpec};
use crate::model::{Job, JobSpec, JobState, Scope, TokenInfo, Totals};
use crate::store::{JobStore, NewToken, StoreError, StoreResult};

/// Applied in order inside one transaction; `tern_schema.version` records how many ran.
/// Never edit a shipped one: add the next file instead (and its SQLite twin).
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/postgres/0001_init.sql"),
    include_str!("../migrations/postgres/0002_fair_share.sql"),
    include_str!("../migrations/postgres/0003_run_as.sql"),
    include_str!("../migrations/postgres/0004_path_tests.sql"),
    include_str!("../migrations/postgres/0005_cluster.sql"),
    include_str!("../migrations/postgres/0006_job_nodes.sql"),
    include_str!("../migrations/postgres/0007_node_load.sql"),
];

/// Serialises migrations of several services starting against one database.
const MIGRATION_LOCK: i64 = 0x7465_726e_0001;

const JOB_COLUMNS: &str = "id, state, spec, owner, created_at, updated_at, started_at, finished_at, not_before, attempts, retries, progress, summary, error, notified";
const SCHEDULE_COLUMNS: &str = "id, spec, owner, created_at, next_at, regressed, alert_pending";
const RESULT_COLUMNS: &str = "id, at, ok, rtt_ms, one_gbps, many_gbps, streams, verdict, expected_gbps, error, baseline_gbps, regressed";
const TOKEN_COLUMNS: &str = "id, name, scope, path_prefix, created_by, created_at, expires_at, revoked_at, last_used_at, run_as";

pub struct PgStore {
    /// A cluster node's name and its cluster: its attempts are marked with the name, and the
    /// attempts of its cluster's dead nodes are its to re-queue.
    node: Option<(String, String)>,
    config: postgres::Config,
    /// Where, for messages: host and database, never the password.
    what: String,
    conn: Mutex<Option<Client>>,
}

/// One line naming the server and what to do; the password never appears.
pub(crate) fn pg_err(what: &str, e: postgres::Error) -> StoreError {
    let msg = match e.as_db_error() {
        Some(d) => d.message().to_string(),
        None => {
            let src = std::error::Error::source(&e).map(|s| format!(": {s}")).unwrap_or_default();
            format!("{e}{src}")
        }
    };
    match e.code() {
        Some(c) if *c == SqlState::DISK_FULL || *c == SqlState::PROGRAM_LIMIT_EXCEEDED => StoreError::Full(format!("PostgreSQL {what}: {msg}")),
        Some(c)
            if *c == SqlState::LOCK_NOT_AVAILABLE
                || *c == SqlState::QUERY_CANCELED
                || *c == SqlState::T_R_DEADLOCK_DETECTED
                || *c == SqlState::T_R_SERIALIZATION_FAILURE
                || *c == SqlState::CANNOT_CONNECT_NOW
                || *c == SqlState::TOO_MANY_CONNECTIONS =>
        {
            StoreError::Busy(format!("PostgreSQL {what}: {msg}"))
        }
        _ if e.is_closed() || e.code().is_none() => StoreError::Unreachable(format!("PostgreSQL {what}: {msg} (is the server running and reachable?)")),
        _ => StoreError::Db(format!("PostgreSQL {what}: {msg}")),
    }
}

fn corrupt(e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt(e.to_string())
}

impl PgStore {
    /// Connects to `url` (`postgres://user[:password]@host[:port]/db` or key=value form) and
    /// brings the schema up to date.
    pub fn open(url: &str) -> StoreResult<Self> {
        Self::open_as(url, None)
    }

    /// The store of a cluster node (`(cluster, node)`), or of a service alone.
    pub fn open_as(url: &str, node: Option<(String, String)>) -> StoreResult<Self> {
        let (config, what) = parse_url(url, "tern-service")?;
        let store = Self { node, config, what, conn: Mutex::new(None) };
        store.with(migrate)??;
        Ok(store)
    }

    /// A cluster node's name: the attempts it may write to are those that name it, so a fenced
    /// node's late write never lands on an attempt the cluster re-queued or another node runs.
    fn me(&self) -> Option<String> {
        self.node.as_ref().map(|n| n.1.clone())
    }

    fn connect(&self) -> StoreResult<Client> {
        let mut c = self.config.connect(NoTls).map_err(|e| pg_err(&self.what, e))?;
        // A table locked by someone else fails the statement after 5 s (503 to the client)
        // instead of holding the API; nothing here should take anywhere near 30 s.
        c.batch_execute("SET lock_timeout = '5s'; SET statement_timeout = '30s'").map_err(|e| pg_err(&self.what, e))?;
        Ok(c)
    }

    /// Runs `f` on the connection, connecting (again) first if there is none or it broke.
    fn with<T>(&self, f: impl FnOnce(&mut Client) -> Result<T, postgres::Error>) -> StoreResult<T> {
        let mut g = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if g.as_ref().is_none_or(Client::is_closed) {
            *g = Some(self.connect()?);
        }
        let c = g.as_mut().expect("connected above");
        let r = f(c);
        if r.is_err() && c.is_closed() {
            *g = None;
        }
        r.map_err(|e| pg_err(&self.what, e))
    }
}

/// `url` as a connection config (10 s connect timeout unless it names one) and, for messages,
/// where it points: host and database, never the password.
pub(crate) fn parse_url(url: &str, application: &str) -> StoreResult<(postgres::Config, String)> {
    let mut config: postgres::Config = url.parse().map_err(|e| StoreError::Db(format!("--db: not a PostgreSQL URL ({e}); expected postgres://USER@HOST[:PORT]/DB")))?;
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(10));
    }
    config.application_name(application);
    // With the port where the URL names one: several servers may share a host.
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let host = match h {
                postgres::config::Host::Tcp(s) => s.clone(),
                postgres::config::Host::Unix(p) => p.display().to_string(),
            };
            match ports.get(i).or(if ports.len() == 1 { ports.first() } else { None }) {
                Some(p) => format!("{host}:{p}"),
                None => host,
            }
        })
        .collect();
    let what = format!("at {} (database {})", if hosts.is_empty() { "localhost".into() } else { hosts.join(",") }, config.get_dbname().unwrap_or("default"));
    Ok((config, what))
}

pub(crate) fn migrate(c: &mut Client) -> Result<StoreResult<()>, postgres::Error> {
    let mut tx = c.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS tern_schema (version BIGINT NOT NULL)")?;
    let version: i64 = match tx.query_opt("SELECT version FROM tern_schema", &[])? {
        Some(r) => r.get(0),
        None => {
            tx.execute("INSERT INTO tern_schema (version) VALUES (0)", &[])?;
            0
        }
    };
    let known = MIGRATIONS.len() as i64;
    if version > known {
        return Ok(Err(StoreError::TooNew { found: version, known }));
    }
    for sql in MIGRATIONS.iter().skip(version as usize) {
        tx.batch_execute(sql)?;
    }
    tx.execute("UPDATE tern_schema SET version = $1", &[&known])?;
    tx.commit()?;
    Ok(Ok(()))
}

fn json_col(r: &Row, i: usize) -> Option<Value> {
    r.get::<_, Option<String>>(i).and_then(|s| serde_json::from_str(&s).ok())
}

fn job_row(r: &Row) -> StoreResult<Job> {
    let id: i64 = r.get(0);
    let state: String = r.get(1);
    let Some(state) = JobState::parse(&state) else { return Err(corrupt(format!("job {id}: state '{state}'"))) };
    let spec: JobSpec = serde_json::from_str(&r.get::<_, String>(2)).map_err(|e| corrupt(format!("job {id}: spec: {e}")))?;
    Ok(Job {
        id,
        state,
        spec,
        owner: r.get(3),
        created_at: r.get(4),
        updated_at: r.get(5),
        started_at: r.get(6),
        finished_at: r.get(7),
        not_before: r.get(8),
        attempts: r.get::<_, i64>(9) as u32,
        retries: r.get::<_, i64>(10) as u32,
        progress: json_col(r, 11),
        summary: json_col(r, 12),
        error: r.get(13),
        notified: r.get::<_, i64>(14) != 0,
    })
}

fn token_row(r: &Row) -> StoreResult<TokenInfo> {
    let id: String = r.get(0);
    let scope: String = r.get(2);
    let Some(scope) = Scope::parse(&scope) else { return Err(corrupt(format!("token {id}: scope '{scope}'"))) };
    Ok(TokenInfo { id, name: r.get(1), scope, path_prefix: r.get(3), created_by: r.get(4), created_at: r.get(5), expires_at: r.get(6), revoked_at: r.get(7), last_used_at: r.get(8), run_as: r.get(9) })
}

fn schedule_row(r: &Row) -> StoreResult<Schedule> {
    let id: i64 = r.get(0);
    let spec: String = r.get(1);
    let spec: TestSpec = serde_json::from_str(&spec).map_err(|e| corrupt(format!("path test {id}: spec: {e}")))?;
    Ok(Schedule { id, spec, owner: r.get(2), created_at: r.get(3), next_at: r.get(4), regressed: r.get::<_, i64>(5) != 0, alert_pending: r.get::<_, i64>(6) != 0 })
}

fn result_row(r: &Row) -> TestResult {
    TestResult {
        id: r.get(0),
        at: r.get(1),
        ok: r.get::<_, i64>(2) != 0,
        rtt_ms: r.get(3),
        one_gbps: r.get(4),
        many_gbps: r.get(5),
        streams: r.get::<_, Option<i64>>(6).and_then(|n| u16::try_from(n).ok()),
        verdict: r.get(7),
        expected_gbps: r.get(8),
        error: r.get(9),
        baseline_gbps: r.get(10),
        regressed: r.get::<_, i64>(11) != 0,
    }
}

fn states_sql(states: &[JobState]) -> String {
    states.iter().map(|s| format!("'{}'", s.as_str())).collect::<Vec<_>>().join(",")
}

impl JobStore for PgStore {
    fn insert_job(&self, spec: &JobSpec, owner: Option<&str>, now: i64) -> StoreResult<Job> {
        let spec_json = serde_json::to_string(spec).map_err(|e| StoreError::Db(e.to_string()))?;
        let notified = spec.notify.is_none() as i64;
        let row = self.with(|c| {
            c.query_one(
                &format!("INSERT INTO jobs (state, spec, label, owner, created_at, updated_at, notified) VALUES ('queued', $1, $2, $3, $4, $4, $5) RETURNING {JOB_COLUMNS}"),
                &[&spec_json, &spec.label, &owner, &now, &notified],
            )
        })?;
        job_row(&row)
    }

    fn get_job(&self, id: i64) -> StoreResult<Option<Job>> {
        self.with(|c| c.query_opt(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"), &[&id]))?.as_ref().map(job_row).transpose()
    }

    fn list_jobs(&self, state: Option<JobState>, owner: Option<&str>, limit: u32) -> StoreResult<Vec<Job>> {
        let (state, limit) = (state.map(JobState::as_str), limit as i64);
        let rows = self.with(|c| {
            c.query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE ($1::text IS NULL OR state = $1) AND ($2::text IS NULL OR owner = $2) ORDER BY id DESC LIMIT $3"), &[&state, &owner, &limit])
        })?;
        rows.iter().map(job_row).collect()
    }

    fn claim_next(&self, now: i64) -> StoreResult<Option<Job>> {
        // Fair share between owners, as in SqliteStore::claim_next. SKIP LOCKED: a job another
        // service is claiming this instant is passed over for the next one in fair order.
        let row = self.with(|c| {
            c.query_opt(
                &format!(
                    "UPDATE jobs SET state = 'running', attempts = attempts + 1, started_at = $1, updated_at = $1, progress = NULL, run_node = $2,
                                     claim_seq = (SELECT COALESCE(MAX(claim_seq), 0) + 1 FROM jobs)
                     WHERE id = (
                       SELECT j.id FROM jobs j WHERE j.state IN ('queued','retrying') AND j.not_before <= $1
                       ORDER BY (SELECT COUNT(*) FROM jobs r WHERE r.state = 'running' AND r.owner IS NOT DISTINCT FROM j.owner),
                                (SELECT COALESCE(MAX(claim_seq), 0) FROM jobs s WHERE s.owner IS NOT DISTINCT FROM j.owner),
                                j.id
                       LIMIT 1 FOR UPDATE OF j SKIP LOCKED)
                     RETURNING {JOB_COLUMNS}"
                ),
                &[&now, &self.node.as_ref().map(|n| n.1.clone())],
            )
        })?;
        row.as_ref().map(job_row).transpose()
    }

    fn transition(&self, id: i64, from: &[JobState], to: JobState, now: i64) -> StoreResult<bool> {
        let fin = if to.is_terminal() { Some(now) } else { None };
        let n = self.with(|c| {
            c.execute(
                &format!("UPDATE jobs SET state = $1, updated_at = $2, finished_at = COALESCE($3, finished_at) WHERE id = $4 AND state IN ({})", states_sql(from)),
                &[&to.as_str(), &now, &fin, &id],
            )
        })?;
        Ok(n == 1)
    }

    fn save_progress(&self, id: i64, progress: &Value, now: i64) -> StoreResult<()> {
        let (p, me) = (progress.to_string(), self.me());
        self.with(|c| c.execute("UPDATE jobs SET progress = $1, updated_at = $2 WHERE id = $3 AND state = 'running' AND ($4::text IS NULL OR run_node = $4)", &[&p, &now, &id, &me]))?;
        Ok(())
    }

    fn finish_attempt(&self, id: i64, to: JobState, summary: Option<&Value>, error: Option<&str>, not_before: i64, now: i64) -> StoreResult<bool> {
        let fin = if to.is_terminal() { Some(now) } else { None };
        let retry = (to == JobState::Retrying) as i64;
        let (summary, me) = (summary.map(|s| s.to_string()), self.me());
        let n = self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = $1, summary = COALESCE($2, summary), error = $3, not_before = $4, updated_at = $5,
                        finished_at = $6, retries = retries + $7
                 WHERE id = $8 AND state = 'running' AND ($9::text IS NULL OR run_node = $9)",
                &[&to.as_str(), &summary, &error, &not_before, &now, &fin, &retry, &id, &me],
            )
        })?;
        Ok(n == 1)
    }

    fn fail_job(&self, id: i64, from: &[JobState], error: &str, progress: Option<&Value>, now: i64) -> StoreResult<bool> {
        let (progress, me) = (progress.map(|p| p.to_string()), self.me());
        let n = self.with(|c| {
            c.execute(
                &format!(
                    "UPDATE jobs SET state = 'failed', error = $1, progress = COALESCE($2, progress), updated_at = $3, finished_at = $3
                     WHERE id = $4 AND state IN ({}) AND (state <> 'running' OR $5::text IS NULL OR run_node = $5)",
                    states_sql(from)
                ),
                &[&error, &progress, &now, &id, &me],
            )
        })?;
        Ok(n == 1)
    }

    fn set_spec(&self, id: i64, spec: &JobSpec) -> StoreResult<bool> {
        let spec_json = serde_json::to_string(spec).map_err(|e| StoreError::Db(e.to_string()))?;
        let n = self.with(|c| c.execute("UPDATE jobs SET spec = $1 WHERE id = $2 AND state IN ('failed','canceled')", &[&spec_json, &id]))?;
        Ok(n == 1)
    }

    fn waiting_with_deadline(&self) -> StoreResult<Vec<Job>> {
        let rows = self.with(|c| c.query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE state IN ('queued','retrying') AND (spec::jsonb -> 'options' ->> 'deadline') IS NOT NULL"), &[]))?;
        rows.iter().map(job_row).collect()
    }

    fn requeue(&self, id: i64, now: i64) -> StoreResult<bool> {
        let n = self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = 'queued', attempts = 0, not_before = 0, error = NULL, finished_at = NULL, updated_at = $1,
                        notified = CASE WHEN (spec::jsonb ->> 'notify') IS NULL THEN 1 ELSE 0 END
                 WHERE id = $2 AND state IN ('failed','canceled')",
                &[&now, &id],
            )
        })?;
        Ok(n == 1)
    }

    fn recover_interrupted(&self, now: i64) -> StoreResult<u64> {
        // The interrupted attempt does not count: the service died, not the transfer. A cluster
        // node takes back only its own attempts (and those no node marked): the others' are
        // running on their nodes.
        let me = self.node.as_ref().map(|n| n.1.clone());
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = 'queued', attempts = GREATEST(attempts - 1, 0), updated_at = $1
                 WHERE state = 'running' AND ($2::text IS NULL OR run_node = $2 OR run_node IS NULL)",
                &[&now, &me],
            )
        })
    }

    fn hand_back(&self, ids: &[i64], now: i64) -> StoreResult<u64> {
        let me = self.me();
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = 'queued', attempts = GREATEST(attempts - 1, 0), updated_at = $1
                 WHERE state = 'running' AND run_node IS NOT DISTINCT FROM $2 AND id = ANY($3)",
                &[&now, &me, &ids],
            )
        })
    }

    fn shared_with_other_nodes(&self) -> bool {
        self.node.is_some()
    }

    fn recover_orphans(&self, now: i64) -> StoreResult<u64> {
        let Some((cluster, me)) = self.node.clone() else { return Ok(0) };
        // A node that left, or is silent for 3 of its heartbeats (the registry's "unreachable"),
        // runs nothing any more: its attempts go back to the queue, to resume from the journals.
        self.with(|c| {
            c.execute(
                "UPDATE jobs SET state = 'queued', attempts = GREATEST(attempts - 1, 0), updated_at = $1
                 WHERE state = 'running' AND run_node IS NOT NULL AND run_node <> $3 AND run_node IN (
                   SELECT node FROM cluster_nodes WHERE cluster = $2
                     AND (state = 'left' OR now() - heartbeat_at >= (heartbeat_ms * 3)::float8 * interval '1 millisecond'))",
                &[&now, &cluster, &me],
            )
        })
    }

    fn pending_notifications(&self) -> StoreResult<Vec<Job>> {
        let rows = self.with(|c| c.query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE notified = 0 AND state IN ('succeeded','failed','canceled') ORDER BY id LIMIT 1000"), &[]))?;
        rows.iter().map(job_row).collect()
    }

    fn mark_notified(&self, id: i64) -> StoreResult<()> {
        self.with(|c| c.execute("UPDATE jobs SET notified = 1 WHERE id = $1", &[&id]))?;
        Ok(())
    }

    fn totals(&self) -> StoreResult<Totals> {
        let (counts, sums) = self.with(|c| {
            let counts = c.query("SELECT state, COUNT(*) FROM jobs GROUP BY state", &[])?;
            // SUM(bigint) is numeric in PostgreSQL: cast back.
            let sums = c.query_one(
                "SELECT COALESCE(SUM((summary::jsonb ->> 'bytes')::bigint), 0)::bigint, COALESCE(SUM((summary::jsonb ->> 'files')::bigint), 0)::bigint,
                        COALESCE(SUM((summary::jsonb ->> 'files_failed')::bigint), 0)::bigint, COALESCE(SUM(retries), 0)::bigint FROM jobs",
                &[],
            )?;
            Ok((counts, sums))
        })?;
        let counts: std::collections::HashMap<String, i64> = counts.iter().map(|r| (r.get(0), r.get(1))).collect();
        let mut t = Totals { jobs_by_state: JobState::ALL.iter().map(|s| (*s, counts.get(s.as_str()).copied().unwrap_or(0) as u64)).collect(), ..Default::default() };
        (t.bytes, t.files, t.files_failed, t.retries) = (sums.get::<_, i64>(0) as u64, sums.get::<_, i64>(1) as u64, sums.get::<_, i64>(2) as u64, sums.get::<_, i64>(3) as u64);
        Ok(t)
    }

    fn insert_token(&self, t: &NewToken<'_>, now: i64) -> StoreResult<TokenInfo> {
        let row = self.with(|c| {
            c.query_one(
                &format!("INSERT INTO tokens (id, name, scope, hash, path_prefix, created_by, created_at, expires_at, run_as) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING {TOKEN_COLUMNS}"),
                &[&t.id, &t.name, &t.scope.as_str(), &&t.hash[..], &t.path_prefix, &t.created_by, &now, &t.expires_at, &t.run_as],
            )
        })?;
        token_row(&row)
    }

    fn token_by_hash(&self, hash: &[u8; 32]) -> StoreResult<Option<TokenInfo>> {
        self.with(|c| c.query_opt(&format!("SELECT {TOKEN_COLUMNS} FROM tokens WHERE hash = $1"), &[&&hash[..]]))?.as_ref().map(token_row).transpose()
    }

    fn list_tokens(&self) -> StoreResult<Vec<TokenInfo>> {
        let rows = self.with(|c| c.query(&format!("SELECT {TOKEN_COLUMNS} FROM tokens ORDER BY created_at, id"), &[]))?;
        rows.iter().map(token_row).collect()
    }

    fn revoke_token(&self, id: &str, now: i64) -> StoreResult<bool> {
        let n = self.with(|c| c.execute("UPDATE tokens SET revoked_at = COALESCE(revoked_at, $1) WHERE id = $2", &[&now, &id]))?;
        Ok(n == 1)
    }

    fn touch_token(&self, id: &str, now: i64) -> StoreResult<()> {
        self.with(|c| c.execute("UPDATE tokens SET last_used_at = $1 WHERE id = $2", &[&now, &id]))?;
        Ok(())
    }

    fn live_tokens(&self, scope: Scope, now: i64) -> StoreResult<u64> {
        let n: i64 =
            self.with(|c| c.query_one("SELECT COUNT(*) FROM tokens WHERE scope = $1 AND revoked_at IS NULL AND (expires_at IS NULL OR expires_at > $2)", &[&scope.as_str(), &now]).map(|r| r.get(0)))?;
        Ok(n as u64)
    }

    fn insert_schedule(&self, spec: &TestSpec, owner: Option<&str>, now: i64) -> StoreResult<Schedule> {
        let spec_json = serde_json::to_string(spec).map_err(|e| StoreError::Db(e.to_string()))?;
        let row =
            self.with(|c| c.query_one(&format!("INSERT INTO path_tests (spec, owner, created_at, next_at) VALUES ($1, $2, $3, $3) RETURNING {SCHEDULE_COLUMNS}"), &[&spec_json, &owner, &now]))?;
        schedule_row(&row)
    }

    fn get_schedule(&self, id: i64) -> StoreResult<Option<Schedule>> {
        let row = self.with(|c| c.query_opt(&format!("SELECT {SCHEDULE_COLUMNS} FROM path_tests WHERE id = $1"), &[&id]))?;
        row.as_ref().map(schedule_row).transpose()
    }

    fn list_schedules(&self, owner: Option<&str>) -> StoreResult<Vec<Schedule>> {
        let rows = self.with(|c| c.query(&format!("SELECT {SCHEDULE_COLUMNS} FROM path_tests WHERE ($1::TEXT IS NULL OR owner = $1) ORDER BY id"), &[&owner]))?;
        rows.iter().map(schedule_row).collect()
    }

    fn delete_schedule(&self, id: i64) -> StoreResult<bool> {
        let n = self.with(|c| {
            let mut tx = c.transaction()?;
            tx.execute("DELETE FROM path_test_results WHERE schedule_id = $1", &[&id])?;
            let n = tx.execute("DELETE FROM path_tests WHERE id = $1", &[&id])?;
            tx.commit()?;
            Ok(n)
        })?;
        Ok(n == 1)
    }

    fn due_schedule(&self, now: i64) -> StoreResult<Option<Schedule>> {
        let row = self.with(|c| c.query_opt(&format!("SELECT {SCHEDULE_COLUMNS} FROM path_tests WHERE next_at <= $1 ORDER BY next_at, id LIMIT 1"), &[&now]))?;
        row.as_ref().map(schedule_row).transpose()
    }

    fn record_result(&self, schedule_id: i64, r: &TestResult, next_at: i64, regressed: bool, alert: bool, keep: u32) -> StoreResult<Option<TestResult>> {
        let (reg, al, ok, res_reg, keep) = (regressed as i64, alert as i64, r.ok as i64, r.regressed as i64, i64::from(keep));
        let streams = r.streams.map(i64::from);
        self.with(|c| {
            let mut tx = c.transaction()?;
            let n = tx.execute("UPDATE path_tests SET next_at = $1, regressed = $2, alert_pending = GREATEST(alert_pending, $3) WHERE id = $4", &[&next_at, &reg, &al, &schedule_id])?;
            if n == 0 {
                return Ok(None);
            }
            let row = tx.query_one(
                &format!(
                    "INSERT INTO path_test_results (schedule_id, at, ok, rtt_ms, one_gbps, many_gbps, streams, verdict, expected_gbps, error, baseline_gbps, regressed)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) RETURNING {RESULT_COLUMNS}"
                ),
                &[&schedule_id, &r.at, &ok, &r.rtt_ms, &r.one_gbps, &r.many_gbps, &streams, &r.verdict, &r.expected_gbps, &r.error, &r.baseline_gbps, &res_reg],
            )?;
            tx.execute(
                "DELETE FROM path_test_results WHERE schedule_id = $1 AND id <= (SELECT id FROM path_test_results WHERE schedule_id = $1 ORDER BY id DESC LIMIT 1 OFFSET $2)",
                &[&schedule_id, &keep],
            )?;
            tx.commit()?;
            Ok(Some(result_row(&row)))
        })
    }

    fn list_results(&self, schedule_id: i64, before: Option<i64>, limit: u32) -> StoreResult<Vec<TestResult>> {
        let limit = i64::from(limit);
        let rows = self.with(|c| {
            c.query(&format!("SELECT {RESULT_COLUMNS} FROM path_test_results WHERE schedule_id = $1 AND ($2::BIGINT IS NULL OR id < $2) ORDER BY id DESC LIMIT $3"), &[&schedule_id, &before, &limit])
        })?;
        Ok(rows.iter().rev().map(result_row).collect())
    }

    fn pending_test_alerts(&self) -> StoreResult<Vec<Schedule>> {
        let rows = self.with(|c| c.query(&format!("SELECT {SCHEDULE_COLUMNS} FROM path_tests WHERE alert_pending = 1 ORDER BY id"), &[]))?;
        rows.iter().map(schedule_row).collect()
    }

    fn mark_test_alert_sent(&self, id: i64) -> StoreResult<()> {
        self.with(|c| c.execute("UPDATE path_tests SET alert_pending = 0 WHERE id = $1", &[&id]))?;
        Ok(())
    }
}
