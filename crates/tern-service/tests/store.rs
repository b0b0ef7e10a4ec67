//! The `JobStore` contract, run unchanged against both backends: a real SQLite file and a real
//! PostgreSQL server started here. Plus the locked-database case on each: a clear error,
//! nothing changed, nothing lost.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

#[path = "support/pg.rs"]
mod pg;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tern_service::model::pathtest::{TestResult, TestSpec};
use tern_service::model::{JobOptions, JobSpec, JobState, Scope};
use tern_service::store::{JobStore, NewToken, StoreError};

/// Opens a store by name; the same name opens the same database again.
trait Backend {
    fn open(&self, name: &str) -> Arc<dyn JobStore>;
}

struct Sqlite(tempfile::TempDir);
impl Backend for Sqlite {
    fn open(&self, name: &str) -> Arc<dyn JobStore> {
        Arc::new(tern_service::sqlite::SqliteStore::open(&self.0.path().join(format!("{name}.db"))).unwrap())
    }
}

struct Postgres(pg::Postgres, Mutex<HashSet<String>>);
impl Backend for Postgres {
    fn open(&self, name: &str) -> Arc<dyn JobStore> {
        if self.1.lock().unwrap().insert(name.to_string()) {
            self.0.create_db(name);
        }
        Arc::new(tern_service::pg::PgStore::open(&self.0.url(name)).unwrap())
    }
}

fn spec(notify: bool) -> JobSpec {
    JobSpec { src: "/a".into(), dst: "/b".into(), sync: false, label: Some("l".into()), notify: notify.then(|| "https://example.org/hook".into()), options: JobOptions::default() }
}

fn claim_is_fifo_and_cas_protects_cancel(b: &dyn Backend) {
    let s = b.open("fifo");
    let a = s.insert_job(&spec(false), None, 1).unwrap();
    let c = s.insert_job(&spec(false), None, 1).unwrap();
    assert!(c.id > a.id);
    assert_eq!((a.state, a.attempts, a.notified), (JobState::Queued, 0, true));
    assert_eq!(s.claim_next(2).unwrap().unwrap().id, a.id);
    assert!(s.transition(a.id, &[JobState::Running], JobState::Canceled, 3).unwrap());
    // The child's exit arrives after the cancel: it must not win.
    assert!(!s.finish_attempt(a.id, JobState::Succeeded, None, None, 0, 4).unwrap());
    let j = s.get_job(a.id).unwrap().unwrap();
    assert_eq!((j.state, j.finished_at), (JobState::Canceled, Some(3)));
    let claimed = s.claim_next(5).unwrap().unwrap();
    assert_eq!((claimed.id, claimed.attempts, claimed.started_at), (c.id, 1, Some(5)));
    assert!(s.claim_next(5).unwrap().is_none());
    assert!(s.get_job(c.id + 100).unwrap().is_none());
}

fn reopening_recovers_running_jobs(b: &dyn Backend) {
    let id = {
        let s = b.open("reopen");
        let j = s.insert_job(&spec(false), None, 1).unwrap();
        s.claim_next(1).unwrap();
        j.id
    };
    // A second open finds the schema current (migrations are not re-run) and the job there.
    let s = b.open("reopen");
    assert_eq!(s.recover_interrupted(2).unwrap(), 1);
    let j = s.get_job(id).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Queued, 0));
    assert_eq!(s.recover_interrupted(3).unwrap(), 0);
}

fn retrying_jobs_wait_for_their_backoff(b: &dyn Backend) {
    let s = b.open("backoff");
    let j = s.insert_job(&spec(false), None, 1).unwrap();
    s.claim_next(1).unwrap();
    assert!(s.finish_attempt(j.id, JobState::Retrying, None, Some("network"), 100, 2).unwrap());
    assert!(s.claim_next(50).unwrap().is_none());
    assert_eq!(s.claim_next(100).unwrap().unwrap().attempts, 2);
    let summary = serde_json::json!({"ok": true, "bytes": 1234, "files": 3, "files_failed": 0});
    assert!(s.finish_attempt(j.id, JobState::Succeeded, Some(&summary), None, 0, 101).unwrap());
    let done = s.get_job(j.id).unwrap().unwrap();
    assert_eq!((done.state, done.finished_at, done.summary.as_ref()), (JobState::Succeeded, Some(101), Some(&summary)));
    let t = s.totals().unwrap();
    assert_eq!((t.retries, t.bytes, t.files, t.files_failed), (1, 1234, 3, 0));
    assert!(t.jobs_by_state.contains(&(JobState::Succeeded, 1)));
}

