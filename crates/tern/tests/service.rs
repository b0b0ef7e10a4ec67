//! The managed service (issue 4) end to end: a real `tern serve --http-listen` with a real
//! SQLite file, real child transfers, the real CLI; kill -9 and restart; a bounded load test.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use crate::pg;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::netns::Netns;
use common::*;
use serde_json::{Value, json};
use tern_service::client::Client;

/// A real `tern serve` with the service API; killed with SIGKILL (by PID) on drop.
struct Service {
    child: Child,
    pub http: u16,
    pub data_port: u16,
    pub state: PathBuf,
    pub root: PathBuf,
    pub daemon_token: PathBuf,
    env: Vec<(String, String)>,
    extra: Vec<String>,
}

impl Service {
    /// With the policy the older tests assume: jobs may use anything under `base` (but the
    /// state directory), reach 127.0.0.1, and run as root when the tests do.
    fn start(base: &Path, env: &[(&str, &str)], extra: &[&str]) -> Self {
        let b = base.to_str().unwrap();
        let mut all = vec!["--job-root", b, "--allow-host", "127.0.0.1", "--allow-root-transfers"];
        all.extend_from_slice(extra);
        Self::start_bare(base, env, &all)
    }

    /// Only `extra` on top of the daemon and service addresses: the service's own defaults.
    fn start_bare(base: &Path, env: &[(&str, &str)], extra: &[&str]) -> Self {
        let mut s = Self::unspawned(base, &base.join("root"), &base.join("daemon.token"), env, extra);
        s.spawn();
        s
    }

    /// Its state under `base`; the daemon's root and token where given (a cluster's nodes share
    /// them). Not started yet.
    fn unspawned(base: &Path, root: &Path, token: &Path, env: &[(&str, &str)], extra: &[&str]) -> Self {
        std::fs::create_dir_all(root).unwrap();
        std::fs::create_dir_all(base).unwrap();
        Service {
            child: Command::new("true").spawn().unwrap(),
            http: 0,
            data_port: 0,
            state: base.join("state"),
            root: root.to_path_buf(),
            daemon_token: token.to_path_buf(),
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn launch(&mut self) {
        let _ = self.child.wait();
        let mut cmd = Command::new(tern_bin());
        cmd.args(["serve", "--listen", &format!("127.0.0.1:{}", self.data_port), "--http-listen", &format!("127.0.0.1:{}", self.http)])
            .arg("--root")
            .arg(&self.root)
            .arg("--token-file")
            .arg(&self.daemon_token)
            .arg("--state-dir")
            .arg(&self.state)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(self.state.with_file_name("service.log")).unwrap())
            .env("TERN_LOG", "info");
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        self.child = cmd.spawn().unwrap();
    }

    /// Starts `tern serve` and waits until this very process says it serves, taking its ports
    /// from what it says: the first start binds port 0 (`wait_for_serving` says why), a restart
    /// the ports it had, which clients already know.
    fn spawn(&mut self) {
        let log = self.state.with_file_name("service.log");
        let from = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
        self.launch();
        match wait_for_serving(&mut self.child, &log, from) {
            Ok((http, data_port)) => (self.http, self.data_port) = (http, data_port),
            Err(said) => panic!("tern serve exited at start: {said}"),
        }
    }

    fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.http)
    }

    fn ca(&self) -> PathBuf {
        self.state.join("tls/cert.pem")
    }

    fn admin(&self) -> String {
        std::fs::read_to_string(self.state.join("admin.token")).unwrap().trim().to_string()
    }

    fn client(&self, token: &str) -> Client {
        Client::new(&self.url(), token, Some(&self.ca())).unwrap()
    }

    /// Runs the CLI against this service with `token`; (exit code, stdout, stderr).
    fn cli(&self, token: &str, args: &[&str]) -> (i32, String, String) {
        let mut cmd = Command::new(tern_bin());
        cmd.args(args).env("TERN_SERVER", self.url()).env("TERN_TOKEN", token).env("TERN_CA_FILE", self.ca()).stdin(Stdio::null());
        let out = run_bounded(cmd, Duration::from_secs(120));
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).trim().to_string(), String::from_utf8_lossy(&out.stderr).into_owned())
    }

    fn token(&self, scope: &str, extra: &[&str]) -> String {
        let mut args = vec!["token", "create", "--scope", scope];
        args.extend_from_slice(extra);
        let (code, out, err) = self.cli(&self.admin(), &args);
        assert_eq!(code, 0, "token create: {err}");
        out
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn job(c: &Client, id: u64) -> Value {
    c.call("GET", &format!("/v1/jobs/{id}"), None).unwrap()
}

fn submit(s: &Service, token: &str, args: &[&str]) -> u64 {
    let mut a = vec!["submit"];
    a.extend_from_slice(args);
    let (code, out, err) = s.cli(token, &a);
    assert_eq!(code, 0, "submit failed: {err}");
    out.parse().unwrap_or_else(|_| panic!("submit printed '{out}', not a job id"))
}

fn small_tree(root: &Path) {
    for i in 0..20u64 {
        write_file(&root.join(format!("d{}/f{i}.dat", i % 3)), i, (i as usize * 7919) % 300_000);
    }
}

#[test]
fn service_runs_local_and_daemon_jobs_to_verified_completion() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &["--webhook-allow", "127.0.0.1"]);
    let admin = s.admin();
    let src = t.path().join("src");
    small_tree(&src);
    let transfer = s.token("transfer", &["--expires", "90d", "--name", "batch"]);

    // A webhook receiver: one POST, answered 200.
    let hook = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let hook_url = format!("http://{}/hook", hook.local_addr().unwrap());
    let hook_thread = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let (mut sock, _) = hook.accept().unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 65536];
        // Headers, then Content-Length bytes of body.
        let complete = |r: &[u8]| {
            let text = String::from_utf8_lossy(r).to_lowercase();
            let Some(end) = text.find("\r\n\r\n") else { return false };
            let len = text.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse::<usize>().ok());
            len.is_some_and(|n| r.len() >= end + 4 + n)
        };
        while !complete(&req) {
            let n = sock.read(&mut buf).unwrap();
            assert!(n > 0, "webhook connection closed early: {}", String::from_utf8_lossy(&req));
            req.extend_from_slice(&buf[..n]);
        }
        sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n").unwrap();
        String::from_utf8_lossy(&req).into_owned()
    });

    // Local to local, through the CLI as a batch script would: submit && wait.
    let dst = t.path().join("dst");
    let id = submit(&s, &transfer, &[src.to_str().unwrap(), dst.to_str().unwrap(), "--label", "local", "--notify", &hook_url]);
    let (code, _, err) = s.cli(&transfer, &["wait", &id.to_string()]);
    assert_eq!(code, 0, "wait: {err}");
    assert_same_tree(&src, &dst);
    assert_no_leftovers(&dst);
    let posted = hook_thread.join().unwrap();
    assert!(posted.starts_with("POST /hook"), "{posted}");
    let hooked: Value = serde_json::from_str(&posted[posted.find("\r\n\r\n").unwrap() + 4..]).unwrap();
    assert_eq!((hooked["job"]["id"].as_u64(), hooked["job"]["state"].as_str()), (Some(id), Some("succeeded")), "{posted}");

    // Through the data daemon of the same `tern serve`.
    let url = format!("tern://127.0.0.1:{}/incoming", s.data_port);
    let id2 = submit(&s, &transfer, &[&format!("{}/.", src.display()), &url, "--token-file", s.daemon_token.to_str().unwrap()]);
    let (code, _, err) = s.cli(&transfer, &["wait", &id2.to_string()]);
    assert_eq!(code, 0, "wait (daemon job): {err}");
    assert_same_tree(&src, &s.root.join("incoming"));

    let (code, out, _) = s.cli(&transfer, &["status", &id2.to_string(), "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["state"], "succeeded");
    assert_eq!(v["summary"]["ok"], true);
    assert_eq!(v["summary"]["files"], 20);
    let (code, out, _) = s.cli(&transfer, &["jobs"]);
    assert!(code == 0 && out.contains("succeeded") && out.contains("local"), "{out}");
    let metrics = s.client(&admin).get_text("/metrics").unwrap();
    assert!(metrics.contains("tern_jobs{state=\"succeeded\"} 2"), "{metrics}");
    assert!(metrics.contains("tern_transferred_files_total 40"), "{metrics}");
}

#[test]
fn service_refuses_bad_tokens_and_requests_with_clear_statuses() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &[]);
    let admin = s.admin();
    let data = t.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    write_file(&data.join("a"), 1, 1000);
    let body = json!({ "src": data.join("a").to_str().unwrap(), "dst": data.join("b").to_str().unwrap() });
    let status = |tok: &str, method: &str, path: &str, b: Option<&Value>| s.client(tok).call(method, path, b).err().map(|e| (e.status, e.message)).unwrap_or((200, String::new()));

    // Every documented route is served and authenticated; every served route is documented.
    let doc: Value = serde_json::from_str(tern_service::api::OPENAPI).unwrap();
    let mut documented: Vec<(String, String)> = Vec::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        for method in ops.as_object().unwrap().keys() {
            documented.push((method.to_uppercase(), path.clone()));
        }
    }
    let mut served: Vec<(String, String)> = tern_service::api::routes().into_iter().map(|(m, p)| (m.to_string(), p.to_string())).collect();
    documented.sort();
    served.sort();
    assert_eq!(documented, served, "docs/openapi.json and the served routes differ");
    let nobody = Client::new(&s.url(), "", Some(&s.ca())).unwrap();
    let empty = json!({});
    for (m, p) in served.iter().filter(|(_, p)| p != "/healthz") {
        let p = p.replace("{id}", "1");
        let e = nobody.call(m, &p, if m == "POST" { Some(&empty) } else { None }).unwrap_err();
        assert_eq!(e.status, 401, "{m} {p}: {}", e.message);
    }
    assert_eq!(status(&admin, "GET", "/v1/nothing", None).0, 404);

    // Scopes.
    let read = s.token("read", &[]);
    let (code, msg) = status(&read, "POST", "/v1/jobs", Some(&body));
    assert!(code == 403 && msg.contains("scope 'read'"), "{code} {msg}");
    assert_eq!(status(&read, "GET", "/v1/jobs", None).0, 200);
    let transfer = s.token("transfer", &[]);
    assert_eq!(status(&transfer, "GET", "/v1/tokens", None).0, 403);
    let with_ssh = json!({ "src": "/x", "dst": "h:/y", "options": { "ssh": "sh -c evil" } });
    assert_eq!(status(&transfer, "POST", "/v1/jobs", Some(&with_ssh)).0, 403);

    // Path prefix.
    let confined = s.token("transfer", &["--path", data.to_str().unwrap()]);
    let outside = json!({ "src": "/etc/passwd", "dst": data.join("p").to_str().unwrap() });
    let (code, msg) = status(&confined, "POST", "/v1/jobs", Some(&outside));
    assert!(code == 403 && msg.contains("outside"), "{code} {msg}");
    let inside = s.client(&confined).call("POST", "/v1/jobs", Some(&body)).unwrap();
    let id = inside["id"].as_u64().unwrap();

    // Revoked and expired tokens.
    let doomed = s.token("read", &[]);
    let doomed_id = doomed.split('_').nth(1).unwrap().to_string();
    let (code, _, err) = s.cli(&admin, &["token", "revoke", &doomed_id]);
    assert_eq!(code, 0, "{err}");
    let (code, msg) = status(&doomed, "GET", "/v1/jobs", None);
    assert!(code == 401 && msg.contains("revoked"), "{code} {msg}");
    let short = s.token("read", &["--expires", "1s"]);
    std::thread::sleep(Duration::from_millis(2100));
    let (code, msg) = status(&short, "GET", "/v1/jobs", None);
    assert!(code == 401 && msg.contains("expired"), "{code} {msg}");
    let (code, msg) = status("tern_0123456789abcdef_0000000000000000000000000000000000000000000000000000000000000000", "GET", "/v1/jobs", None);
    assert!(code == 401 && msg.contains("unknown"), "{code} {msg}");
    assert_eq!(status("garbage", "GET", "/v1/jobs", None).0, 401);
    // The CLI shows the server's reason and fails.
    let (code, _, err) = s.cli(&doomed, &["jobs"]);
    assert!(code != 0 && err.contains("revoked"), "{err}");

    // Malformed, oversized, unknown.
    let c = s.client(&admin);
    assert_eq!(c.send_raw("/v1/jobs", "application/json", b"{not json").unwrap_err().status, 400);
    assert_eq!(c.send_raw("/v1/jobs", "text/plain", b"{}").unwrap_err().status, 415);
    assert_eq!(c.send_raw("/v1/jobs", "application/json", &vec![b' '; 100_000]).unwrap_err().status, 413);
    let e = c.call("POST", "/v1/jobs", Some(&json!({ "src": "/a", "dst": "/b", "surprise": 1 }))).unwrap_err();
    assert!(e.status == 422 && e.message.contains("surprise"), "{e}");
    let e = c.call("POST", "/v1/jobs", Some(&json!({ "src": "relative", "dst": "/b" }))).unwrap_err();
    assert!(e.status == 400 && e.message.contains("absolute"), "{e}");
    assert_eq!(c.call("GET", "/v1/jobs/999999", None).unwrap_err().status, 404);
    assert_eq!(c.call("GET", "/v1/jobs/abc", None).unwrap_err().status, 400);
    assert_eq!(c.call("GET", "/v1/jobs?state=bogus", None).unwrap_err().status, 400);
    // A finished job cannot be canceled; the last admin token cannot be revoked.
    let (code, _, _) = s.cli(&confined, &["wait", &id.to_string()]);
    assert_eq!(code, 0);
    assert_eq!(c.call("POST", &format!("/v1/jobs/{id}/cancel"), None).unwrap_err().status, 409);
    let admin_id = admin.split('_').nth(1).unwrap();
    assert_eq!(c.call("DELETE", &format!("/v1/tokens/{admin_id}"), None).unwrap_err().status, 409);
    // Confined tokens see only their own jobs.
    assert_eq!(status(&confined, "GET", "/v1/jobs", None).0, 200);
}

