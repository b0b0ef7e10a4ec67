//! The web dashboard in a real headless Chromium (Debian's `chromium`, driven by Playwright from
//! `crates/tern-service/web-tests/`) against a real `tern serve --http-listen`: sign in, submit
//! a rate-limited job to the daemon's own data port, watch progress and the live chart, cancel,
//! retry to success, a job whose file name is markup, token create/use/revoke, dark and narrow
//! screens; where PostgreSQL is installed, a second service that is a cluster node shows its
//! Nodes panel. Then the outcome is checked here, on disk and through the API.
//!
//! Needs `node`, `/usr/bin/chromium` and `npm ci` in the web-tests folder (scripts/test.sh
//! installs all three); without them the test says so and skips, except under CI, where it fails.
//! `TERN_DASHBOARD_DOCS=1` also copies the screenshot to docs/dashboard.png.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use crate::pg;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use tern_service::client::Client;

/// At the 5 MB/s the browser test sets, about 12 s: time to watch it and cancel it mid-way
/// even on a loaded machine.
const BIG: usize = 56 << 20;
const MARKUP_NAME: &str = "<img src=x onerror=window.__xss=1>.dat";

struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cmd` (a `tern serve` listening on port 0 for data and the service API) with its
/// stderr in `log`, and returns it with the API's and the daemon's ports, read from what this
/// very server says (`wait_for_serving`). `what` names it if it exits at start.
fn start_serving(mut cmd: Command, log: &Path, what: &str) -> (Serve, u16, u16) {
    let mut child = cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(std::fs::File::create(log).unwrap()).spawn().unwrap();
    let ports = wait_for_serving(&mut child, log, 0);
    let serve = Serve(child);
    let (http, data_port) = ports.unwrap_or_else(|said| panic!("{what} exited at start: {said}"));
    (serve, http, data_port)
}

fn web_tests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tern-service/web-tests")
}

/// Why the browser test cannot run here, if it cannot.
fn missing_tools() -> Option<String> {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    if !Path::new(&chromium).exists() {
        return Some(format!("{chromium} is not installed (apt-get install chromium)"));
    }
    if Command::new("node").arg("--version").output().map(|o| !o.status.success()).unwrap_or(true) {
        return Some("node is not installed (apt-get install nodejs npm)".into());
    }
    if !web_tests().join("node_modules/playwright-core").is_dir() {
        return Some(format!("playwright-core is not installed (cd {} && npm ci)", web_tests().display()));
    }
    None
}

/// PNG width and height from the IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.len() > 24 && &bytes[1..4] == b"PNG", "not a PNG");
    let be = |i: usize| u32::from_be_bytes(bytes[i..i + 4].try_into().unwrap());
    (be(16), be(20))
}

#[test]
fn dashboard_in_headless_chromium() {
    if let Some(why) = missing_tools() {
        assert!(std::env::var_os("CI").is_none(), "dashboard test cannot run under CI: {why}");
        eprintln!("SKIP dashboard_in_headless_chromium: {why}");
        return;
    }
    let t = scratch();
    let base = t.path();
    let root = base.join("root");
    std::fs::create_dir_all(root.join("landing")).unwrap();
    // The slow job: a local tree to the daemon's own data port (tern://), rate-limited so it
    // runs for several seconds.
    write_file(&base.join("run42/big.dat"), 42, BIG);
    write_file(&base.join("run42/small.dat"), 43, 10_000);
    // The failing job: its file name is markup, and a directory stands where it should land.
    let xss_src = base.join("xss");
    write_file(&xss_src.join("ok.dat"), 1, 100);
    write_file(&xss_src.join(MARKUP_NAME), 2, 100_000);
    write_file(&base.join("xss-out/xss").join(MARKUP_NAME).join("keep"), 3, 10);

    let state = base.join("state");
    let daemon_token = base.join("daemon.token");
    let log = base.join("serve.log");
    // Port 0 for both: the ports come from what this very server says (`start_serving`).
    let mut serve = Command::new(tern_bin());
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0"])
        .arg("--root")
        .arg(&root)
        // Jobs read and write local trees beside the daemon's root.
        .arg("--job-root")
        .arg(base)
        // CI runs as root; this test is not about run-as mapping (tests/service_security.rs is).
        .arg("--allow-root-transfers")
        .arg("--token-file")
        .arg(&daemon_token)
        // The scheduled path test below runs every 6 s against the daemon.
        .args(["--test-min-interval", "1", "--allow-host", "127.0.0.1"])
        .arg("--state-dir")
        .arg(&state);
    let (_serve, http, data_port) = start_serving(serve, &log, "tern serve");
    let admin = std::fs::read_to_string(state.join("admin.token")).unwrap().trim().to_string();
    let url = format!("https://127.0.0.1:{http}");
    // Screenshots stay after the run (target/tmp/dashboard/) for a person to look at.
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out).unwrap();

    // A path with history for the Paths chart: three good tests, then its token revoked so the
    // following runs fail at once (a mark each) and the good points stay three.
    let c = Client::new(&url, &admin, Some(&state.join("tls/cert.pem"))).unwrap();
    let tester = c.call("POST", "/v1/tokens", Some(&serde_json::json!({ "scope": "transfer", "name": "path tests" }))).unwrap();
    let tc = Client::new(&url, tester["token"].as_str().unwrap(), Some(&state.join("tls/cert.pem"))).unwrap();
    let body = serde_json::json!({ "dest": format!("tern://127.0.0.1:{data_port}/"), "every": 6, "seconds": 5, "streams": 2, "token_file": daemon_token.to_str().unwrap(), "label": "loopback" });
    let path_id = tc.call("POST", "/v1/path-tests", Some(&body)).unwrap()["id"].as_u64().unwrap();
    let results = |n: usize, failed: bool| {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let r = c.call("GET", &format!("/v1/path-tests/{path_id}/results"), None).unwrap()["results"].as_array().unwrap().clone();
            if r.len() >= n && (!failed || r.last().is_some_and(|x| x["ok"] == false)) {
                return r;
            }
            assert!(Instant::now() < deadline, "path test results: {r:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    results(3, false);
    c.call("DELETE", &format!("/v1/tokens/{}", tester["id"].as_str().unwrap()), None).unwrap();
    let r = results(4, true);
    let points = r.iter().filter(|x| x["ok"] == true).count();
    assert!(points >= 3, "{r:?}");

    // A cluster node of its own (one node: admitted alone) for the Nodes panel.
    let pg = pg::Postgres::start();
    let node = pg.as_ref().map(|pg| {
        let (state, root, node_log) = (base.join("node-state"), base.join("node-root"), base.join("node.log"));
        std::fs::create_dir_all(&root).unwrap();
        let db = pg.create_db("dash");
        let mut cmd = Command::new(tern_bin());
        cmd.args(["serve", "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--token-file"]).arg(&daemon_token).arg("--root").arg(&root).arg("--state-dir").arg(&state).args([
            "--db",
            &db,
            "--cluster",
            "site-a",
            "--node-name",
            "dtn-ui",
            "--cluster-heartbeat-ms",
            "300",
        ]);
        let (serve, http, _) = start_serving(cmd, &node_log, "the cluster node");
        let token = std::fs::read_to_string(state.join("admin.token")).unwrap().trim().to_string();
        (serve, format!("https://127.0.0.1:{http}"), token)
    });
    let mut cmd = Command::new("node");
    if let Some((_, url, token)) = &node {
        cmd.env("TERN_DASH_NODE_URL", url).env("TERN_DASH_NODE_TOKEN", token);
    }
    cmd.arg(web_tests().join("dashboard.mjs"))
        .current_dir(web_tests())
        .env("TERN_DASH_URL", &url)
        .env("TERN_DASH_TOKEN", &admin)
        .env("TERN_DASH_SRC", base.join("run42"))
        .env("TERN_DASH_DST", format!("tern://127.0.0.1:{data_port}/landing"))
        .env("TERN_DASH_TOKEN_FILE", &daemon_token)
        .env("TERN_DASH_XSS_SRC", &xss_src)
        .env("TERN_DASH_XSS_DST", base.join("xss-out"))
        .env("TERN_DASH_OUT", &out)
        .env("TERN_DASH_PATH_ID", path_id.to_string())
        .env("TERN_DASH_PATH_POINTS", points.to_string())
        .stdin(Stdio::null());
    let started = Instant::now();
    let run = run_bounded(cmd, Duration::from_secs(180));
    let stdout = String::from_utf8_lossy(&run.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&run.stderr));
    assert!(run.status.success() && stdout.contains("dashboard: all checks passed"), "the browser test failed (its log is above)");
    eprintln!("dashboard: browser part took {:.1} s", started.elapsed().as_secs_f64());

    // What the clicks did, seen from outside the browser.
    let jobs = c.call("GET", "/v1/jobs", None).unwrap()["jobs"].as_array().unwrap().clone();
    let slow = jobs.iter().find(|j| j["spec"]["label"] == "run42 to archive").expect("the submitted job");
    assert_eq!(slow["state"], "succeeded", "{slow}");
    assert_eq!(slow["spec"]["options"]["bwlimit"], "5M", "the form's option reached the job");
    assert_eq!(std::fs::read(root.join("landing/run42/big.dat")).unwrap(), data(42, BIG), "landed byte-identical after cancel and retry");
    let sent = slow["summary"]["bytes"].as_u64().unwrap();
    assert!(sent < BIG as u64, "the retry resumed instead of starting over: it sent {sent} of {BIG} bytes");
    let markup = jobs.iter().find(|j| j["spec"]["label"].as_str().is_some_and(|l| l.starts_with("<img"))).expect("the markup job");
    assert_eq!(markup["state"], "failed");
    assert!(markup["summary"]["errors"][0]["path"].as_str().unwrap().ends_with(MARKUP_NAME), "{markup}");
    assert_eq!(std::fs::read(base.join("xss-out/xss/ok.dat")).unwrap().len(), 100, "the other file of the failing job landed");
    let tokens = c.call("GET", "/v1/tokens", None).unwrap();
    let made = tokens["tokens"].as_array().unwrap().iter().find(|t| t["name"] == "collaborator <b>x</b>").expect("the token made in the browser");
    assert!(made["revoked_at"].is_number() && made["scope"] == "read" && made["path_prefix"] == "/shared/run42", "{made}");

    let chart = std::fs::read(out.join("path-chart.png")).unwrap();
    assert!(png_size(&chart).0 > 600 && chart.len() > 4000, "the path chart screenshot");

    let shot = std::fs::read(out.join("dashboard.png")).unwrap();
    assert_eq!(png_size(&shot), (1280, 900), "screenshot size");
    assert!(shot.len() > 40_000, "a 1280x900 dashboard with a chart is not a near-empty PNG ({} bytes)", shot.len());
    if std::env::var_os("TERN_DASHBOARD_DOCS").is_some() {
        std::fs::copy(out.join("dashboard.png"), Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/dashboard.png")).unwrap();
    }
}