fn progress_requeue_and_notifications(b: &dyn Backend) {
    let s = b.open("notify");
    let j = s.insert_job(&spec(true), Some("tok1"), 1).unwrap();
    assert!(!j.notified);
    s.claim_next(1).unwrap();
    s.save_progress(j.id, &serde_json::json!({"bytes": 7}), 2).unwrap();
    assert_eq!(s.get_job(j.id).unwrap().unwrap().progress.unwrap()["bytes"], 7);
    assert!(s.finish_attempt(j.id, JobState::Failed, None, Some("dst: /b: permission denied"), 0, 3).unwrap());
    assert_eq!(s.pending_notifications().unwrap().iter().map(|j| j.id).collect::<Vec<_>>(), vec![j.id]);
    s.mark_notified(j.id).unwrap();
    assert!(s.pending_notifications().unwrap().is_empty());
    // Only failed/canceled jobs can be retried; a retry re-arms the notification.
    assert!(!s.requeue(j.id + 100, 4).unwrap());
    assert!(s.requeue(j.id, 4).unwrap());
    let r = s.get_job(j.id).unwrap().unwrap();
    assert_eq!((r.state, r.attempts, r.error, r.finished_at, r.notified), (JobState::Queued, 0, None, None, false));
    assert!(!s.requeue(j.id, 5).unwrap());
}

fn deadlines_fail_waiting_and_running_jobs(b: &dyn Backend) {
    let s = b.open("deadline");
    let mut d = spec(false);
    d.options.deadline = Some("2026-11-22T06:00:00Z".into());
    let plain = s.insert_job(&spec(false), None, 1).unwrap();
    let run = s.insert_job(&d, None, 1).unwrap();
    let wait = s.insert_job(&d, None, 1).unwrap();
    // Only waiting jobs that have a deadline are candidates.
    assert_eq!(s.waiting_with_deadline().unwrap().iter().map(|j| j.id).collect::<Vec<_>>(), vec![run.id, wait.id]);
    assert_eq!(s.claim_next(2).unwrap().unwrap().id, plain.id);
    assert_eq!(s.claim_next(2).unwrap().unwrap().id, run.id);
    assert_eq!(s.waiting_with_deadline().unwrap().iter().map(|j| j.id).collect::<Vec<_>>(), vec![wait.id]);
    // Compare-and-set: a running job is failed from `running` only, with its last progress.
    let p = serde_json::json!({"files_done": 1, "files_total": 3});
    assert!(!s.fail_job(run.id, &[JobState::Queued, JobState::Retrying], "x", None, 3).unwrap());
    assert!(s.fail_job(run.id, &[JobState::Running], "deadline passed", Some(&p), 3).unwrap());
    let j = s.get_job(run.id).unwrap().unwrap();
    assert_eq!((j.state, j.error.as_deref(), j.finished_at, j.progress), (JobState::Failed, Some("deadline passed"), Some(3), Some(p)));
    // The child's late exit changes nothing.
    assert!(!s.finish_attempt(run.id, JobState::Succeeded, None, None, 0, 4).unwrap());
    assert!(s.fail_job(wait.id, &[JobState::Queued, JobState::Retrying], "deadline passed", None, 3).unwrap());
    assert!(s.waiting_with_deadline().unwrap().is_empty());
    // A retry with a new deadline: the spec of a failed job is replaced, not of a running one.
    d.options.deadline = Some("2027-01-01T00:00:00Z".into());
    assert!(s.set_spec(wait.id, &d).unwrap());
    assert!(!s.set_spec(plain.id, &d).unwrap());
    assert_eq!(s.get_job(wait.id).unwrap().unwrap().spec.options.deadline.as_deref(), Some("2027-01-01T00:00:00Z"));
}

fn list_filters_newest_first(b: &dyn Backend) {
    let s = b.open("list");
    let ids: Vec<i64> = (0..5).map(|i| s.insert_job(&spec(false), Some(if i % 2 == 0 { "alice" } else { "bob" }), i).unwrap().id).collect();
    s.claim_next(10).unwrap();
    let all = s.list_jobs(None, None, 100).unwrap();
    assert_eq!(all.iter().map(|j| j.id).collect::<Vec<_>>(), ids.iter().rev().copied().collect::<Vec<_>>());
    assert_eq!(s.list_jobs(None, None, 2).unwrap().len(), 2);
    assert_eq!(s.list_jobs(None, Some("bob"), 100).unwrap().len(), 2);
    let running = s.list_jobs(Some(JobState::Running), None, 100).unwrap();
    assert_eq!(running.len(), 1);
    assert_eq!(s.list_jobs(Some(JobState::Queued), Some("alice"), 100).unwrap().len(), 3 - running.iter().filter(|j| j.owner.as_deref() == Some("alice")).count());
}