#[test]
fn service_cancel_stops_a_running_job() {
    let t = scratch();
    let s = Service::start(t.path(), &[("TERN_FAULT_DELAY_MS", "20")], &[]);
    let admin = s.admin();
    write_file(&t.path().join("src/big"), 7, 32 << 20);
    let dst = t.path().join("dst");
    let id = submit(&s, &admin, &[t.path().join("src").to_str().unwrap(), dst.to_str().unwrap(), "--chunk-size", "64K", "--streams", "2"]);
    let c = s.client(&admin);
    let deadline = Instant::now() + Duration::from_secs(30);
    while job(&c, id)["state"] != "running" {
        assert!(Instant::now() < deadline, "job never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (code, out, err) = s.cli(&admin, &["cancel", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("canceled"), "{out}");
    let started = Instant::now();
    let (code, _, _) = s.cli(&admin, &["wait", &id.to_string()]);
    assert_eq!(code, 3, "wait exits 3 for a canceled job");
    assert!(started.elapsed() < Duration::from_secs(10));
    // The child is gone: nothing keeps writing, the state stays canceled.
    std::thread::sleep(Duration::from_millis(500));
    let j = job(&c, id);
    assert_eq!(j["state"], "canceled", "{j}");
    assert!(!dst.join("big").exists(), "a canceled copy must not land under the final name");
    // And it can be queued again.
    let (code, _, err) = s.cli(&admin, &["retry", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
}

#[test]
fn service_resumes_jobs_after_kill_9_and_never_redoes_finished_ones() {
    let t = scratch();
    let mut s = Service::start(t.path(), &[("TERN_FAULT_DELAY_MS", "20")], &[]);
    let admin = s.admin();
    let c = s.client(&admin);
    // A small job finishes first: after the crash it must stay done, untouched.
    write_file(&t.path().join("small/a"), 3, 1000);
    let small = submit(&s, &admin, &[t.path().join("small").to_str().unwrap(), t.path().join("small-copy").to_str().unwrap()]);
    assert_eq!(s.cli(&admin, &["wait", &small.to_string()]).0, 0);
    let small_before = job(&c, small);

    let size = 24u64 << 20;
    write_file(&t.path().join("src/big"), 9, size as usize);
    let dst = t.path().join("dst");
    let id = submit(&s, &admin, &[t.path().join("src").to_str().unwrap(), dst.to_str().unwrap(), "--chunk-size", "64K", "--streams", "2"]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let j = job(&c, id);
        let done = j["progress"]["bytes"].as_u64().unwrap_or(0);
        if done > size / 4 {
            break;
        }
        assert!(j["state"] != "succeeded", "the job finished before the kill; slow it down");
        assert!(Instant::now() < deadline, "no progress: {j}");
        std::thread::sleep(Duration::from_millis(100));
    }
    // A batch script's `tern wait`, started before the crash, rides over the restart.
    let mut waiter = Command::new(tern_bin())
        .args(["wait", &id.to_string()])
        .env("TERN_SERVER", s.url())
        .env("TERN_TOKEN", &admin)
        .env("TERN_CA_FILE", s.ca())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    s.kill9();
    s.spawn();
    let c = s.client(&admin);
    let deadline = Instant::now() + Duration::from_secs(90);
    let code = loop {
        if let Some(st) = waiter.try_wait().unwrap() {
            break st.code();
        }
        if Instant::now() > deadline {
            let _ = waiter.kill();
            panic!("tern wait did not return after the restart");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(code, Some(0), "tern wait across the restart");
    assert_same_tree(&t.path().join("src"), &dst);
    assert_no_leftovers(&dst);
    let j = job(&c, id);
    let resent = j["summary"]["bytes"].as_u64().unwrap();
    assert!(resent < size * 3 / 4 + (4 << 20), "the resumed attempt sent {resent} of {size} bytes: verified data was re-sent");
    assert_eq!(j["attempts"], 1, "the interrupted attempt does not count: {j}");
    let small_after = job(&c, small);
    assert_eq!(small_after["state"], "succeeded");
    assert_eq!(small_after["finished_at"], small_before["finished_at"], "a finished job was run again");
    eprintln!("kill -9 resume: second attempt sent {:.1} MiB of {} MiB", resent as f64 / (1 << 20) as f64, size >> 20);
}

#[test]
fn service_load_200_jobs_from_4_clients_none_lost_or_duplicated() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &["--max-jobs", "4"]);
    let admin = s.admin();
    let src = t.path().join("src");
    for i in 0..200u64 {
        write_file(&src.join(format!("f{i}")), i, 1000 + i as usize);
    }
    std::fs::create_dir_all(t.path().join("out")).unwrap();
    let started = Instant::now();
    let threads: Vec<_> = (0..4u64)
        .map(|k| {
            let (url, ca, token, src, out) = (s.url(), s.ca(), admin.clone(), src.clone(), t.path().join("out"));
            std::thread::spawn(move || {
                let c = Client::new(&url, &token, Some(&ca)).unwrap();
                let mut ids = Vec::new();
                let mut lat = Vec::new();
                for i in (k * 50)..(k * 50 + 50) {
                    let body = json!({ "src": src.join(format!("f{i}")).to_str().unwrap(), "dst": out.join(format!("f{i}")).to_str().unwrap(), "label": format!("load-{i}") });
                    let t0 = Instant::now();
                    let v = c.call("POST", "/v1/jobs", Some(&body)).unwrap();
                    lat.push(t0.elapsed());
                    ids.push((i, v["id"].as_u64().unwrap()));
                    // A status read between submissions, as a dashboard would.
                    let t0 = Instant::now();
                    c.call("GET", &format!("/v1/jobs/{}", ids[0].1), None).unwrap();
                    lat.push(t0.elapsed());
                }
                (ids, lat)
            })
        })
        .collect();
    let mut ids = Vec::new();
    let mut lat = Vec::new();
    for th in threads {
        let (i, l) = th.join().unwrap();
        ids.extend(i);
        lat.extend(l);
    }
    let submitted = started.elapsed();
    let mut unique: Vec<u64> = ids.iter().map(|x| x.1).collect();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 200, "job ids were reused");
    let c = s.client(&admin);
    let deadline = Instant::now() + Duration::from_secs(150);
    let jobs = loop {
        let v = c.call("GET", "/v1/jobs?limit=1000", None).unwrap();
        let jobs = v["jobs"].as_array().unwrap().clone();
        if jobs.iter().all(|j| j["state"] == "succeeded" || j["state"] == "failed") {
            break jobs;
        }
        assert!(Instant::now() < deadline, "jobs did not finish in time");
        std::thread::sleep(Duration::from_millis(250));
    };
    assert_eq!(jobs.len(), 200, "lost or extra jobs");
    let failed: Vec<_> = jobs.iter().filter(|j| j["state"] != "succeeded").collect();
    assert!(failed.is_empty(), "failed jobs: {failed:?}");
    assert!(jobs.iter().all(|j| j["attempts"] == 1), "a job ran twice");
    for (i, _) in &ids {
        assert_eq!(std::fs::read(t.path().join(format!("out/f{i}"))).unwrap(), data(*i, 1000 + *i as usize));
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() as f64 * p).ceil() as usize).min(lat.len()) - 1];
    eprintln!(
        "load: 200 jobs from 4 clients: submitted in {:.2} s, all done in {:.2} s; API latency over {} calls: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        submitted.as_secs_f64(),
        started.elapsed().as_secs_f64(),
        lat.len(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3,
        lat[lat.len() - 1].as_secs_f64() * 1e3
    );
}

#[test]
fn service_retries_network_failures_with_backoff_and_keeps_permanent_reasons() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &["--max-attempts", "2", "--retry-base-ms", "200"]);
    let admin = s.admin();
    let c = s.client(&admin);
    // Permanent: the source does not exist. One attempt, the per-file reason kept.
    let missing = submit(&s, &admin, &[t.path().join("nope").to_str().unwrap(), t.path().join("x").to_str().unwrap()]);
    // Transient: nothing listens on that port. Retried once after the backoff, then failed.
    let closed = format!("tern://127.0.0.1:{}/x", free_port());
    let net = submit(&s, &admin, &[t.path().to_str().unwrap(), &closed, "--retry-for", "1", "--token-file", s.daemon_token.to_str().unwrap()]);
    // A script waiting with --json still gets the job as it stands when --timeout ends the wait.
    let (code, out, _) = s.cli(&admin, &["wait", "--timeout", "1", "--json", &net.to_string()]);
    assert_eq!(code, 4, "--timeout exits 4: {out}");
    let j: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("wait --json on timeout printed no JSON ({e}): {out:?}"));
    assert_eq!((j["id"].as_u64(), &j["wait_timed_out"]), (Some(net), &json!(true)), "{j}");
    let (code, out, _) = s.cli(&admin, &["wait", &missing.to_string()]);
    assert_eq!(code, 1, "wait exits 1 for a failed job");
    assert!(out.contains("source") && out.contains("check the source path"), "the reason is shown: {out}");
    let j = job(&c, missing);
    assert_eq!((j["attempts"].as_u64(), j["retries"].as_u64()), (Some(1), Some(0)), "{j}");
    assert_eq!(j["summary"]["errors"][0]["side"], "source");
    let (code, _, _) = s.cli(&admin, &["wait", &net.to_string()]);
    assert_eq!(code, 1);
    let j = job(&c, net);
    assert_eq!((j["attempts"].as_u64(), j["retries"].as_u64()), (Some(2), Some(1)), "{j}");
    assert!(j["error"].as_str().unwrap().contains("cannot connect"), "{j}");
    let metrics = c.get_text("/metrics").unwrap();
    assert!(metrics.contains("tern_job_retries_total 1") && metrics.contains("tern_job_failures_total 2"), "{metrics}");
    // An explicit retry runs it again from the start of its attempt budget.
    let (code, out, err) = s.cli(&admin, &["retry", &missing.to_string()]);
    assert!(code == 0 && out.contains("queued"), "{out} {err}");
    assert_eq!(s.cli(&admin, &["wait", &missing.to_string()]).0, 1);
    assert_eq!(job(&c, missing)["attempts"], 1);
}

#[test]
fn service_on_postgres_runs_a_job_and_keeps_it_across_a_restart() {
    let Some(pg) = pg::Postgres::start() else { return };
    let url = pg.create_db("tern");
    let t = scratch();
    let mut s = Service::start(t.path(), &[], &["--db", &url]);
    let admin = s.admin();
    let src = t.path().join("src");
    small_tree(&src);
    let dst = t.path().join("dst");
    let id = submit(&s, &admin, &[src.to_str().unwrap(), dst.to_str().unwrap(), "--label", "pg"]);
    let (code, _, err) = s.cli(&admin, &["wait", &id.to_string()]);
    assert_eq!(code, 0, "wait: {err}");
    assert_same_tree(&src, &dst);
    // Nothing of the job store went to the state directory's SQLite file.
    assert!(!s.state.join("jobs.db").exists(), "--db postgres:// must not create jobs.db");
    // The job, and the admin token, live in PostgreSQL: a restarted service still has both.
    s.kill9();
    s.spawn();
    let (code, out, err) = s.cli(&admin, &["status", &id.to_string(), "--json"]);
    assert_eq!(code, 0, "status after restart: {err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((v["state"].as_str(), v["spec"]["label"].as_str(), v["summary"]["files"].as_u64()), (Some("succeeded"), Some("pg"), Some(20)), "{v}");
    let rows = pg.psql("tern").args(["-A", "-t", "-c", "SELECT state FROM jobs ORDER BY id"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&rows.stdout).trim(), "succeeded");
}

#[test]
fn service_answers_503_while_its_sqlite_database_is_locked_and_loses_nothing() {
    let t = scratch();
    let s = Service::start(t.path(), &[("TERN_FAULT_DELAY_MS", "20")], &[]);
    let admin = s.admin();
    let c = s.client(&admin);
    // ~2.6 s to send (128 chunks, 20 ms each): still running when the lock is taken.
    write_file(&t.path().join("src/big"), 5, 8 << 20);
    let src = t.path().join("src");
    // A job that is running when the lock is taken finishes while it is held: its outcome
    // must be recorded once the lock is gone, not dropped.
    let running = submit(&s, &admin, &[src.to_str().unwrap(), t.path().join("dst1").to_str().unwrap(), "--chunk-size", "64K", "--streams", "1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while job(&c, running)["state"] != "running" {
        assert!(Instant::now() < deadline, "job never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Someone else (a backup, the sqlite3 CLI) holds the write lock.
    let other = rusqlite::Connection::open(s.state.join("jobs.db")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE; UPDATE tokens SET name = name;").unwrap();
    let held = Instant::now();
    let e = c.call("POST", "/v1/jobs", Some(&json!({"src": src.to_str().unwrap(), "dst": t.path().join("dst2").to_str().unwrap()}))).expect_err("submit while locked");
    assert_eq!(e.status, 503, "{e}");
    assert!(e.message.contains("locked") && e.message.contains("try again"), "{e}");
    eprintln!("while locked: HTTP {} {}", e.status, e.message);
    // Reads still work (WAL): the queue is visible while writes wait.
    let list = c.call("GET", "/v1/jobs", None).unwrap();
    assert_eq!(list["jobs"].as_array().map(Vec::len).or_else(|| list.as_array().map(Vec::len)), Some(1), "{list}");
    std::thread::sleep(Duration::from_secs(8).saturating_sub(held.elapsed()));
    other.execute_batch("ROLLBACK").unwrap();
    drop(other);
    let (code, _, err) = s.cli(&admin, &["wait", &running.to_string()]);
    assert_eq!(code, 0, "the job that ended during the lock: {err}");
    assert_same_tree(&src, &t.path().join("dst1"));
    // The refused submit left nothing behind; a new one goes through.
    let id2 = submit(&s, &admin, &[src.to_str().unwrap(), t.path().join("dst2").to_str().unwrap()]);
    assert_eq!(s.cli(&admin, &["wait", &id2.to_string()]).0, 0);
    let (code, out, _) = s.cli(&admin, &["jobs", "--json"]);
    assert_eq!(code, 0);
    let v: Value = serde_json::from_str(&out).unwrap();
    let jobs = v.as_array().cloned().or_else(|| v["jobs"].as_array().cloned()).unwrap();
    let ids: Vec<u64> = jobs.iter().map(|j| j["id"].as_u64().unwrap()).collect();
    assert_eq!(ids, vec![id2, running], "exactly the two accepted jobs, nothing lost or duplicated");
    assert!(jobs.iter().all(|j| j["state"] == "succeeded"), "{v}");
}

/// A real SMTP server (Debian's python3-aiosmtpd) that stores what it receives in a Maildir;
/// killed by PID on drop. `None` (with a note) where aiosmtpd is not installed.
struct SmtpSink {
    child: Child,
    dir: PathBuf,
}

impl SmtpSink {
    fn start(dir: &Path, port: u16) -> Option<Self> {
        let ok = Command::new("/usr/bin/python3").args(["-c", "import aiosmtpd"]).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIP: no aiosmtpd (apt-get install python3-aiosmtpd; scripts/test.sh does)");
            return None;
        }
        let child = Command::new("/usr/bin/python3")
            .args(["-m", "aiosmtpd", "-n", "-l", &format!("127.0.0.1:{port}"), "-c", "aiosmtpd.handlers.Mailbox"])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut sink = SmtpSink { child, dir: dir.to_path_buf() };
        let deadline = Instant::now() + Duration::from_secs(20);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(sink.child.try_wait().unwrap().is_none(), "aiosmtpd exited at start");
            assert!(Instant::now() < deadline, "aiosmtpd did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Some(sink)
    }

    /// Every message received so far, as text.
    fn messages(&self) -> Vec<String> {
        let Ok(rd) = std::fs::read_dir(self.dir.join("new")) else { return Vec::new() };
        rd.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok()).collect()
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn service_mails_job_outcomes_over_smtp_retried_and_kept_across_a_restart() {
    let t = scratch();
    let smtp_port = free_port();
    let relay = format!("127.0.0.1:{smtp_port}");
    let mut s = Service::start(t.path(), &[], &["--smtp", &relay, "--smtp-from", "tern@dtn.test", "--max-attempts", "1"]);
    let admin = s.admin();
    let src = t.path().join("src");
    small_tree(&src);
    // Refused at submit, with what to write instead.
    let (code, _, err) = s.cli(&admin, &["submit", src.to_str().unwrap(), "/tmp/x", "--notify", "mailto:not an address"]);
    assert!(code != 0 && err.contains("not an email address"), "{err}");
    let ok = submit(&s, &admin, &[src.to_str().unwrap(), t.path().join("dst").to_str().unwrap(), "--label", "run42", "--notify", "mailto:alice@example.org"]);
    let bad = submit(&s, &admin, &[t.path().join("missing").to_str().unwrap(), t.path().join("dst2").to_str().unwrap(), "--notify", "mailto:bob@example.org"]);
    assert_eq!(s.cli(&admin, &["wait", &ok.to_string()]).0, 0);
    assert_eq!(s.cli(&admin, &["wait", &bad.to_string()]).0, 1);
    // The relay is down: the first tries fail. Then the service dies before a later try.
    std::thread::sleep(Duration::from_millis(1500));
    s.kill9();
    let Some(sink) = SmtpSink::start(&t.path().join("maildir"), smtp_port) else { return };
    assert!(sink.messages().is_empty());
    // The restarted service sends what was still pending.
    s.spawn();
    let deadline = Instant::now() + Duration::from_secs(30);
    while sink.messages().len() < 2 {
        assert!(Instant::now() < deadline, "mails did not arrive: {:?}", sink.messages());
        std::thread::sleep(Duration::from_millis(100));
    }
    let msgs = sink.messages();
    let find = |to: &str| msgs.iter().find(|m| m.contains(&format!("To: {to}"))).unwrap_or_else(|| panic!("no mail to {to}: {msgs:?}")).clone();
    let a = find("alice@example.org");
    assert!(a.contains(&format!("Subject: tern job {ok} succeeded (run42)")), "{a}");
    assert!(a.contains("From: tern@dtn.test") && a.contains(&format!("Job {ok} succeeded.")) && a.contains("files: 20 transferred, 0 failed"), "{a}");
    let b = find("bob@example.org");
    assert!(b.contains(&format!("Subject: tern job {bad} failed")) && b.contains("What went wrong:") && b.contains("missing"), "{b}");
    // Delivered once each, and recorded: nothing pending any more.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(sink.messages().len(), 2, "{:?}", sink.messages());
    let c = s.client(&admin);
    assert_eq!(job(&c, ok)["notified"], true);
    assert_eq!(job(&c, bad)["notified"], true);
}

/// Writes `len` deterministic incompressible bytes to `path` in 8 MiB pieces (never the whole
/// file in memory); returns their SHA-256 (an independent check: the engine uses BLAKE3).
fn write_big(path: &Path, seed: u64, len: u64) -> [u8; 32] {
    use sha2::Digest;
    use std::io::Write;
    let mut xof = {
        let mut h = blake3::Hasher::new();
        h.update(&seed.to_le_bytes());
        h.finalize_xof()
    };
    let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut sha = sha2::Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(buf.len() as u64) as usize;
        xof.fill(&mut buf[..n]);
        sha.update(&buf[..n]);
        f.write_all(&buf[..n]).unwrap();
        left -= n as u64;
    }
    f.into_inner().unwrap().sync_all().unwrap();
    sha.finalize().into()
}

fn sha256_file(path: &Path) -> [u8; 32] {
    use sha2::Digest;
    use std::io::Read;
    let mut f = std::fs::File::open(path).unwrap();
    let mut sha = sha2::Sha256::new();
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        sha.update(&buf[..n]);
    }
    sha.finalize().into()
}

/// kill -9 of `tern serve` (service and receiving data daemon in one process) in the middle of
/// a 2 GiB job, then a restart: the job resumes from the receiver's journal, lands
/// byte-identical (SHA-256, computed here), and re-sends no more than was in flight at the kill.
/// On /tmp (disk), not tmpfs: 4 GiB of scratch, deleted at the end.
#[test]
fn service_kill_9_during_a_2_gib_job_resumes_verified_and_resends_only_what_was_in_flight() {
    let t = tempfile::Builder::new().prefix("tern-crash").tempdir_in("/tmp").unwrap();
    let size: u64 = 2 << 30;
    let (chunk, streams): (u64, u64) = (4 << 20, 4);
    let src = t.path().join("big.bin");
    let want = write_big(&src, 42, size);
    let mut s = Service::start(t.path(), &[], &[]);
    let admin = s.admin();
    let c = s.client(&admin);
    let url = format!("tern://127.0.0.1:{}/big.bin", s.data_port);
    let id = submit(&s, &admin, &[src.to_str().unwrap(), &url, "--token-file", s.daemon_token.to_str().unwrap(), "--chunk-size", "4M", "--streams", &streams.to_string()]);
    // Kill right after a fresh progress report past 30 %, so "sent before the kill" is known
    // to within one poll (50 ms) of sending.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = 0u64;
    let (sent_before, rate) = loop {
        let j = job(&c, id);
        assert!(j["state"] != "succeeded", "the job finished before the kill");
        let b = j["progress"]["bytes"].as_u64().unwrap_or(0);
        if b != last && b > size * 3 / 10 {
            break (b, j["rate_bytes_per_s"].as_f64().unwrap_or(0.0));
        }
        last = b;
        assert!(Instant::now() < deadline, "no progress: {j}");
        std::thread::sleep(Duration::from_millis(50));
    };
    let killed_at = Instant::now();
    s.kill9();
    s.spawn();
    let c = s.client(&admin);
    let (code, _, err) = s.cli(&admin, &["wait", &id.to_string(), "--timeout", "300"]);
    assert_eq!(code, 0, "the job after the restart: {err}");
    let recovery = killed_at.elapsed();
    let j = job(&c, id);
    let dst = s.root.join("big.bin");
    assert_eq!(std::fs::metadata(&dst).unwrap().len(), size);
    assert!(sha256_file(&dst) == want, "the resumed copy differs from the source (SHA-256)");
    let (sent_after, reused) = (j["summary"]["bytes"].as_u64().unwrap(), j["summary"]["bytes_skipped"].as_u64().unwrap());
    // What the first attempt sent but the second could not reuse was sent twice. "Sent" is
    // counted when a chunk is handed to the socket, so in flight at the kill is, per stream,
    // what the kernel buffers on both ends (tcp_wmem + tcp_rmem maxima: loopback autotunes up
    // to them) plus one chunk being verified and one being written at the receiver; plus what
    // was sent between the progress report we read (≤ one 50 ms poll old) and the kill.
    let resent = (sent_before + sent_after).saturating_sub(size);
    let tcp_max = |f: &str| std::fs::read_to_string(f).ok().and_then(|v| v.split_whitespace().nth(2)?.parse::<u64>().ok()).unwrap_or(8 << 20);
    let socket_buffers = tcp_max("/proc/sys/net/ipv4/tcp_wmem") + tcp_max("/proc/sys/net/ipv4/tcp_rmem");
    let in_flight = streams * (socket_buffers + 2 * chunk) + (rate * 0.1) as u64;
    eprintln!(
        "measured: kill -9 of tern serve at {:.0} MiB of {} MiB sent; after restart reused {:.0} MiB verified, sent {:.0} MiB; re-sent {:.1} MiB (in-flight bound {} MiB = {streams} streams x ({} MiB socket buffers + 2 x {} MiB chunks) + 0.1 s at {:.0} MB/s); restart to verified completion {:.1} s",
        sent_before as f64 / 1048576.0,
        size >> 20,
        reused as f64 / 1048576.0,
        sent_after as f64 / 1048576.0,
        resent as f64 / 1048576.0,
        in_flight >> 20,
        socket_buffers >> 20,
        chunk >> 20,
        rate / 1e6,
        recovery.as_secs_f64()
    );
    assert_eq!(reused + sent_after, size, "{j}");
    assert!(resent <= in_flight, "re-sent {resent} bytes, more than was in flight ({in_flight}): verified data was sent again");
    assert!(reused >= sent_before.saturating_sub(in_flight), "reused only {reused} of the {sent_before} bytes sent before the kill");
    assert_eq!(j["attempts"], 1, "the interrupted attempt does not count: {j}");
    drop(s);
    drop(t); // 4 GiB of scratch on disk
}

/// `--max-jobs 2` and two owners: alice queues six jobs, then bob two. Slots are shared by
/// owner (fewest running first, then longest since served), not by global FIFO: bob's jobs
/// start while alice still has jobs waiting, and never more than two run at once.
#[test]
fn service_shares_run_slots_fairly_between_owners() {
    let t = scratch();
    // Each job: 16 chunks of 64 KiB, 80 ms each, ≈ 1.3 s.
    let s = Service::start(t.path(), &[("TERN_FAULT_DELAY_MS", "80")], &["--max-jobs", "2"]);
    let (alice, bob) = (s.token("transfer", &["--name", "alice"]), s.token("transfer", &["--name", "bob"]));
    write_file(&t.path().join("src/f"), 11, 1 << 20);
    let src = t.path().join("src");
    let job_args =
        |i: usize| vec![src.to_str().unwrap().to_string(), t.path().join(format!("dst{i}")).to_str().unwrap().to_string(), "--chunk-size".into(), "64K".into(), "--streams".into(), "1".into()];
    let sub = |tok: &str, i: usize| {
        let a = job_args(i);
        submit(&s, tok, &a.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let a: Vec<u64> = (0..6).map(|i| sub(&alice, i)).collect();
    let b: Vec<u64> = (6..8).map(|i| sub(&bob, i)).collect();
    let c = s.client(&s.admin());
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut most = 0;
    loop {
        let list = c.call("GET", "/v1/jobs?limit=100", None).unwrap();
        let jobs = list["jobs"].as_array().unwrap().clone();
        let running = jobs.iter().filter(|j| j["state"] == "running").count();
        most = most.max(running);
        if jobs.iter().all(|j| j["state"] == "succeeded") {
            break;
        }
        assert!(jobs.iter().all(|j| ["queued", "running", "succeeded"].contains(&j["state"].as_str().unwrap())), "{list}");
        assert!(Instant::now() < deadline, "jobs did not finish: {list}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(most, 2, "--max-jobs 2: two at once, never more");
    let started = |ids: &[u64]| ids.iter().map(|id| job(&c, *id)["started_at"].as_i64().unwrap()).collect::<Vec<_>>();
    let (sa, sb) = (started(&a), started(&b));
    eprintln!("measured: started_at (s) alice {sa:?}, bob {sb:?}");
    // FIFO would start bob's jobs after all of alice's (≥ 1 s later than her last start).
    assert!(sb.iter().max() < sa.iter().max(), "bob waited behind all of alice's jobs: alice {sa:?}, bob {sb:?}");
    assert!(sb[0] <= sa[2] && sb[1] <= sa[4], "bob's jobs should start in the rounds after alice's first ones: alice {sa:?}, bob {sb:?}");
    for i in 0..8 {
        assert_same_tree(&src, &t.path().join(format!("dst{i}")));
    }
}

/// docs/examples/slurm-transfer.sh, its body run with bash (no Slurm needed) against a real
/// service: the batch job's exit status is the transfer's.
#[test]
fn slurm_example_script_exits_with_the_transfer_outcome() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &["--max-attempts", "1"]);
    let token = s.token("transfer", &["--name", "batch", "--expires", "180d"]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/examples/slurm-transfer.sh");
    let src = t.path().join("run42");
    small_tree(&src);
    let run = |src: &Path, dst: &Path, token: &str| {
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .env("TERN", tern_bin())
            .env("TERN_SERVER", s.url())
            .env("TERN_TOKEN", token)
            .env("TERN_CA_FILE", s.ca())
            .env("SRC", src)
            .env("DST", dst)
            .env("SLURM_JOB_ID", "4242")
            .env("WAIT_TIMEOUT", "120")
            .stdin(Stdio::null());
        let out = run_bounded(cmd, Duration::from_secs(150));
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    std::fs::create_dir(t.path().join("archive")).unwrap();
    let dst = t.path().join("archive/run42");
    let (code, err) = run(&src, &dst, &token);
    assert_eq!(code, Some(0), "a transfer that succeeded: {err} {}", s.cli(&s.admin(), &["jobs", "--json"]).1);
    assert_same_tree(&src, &dst);
    let (code, err) = run(&t.path().join("no-such-run"), &t.path().join("archive/x"), &token);
    assert_eq!(code, Some(1), "a transfer that failed must fail the batch job: {err}");
    let (code, err) = run(&src, &t.path().join("archive/y"), "tern_0000_bad");
    assert_eq!(code, Some(2), "a refused submit (bad token) must fail the batch job too: {err}");
    let (_, out, _) = s.cli(&s.admin(), &["jobs", "--json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!(v["jobs"].as_array().unwrap().iter().all(|j| j["spec"]["label"] == "4242"), "labelled with the batch job id: {v}");
}

/// Processes whose parent is `pid` (the service's transfer children).
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else { continue };
        // pid (comm) state ppid ...: comm may hold spaces, so parse after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r.to_string()) else { continue };
        let f: Vec<&str> = rest.split_whitespace().collect();
        if f.get(1).and_then(|p| p.parse::<u32>().ok()) == Some(pid) {
            out.push(e.file_name().to_string_lossy().parse().unwrap_or(0));
        }
    }
    out
}

#[test]
fn service_deadline_fails_a_slow_job_and_one_still_queued() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &["--max-jobs", "1"]);
    let admin = s.admin();
    write_file(&t.path().join("src/a"), 1, 100_000);
    write_file(&t.path().join("src/big"), 7, 16 << 20);
    let dst = t.path().join("dst");
    // 16 MiB at 1 MB/s: far from done when the deadline, 3 s away, passes.
    let id = submit(&s, &admin, &[t.path().join("src").to_str().unwrap(), dst.to_str().unwrap(), "--bwlimit", "1M", "--streams", "1", "--chunk-size", "64K", "--deadline", "3s"]);
    // Behind it (one slot): never started before its own deadline.
    let queued = submit(&s, &admin, &[t.path().join("src").to_str().unwrap(), t.path().join("dst2").to_str().unwrap(), "--deadline", "2s"]);
    let c = s.client(&admin);
    let j = job(&c, id);
    let d = j["spec"]["options"]["deadline"].as_str().unwrap().to_string();
    assert!(d.ends_with('Z') && d.len() == 20, "stored as RFC 3339: {j}");
    let (code, out, _) = s.cli(&admin, &["status", &id.to_string()]);
    assert_eq!(code, 0);
    assert!(out.contains(&format!("deadline: {d}")), "{out}");
    let started = Instant::now();
    let (code, _, _) = s.cli(&admin, &["wait", &id.to_string()]);
    assert_eq!(code, 1, "wait exits 1 for a failed job");
    assert!(started.elapsed() < Duration::from_secs(12), "failed at the deadline, not at the end: {:?}", started.elapsed());
    let j = job(&c, id);
    assert_eq!(j["state"], "failed", "{j}");
    let e = j["error"].as_str().unwrap();
    assert!(e.starts_with(&format!("deadline passed ({d}) with ")) && e.contains(" files done; resubmit or retry with a later --deadline"), "{e}");
    assert!(e.contains("of 2 files done"), "{e}");
    // The child is gone, and the job stays failed.
    std::thread::sleep(Duration::from_millis(500));
    assert!(children_of(s.child.id()).is_empty(), "transfer child still running: {:?}", children_of(s.child.id()));
    assert!(!dst.join("big").exists(), "an unfinished file must not land under its final name");
    assert_eq!(job(&c, id)["state"], "failed");
    let q = job(&c, queued);
    assert_eq!(q["state"], "failed", "{q}");
    assert!(q["error"].as_str().unwrap().contains("deadline passed") && q["started_at"].is_null(), "{q}");
    assert!(!t.path().join("dst2").exists());
    // A retry needs a later deadline, and then runs.
    let (code, _, err) = s.cli(&admin, &["retry", &queued.to_string()]);
    assert_ne!(code, 0);
    assert!(err.contains("has passed") && err.contains("--deadline"), "{err}");
    let (code, out, err) = s.cli(&admin, &["retry", &queued.to_string(), "--deadline", "1h"]);
    assert_eq!(code, 0, "{err}");
    // The runner may claim it before the CLI prints its state.
    assert!(out.contains("queued") || out.contains("running"), "{out}");
    assert_eq!(s.cli(&admin, &["wait", &queued.to_string()]).0, 0);
    assert!(t.path().join("dst2/big").is_file());
}

#[test]
fn service_refuses_a_past_deadline_at_submit() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &[]);
    let admin = s.admin();
    let (src, dst) = (t.path().join("src"), t.path().join("dst"));
    write_file(&src.join("a"), 1, 10);
    let (code, _, err) = s.cli(&admin, &["submit", src.to_str().unwrap(), dst.to_str().unwrap(), "--deadline", "2020-01-01T00:00:00Z"]);
    assert_ne!(code, 0);
    assert!(err.contains("options.deadline 2020-01-01T00:00:00Z is in the past") && err.contains("give a later time"), "{err}");
    let (code, _, err) = s.cli(&admin, &["submit", src.to_str().unwrap(), dst.to_str().unwrap(), "--deadline", "tomorrow"]);
    assert_ne!(code, 0);
    assert!(err.contains("RFC 3339"), "{err}");
    let body = json!({ "src": src.to_str().unwrap(), "dst": dst.to_str().unwrap(), "options": { "deadline": "2020-01-01T00:00:00Z" } });
    assert_eq!(s.client(&admin).call("POST", "/v1/jobs", Some(&body)).unwrap_err().status, 400);
    assert!(s.client(&admin).call("GET", "/v1/jobs", None).unwrap()["jobs"].as_array().unwrap().is_empty(), "nothing was queued");
}

#[test]
fn service_fail_fast_job_ends_failed_at_the_first_file() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &[]);
    let admin = s.admin();
    let src = t.path().join("src");
    for i in 0..6u64 {
        write_file(&src.join(format!("f{i}")), i, 50_000);
    }
    // A directory where f3 should land: a permanent per-file fault, even for root.
    let dst = t.path().join("dst");
    std::fs::create_dir_all(dst.join("src/f3/keep")).unwrap();
    let id = submit(&s, &admin, &[src.to_str().unwrap(), dst.to_str().unwrap(), "--fail-fast"]);
    let (code, _, _) = s.cli(&admin, &["wait", &id.to_string()]);
    assert_eq!(code, 1);
    let j = job(&s.client(&admin), id);
    assert_eq!(j["state"], "failed", "{j}");
    assert_eq!(j["spec"]["options"]["fail_fast"], true);
    let e = j["error"].as_str().unwrap();
    assert!(e.contains("src/f3") && e.contains("stopped at the first failure (--fail-fast)"), "{e}");
    assert_eq!(j["attempts"], 1, "a permanent failure is not retried: {j}");
}

#[test]
fn service_job_applies_include_exclude_rules_in_order() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &[]);
    let admin = s.admin();
    let src = t.path().join("src");
    write_file(&src.join("run/a.h5"), 1, 1000);
    write_file(&src.join("run/a.log"), 2, 1000);
    write_file(&src.join("scratch/b.h5"), 3, 1000);
    let dst = t.path().join("dst");
    let id = submit(&s, &admin, &["--sync", src.to_str().unwrap(), dst.to_str().unwrap(), "--exclude", "/scratch", "--include", "*/", "--include", "*.h5", "--exclude", "*"]);
    let (code, _, err) = s.cli(&admin, &["wait", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    let j = job(&s.client(&admin), id);
    assert_eq!(j["spec"]["options"]["filters"], json!(["- /scratch", "+ */", "+ *.h5", "- *"]), "{j}");
    let names: Vec<_> = snapshot(&dst).into_keys().map(|k| String::from_utf8(k).unwrap()).collect();
    assert_eq!(names, ["run", "run/a.h5"]);
    // A bad rule is refused at submit, by the CLI and by the API.
    let (code, _, err) = s.cli(&admin, &["submit", src.to_str().unwrap(), dst.to_str().unwrap(), "--exclude", "a["]);
    assert_ne!(code, 0);
    assert!(err.contains("filter pattern 'a['"), "{err}");
    let body = json!({ "src": src.to_str().unwrap(), "dst": dst.to_str().unwrap(), "options": { "filters": ["*.tmp"] } });
    assert_eq!(s.client(&admin).call("POST", "/v1/jobs", Some(&body)).unwrap_err().status, 400);
}

// ---------- issue 10: the service as an attacker sees it ----------

/// A POST /v1/jobs that must be refused: (status, message).
fn refused(s: &Service, token: &str, body: &Value) -> (u16, String) {
    match s.client(token).call("POST", "/v1/jobs", Some(body)) {
        Ok(v) => panic!("accepted: {v} for {body}"),
        Err(e) => (e.status, e.message),
    }
}

fn all_jobs(s: &Service) -> Vec<Value> {
    s.client(&s.admin()).call("GET", "/v1/jobs?limit=1000", None).unwrap()["jobs"].as_array().unwrap().clone()
}

/// The issue's attack: `--remote-bin "/bin/sh -c 'id > pwned' #"` under a transfer token, and
/// every other field that names a program, a host, a file or an address.
#[test]
fn service_refuses_programs_hosts_files_and_webhooks_a_transfer_token_names() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &[]);
    let transfer = s.token("transfer", &["--name", "mallory"]);
    let base = t.path();
    write_file(&base.join("one.txt"), 1, 1000);
    let one = base.join("one.txt");
    let one = one.to_str().unwrap();
    let pwned = base.join("pwned");

    let (code, _, err) = s.cli(&transfer, &["submit", one, &format!("127.0.0.1:{}/x", base.display()), "--remote-bin", &format!("/bin/sh -c 'id > {}' #", pwned.display())]);
    assert!(code != 0 && err.contains("options.remote_bin") && err.contains("admin token") && err.contains("HTTP 403"), "{code} {err}");
    assert!(all_jobs(&s).is_empty(), "nothing was queued");
    assert!(!pwned.exists(), "nothing ran");

    let cases: Vec<(Value, &str)> = vec![
        (json!({ "src": one, "dst": "127.0.0.1:/x", "options": { "ssh": "sh -c evil" } }), "options.ssh"),
        (json!({ "src": one, "dst": "intranet.example:/x" }), "--allow-host"),
        (json!({ "src": one, "dst": "tern://10.0.0.1:7700/x" }), "--allow-host"),
        (json!({ "src": "/etc/shadow", "dst": base.join("s").to_str().unwrap() }), "--job-root"),
        (json!({ "src": s.state.join("admin.token").to_str().unwrap(), "dst": base.join("a").to_str().unwrap() }), "state directory"),
        (json!({ "src": one, "dst": "tern://127.0.0.1:1/x", "options": { "token_file": "/etc/shadow" } }), "--job-root"),
        (json!({ "src": base.to_str().unwrap(), "dst": "tern://127.0.0.1:1/x", "options": { "watch": { "ready": "log:/etc/shadow:^(\\S+)" } } }), "--job-root"),
        (json!({ "src": one, "dst": base.join("h").to_str().unwrap(), "notify": "http://127.0.0.1:9/hook" }), "--webhook-allow"),
        (json!({ "src": one, "dst": base.join("h").to_str().unwrap(), "notify": "http://169.254.169.254/latest/meta-data" }), "internal address"),
        (json!({ "src": one, "dst": base.join("h").to_str().unwrap(), "notify": "http://[::1]:9/" }), "internal address"),
    ];
    for (body, want) in &cases {
        let (code, msg) = refused(&s, &transfer, body);
        assert!(code == 403 && msg.contains(want), "{body}: {code} {msg}");
    }
    // A token file the service would read must be private.
    let loose = base.join("loose.token");
    std::fs::write(&loose, "0123456789abcdef0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&loose, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let (code, msg) = refused(&s, &transfer, &json!({ "src": one, "dst": "tern://127.0.0.1:1/x", "options": { "token_file": loose.to_str().unwrap() } }));
    assert!(code == 403 && msg.contains(&format!("chmod 600 {}", loose.display())), "{code} {msg}");
    assert!(all_jobs(&s).is_empty(), "no refused request queued a job");
    assert!(!pwned.exists());
}

/// Two transfer tokens and a read token: each sees, lists, cancels and retries only its own
/// jobs; an admin sees all.
#[test]
fn service_jobs_are_visible_only_to_their_owner_and_admins() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &[]);
    let (alice, bob, read) = (s.token("transfer", &["--name", "alice"]), s.token("transfer", &["--name", "bob"]), s.token("read", &["--name", "portal"]));
    write_file(&t.path().join("src/f"), 3, 5000);
    let id = submit(&s, &alice, &[t.path().join("src").to_str().unwrap(), t.path().join("dst").to_str().unwrap(), "--label", "alice-secret-run"]);
    let (code, _, err) = s.cli(&alice, &["wait", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    for (who, tok) in [("bob", &bob), ("read", &read)] {
        let c = s.client(tok);
        let list = c.call("GET", "/v1/jobs", None).unwrap();
        assert_eq!(list["jobs"].as_array().unwrap().len(), 0, "{who} lists alice's job: {list}");
        assert!(!list.to_string().contains("alice-secret-run") && !list.to_string().contains("/src"), "{who}: {list}");
        for (m, p) in [
            ("GET", format!("/v1/jobs/{id}")),
            ("GET", format!("/v1/jobs/{id}/wait?timeout_s=0")),
            ("GET", format!("/v1/jobs/{id}/throughput")),
            ("POST", format!("/v1/jobs/{id}/retry")),
            ("POST", format!("/v1/jobs/{id}/cancel")),
        ] {
            let e = c.call(m, &p, None).unwrap_err();
            assert!(e.status == 404 || (who == "read" && e.status == 403), "{who} {m} {p}: {e}");
        }
    }
    let (code, out, _) = s.cli(&bob, &["jobs"]);
    assert!(code == 0 && !out.contains("alice-secret-run"), "{out}");
    assert_eq!(s.client(&alice).call("GET", "/v1/jobs", None).unwrap()["jobs"].as_array().unwrap().len(), 1);
    assert_eq!(job(&s.client(&s.admin()), id)["spec"]["label"], "alice-secret-run", "admin sees every job");
    // Alice can retry her own finished job: it is hers.
    assert_eq!(s.client(&alice).call("POST", &format!("/v1/jobs/{id}/retry"), None).unwrap_err().status, 409);
}

/// The issue's `alice/bobl -> bob`: a token confined to alice/ can neither read nor write bob/
/// through a link, at submit, nor through a link swapped in while the job waited in the queue.
#[test]
fn service_token_prefix_holds_against_symlinks_at_submit_and_at_start() {
    let t = scratch();
    let s = Service::start(t.path(), &[("TERN_FAULT_DELAY_MS", "50")], &["--max-jobs", "1"]);
    let data = t.path().join("data");
    write_file(&data.join("bob/secret.txt"), 7, 100);
    write_file(&data.join("alice/in/a.txt"), 8, 100);
    std::os::unix::fs::symlink("../bob", data.join("alice/bobl")).unwrap();
    let alice = s.token("transfer", &["--path", data.join("alice").to_str().unwrap()]);
    let p = |x: &str| data.join(x).to_str().unwrap().to_string();
    for body in [json!({ "src": p("alice/bobl/secret.txt"), "dst": p("alice/stolen") }), json!({ "src": p("alice/in"), "dst": p("alice/bobl/planted") })] {
        let (code, msg) = refused(&s, &alice, &body);
        assert!(code == 403 && msg.contains("resolves outside"), "{body}: {code} {msg}");
    }
    assert!(!data.join("alice/stolen").exists() && !data.join("bob/planted").exists());

    // Held in the queue behind a slow job (one slot), then the source becomes a link to bob/.
    write_file(&t.path().join("slow/f"), 9, 4 << 20);
    let blocker = submit(&s, &s.admin(), &[t.path().join("slow").to_str().unwrap(), t.path().join("slow-dst").to_str().unwrap(), "--chunk-size", "64K", "--streams", "1"]);
    let c = s.client(&s.admin());
    let deadline = Instant::now() + Duration::from_secs(60);
    while job(&c, blocker)["state"] != "running" {
        assert!(Instant::now() < deadline, "the blocker never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let id = submit(&s, &alice, &[&p("alice/in"), &p("alice/out")]);
    assert_eq!(job(&c, id)["state"], "queued");
    // And a job whose token is revoked while it waits does not run either.
    let carol = s.token("transfer", &["--name", "carol"]);
    let carols = submit(&s, &carol, &[&p("alice/in"), &p("carol-out")]);
    let (code, _, err) = s.cli(&s.admin(), &["token", "revoke", carol.split('_').nth(1).unwrap()]);
    assert_eq!(code, 0, "{err}");
    std::fs::rename(data.join("alice/in"), data.join("alice/in.old")).unwrap();
    std::os::unix::fs::symlink("../bob", data.join("alice/in")).unwrap();
    c.call("POST", &format!("/v1/jobs/{blocker}/cancel"), None).unwrap();
    let (code, _, _) = s.cli(&alice, &["wait", &id.to_string()]);
    assert_eq!(code, 1, "the job must fail");
    let j = job(&c, id);
    assert!(j["state"] == "failed" && j["error"].as_str().unwrap().contains("resolves outside"), "{j}");
    assert!(!data.join("alice/out").exists(), "nothing of bob's was copied");
    let (code, _, _) = s.cli(&s.admin(), &["wait", &carols.to_string()]);
    let j = job(&c, carols);
    assert!(code == 1 && j["error"].as_str().unwrap().contains("was revoked"), "{j}");
    assert!(!data.join("carol-out").exists());
}

/// A throwaway local account, removed (with its home) on drop.
struct TestUser(String);

impl TestUser {
    fn create(tag: &str) -> Option<Self> {
        let name = format!("tt{tag}{}", std::process::id() % 100_000);
        let ok = Command::new("useradd").args(["-m", "-U", "-s", "/bin/sh", &name]).stdout(Stdio::null()).stderr(Stdio::null()).status().ok()?.success();
        ok.then(|| TestUser(name))
    }

    fn id(&self, flag: &str) -> u32 {
        let out = Command::new("id").args([flag, &self.0]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

impl Drop for TestUser {
    fn drop(&mut self) {
        let _ = Command::new("userdel").args(["-r", &self.0]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}

fn chown(path: &Path, u: &TestUser, mode: u32) {
    std::os::unix::fs::chown(path, Some(u.id("-u")), Some(u.id("-g"))).unwrap();
    std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode)).unwrap();
}

/// A root service runs each token's jobs as its mapped account: Alice's job cannot read Bob's
/// file, what she copies is hers, and a token with no mapping is refused.
#[test]
fn service_as_root_runs_jobs_as_the_tokens_mapped_user() {
    // SAFETY: plain syscall.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: run-as needs the tests to run as root");
        return;
    }
    let (Some(alice), Some(bob)) = (TestUser::create("a"), TestUser::create("b")) else {
        eprintln!("skipped: useradd is not available");
        return;
    };
    let t = scratch();
    std::fs::set_permissions(t.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let data = t.path().join("data");
    write_file(&data.join("alice/mine.txt"), 1, 3000);
    write_file(&data.join("bob/secret.txt"), 2, 3000);
    std::fs::set_permissions(&data, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    chown(&data.join("alice"), &alice, 0o700);
    chown(&data.join("alice/mine.txt"), &alice, 0o600);
    chown(&data.join("bob"), &bob, 0o700);
    chown(&data.join("bob/secret.txt"), &bob, 0o600);
    let s = Service::start_bare(t.path(), &[], &["--job-root", data.to_str().unwrap(), "--max-attempts", "1"]);

    let unmapped = s.token("transfer", &[]);
    let body = json!({ "src": data.join("alice/mine.txt").to_str().unwrap(), "dst": data.join("alice/copy.txt").to_str().unwrap() });
    let (code, msg) = refused(&s, &unmapped, &body);
    assert!(code == 403 && msg.contains("runs as root") && msg.contains("--run-as USER") && msg.contains("--allow-root-transfers"), "{code} {msg}");
    let (code, _, err) = s.cli(&s.admin(), &["token", "create", "--scope", "transfer", "--run-as", "root"]);
    assert!(code != 0 && err.contains("root"), "{err}");

    let tok = s.token("transfer", &["--run-as", &alice.0, "--name", "alice"]);
    let ok = submit(&s, &tok, &[data.join("alice/mine.txt").to_str().unwrap(), data.join("alice/copy.txt").to_str().unwrap()]);
    let (code, _, err) = s.cli(&tok, &["wait", &ok.to_string()]);
    assert_eq!(code, 0, "alice's own file: {err} {}", job(&s.client(&s.admin()), ok));
    let meta = std::fs::metadata(data.join("alice/copy.txt")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::uid(&meta), alice.id("-u"), "the copy belongs to alice, not root");

    let steal = submit(&s, &tok, &[data.join("bob/secret.txt").to_str().unwrap(), data.join("alice/stolen.txt").to_str().unwrap()]);
    let (code, _, _) = s.cli(&tok, &["wait", &steal.to_string()]);
    let j = job(&s.client(&s.admin()), steal);
    assert!(code == 1 && j["state"] == "failed", "{j}");
    assert!(j.to_string().to_lowercase().contains("permission denied"), "{j}");
    assert!(!data.join("alice/stolen.txt").exists(), "bob's file was not copied");
    let log = std::fs::read_to_string(t.path().join("service.log")).unwrap();
    assert!(log.contains(&format!("job {ok} start: token 'alice'")) && log.contains(&format!("as user {}", alice.0)), "{log}");
    assert!(log.contains(&format!("job {ok} end: token 'alice'")) && log.contains("succeeded, "), "{log}");
}

/// The operator's side: state files private, a loose token file refused with the fix,
/// /healthz without a token, anonymous /metrics only when asked, the operator's certificate.
#[test]
fn service_state_is_private_and_operator_endpoints_work() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &["--metrics-anonymous"]);
    let admin = s.admin();
    write_file(&t.path().join("src/f"), 4, 2000);
    let id = submit(&s, &admin, &[t.path().join("src").to_str().unwrap(), t.path().join("dst").to_str().unwrap()]);
    assert_eq!(s.cli(&admin, &["wait", &id.to_string()]).0, 0);
    let mode = |p: &Path| std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(p).unwrap().permissions()) & 0o777;
    assert_eq!(mode(&s.state), 0o700);
    for f in ["jobs.db", "jobs.db-wal", "jobs.db-shm", "admin.token", "tls/key.pem"] {
        assert_eq!(mode(&s.state.join(f)), 0o600, "{f}");
    }
    // A token file others can read is refused, with the fix.
    let file = t.path().join("admin.tok");
    std::fs::write(&file, &admin).unwrap();
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let (code, _, err) = s.cli(&format!("@{}", file.display()), &["jobs"]);
    assert!(code != 0 && err.contains(&format!("chmod 600 {}", file.display())), "{err}");
    std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    assert_eq!(s.cli(&format!("@{}", file.display()), &["jobs"]).0, 0);

    let nobody = Client::new(&s.url(), "", Some(&s.ca())).unwrap();
    assert_eq!(nobody.call("GET", "/healthz", None).unwrap(), json!({ "ok": true }));
    assert!(nobody.get_text("/metrics").unwrap().contains("tern_jobs{state=\"succeeded\"} 1"));
    assert_eq!(nobody.call("GET", "/v1/jobs", None).unwrap_err().status, 401);

    // A second service with the first one's certificate given as the operator's own.
    let t2 = scratch();
    let (cert, key) = (t2.path().join("cert.pem"), t2.path().join("key.pem"));
    std::fs::copy(s.ca(), &cert).unwrap();
    std::fs::copy(s.state.join("tls/key.pem"), &key).unwrap();
    let s2 = Service::start(t2.path(), &[], &["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()]);
    assert!(!s2.state.join("tls").exists(), "no self-signed certificate made");
    let c = Client::new(&s2.url(), "", Some(&cert)).unwrap();
    assert_eq!(c.call("GET", "/healthz", None).unwrap(), json!({ "ok": true }));
    assert_eq!(c.call("GET", "/metrics", None).unwrap_err().status, 401, "metrics need a token by default");
    // The client trusts the system's store (here SSL_CERT_FILE) without --ca-file.
    let mut cmd = Command::new(tern_bin());
    cmd.args(["jobs", "--json"]).env("TERN_SERVER", s2.url()).env("TERN_TOKEN", s2.admin()).env("SSL_CERT_FILE", &cert).env_remove("TERN_CA_FILE").stdin(Stdio::null());
    let out = run_bounded(cmd, Duration::from_secs(60));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// The dashboard's file browser (GET /v1/fs) lists only what a job of the token may use: beneath
/// the job roots and the token's prefix as the kernel resolves them, never the state directory,
/// never through a link out; without a path, where to start.
#[test]
fn service_lists_directories_only_where_the_token_may_go() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &[]);
    let data = t.path().join("data");
    write_file(&data.join("alice/in/a.txt"), 8, 1234);
    write_file(&data.join("bob/secret.txt"), 7, 100);
    std::os::unix::fs::symlink("../bob", data.join("alice/bobl")).unwrap();
    std::os::unix::fs::symlink("/etc", data.join("alice/etcl")).unwrap();
    let base = t.path().canonicalize().unwrap();
    let alice = s.token("transfer", &["--path", base.join("data/alice").to_str().unwrap()]);
    let c = s.client(&alice);
    let q = |p: &std::path::Path| format!("/v1/fs?path={}", p.to_str().unwrap().replace('/', "%2F"));
    let v = c.call("GET", "/v1/fs", None).unwrap();
    assert_eq!(v["entries"][0]["name"], base.join("data/alice").to_str().unwrap(), "alice starts at her prefix: {v}");
    let v = c.call("GET", &q(&base.join("data/alice")), None).unwrap();
    let names: Vec<(&str, &str)> = v["entries"].as_array().unwrap().iter().map(|e| (e["name"].as_str().unwrap(), e["kind"].as_str().unwrap())).collect();
    assert_eq!(names, [("in", "dir"), ("bobl", "symlink"), ("etcl", "symlink")], "directories first, links as links: {v}");
    let v = c.call("GET", &q(&base.join("data/alice/in")), None).unwrap();
    assert_eq!((v["entries"][0]["name"].as_str(), v["entries"][0]["size"].as_u64()), (Some("a.txt"), Some(1234)));
    // Attacker's requests: outside the prefix, through a link out, the state directory, `..`.
    for bad in [base.join("data/bob"), base.join("data/alice/bobl"), base.join("data/alice/etcl"), base.join("state"), std::path::PathBuf::from("/etc"), base.join("data/alice/../bob")] {
        let e = c.call("GET", &q(&bad), None).unwrap_err();
        assert_eq!(e.status, 403, "{}: {e:?}", bad.display());
    }
    assert!(c.call("GET", &q(&base.join("data/alice/nope")), None).unwrap_err().status == 403);
    // An admin (no prefix) starts at the job roots and may not list the state directory either.
    let admin = s.client(&s.admin());
    let v = admin.call("GET", "/v1/fs", None).unwrap();
    assert_eq!(v["entries"][0]["name"], base.to_str().unwrap(), "{v}");
    assert_eq!(admin.call("GET", &q(&base.join("state")), None).unwrap_err().status, 403);
    // A read token may not browse.
    let reader = s.client(&s.token("read", &[]));
    assert_eq!(reader.call("GET", "/v1/fs", None).unwrap_err().status, 403);
}

// ---------- scheduled path tests (issue 15) ----------

fn path_test_refused(s: &Service, token: &str, body: &Value) -> (u16, String) {
    match s.client(token).call("POST", "/v1/path-tests", Some(body)) {
        Ok(v) => panic!("accepted: {v} for {body}"),
        Err(e) => (e.status, e.message),
    }
}

/// One attacker's request per rule of docs/security-service.md "Scheduled path tests"; none
/// of them leaves a schedule behind, and nobody sees or deletes another token's schedule.
#[test]
fn service_path_test_schedules_refuse_what_a_token_may_not_ask() {
    let t = scratch();
    let s = Service::start(t.path(), &[], &[]);
    let (transfer, other, read) = (s.token("transfer", &["--name", "mallory"]), s.token("transfer", &["--name", "bob"]), s.token("read", &[]));
    let base = t.path();
    // Nothing listens on port 1: schedules that do get created fail fast when they run.
    let ok_dest = "tern://127.0.0.1:1/x";
    let (code, msg) = path_test_refused(&s, &read, &json!({ "dest": ok_dest, "every": "1h" }));
    assert!(code == 403 && msg.contains("needs 'transfer'"), "read scope: {code} {msg}");
    let long = format!("tern://127.0.0.1:1/{}", "a".repeat(2000));
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({ "dest": "tern://10.0.0.1:7700/x", "every": "1h" }), 403, "--allow-host"),
        (json!({ "dest": "intranet.example:/x", "every": "1h" }), 403, "--allow-host"),
        (json!({ "dest": base.join("root").to_str().unwrap(), "every": "1h" }), 403, "admin token"),
        (json!({ "dest": ok_dest, "every": "1h", "token_file": "/etc/shadow" }), 403, "--job-root"),
        (json!({ "dest": ok_dest, "every": "1h", "token_file": s.state.join("admin.token").to_str().unwrap() }), 403, "state directory"),
        (json!({ "dest": ok_dest, "every": "1h", "notify": "http://169.254.169.254/latest/meta-data" }), 403, "internal address"),
        (json!({ "dest": ok_dest, "every": "1h", "notify": "http://127.0.0.1:9/hook" }), 403, "--webhook-allow"),
        (json!({ "dest": ok_dest, "every": "1h", "notify": "file:///etc/passwd" }), 400, "http"),
        (json!({ "dest": ok_dest, "every": 60 }), 400, "--test-min-interval"),
        (json!({ "dest": ok_dest, "every": "999d" }), 400, "30 days"),
        (json!({ "dest": ok_dest, "every": "soon" }), 400, "duration"),
        (json!({ "dest": "--ssh=sh -c id", "every": "1h" }), 400, "'-'"),
        (json!({ "dest": long, "every": "1h" }), 400, "1024 bytes"),
        (json!({ "dest": ok_dest, "every": "1h", "label": "x".repeat(201) }), 400, "200 bytes"),
        (json!({ "dest": ok_dest, "every": "1h", "seconds": 1000 }), 400, "seconds"),
        (json!({ "dest": ok_dest, "every": "1h", "streams": 1000 }), 400, "streams"),
        (json!({ "dest": ok_dest, "every": "1h", "alert_below": 7 }), 400, "alert_below"),
        (json!({ "dest": ok_dest, "every": "1h", "ssh": "sh -c id" }), 422, "unknown field"),
        (json!({ "dest": ok_dest, "every": "1h", "remote_bin": "/bin/sh" }), 422, "unknown field"),
    ];
    for (body, want_code, want) in &cases {
        let (code, msg) = path_test_refused(&s, &transfer, body);
        assert!(code == *want_code && msg.contains(want), "{body}: {code} {msg}");
    }
    let admin = s.client(&s.admin());
    assert!(admin.call("GET", "/v1/path-tests", None).unwrap()["path_tests"].as_array().unwrap().is_empty(), "no refused request left a schedule");
    // The cap per token: ten, then 409.
    let c = s.client(&transfer);
    let ids: Vec<u64> = (0..10).map(|_| c.call("POST", "/v1/path-tests", Some(&json!({ "dest": ok_dest, "every": "1h" }))).unwrap()["id"].as_u64().unwrap()).collect();
    let (code, msg) = path_test_refused(&s, &transfer, &json!({ "dest": ok_dest, "every": "1h" }));
    assert!(code == 409 && msg.contains("limit per token"), "{code} {msg}");
    // Another token neither sees nor deletes them, nor reads their results.
    let b = s.client(&other);
    assert!(b.call("GET", "/v1/path-tests", None).unwrap()["path_tests"].as_array().unwrap().is_empty());
    for (m, p) in [("GET", format!("/v1/path-tests/{}", ids[0])), ("GET", format!("/v1/path-tests/{}/results", ids[0])), ("DELETE", format!("/v1/path-tests/{}", ids[0]))] {
        let e = b.call(m, &p, None).expect_err("another token's schedule");
        assert_eq!(e.status, 404, "{m} {p}: {}", e.message);
    }
    let e = c.call("GET", &format!("/v1/path-tests/{}/results?limit=5&evil=1", ids[0]), None).expect_err("unknown query field");
    assert_eq!(e.status, 400);
    // Its owner deletes one; an admin sees the rest.
    c.call("DELETE", &format!("/v1/path-tests/{}", ids[0]), None).unwrap();
    assert_eq!(admin.call("GET", "/v1/path-tests", None).unwrap()["path_tests"].as_array().unwrap().len(), 9);
}

/// Waits (bounded) until schedule `id` has at least `n` results; returns them.
fn results_at_least(s: &Service, token: &str, id: u64, n: usize, limit: Duration) -> Vec<Value> {
    let deadline = Instant::now() + limit;
    loop {
        let v = s.client(token).call("GET", &format!("/v1/path-tests/{id}/results"), None).unwrap();
        let r = v["results"].as_array().unwrap().clone();
        if r.len() >= n {
            return r;
        }
        assert!(Instant::now() < deadline, "only {} of {n} results after {limit:?}: {v}", r.len());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Scheduled through the CLI (`tern test --every`) against the service's own daemon; the
/// results are kept across a kill -9 and a restart on the same database, listed by the CLI and
/// exported on /metrics.
#[test]
fn service_path_test_history_survives_a_restart() {
    let t = scratch();
    let mut s = Service::start(t.path(), &[], &["--test-min-interval", "1"]);
    let transfer = s.token("transfer", &[]);
    let dest = format!("tern://127.0.0.1:{}/", s.data_port);
    let (code, out, err) = s.cli(&transfer, &["test", "--every", "6s", "--seconds", "5", "--streams", "2", "--token-file", s.daemon_token.to_str().unwrap(), "--label", "loop", &dest]);
    assert_eq!(code, 0, "tern test --every: {err}");
    let id: u64 = out.parse().unwrap_or_else(|_| panic!("printed '{out}', not an id"));
    let started = Instant::now();
    let before = results_at_least(&s, &transfer, id, 2, Duration::from_secs(60));
    println!("2 scheduled tests in {:?}: {} / {} Gb/s", started.elapsed(), before[0]["many_gbps"], before[1]["many_gbps"]);
    for r in &before {
        assert_eq!(r["ok"], true, "{r}");
        assert!(r["many_gbps"].as_f64().unwrap() > 0.0 && r["rtt_ms"].as_f64().unwrap() > 0.0 && r["streams"] == 2, "{r}");
    }
    assert!(before[1]["at"].as_i64().unwrap() - before[0]["at"].as_i64().unwrap() >= 5, "one at a time, every 6 s: {before:?}");
    s.kill9();
    s.spawn();
    let after = s.client(&transfer).call("GET", &format!("/v1/path-tests/{id}/results"), None).unwrap();
    let kept = after["results"].as_array().unwrap();
    assert!(kept.len() >= 2 && kept[..2] == before[..2], "history after the restart: {after}");
    let (code, out, err) = s.cli(&transfer, &["test", "--results", &id.to_string()]);
    assert!(code == 0 && out.lines().count() > kept.len() && out.contains("Gb/s"), "{code} {out} {err}");
    let (code, out, _) = s.cli(&transfer, &["test", "--schedules"]);
    assert!(code == 0 && out.contains(&dest) && out.contains("ok"), "{out}");
    let metrics = s.client(&s.admin()).get_text("/metrics").unwrap();
    let line = format!("tern_path_test_rate_bits_per_second{{id=\"{id}\",dest=\"{dest}\",streams=\"many\"}}");
    assert!(metrics.contains(&line) && metrics.contains(&format!("tern_path_test_regressed{{id=\"{id}\",dest=\"{dest}\"}} 0")), "{metrics}");
    let (code, _, err) = s.cli(&transfer, &["test", "--unschedule", &id.to_string()]);
    assert_eq!(code, 0, "{err}");
    let e = s.client(&transfer).call("GET", &format!("/v1/path-tests/{id}/results"), None).expect_err("deleted");
    assert_eq!(e.status, 404);
}

/// A namespace (198.19.211.2) joined to this one (198.19.211.1) by a veth pair whose egress here
/// is shaped by `tbf` at `rate`; a daemon runs there. `None` (with a note) where namespaces
/// cannot be made.
fn throttled_link(rate: &str) -> Option<Netns> {
    let n = Netns::up_from_here("s", "198.19.211")?;
    shape(&n, "add", rate);
    Some(n)
}

/// This side's egress (what a push test sends) at `rate`.
fn shape(n: &Netns, verb: &str, rate: &str) {
    n.qdisc(verb, true, &["tbf", "rate", rate, "burst", "64kb", "latency", "50ms"]);
}

/// Webhook receiver on `port` (0: any): answers every POST 200 and keeps its body.
fn hook_receiver(port: u16) -> (String, std::sync::Arc<std::sync::Mutex<Vec<Value>>>) {
    let hook = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let url = format!("http://{}/hook", hook.local_addr().unwrap());
    let got = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let g = got.clone();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for sock in hook.incoming() {
            let Ok(mut sock) = sock else { continue };
            sock.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 65536];
            let body_at = loop {
                let text = String::from_utf8_lossy(&req).to_lowercase();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text.lines().find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse::<usize>().ok()).unwrap_or(0);
                    if req.len() >= end + 4 + len {
                        break end + 4;
                    }
                }
                match sock.read(&mut buf) {
                    Ok(n) if n > 0 => req.extend_from_slice(&buf[..n]),
                    _ => break usize::MAX,
                }
            };
            if body_at == usize::MAX {
                continue;
            }
            let _ = sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
            g.lock().unwrap().push(serde_json::from_slice(&req[body_at..]).unwrap_or(Value::Null));
        }
    });
    (url, got)
}