fn tokens_hashed_revoked_and_expiring(b: &dyn Backend) {
    let s = b.open("tokens");
    let (h1, h2) = ([1u8; 32], [2u8; 32]);
    let t = s.insert_token(&NewToken { id: "a1", name: "first", scope: Scope::Admin, hash: &h1, path_prefix: None, created_by: None, expires_at: None, run_as: None }, 10).unwrap();
    assert_eq!((t.scope, t.created_at, t.revoked_at), (Scope::Admin, 10, None));
    s.insert_token(&NewToken { id: "r1", name: "portal", scope: Scope::Read, hash: &h2, path_prefix: Some("/data/x"), created_by: Some("a1"), expires_at: Some(100), run_as: None }, 11).unwrap();
    // The same hash twice is refused (unique index), whatever the backend.
    assert!(s.insert_token(&NewToken { id: "r2", name: "dup", scope: Scope::Read, hash: &h2, path_prefix: None, created_by: None, expires_at: None, run_as: None }, 12).is_err());
    let r = s.token_by_hash(&h2).unwrap().unwrap();
    assert_eq!((r.id.as_str(), r.path_prefix.as_deref(), r.created_by.as_deref(), r.expires_at), ("r1", Some("/data/x"), Some("a1"), Some(100)));
    assert!(s.token_by_hash(&[3u8; 32]).unwrap().is_none());
    assert_eq!(s.list_tokens().unwrap().iter().map(|t| t.id.as_str()).collect::<Vec<_>>(), vec!["a1", "r1"]);
    assert_eq!((s.live_tokens(Scope::Read, 50).unwrap(), s.live_tokens(Scope::Read, 100).unwrap()), (1, 0));
    s.touch_token("r1", 60).unwrap();
    assert_eq!(s.token_by_hash(&h2).unwrap().unwrap().last_used_at, Some(60));
    assert!(s.revoke_token("a1", 70).unwrap());
    assert!(s.revoke_token("a1", 80).unwrap());
    assert_eq!(s.token_by_hash(&h1).unwrap().unwrap().revoked_at, Some(70));
    assert!(!s.revoke_token("nope", 70).unwrap());
    assert_eq!(s.live_tokens(Scope::Admin, 71).unwrap(), 0);
}