/// The issue's "done": a baseline at 300 Mb/s, then the link throttled to 30 Mb/s: the next
/// result is regressed and exactly one webhook arrives, however many regressed results follow.
/// The receiver is down when the regression is found, so the notification stays pending in the
/// database across a kill -9 and is delivered by the restarted service.
#[test]
fn service_path_test_regression_notifies_once_when_the_link_is_throttled() {
    measuring();
    let Some(mut link) = throttled_link("300mbit") else { return };
    let t = scratch();
    let root = t.path().join("far");
    std::fs::create_dir_all(&root).unwrap();
    let token = t.path().join("far.token");
    link.serve(&root, &token);
    let mut s = Service::start(t.path(), &[], &["--test-min-interval", "1", "--allow-host", "198.19.211.2", "--webhook-allow", "127.0.0.1"]);
    let transfer = s.token("transfer", &[]);
    // Nothing listens there until after the restart.
    let hook_port = free_port();
    let hook = format!("http://127.0.0.1:{hook_port}/hook");
    let body = json!({ "dest": "tern://198.19.211.2:7788/", "every": 6, "seconds": 5, "streams": 2, "token_file": token.to_str().unwrap(), "alert_below": 0.5, "notify": hook, "label": "throttled" });
    let id = s.client(&transfer).call("POST", "/v1/path-tests", Some(&body)).unwrap()["id"].as_u64().unwrap();
    let started = Instant::now();
    // Runs that carried nothing under the full suite's load are failed, not counted: 3 good ones.
    let deadline = Instant::now() + Duration::from_secs(120);
    let (base, before): (Vec<Value>, usize) = loop {
        let all = results_at_least(&s, &transfer, id, 3, Duration::from_secs(90));
        let before = all.len();
        let good: Vec<Value> = all.into_iter().filter(|r| r["ok"] == true).collect();
        if good.len() >= 3 {
            break (good.into_iter().take(3).collect(), before);
        }
        assert!(Instant::now() < deadline, "fewer than 3 good baseline runs: {good:?}");
        std::thread::sleep(Duration::from_millis(500));
    };
    let rates: Vec<f64> = base.iter().map(|r| r["many_gbps"].as_f64().unwrap_or_else(|| panic!("baseline run failed: {r}"))).collect();
    println!("baseline at 300 Mb/s: {rates:?} Gb/s ({:?})", started.elapsed());
    // At most the cap; below it when other work shares the 2 cores, but each at least twice
    // what 30 Mb/s allows and their median far above it, which is all the alert needs.
    let mut sorted = rates.clone();
    sorted.sort_by(f64::total_cmp);
    assert!(rates.iter().all(|r| (0.06..=0.345).contains(r)) && sorted[1] >= 0.1, "{rates:?}");
    assert!(base.iter().all(|r| r["regressed"] == false));
    shape(&link, "change", "30mbit");
    // A run that straddled the change may be either; the second good run after it is surely
    // throttled. Runs that carried nothing under the full suite's load are not counted, here
    // as in the baseline (two such in a row were seen in CI).
    let deadline = Instant::now() + Duration::from_secs(150);
    let mut wanted = before + 2;
    let mut seen;
    let last = loop {
        let all = results_at_least(&s, &transfer, id, wanted, Duration::from_secs(90));
        seen = all.len();
        println!("after the change to 30 Mb/s: {:?} Gb/s ({:?})", all.iter().skip(before).map(|r| r["many_gbps"].as_f64()).collect::<Vec<_>>(), started.elapsed());
        let good: Vec<&Value> = all.iter().skip(before).filter(|r| r["ok"] == true).collect();
        if good.len() >= 2 {
            break good.last().copied().unwrap().clone();
        }
        assert!(Instant::now() < deadline, "fewer than 2 good runs after the change: {all:?}");
        wanted = all.len() + 1;
    };
    let last = &last;
    assert!(last["regressed"] == true && last["many_gbps"].as_f64().unwrap() < 0.05, "{last}");
    assert!((0.1..=0.345).contains(&last["baseline_gbps"].as_f64().unwrap()), "{last}");
    let v = s.client(&transfer).call("GET", &format!("/v1/path-tests/{id}"), None).unwrap();
    assert!(v["regressed"] == true && v["alert_pending"] == true, "the receiver is down: the notification waits: {v}");
    s.kill9();
    let (_, got) = hook_receiver(hook_port);
    s.spawn();
    let deadline = Instant::now() + Duration::from_secs(15);
    while got.lock().unwrap().is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    // More regressed runs: still one notification.
    results_at_least(&s, &transfer, id, seen + 1, Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(1));
    let posts = got.lock().unwrap().clone();
    println!("notifications: {} ({:?})", posts.len(), started.elapsed());
    assert_eq!(posts.len(), 1, "exactly one notification: {posts:?}");
    assert_eq!(posts[0]["path_test"]["id"].as_u64(), Some(id), "{}", posts[0]);
    assert_eq!(posts[0]["result"]["regressed"], true);
    let v = s.client(&transfer).call("GET", &format!("/v1/path-tests/{id}"), None).unwrap();
    assert!(v["regressed"] == true && v["alert_pending"] == false, "{v}");
    let metrics = s.client(&s.admin()).get_text("/metrics").unwrap();
    assert!(metrics.contains(&format!("tern_path_test_regressed{{id=\"{id}\",dest=\"tern://198.19.211.2:7788/\"}} 1")), "{metrics}");
}

/// A service that is a node of cluster `site-a` on `url`: its own state directory under `base`,
/// the cluster's shared root and daemon token.
fn cluster_node(base: &Path, shared: &Path, url: &str, name: &str) -> Service {
    cluster_node_beating(base, shared, url, name, 300)
}

/// `cluster_node` with heartbeats every `beat_ms`.
fn cluster_node_beating(base: &Path, shared: &Path, url: &str, name: &str, beat_ms: u64) -> Service {
    let (b, beat) = (shared.to_str().unwrap(), beat_ms.to_string());
    let extra = ["--job-root", b, "--allow-host", "127.0.0.1", "--allow-root-transfers", "--db", url, "--cluster", "site-a", "--node-name", name, "--cluster-heartbeat-ms", &beat];
    let mut s = Service::unspawned(base, &shared.join("root"), &shared.join("daemon.token"), &[], &extra);
    s.spawn();
    s
}

/// Which node's runner has job `id`'s attempt (NULL: none).
fn run_node(pg: &pg::Postgres, id: u64) -> String {
    let o = pg.psql("tern").args(["-A", "-t", "-c", &format!("SELECT run_node FROM jobs WHERE id = {id}")]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn cluster_nodes_share_jobs_take_over_a_dead_nodes_attempt_and_cancel_across_nodes() {
    let Some(pg) = pg::Postgres::start() else { return };
    let url = pg.create_db("tern");
    let t = scratch();
    let shared = t.path().join("site");
    let mut nodes = [cluster_node(&t.path().join("a"), &shared, &url, "dtn-a"), cluster_node(&t.path().join("b"), &shared, &url, "dtn-b")];
    // One database: the first node's admin token works on every node.
    let admin = nodes[0].admin();
    write_file(&shared.join("src/big"), 11, 24 << 20);
    let (src, dst) = (shared.join("src"), shared.join("dst"));
    // ~6 s at 4 MiB/s: still running when its node is killed.
    let id = submit(&nodes[0], &admin, &[src.to_str().unwrap(), dst.to_str().unwrap(), "--bwlimit", "4M"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    // Visible, with its state, through the other node's API.
    while job(&nodes[1].client(&admin), id)["state"] != "running" {
        assert!(Instant::now() < deadline, "job never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let runner = run_node(&pg, id);
    let (dead, alive) = if runner == "dtn-a" { (0, 1) } else { (1, 0) };
    assert!(runner == "dtn-a" || runner == "dtn-b", "the attempt names its node: '{runner}'");
    std::thread::sleep(Duration::from_millis(1500));
    nodes[dead].kill9();
    // The other node re-queues it once the dead one is 3 heartbeats silent, and finishes it.
    let (code, _, err) = nodes[alive].cli(&admin, &["wait", &id.to_string()]);
    assert_eq!(code, 0, "wait: {err}");
    assert_eq!(run_node(&pg, id), if alive == 0 { "dtn-a" } else { "dtn-b" });
    assert_same_tree(&src, &dst);
    let j = job(&nodes[alive].client(&admin), id);
    assert_eq!(j["state"], "succeeded", "{j}");
    // A node restarting takes back only its own attempts: the dead node comes back while a job
    // runs on the other one, which goes on undisturbed; then that job is canceled through the
    // node that does not run it, and its child stops.
    let id2 = submit(&nodes[alive], &admin, &[src.to_str().unwrap(), shared.join("dst2").to_str().unwrap(), "--bwlimit", "2M"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while job(&nodes[alive].client(&admin), id2)["state"] != "running" {
        assert!(Instant::now() < deadline, "job never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    nodes[dead].spawn();
    let holder = if run_node(&pg, id2) == "dtn-a" { 0 } else { 1 };
    let other = 1 - holder;
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(job(&nodes[other].client(&admin), id2)["state"], "running", "a restarted node left the other's attempt alone");
    assert!(!children_of(nodes[holder].child.id()).is_empty(), "the holder runs a child");
    let (code, out, err) = nodes[other].cli(&admin, &["cancel", &id2.to_string()]);
    assert!(code == 0 && out.contains("canceled"), "{out} {err}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !children_of(nodes[holder].child.id()).is_empty() {
        assert!(Instant::now() < deadline, "the holder's child still runs after a cancel through another node");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(job(&nodes[holder].client(&admin), id2)["state"], "canceled");
}

/// A TCP forwarder between one node and PostgreSQL that the test can cut: while cut, every
/// connection through it is shut down and new ones are closed as soon as they are accepted (to
/// the node, the database has gone away). Its threads end when it is dropped.
struct Forwarder {
    port: u16,
    cut: std::sync::Arc<std::sync::atomic::AtomicBool>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    conns: std::sync::Arc<std::sync::Mutex<Vec<std::net::TcpStream>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Forwarder {
    fn start(to: u16) -> Self {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let cut = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let conns = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let thread = {
            let (cut, stop, conns) = (cut.clone(), stop.clone(), conns.clone());
            std::thread::spawn(move || {
                while !stop.load(SeqCst) {
                    let Ok((down, _)) = listener.accept() else {
                        std::thread::sleep(Duration::from_millis(5));
                        continue;
                    };
                    if cut.load(SeqCst) {
                        let _ = down.shutdown(std::net::Shutdown::Both);
                        continue;
                    }
                    down.set_nonblocking(false).unwrap();
                    let Ok(up) = std::net::TcpStream::connect(("127.0.0.1", to)) else { continue };
                    conns.lock().unwrap().extend([down.try_clone().unwrap(), up.try_clone().unwrap()]);
                    for (mut from, mut into) in [(down.try_clone().unwrap(), up.try_clone().unwrap()), (up, down)] {
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut into);
                            let _ = from.shutdown(std::net::Shutdown::Both);
                            let _ = into.shutdown(std::net::Shutdown::Both);
                        });
                    }
                }
            })
        };
        Forwarder { port, cut, stop, conns, thread: Some(thread) }
    }

    fn url(&self, db: &str) -> String {
        format!("postgres://tern@127.0.0.1:{}/{db}", self.port)
    }

    fn cut(&self) {
        self.cut.store(true, std::sync::atomic::Ordering::SeqCst);
        for c in self.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
    }

    fn restore(&self) {
        self.cut.store(false, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        self.cut();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Heartbeats of the fencing tests: a node fences 2 of them (3 s) after its last heartbeat
/// that landed; the others re-queue its job after 3 (4.5 s).
const FENCE_BEAT_MS: u64 = 1500;

/// Node dtn-a (through a forwarder the test cuts) runs a job of 24 MiB at `bwlimit`; dtn-b (straight to
/// PostgreSQL) joins. Returns the forwarder, the nodes, the admin token, the job and its trees.
fn fencing_cluster(pg: &pg::Postgres, t: &Path, beat_ms: u64, bwlimit: &str) -> (Forwarder, Service, Service, String, u64, PathBuf, PathBuf) {
    let url = pg.create_db("tern");
    let fwd = Forwarder::start(pg.port);
    let shared = t.join("site");
    let a = cluster_node_beating(&t.join("a"), &shared, &fwd.url("tern"), "dtn-a", beat_ms);
    let admin = a.admin();
    let (src, dst) = (shared.join("src"), shared.join("dst"));
    write_file(&src.join("big"), 17, 24 << 20);
    // Submitted while dtn-a is the only node: it runs the job.
    let id = submit(&a, &admin, &[src.to_str().unwrap(), dst.to_str().unwrap(), "--bwlimit", bwlimit]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while job(&a.client(&admin), id)["state"] != "running" || children_of(a.child.id()).is_empty() {
        assert!(Instant::now() < deadline, "the job never started on dtn-a");
        std::thread::sleep(Duration::from_millis(50));
    }
    let b = cluster_node_beating(&t.join("b"), &shared, &url, "dtn-b", beat_ms);
    assert_eq!(run_node(pg, id), "dtn-a");
    (fwd, a, b, admin, id, src, dst)
}

fn log_of(s: &Service) -> String {
    std::fs::read_to_string(s.state.with_file_name("service.log")).unwrap_or_default()
}

/// How many times job `id` was claimed, by any node (`claim_seq` counts claims in the table).
fn claims(pg: &pg::Postgres, id: u64) -> String {
    let o = pg.psql("tern").args(["-A", "-t", "-c", &format!("SELECT claim_seq FROM jobs WHERE id = {id}")]).output().unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// A node cut from PostgreSQL fences itself: within the fence interval its transfer is gone and
/// its log says why, before the other node re-queues the job and finishes it (never both at
/// once); its /healthz answers 503 meanwhile. Back on the database, it registers again.
#[test]
fn cluster_node_cut_from_the_database_fences_itself_before_another_takes_its_job() {
    let Some(pg) = pg::Postgres::start() else { return };
    let t = scratch();
    let started = Instant::now();
    let (fwd, a, b, admin, id, src, dst) = fencing_cluster(&pg, t.path(), FENCE_BEAT_MS, "2M");
    std::thread::sleep(Duration::from_millis(500));
    let cut = Instant::now();
    fwd.cut();
    let (mut a_gone, mut b_first, mut polled) = (None::<Duration>, None::<Duration>, Instant::now());
    let mut a_health = None;
    loop {
        let (on_a, on_b) = (children_of(a.child.id()), children_of(b.child.id()));
        let at = cut.elapsed();
        assert!(on_a.is_empty() || on_b.is_empty(), "both nodes run job {id} at {at:?} after the cut: dtn-a {on_a:?}, dtn-b {on_b:?}");
        if on_a.is_empty() && a_gone.is_none() {
            a_gone = Some(at);
            // Fenced: a load balancer sees it.
            a_health = Some(a.client(&admin).call("GET", "/healthz", None));
        }
        assert!(on_a.is_empty() || a_gone.is_none(), "dtn-a started a transfer again while cut from the database");
        if !on_b.is_empty() && b_first.is_none() {
            b_first = Some(at);
        }
        if polled.elapsed() > Duration::from_millis(250) {
            polled = Instant::now();
            if job(&b.client(&admin), id)["state"] == "succeeded" {
                break;
            }
        }
        assert!(at < Duration::from_secs(45), "job {id} did not finish on dtn-b: {}", job(&b.client(&admin), id));
        std::thread::sleep(Duration::from_millis(10));
    }
    let (a_gone, b_first) = (a_gone.expect("dtn-a's transfer ended"), b_first.expect("dtn-b ran the job"));
    println!("after the cut: dtn-a's transfer gone at {a_gone:?}, dtn-b's started at {b_first:?}, job done at {:?} ({:?} in all)", cut.elapsed(), started.elapsed());
    let limit = Duration::from_millis(2 * FENCE_BEAT_MS);
    assert!(a_gone <= limit + Duration::from_millis(1500), "dtn-a stopped its transfer {a_gone:?} after the cut (fence interval {limit:?})");
    assert!(a_gone < b_first, "dtn-a's attempt ended before dtn-b's began");
    let e = a_health.unwrap().expect_err("a fenced node's /healthz fails");
    assert!(e.status == 503 && e.message.contains("node dtn-a of cluster site-a is fenced"), "{e}");
    let log = log_of(&a);
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("is fenced:")).collect();
    assert_eq!(lines.len(), 1, "one fencing line: {log}");
    assert!(lines[0].contains("node dtn-a of cluster site-a") && lines[0].contains(&format!("127.0.0.1:{}", fwd.port)) && lines[0].contains("check this node's network path"), "{}", lines[0]);
    assert!(!log.contains(&format!("job {id}: attempt")), "dtn-a wrote no outcome: {log}");
    assert_eq!(run_node(&pg, id), "dtn-b");
    assert_eq!(claims(&pg, id), "2", "claimed by dtn-a, then once by dtn-b");
    assert_same_tree(&src, &dst);
    // Back on the database: the others counted it silent, so it registers again and serves.
    fwd.restore();
    let deadline = Instant::now() + Duration::from_secs(20);
    while a.client(&admin).call("GET", "/healthz", None).is_err() {
        assert!(Instant::now() < deadline, "dtn-a did not come back: {}", log_of(&a));
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("dtn-a serves again {:?} after the cut", cut.elapsed());
    assert!(log_of(&a).contains("registered again"), "{}", log_of(&a));
}

/// A cut shorter than the fence interval leaves the running job alone: the same transfer
/// process runs it to the end, claimed once, and nothing is fenced.
#[test]
fn cluster_node_a_short_database_cut_does_not_fence_and_its_job_runs_once() {
    let Some(pg) = pg::Postgres::start() else { return };
    let t = scratch();
    let (fwd, a, b, admin, id, src, dst) = fencing_cluster(&pg, t.path(), FENCE_BEAT_MS, "2M");
    let child = children_of(a.child.id());
    assert_eq!(child.len(), 1, "{child:?}");
    fwd.cut();
    std::thread::sleep(Duration::from_millis(300));
    fwd.restore();
    let started = Instant::now();
    let mut polled = Instant::now();
    loop {
        let (on_a, on_b) = (children_of(a.child.id()), children_of(b.child.id()));
        assert!(on_b.is_empty(), "dtn-b runs job {id} too: {on_b:?}");
        assert!(on_a.is_empty() || on_a == child, "dtn-a's transfer was restarted: {on_a:?}, was {child:?}");
        if polled.elapsed() > Duration::from_millis(250) {
            polled = Instant::now();
            if job(&a.client(&admin), id)["state"] == "succeeded" {
                break;
            }
        }
        assert!(started.elapsed() < Duration::from_secs(45), "job {id} did not finish: {}", job(&a.client(&admin), id));
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("job done {:?} after the cut ended", started.elapsed());
    let log = log_of(&a);
    assert!(log.contains("node dtn-a cannot reach the database"), "the cut reached the heartbeat: {log}");
    assert!(!log.contains("is fenced"), "{log}");
    assert_eq!((run_node(&pg, id), claims(&pg, id)), ("dtn-a".to_string(), "1".to_string()), "one attempt, on dtn-a");
    assert_same_tree(&src, &dst);
}

/// A node cut for longer than its fence interval but back before the others count it silent
/// (3 heartbeats): it fenced (its transfer stopped), and back on its still-live registration it
/// re-queues its own attempt (the others never re-queue it), and the job runs again on one node
/// at a time — usually dtn-a, dtn-b when its claim comes first (seen under CI's load).
#[test]
fn cluster_node_back_before_the_others_count_it_silent_re_queues_its_own_job() {
    let Some(pg) = pg::Postgres::start() else { return };
    let t = scratch();
    // Fence at 6 s, re-queue by the others at 9 s: the cut ends at 7 s.
    let beat_ms = 3000;
    let (fwd, a, b, admin, id, src, dst) = fencing_cluster(&pg, t.path(), beat_ms, "1M");
    // Cut right after one of dtn-a's heartbeats landed, so the 7 s fall between 6 and 9.
    let beat_at = || {
        let o = pg.psql("tern").args(["-A", "-t", "-c", "SELECT heartbeat_at FROM cluster_nodes WHERE node = 'dtn-a'"]).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    let (first, deadline) = (beat_at(), Instant::now() + Duration::from_secs(10));
    while beat_at() == first {
        assert!(Instant::now() < deadline, "dtn-a does not heartbeat");
        std::thread::sleep(Duration::from_millis(20));
    }
    let child = children_of(a.child.id());
    assert_eq!(child.len(), 1, "job {id} runs on dtn-a at the cut: {child:?}");
    let cut = Instant::now();
    fwd.cut();
    let (mut restored, mut stopped, mut again, mut polled) = (false, None::<Duration>, None::<Duration>, Instant::now());
    loop {
        let (on_a, on_b) = (children_of(a.child.id()), children_of(b.child.id()));
        let at = cut.elapsed();
        // Before the restore only dtn-a may run it (the others count it live until 9 s); once
        // dtn-a re-queued its own attempt, whichever node claims first runs it: never both.
        assert!(on_b.is_empty() || (restored && on_a.is_empty()), "dtn-b runs job {id} at {at:?}: {on_b:?} (dtn-a: {on_a:?})");
        if on_a.is_empty() && stopped.is_none() {
            stopped = Some(at);
        }
        if ((!on_a.is_empty() && on_a != child) || !on_b.is_empty()) && again.is_none() {
            again = Some(at);
        }
        if !restored && at >= Duration::from_millis(7 * beat_ms / 3) {
            fwd.restore();
            restored = true;
        }
        if restored && polled.elapsed() > Duration::from_millis(250) {
            polled = Instant::now();
            if job(&a.client(&admin), id)["state"] == "succeeded" {
                break;
            }
        }
        assert!(at < Duration::from_secs(50), "job {id} did not finish: {}", job(&a.client(&admin), id));
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("after the cut: dtn-a's transfer stopped at {stopped:?}, ran again at {again:?}, job done at {:?}", cut.elapsed());
    let (stopped, again) = (stopped.expect("dtn-a fenced its transfer"), again.expect("the job ran again"));
    assert!(stopped < Duration::from_millis(7 * beat_ms / 3) && again > stopped, "stopped {stopped:?}, again {again:?}");
    let log = log_of(&a);
    assert!(log.contains("node dtn-a of cluster site-a is fenced") && log.contains("its registration is still live"), "{log}");
    assert!(log.contains("re-queued 1 of this node's job attempt(s)") && !log.contains("registered again"), "{log}");
    // Claimed twice: first by dtn-a, then by whichever node took the attempt dtn-a re-queued
    // (usually dtn-a itself; under load dtn-b's claim can come first).
    assert_eq!(claims(&pg, id), "2", "claimed twice");
    assert!(["dtn-a", "dtn-b"].contains(&run_node(&pg, id).as_str()));
    assert_same_tree(&src, &dst);
}

/// The value of `/metrics` line `series` (name and labels), if there is one.
fn gauge(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Every node's state, jobs, rate and load as its heartbeats report them, through
/// `GET /v1/cluster`, `/metrics` and `tern cluster status` (docs/cluster.md "Nodes on the
/// dashboard, the API and /metrics"); a service alone shows no cluster.
#[test]
fn cluster_nodes_show_their_state_jobs_rate_and_load_on_the_api_metrics_and_cli() {
    let Some(pg) = pg::Postgres::start() else { return };
    let url = pg.create_db("tern");
    let t = scratch();
    let shared = t.path().join("site");
    let mut nodes = [cluster_node(&t.path().join("a"), &shared, &url, "dtn-a"), cluster_node(&t.path().join("b"), &shared, &url, "dtn-b")];
    let admin = nodes[0].admin();
    let read = nodes[0].token("read", &[]);
    write_file(&shared.join("src/big"), 12, 40 << 20);
    // ~10 s at 4 MiB/s: running while the nodes are looked at.
    let id = submit(&nodes[0], &admin, &[shared.join("src").to_str().unwrap(), shared.join("dst").to_str().unwrap(), "--bwlimit", "4M"]);
    let cluster = |n: &Service| n.client(&read).call("GET", "/v1/cluster", None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    // Asked of the other node: the registry, not the node's own runner, answers.
    let (runner, v) = loop {
        let runner = run_node(&pg, id);
        let v = cluster(&nodes[1]);
        let busy = v["nodes"].as_array().unwrap().iter().find(|n| n["node"] == runner.as_str()).map(|n| (n["running_jobs"].as_i64(), n["rate_bps"].as_f64().unwrap_or(0.0)));
        if let Some((Some(1), rate)) = busy
            && rate > 0.0
        {
            break (runner, v);
        }
        assert!(Instant::now() < deadline, "the running job's node never showed it: {v}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!((v["cluster"].as_str(), v["node"].as_str()), (Some("site-a"), Some("dtn-b")), "{v}");
    let listed: Vec<&str> = v["nodes"].as_array().unwrap().iter().map(|n| n["node"].as_str().unwrap()).collect();
    assert_eq!(listed, ["dtn-a", "dtn-b"], "{v}");
    for n in v["nodes"].as_array().unwrap() {
        let mine = n["node"] == runner.as_str();
        assert_eq!(n["state"], "active", "{n}");
        assert!(n["host"].as_str().is_some_and(|h| !h.is_empty()) && n["version"] == env!("CARGO_PKG_VERSION"), "{n}");
        assert!(n["heartbeat_age_s"].as_f64().is_some_and(|a| (0.0..2.0).contains(&a)), "heartbeats every 300 ms: {n}");
        assert!(n["load1"].as_f64().is_some_and(|l| l >= 0.0), "Linux has /proc/loadavg: {n}");
        assert_eq!(n["running_jobs"], if mine { 1 } else { 0 }, "{n}");
        let rate = n["rate_bps"].as_f64().unwrap();
        // --bwlimit 4M: about 4 MB/s, well under the 1 GB/s+ of an unlimited local copy.
        assert!(if mine { (5e5..2e7).contains(&rate) } else { rate == 0.0 }, "{n}");
    }

    let m = nodes[0].client(&read).get_text("/metrics").unwrap();
    for node in ["dtn-a", "dtn-b"] {
        let l = format!("{{cluster=\"site-a\",node=\"{node}\"}}");
        assert_eq!(gauge(&m, &format!("tern_cluster_node_up{l}")), Some(1.0), "{m}");
        assert!(gauge(&m, &format!("tern_cluster_node_heartbeat_age_seconds{l}")).is_some_and(|a| (0.0..2.0).contains(&a)), "{m}");
        assert_eq!(gauge(&m, &format!("tern_cluster_node_running_jobs{l}")), Some(if node == runner { 1.0 } else { 0.0 }), "{m}");
        let rate = gauge(&m, &format!("tern_cluster_node_rate_bytes_per_second{l}")).unwrap();
        assert!(if node == runner { rate > 0.0 } else { rate == 0.0 }, "{m}");
    }
    assert!(m.contains("# TYPE tern_cluster_node_up gauge"), "{m}");

    // The command line prints the same beside state and heartbeat.
    let mut cmd = Command::new(tern_bin());
    cmd.args(["cluster", "status", "--db", &url, "--cluster", "site-a"]).stdin(Stdio::null());
    let text = String::from_utf8_lossy(&run_bounded(cmd, Duration::from_secs(30)).stdout).into_owned();
    let line = text.lines().find(|l| l.split_whitespace().nth(1) == Some(runner.as_str())).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains(" active ") && line.contains("/s") && line.contains("1 jobs") && line.contains("load ") && line.contains("heartbeat "), "{text}");

    // Only with a token: the registry is not for anyone on the network.
    let nobody = Client::new(&nodes[0].url(), "", Some(&nodes[0].ca())).unwrap();
    assert_eq!(nobody.call("GET", "/v1/cluster", None).unwrap_err().status, 401);

    // Canceled: its node runs nothing again; killed: a node is down on /metrics after 3 missed
    // heartbeats.
    let (code, _, err) = nodes[0].cli(&admin, &["cancel", &id.to_string()]);
    assert_eq!(code, 0, "cancel: {err}");
    let deadline = Instant::now() + Duration::from_secs(15);
    while cluster(&nodes[0])["nodes"].as_array().unwrap().iter().any(|n| n["running_jobs"] != 0 || n["rate_bps"] != 0.0) {
        assert!(Instant::now() < deadline, "still busy after the cancel: {}", cluster(&nodes[0]));
        std::thread::sleep(Duration::from_millis(100));
    }
    nodes[1].kill9();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let m = nodes[0].client(&read).get_text("/metrics").unwrap();
        if gauge(&m, "tern_cluster_node_up{cluster=\"site-a\",node=\"dtn-b\"}") == Some(0.0) {
            assert_eq!(gauge(&m, "tern_cluster_node_up{cluster=\"site-a\",node=\"dtn-a\"}"), Some(1.0), "{m}");
            break;
        }
        assert!(Instant::now() < deadline, "a killed node still up: {m}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(cluster(&nodes[0])["nodes"][1]["state"], "unreachable");

    // A service alone: no cluster, and no node gauges.
    let solo = Service::start(&t.path().join("solo"), &[], &[]);
    let (tok, c) = (solo.admin(), Client::new(&solo.url(), &solo.admin(), Some(&solo.ca())).unwrap());
    assert_eq!(c.call("GET", "/v1/cluster", None).unwrap(), json!({ "cluster": null, "nodes": [] }));
    assert!(!solo.client(&tok).get_text("/metrics").unwrap().contains("tern_cluster_node"));
}