/// Two stores on one database (two services, or a service and a restarted one) claiming at
/// once: every job is claimed exactly once.
fn concurrent_claims_never_double_claim(b: &dyn Backend) {
    let s1 = b.open("race");
    let s2 = b.open("race");
    let n = 60;
    for _ in 0..n {
        s1.insert_job(&spec(false), None, 1).unwrap();
    }
    let claimed = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = [s1, s2]
        .into_iter()
        .flat_map(|s| [s.clone(), s])
        .map(|s| {
            let claimed = claimed.clone();
            std::thread::spawn(move || {
                while let Some(j) = s.claim_next(2).unwrap() {
                    claimed.lock().unwrap().push(j.id);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut ids = claimed.lock().unwrap().clone();
    ids.sort();
    let before = ids.len();
    ids.dedup();
    assert_eq!((before, ids.len()), (n, n), "each job claimed exactly once");
}

/// Owners (tokens) share the run slots: the owner with fewer running jobs goes first, then
/// the one served longest ago; one owner's jobs stay in submission order.
fn claims_share_slots_fairly_between_owners(b: &dyn Backend) {
    let s = b.open("fair");
    let a: Vec<i64> = (0..4).map(|_| s.insert_job(&spec(false), Some("alice"), 1).unwrap().id).collect();
    let bo: Vec<i64> = (0..2).map(|_| s.insert_job(&spec(false), Some("bob"), 1).unwrap().id).collect();
    let claim = || s.claim_next(2).unwrap().unwrap().id;
    let done = |id: i64| assert!(s.finish_attempt(id, JobState::Succeeded, None, None, 0, 3).unwrap());
    // Two slots: alice's oldest, then bob's (he has nothing running) although alice was first.
    let (x, y) = (claim(), claim());
    assert_eq!((x, y), (a[0], bo[0]), "FIFO would have started alice's second job");
    done(x);
    let z = claim();
    assert_eq!(z, a[1]);
    done(y);
    assert_eq!(claim(), bo[1], "bob's turn again: alice has one running, he has none");
    done(z);
    assert_eq!(claim(), a[2]);
    assert_eq!(claim(), a[3], "with only alice waiting, she gets every free slot");
    // One slot (serial): strict alternation by who was served longest ago.
    let s = b.open("fair_serial");
    let a: Vec<i64> = (0..3).map(|_| s.insert_job(&spec(false), Some("alice"), 1).unwrap().id).collect();
    let bo: Vec<i64> = (0..2).map(|_| s.insert_job(&spec(false), Some("bob"), 1).unwrap().id).collect();
    let mut order = Vec::new();
    while let Some(j) = s.claim_next(2).unwrap() {
        order.push(j.id);
        assert!(s.finish_attempt(j.id, JobState::Succeeded, None, None, 0, 3).unwrap());
    }
    assert_eq!(order, vec![a[0], bo[0], a[1], bo[1], a[2]]);
}

fn test_spec(dest: &str) -> TestSpec {
    TestSpec {
        dest: dest.into(),
        every_s: 600,
        streams: Some(4),
        seconds: 5,
        pull: false,
        no_encrypt: false,
        token_file: None,
        alert_below: 0.5,
        notify: Some("https://example.org/h".into()),
        label: None,
    }
}

fn result(at: i64, many: Option<f64>) -> TestResult {
    TestResult {
        at,
        ok: many.is_some(),
        rtt_ms: Some(0.2),
        one_gbps: many.map(|m| m / 2.0),
        many_gbps: many,
        streams: Some(4),
        verdict: Some("network".into()),
        error: many.is_none().then(|| "refused".into()),
        ..Default::default()
    }
}

/// Scheduled path tests: due order, results oldest first and bounded, paging, regressed and
/// pending-alert state, owners, delete (with the results), and all of it kept across a reopen.
fn path_test_schedules_and_results(b: &dyn Backend) {
    let s = b.open("pathtests");
    let a = s.insert_schedule(&test_spec("tern://dtn2/x"), Some("alice"), 100).unwrap();
    let c = s.insert_schedule(&test_spec("tern://dtn3/y"), Some("bob"), 50).unwrap();
    assert_eq!((a.next_at, a.regressed, a.alert_pending, a.spec.clone()), (100, false, false, test_spec("tern://dtn2/x")));
    assert_eq!(s.due_schedule(49).unwrap().map(|x| x.id), None);
    assert_eq!(s.due_schedule(100).unwrap().unwrap().id, c.id, "the one due longest ago first");
    assert_eq!(s.list_schedules(Some("alice")).unwrap().iter().map(|x| x.id).collect::<Vec<_>>(), [a.id]);
    assert_eq!(s.list_schedules(None).unwrap().len(), 2);
    for i in 0..7 {
        let r = s.record_result(a.id, &result(100 + i, (i != 3).then_some(1.0 + i as f64)), 700 + i, false, false, 5).unwrap().unwrap();
        assert!(r.id > 0 && r.at == 100 + i);
    }
    let all = s.list_results(a.id, None, 100).unwrap();
    assert_eq!(all.iter().map(|r| r.at).collect::<Vec<_>>(), [102, 103, 104, 105, 106], "the newest 5 kept, oldest first");
    assert_eq!((all[1].ok, all[1].error.as_deref(), all[1].many_gbps), (false, Some("refused"), None));
    assert_eq!((all[4].many_gbps, all[4].one_gbps, all[4].streams, all[4].verdict.as_deref()), (Some(7.0), Some(3.5), Some(4), Some("network")));
    let page = s.list_results(a.id, None, 2).unwrap();
    assert_eq!(page.iter().map(|r| r.at).collect::<Vec<_>>(), [105, 106]);
    let older = s.list_results(a.id, Some(page[0].id), 2).unwrap();
    assert_eq!(older.iter().map(|r| r.at).collect::<Vec<_>>(), [103, 104]);
    assert!(s.list_results(c.id, None, 10).unwrap().is_empty());
    // Crossing into regression leaves a pending alert until it is marked sent.
    let mut bad = result(200, Some(0.1));
    (bad.baseline_gbps, bad.regressed) = (Some(5.0), true);
    let stored = s.record_result(a.id, &bad, 800, true, true, 5).unwrap().unwrap();
    assert_eq!((stored.regressed, stored.baseline_gbps), (true, Some(5.0)));
    let got = s.get_schedule(a.id).unwrap().unwrap();
    assert_eq!((got.next_at, got.regressed, got.alert_pending), (800, true, true));
    assert_eq!(s.pending_test_alerts().unwrap().iter().map(|x| x.id).collect::<Vec<_>>(), [a.id]);
    // Still regressed, no new alert: the pending one stays pending.
    s.record_result(a.id, &result(201, Some(0.1)), 900, true, false, 5).unwrap();
    assert!(s.get_schedule(a.id).unwrap().unwrap().alert_pending);
    s.mark_test_alert_sent(a.id).unwrap();
    assert!(s.pending_test_alerts().unwrap().is_empty());
    drop(s);
    // Reopened: everything is still there.
    let s = b.open("pathtests");
    assert_eq!(s.list_results(a.id, None, 100).unwrap().len(), 5);
    assert_eq!(s.get_schedule(a.id).unwrap().unwrap().next_at, 900);
    assert!(s.delete_schedule(a.id).unwrap());
    assert!(!s.delete_schedule(a.id).unwrap());
    assert!(s.get_schedule(a.id).unwrap().is_none() && s.list_results(a.id, None, 100).unwrap().is_empty());
    assert_eq!(s.record_result(a.id, &result(300, Some(1.0)), 1000, false, false, 5).unwrap(), None, "a deleted schedule's late result is dropped");
    assert_eq!(s.list_schedules(None).unwrap().len(), 1);
}

fn run_suite(b: &dyn Backend) {
    type Check = fn(&dyn Backend);
    let checks: &[(&str, Check)] = &[
        ("claim_is_fifo_and_cas_protects_cancel", claim_is_fifo_and_cas_protects_cancel),
        ("reopening_recovers_running_jobs", reopening_recovers_running_jobs),
        ("retrying_jobs_wait_for_their_backoff", retrying_jobs_wait_for_their_backoff),
        ("progress_requeue_and_notifications", progress_requeue_and_notifications),
        ("list_filters_newest_first", list_filters_newest_first),
        ("deadlines_fail_waiting_and_running_jobs", deadlines_fail_waiting_and_running_jobs),
        ("tokens_hashed_revoked_and_expiring", tokens_hashed_revoked_and_expiring),
        ("concurrent_claims_never_double_claim", concurrent_claims_never_double_claim),
        ("claims_share_slots_fairly_between_owners", claims_share_slots_fairly_between_owners),
        ("path_test_schedules_and_results", path_test_schedules_and_results),
    ];
    for (name, check) in checks {
        let t = Instant::now();
        check(b);
        eprintln!("  {name}: ok ({:?})", t.elapsed());
    }
}

/// While `hold` keeps the database locked from outside, a write fails with `Busy` naming the
/// lock (after the store's wait), reads still work, and once the lock is gone the write
/// succeeds with every earlier job intact.
fn locked_database_is_a_clear_error_and_loses_nothing(s: &dyn JobStore, hold: impl FnOnce() -> Box<dyn FnOnce()>) {
    let before: Vec<i64> = (0..3).map(|_| s.insert_job(&spec(false), Some("o"), 1).unwrap().id).collect();
    let release = hold();
    let t = Instant::now();
    let err = s.insert_job(&spec(false), Some("o"), 2).expect_err("a write while the database is locked must fail, not hang");
    let waited = t.elapsed();
    assert!(matches!(err, StoreError::Busy(_)), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("locked") && msg.contains("try again"), "{msg}");
    assert!(waited >= Duration::from_secs(4) && waited < Duration::from_secs(20), "waited {waited:?}");
    eprintln!("  locked: {msg} (after {waited:?})");
    release();
    let after = s.insert_job(&spec(false), Some("o"), 3).unwrap();
    let ids: Vec<i64> = s.list_jobs(None, None, 100).unwrap().iter().map(|j| j.id).rev().collect();
    let mut want = before.clone();
    want.push(after.id);
    assert_eq!(ids, want, "the jobs queued before the lock are all still there, and only they");
}

#[test]
fn store_contract_on_sqlite() {
    let b = Sqlite(tempfile::tempdir().unwrap());
    run_suite(&b);
    let s = b.open("locked");
    let path = b.0.path().join("locked.db");
    locked_database_is_a_clear_error_and_loses_nothing(s.as_ref(), move || {
        // Another process (a backup, the sqlite3 CLI) holding the write lock.
        let other = rusqlite::Connection::open(&path).unwrap();
        other.execute_batch("BEGIN IMMEDIATE; INSERT INTO jobs (state, spec, created_at, updated_at) VALUES ('queued', '{}', 0, 0);").unwrap();
        Box::new(move || other.execute_batch("ROLLBACK").unwrap())
    });
}

#[test]
fn store_contract_on_postgres() {
    let Some(server) = pg::Postgres::start() else { return };
    let b = Postgres(server, Mutex::new(HashSet::new()));
    run_suite(&b);
    let s = b.open("locked");
    let mut lock = b.0.psql("locked");
    locked_database_is_a_clear_error_and_loses_nothing(s.as_ref(), move || {
        // Another session holding the table: psql stays in its transaction until stdin closes.
        use std::io::Write;
        let mut child = lock.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"BEGIN; LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE; \\echo locked\n").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
        assert_eq!(line.trim(), "locked");
        Box::new(move || {
            stdin.write_all(b"ROLLBACK;\n").unwrap();
            drop(stdin);
            let _ = child.wait();
        })
    });
}

/// Cluster nodes on one PostgreSQL (migrations 0005-0007): every claim names its node
/// (`run_node`), a restarting node takes back only its own attempts, and the attempts of a node
/// that left (or fell silent) are re-queued by a live node, never by the dead one's own store.
/// PostgreSQL only: SQLite serves one node.
#[test]
fn cluster_nodes_share_the_job_table_on_postgres() {
    let Some(server) = pg::Postgres::start() else { return };
    let url = server.create_db("nodes");
    let node = |n: &str| tern_service::pg::PgStore::open_as(&url, Some(("site-b".into(), n.into()))).unwrap();
    let (a, b) = (node("dtn-a"), node("dtn-b"));
    assert!(a.shared_with_other_nodes() && !tern_service::pg::PgStore::open(&url).unwrap().shared_with_other_nodes());
    let sql = |q: &str| {
        let out = server.psql("nodes").args(["-tA", "-c", q]).output().unwrap();
        assert!(out.status.success(), "{q}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let (ja, jb) = (a.insert_job(&spec(false), None, 1).unwrap().id, a.insert_job(&spec(false), None, 1).unwrap().id);
    assert_eq!(a.claim_next(2).unwrap().map(|j| j.id), Some(ja));
    assert_eq!(b.claim_next(2).unwrap().map(|j| j.id), Some(jb), "a job submitted through one node runs on another");
    assert_eq!(sql(&format!("SELECT run_node FROM jobs WHERE id IN ({ja}, {jb}) ORDER BY id")), "dtn-a\ndtn-b");
    // dtn-a restarts: its own attempt goes back to the queue, dtn-b's keeps running.
    assert_eq!(a.recover_interrupted(3).unwrap(), 1);
    let state = |id: i64| a.get_job(id).unwrap().unwrap().state;
    assert_eq!((state(ja), state(jb)), (JobState::Queued, JobState::Running));
    // dtn-b is live: nobody takes its attempt.
    let register = |n: &str, st: &str, beat_ago_ms: i64| {
        sql(&format!(
            "INSERT INTO cluster_nodes (cluster, node, host, version, roots_digest, secret_digest, listen, state, incarnation, heartbeat_ms, heartbeat_at)
             VALUES ('site-b', '{n}', 'h', 'v', 'r', 's', 'h:1', '{st}', 1, 1000, now() - interval '{beat_ago_ms} milliseconds')
             ON CONFLICT (cluster, node) DO UPDATE SET state = EXCLUDED.state, heartbeat_at = EXCLUDED.heartbeat_at"
        ))
    };
    register("dtn-a", "active", 0);
    register("dtn-b", "active", 500);
    assert_eq!(a.recover_orphans(4).unwrap(), 0, "a live node's attempt is left alone");
    // Silent for 3 of its heartbeats: a live node re-queues it (the transfer resumes from its
    // journals); its own store never does.
    register("dtn-b", "active", 3500);
    assert_eq!(b.recover_orphans(5).unwrap(), 0, "a node never re-queues its own attempts as orphans");
    assert_eq!(a.recover_orphans(5).unwrap(), 1);
    let j = a.get_job(jb).unwrap().unwrap();
    assert_eq!((j.state, j.attempts), (JobState::Queued, 0), "the interrupted attempt does not count");
    // A node that left cleanly: the same.
    assert_eq!(b.claim_next(6).unwrap().map(|j| j.id), Some(ja));
    register("dtn-b", "left", 0);
    assert_eq!(a.recover_orphans(7).unwrap(), 1);
    assert_eq!(state(ja), JobState::Queued);
}
