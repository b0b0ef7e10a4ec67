//! `tern test DEST`: what limits a transfer to DEST, with numbers. The engine measures
//! (`tern_engine::probe`: round trip, memory→memory with one stream and with tern's count,
//! the destination's writers, the source's readers, hash and seal rates per core on each side);
//! the verdict is a pure function of those numbers (`verdict`), tested with made-up
//! measurements as `tern doctor`'s findings are.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use tern_engine::client::probe::Plan;
use tern_engine::endpoint::Endpoint;
use tern_engine::probe::{Outcome, Rate};
use tern_proto::TestWhat;

#[derive(Args)]
pub(crate) struct TestArgs {
    /// Where transfers go: [user@]host:path, tern://host[:port]/path, or a local path (a
    /// loopback self-test of this host). The write test uses a scratch file in that directory.
    #[arg(required_unless_present_any = ["schedules", "results", "unschedule"])]
    dest: Option<String>,
    /// Do not run it now: have the tern service (--server, as tern submit) run it every
    /// DURATION (10m, 6h, 1d), keep the results and plot them; prints the schedule's id.
    #[arg(long, value_name = "DURATION", conflicts_with_all = ["source", "schedules", "results", "unschedule"])]
    every: Option<String>,
    /// With --every: notify when the many-stream rate falls below this fraction of the path's
    /// own baseline (the median of its last good results) [default: 0.5].
    #[arg(long, value_name = "FRACTION", requires = "every")]
    alert_below: Option<f64>,
    /// With --every: where the regression notification goes (https://... webhook or mailto:ADDR).
    #[arg(long, value_name = "URL", requires = "every")]
    notify: Option<String>,
    /// With --every: a name for the path on the dashboard.
    #[arg(long, requires = "every")]
    label: Option<String>,
    /// List the service's path-test schedules (yours; an admin's token: all).
    #[arg(long, conflicts_with_all = ["results", "unschedule"])]
    schedules: bool,
    /// List one schedule's results, oldest first.
    #[arg(long, value_name = "ID", conflicts_with = "unschedule")]
    results: Option<u64>,
    /// Delete a schedule and its results.
    #[arg(long, value_name = "ID")]
    unschedule: Option<u64>,
    #[command(flatten)]
    service: crate::service_cli::ServerArgs,
    /// The whole test's time budget in seconds, 5 to 100 (each of its ten steps gets about a
    /// tenth; the far side allows a test 60 s of its own).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u32).range(5..=100))]
    seconds: u32,
    /// Measure memory→memory in a download's direction (DEST's host sends) instead of an
    /// upload's. The storage steps stay as they are: DEST's writers and this host's readers.
    #[arg(long)]
    pull: bool,
    /// Data streams unsealed, as `tern cp --no-encrypt` (frames still carry keyed tags).
    #[arg(long)]
    no_encrypt: bool,
    /// Streams for the many-stream steps (default: the count tern would start a transfer with).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=64))]
    streams: Option<u16>,
    /// A file (or a directory: its largest file) to read for the source read test; default: a
    /// scratch file written first (its pages are then likely cached: an upper bound).
    #[arg(long, value_name = "PATH")]
    source: Option<PathBuf>,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: crate::fs_cli::ConnArgs,
}

/// The numbers the verdict is judged from (Gb/s unless named otherwise).
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct Measures {
    pub rtt_ms: Option<f64>,
    pub streams: u16,
    pub net_one: f64,
    pub net_many: f64,
    pub encrypt: bool,
    /// None: skipped (the reason is elsewhere).
    pub write_one: Option<f64>,
    pub write_many: Option<f64>,
    pub read_one: Option<f64>,
    pub read_many: Option<f64>,
    /// One core each: the sending side's and the receiving side's BLAKE3 and seal rates.
    pub send_hash: f64,
    pub send_seal: f64,
    pub recv_hash: f64,
    pub recv_seal: f64,
    /// Usable cores on this host: its CPUs, or its cgroup's CPU quota where that is fewer.
    pub cores: f64,
    /// The far side's usable cores, where it says (a server with the cpu step; otherwise the
    /// streams stand for them), and where they come from ("CPU quota 0.50 cores (...)").
    pub far_cores: Option<f64>,
    pub far_how: Option<String>,
    /// Cores the far side's process kept busy during the many-stream carry.
    pub far_busy: Option<f64>,
    /// The socket-buffer maximum that bounds one stream's window here (bytes): the sender's
    /// tcp_wmem max for a push, the receiver's tcp_rmem max for a pull.
    pub sock_max: Option<u64>,
    pub pull: bool,
    /// This side's TCP counters over the many-stream carry (a push; in a pull the far side sends).
    pub loss: Option<Loss>,
}

/// Segments sent, re-sent and reorderings seen by the sending side's TCP.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(crate) struct Loss {
    pub segments: u64,
    pub retransmitted: u64,
    pub reorderings: u64,
}

impl Loss {
    /// Re-sent segments as a percentage of those sent.
    pub(crate) fn pct(&self) -> f64 {
        if self.segments == 0 { 0.0 } else { self.retransmitted as f64 * 100.0 / self.segments as f64 }
    }
}

/// Re-sending this share of segments (%) is loss worth naming: on a long path TCP's rate falls
/// with the square root of the loss rate, so even 0.1 % costs a cubic or reno stream most of it.
const LOSSY_PCT: f64 = 0.1;

#[derive(Clone, Debug, Serialize)]
pub(crate) struct Verdict {
    /// network, cpu, destination or source.
    pub limit: &'static str,
    pub line: String,
    pub fix: Option<String>,
    /// The slowest component's rate: what a transfer of large files can expect.
    pub expected_gbps: f64,
}

pub(crate) fn gb(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.1} Gb/s")
    } else if v >= 1.0 {
        format!("{v:.2} Gb/s")
    } else {
        format!("{v:.3} Gb/s")
    }
}

/// Gb/s as storage people say it: "40.0 MB/s".
fn mbs(gbps: f64) -> String {
    format!("{:.1} MB/s", gbps * 1e9 / 8.0 / 1e6)
}

fn mb(bytes: f64) -> String {
    if bytes >= 1e6 { format!("{:.1} MB", bytes / 1e6) } else { format!("{:.0} kB", bytes / 1e3) }
}

/// One core's rate at both hashing and sealing a byte (they run one after the other).
fn combined(hash: f64, seal: f64, encrypt: bool) -> f64 {
    if !encrypt || seal <= 0.0 {
        return hash;
    }
    if hash <= 0.0 {
        return seal;
    }
    1.0 / (1.0 / hash + 1.0 / seal)
}

/// Names the component that limits a transfer, with its numbers and what would lift it.
pub(crate) fn verdict(m: &Measures) -> Verdict {
    let n = m.streams.max(1);
    // What the streams' CPU work allows on each side: per-core rate × the cores the streams can
    // use (the side's usable cores, a CPU quota included, or the streams where unknown).
    let here = m.cores.max(0.01).min(n as f64);
    let far = m.far_cores.map_or(n as f64, |c| c.max(0.01).min(n as f64));
    let (send_par, recv_par) = if m.pull { (far, here) } else { (here, far) };
    let cpu_send = combined(m.send_hash, m.send_seal, m.encrypt) * send_par;
    let cpu_recv = combined(m.recv_hash, m.recv_seal, m.encrypt) * recv_par;
    let cpu = cpu_send.min(cpu_recv);
    let mut parts: Vec<(&'static str, f64)> = vec![("network", m.net_many)];
    if let Some(w) = m.write_many {
        parts.push(("destination", w.max(m.write_one.unwrap_or(0.0))));
    }
    if let Some(r) = m.read_many {
        parts.push(("source", r.max(m.read_one.unwrap_or(0.0))));
    }
    let (mut limit, expected) = parts.iter().copied().fold(("network", f64::INFINITY), |a, b| if b.1 < a.1 { b } else { a });
    // memory→memory already paid for hashing and sealing: if those alone allow about this
    // rate, the network was not what held it.
    // The far side's process kept (nearly) all the cores it may use busy while carrying, with
    // more streams than those cores: its CPU held the rate, whatever the per-core estimate says.
    let far_saturated = matches!((m.far_busy, m.far_cores), (Some(b), Some(c)) if c < n as f64 && b >= 0.85 * c.min(n as f64));
    if limit == "network" && ((cpu > 0.0 && cpu <= m.net_many * 1.25) || far_saturated) {
        limit = "cpu";
    }
    // The far side's storage step runs on the same starved cores: when they were saturated and
    // its storage measured about what the network carried, the storage did not hold the rate.
    let far_storage = if m.pull { "source" } else { "destination" };
    if limit == far_storage && far_saturated && expected * 1.25 >= m.net_many {
        limit = "cpu";
    }
    let many = |what: &str, one: Option<f64>, many: Option<f64>| {
        let (one, many) = (one.unwrap_or(0.0), many.unwrap_or(0.0));
        format!("one {what} {} ({}), {n} {what}s {} ({})", mbs(one), gb(one), mbs(many), gb(many))
    };
    let (line, fix) = match limit {
        "cpu" => {
            // The far side when it is the one held (saturated), else the side whose estimate is lower.
            let far_side = if m.pull { "sending" } else { "receiving" };
            let side = if far_saturated {
                far_side
            } else if cpu_send <= cpu_recv {
                "sending"
            } else {
                "receiving"
            };
            let (side_cpu, par) = if side == "sending" { (cpu_send, send_par) } else { (cpu_recv, recv_par) };
            let what = if m.encrypt { "hashing and sealing" } else { "hashing" };
            let (cores, how) = if side == far_side { (m.far_cores, m.far_how.clone()) } else { (Some(m.cores), None) };
            let quota = how.as_deref().filter(|h| h.starts_with("CPU quota"));
            let mut line = format!("CPU ({what}): {} with {n} streams; the {side} side's ", gb(m.net_many));
            // Measured: the rate per core its process kept busy (hashing and sealing alone are
            // only part of a stream's work: system calls, copies, the TCP stack).
            let busy = if side == far_side { m.far_busy.filter(|b| *b > 0.0) } else { None };
            let per_core = busy.map_or(side_cpu / par, |b| m.net_many / b);
            match (cores, quota) {
                (Some(c), Some(q)) => line += &format!("usable cores are {c:.2} ({q})"),
                (Some(c), None) if c < n as f64 => line += &format!("usable cores are {c:.2}"),
                _ => line += &format!("cores allow about {} ({} per core)", gb(side_cpu), gb(side_cpu / par)),
            }
            if let Some(b) = busy {
                line += &format!(" and it kept {b:.2} busy carrying: {} per busy core ({what} alone: {} per core)", gb(per_core), gb(side_cpu / par));
            } else if cores.is_some_and(|c| c < n as f64) || quota.is_some() {
                line += &format!(", allowing about {} ({} per core)", gb(side_cpu), gb(side_cpu / par));
            }
            let fix = if quota.is_some() {
                format!(
                    "the {side} side's CPU quota is the limit: raise it (cgroup cpu.max or cpu.cfs_quota_us, or the job's CPU request); each further core carries about {}{}",
                    gb(per_core),
                    if m.encrypt { "; on a trusted network --no-encrypt drops the sealing" } else { "" }
                )
            } else if m.encrypt {
                "on a trusted network --no-encrypt drops the sealing; otherwise more cores (and --streams up to them) lift it".to_string()
            } else {
                "more cores, and --streams up to them, lift it".to_string()
            };
            (line, Some(fix))
        }
        "destination" => {
            let helps = m.write_many.unwrap_or(0.0) > 1.5 * m.write_one.unwrap_or(0.0);
            (
                format!("destination storage: {}; tern will use {n}", many("writer", m.write_one, m.write_many)),
                Some(if helps {
                    format!("more parallel writers help this file system: try --streams {}", (n * 2).min(64))
                } else {
                    "more writers do not help: the file system itself is the limit (a faster or more widely striped target, e.g. lfs setstripe -c on Lustre)".to_string()
                }),
            )
        }
        "source" => {
            let helps = m.read_many.unwrap_or(0.0) > 1.5 * m.read_one.unwrap_or(0.0);
            (
                format!("source storage: {}; tern will use {n}", many("reader", m.read_one, m.read_many)),
                Some(if helps { format!("more parallel readers help: try --streams {}", (n * 2).min(64)) } else { "more readers do not help: the source file system is the limit".to_string() }),
            )
        }
        _ => {
            let mut line = format!("network: {} with {n} streams, {} with one", gb(m.net_many), gb(m.net_one));
            let mut fix = None;
            if let Some(rtt) = m.rtt_ms.filter(|_| m.net_one * 1.5 < m.net_many) {
                // One stream's window is its rate × RTT; the path's BDP is the N-stream rate × RTT.
                let window = m.net_one * 1e9 / 8.0 * rtt / 1e3;
                let bdp = m.net_many * 1e9 / 8.0 * rtt / 1e3;
                let (knob, which) = if m.pull { ("net.ipv4.tcp_rmem", "receiving") } else { ("net.ipv4.tcp_wmem", "sending") };
                match m.sock_max {
                    // The buffer held one stream only if that stream filled much of it: a window
                    // far below the limit was held by loss or congestion control instead.
                    Some(max) if (max as f64) < bdp * 1.5 && window >= max as f64 / 2.0 => {
                        let want = ((2.0 * bdp) as u64).next_power_of_two().max(16 << 20);
                        line += &format!(
                            ": one stream holds {} in flight at {rtt:.1} ms; the {} MiB socket-buffer limit ({knob} max, {which} side) is below this path's bandwidth-delay product ({})",
                            mb(window),
                            max >> 20,
                            mb(bdp)
                        );
                        fix = Some(format!(
                            "raise the socket-buffer limits on both hosts to {} MiB: sysctl -w net.core.rmem_max={want} net.core.wmem_max={want} net.ipv4.tcp_rmem='4096 131072 {want}' net.ipv4.tcp_wmem='4096 16384 {want}' (root); tern uses {n} streams meanwhile",
                            want >> 20
                        ));
                    }
                    _ => {
                        line += &format!(": one stream holds {} in flight at {rtt:.1} ms (bandwidth-delay product {})", mb(window), mb(bdp));
                        fix = Some(format!("one stream is limited by loss or congestion control rather than buffers (try BBR: sysctl -w net.ipv4.tcp_congestion_control=bbr); tern uses {n} streams"));
                    }
                }
            } else if m.net_one * 1.5 >= m.net_many {
                fix = Some("one stream already fills the path: the link (or what shares it) is the limit".into());
            }
            if let Some(l) = m.loss.filter(|l| l.pct() >= LOSSY_PCT) {
                line += &format!("; the path loses packets: {:.2} % of segments were re-sent ({} of {})", l.pct(), l.retransmitted, l.segments);
                if !fix.as_deref().is_some_and(|f| f.starts_with("raise the socket-buffer")) {
                    fix = Some(format!(
                        "loss, not capacity, holds each stream: look for errors along the path (ip -s link on both hosts, the switches' counters) and use BBR, which keeps its rate under random loss (sysctl -w net.ipv4.tcp_congestion_control=bbr); tern uses {n} streams"
                    ));
                }
            }
            (line, fix)
        }
    };
    Verdict { limit, line, fix, expected_gbps: if expected.is_finite() { expected } else { 0.0 } }
}

/// What a test may take beyond its steps' budget: connecting, an ssh login, an install.
pub(crate) const WATCHDOG_GRACE_S: u64 = 30;

/// Ends the process with one line (exit 1) if the far side has not finished answering by the
/// deadline; dropping it first stands it down. The far side closes a test's streams by itself
/// (docs/security.md), and nothing local needs cleaning up before the local read test.
pub(crate) struct Watchdog(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Watchdog {
    pub(crate) fn start(limit: Duration, dest: &str) -> Self {
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (flag, dest) = (done.clone(), dest.to_string());
        std::thread::spawn(move || {
            let until = std::time::Instant::now() + limit;
            while std::time::Instant::now() < until {
                if flag.load(std::sync::atomic::Ordering::SeqCst) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if !flag.load(std::sync::atomic::Ordering::SeqCst) {
                eprintln!("tern: network: {dest} stopped answering: no result within {} s (the path lost every packet, or it was cut); check the link, then run tern test again", limit.as_secs());
                std::process::exit(1);
            }
        });
        Watchdog(done)
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.0.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

fn gbps(r: &Rate) -> f64 {
    r.gbps()
}

fn outcome(o: &Outcome) -> (Option<f64>, Option<String>) {
    match o {
        Outcome::Measured(r) => (Some(r.gbps()), None),
        Outcome::Skipped(why) => (None, Some(why.clone())),
        Outcome::Cpu { .. } => (None, Some("not a rate".into())),
    }
}

pub(crate) fn run(a: TestArgs) -> Result<ExitCode> {
    if a.every.is_some() || a.schedules || a.results.is_some() || a.unschedule.is_some() {
        return scheduled(&a);
    }
    let dest = a.dest.clone().unwrap_or_default();
    let ep = match Endpoint::parse(&dest) {
        Ok(ep) => ep,
        Err(e) => {
            eprintln!("tern: {e}");
            return Ok(ExitCode::from(2));
        }
    };
    let spec = crate::fs_cli::spec(&ep, &a.conn);
    let step = Duration::from_millis(a.seconds as u64 * 100);
    let plan = Plan { step, pull: a.pull, encrypt: !a.no_encrypt, chunk_size: 1 << 20, streams: a.streams };
    // A local path: the in-process server, joined here (engine client code imports no server code).
    let local = match &ep {
        Endpoint::Local(_) => match tern_engine::server::probe::loopback() {
            Ok(c) => Some(c),
            Err(e) => {
                eprintln!("tern: {e}");
                return Ok(ExitCode::from(1));
            }
        },
        _ => None,
    };
    // A path that stops carrying anything (every packet lost, a cut link) leaves a blocked read
    // on either channel: the whole test is bounded instead, ssh login and install included.
    let bounded = Watchdog::start(Duration::from_secs(a.seconds as u64 + WATCHDOG_GRACE_S), &dest);
    let report = match tern_engine::client::probe::run(&spec, &ep, &plan, local) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("tern: {e}");
            return Ok(ExitCode::from(1));
        }
    };
    drop(bounded);
    let step_ms = step.as_millis() as u32;
    let n = report.streams;
    let read = tern_engine::store::probe::read_test(a.source.as_deref(), n, 1 << 20, step_ms / 2);
    let cpu_ms = (step_ms / 3).max(100);
    let (hash, seal) = (tern_engine::net::probe::cpu_rate(TestWhat::Hash, cpu_ms), tern_engine::net::probe::cpu_rate(TestWhat::Seal, cpu_ms));
    let facts = crate::doctor::Facts::gather(&[]);
    let (cores, cores_how) = tern_engine::net::probe::usable_cores();
    let far_cpu = report.far_cpu.clone();
    let rtt_ms: Vec<f64> = report.rtt.iter().map(|s| s * 1e3).collect();
    let (w1, w1_skip) = outcome(&report.write_one);
    let (wn, _) = outcome(&report.write_many);
    let ((here_hash, here_seal), (there_hash, there_seal)) = ((gbps(&hash), gbps(&seal)), (gbps(&report.hash), gbps(&report.seal)));
    let m = Measures {
        rtt_ms: rtt_ms.get(rtt_ms.len() / 2).copied(),
        streams: n,
        net_one: gbps(&report.carry_one),
        net_many: gbps(&report.carry_many),
        encrypt: plan.encrypt,
        write_one: w1,
        write_many: wn,
        read_one: read.as_ref().ok().map(|r| r.one.gbps()),
        read_many: read.as_ref().ok().map(|r| r.many.gbps()),
        send_hash: if a.pull { there_hash } else { here_hash },
        send_seal: if a.pull { there_seal } else { here_seal },
        recv_hash: if a.pull { here_hash } else { there_hash },
        recv_seal: if a.pull { here_seal } else { there_seal },
        cores,
        far_cores: far_cpu.as_ref().map(|c| c.cores),
        far_how: far_cpu.as_ref().map(|c| c.how.clone()),
        far_busy: far_cpu.as_ref().map(|c| c.busy),
        sock_max: if a.pull { facts.tcp_rmem_max } else { facts.tcp_wmem_max },
        pull: a.pull,
        loss: report.sent.map(|c| Loss { segments: c.data_segs_out, retransmitted: c.retrans_segs, reorderings: c.reord_seen }),
    };
    let v = verdict(&m);
    // A later large transfer of this pair is compared with what this test expected.
    let here = Endpoint::Local(PathBuf::new());
    let (from, to) = if a.pull { (&ep, &here) } else { (&here, &ep) };
    crate::plan::record_test(from, to, v.expected_gbps, n as u64);
    let direction = if a.pull { "pull" } else { "push" };
    let source = match &read {
        Ok(r) => serde_json::json!({ "one_gbps": r.one.gbps(), "many_gbps": r.many.gbps(), "readers": r.readers, "file": r.file.display().to_string(), "scratch": r.scratch, "warm_cache": r.warm }),
        Err(why) => serde_json::json!({ "skipped": why }),
    };
    let destination = match &w1_skip {
        None => serde_json::json!({ "one_gbps": w1, "many_gbps": wn, "writers": n }),
        Some(why) => serde_json::json!({ "skipped": why }),
    };
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "type": "test",
                "dest": dest,
                "peer": report.peer,
                "direction": direction,
                "encrypt": plan.encrypt,
                "streams": n,
                "rtt_ms": { "min": rtt_ms.first(), "median": m.rtt_ms, "samples": rtt_ms },
                "network": {
                    "one_gbps": m.net_one, "many_gbps": m.net_many, "streams": n,
                    "segments": m.loss.map(|l| l.segments), "retransmitted": m.loss.map(|l| l.retransmitted),
                    "retransmitted_pct": m.loss.map(|l| l.pct()), "reorderings": m.loss.map(|l| l.reorderings),
                },
                "destination": destination,
                "source": source,
                "cpu": {
                    "local": { "hash_gbps": here_hash, "seal_gbps": here_seal, "cores": cores, "cores_from": cores_how },
                    "remote": { "hash_gbps": there_hash, "seal_gbps": there_seal, "cores": m.far_cores, "cores_from": m.far_how, "busy_cores": m.far_busy },
                },
                "verdict": v,
                "expected_gbps": v.expected_gbps,
            })
        );
        return Ok(ExitCode::SUCCESS);
    }
    println!("tern test {dest}: {} ({direction}, {}, {} s per step)", report.peer, if plan.encrypt { "encrypted" } else { "--no-encrypt" }, step.as_secs_f64());
    println!("round trip   min {:.3} ms, median {:.3} ms (TCP connects to the data port)", rtt_ms.first().copied().unwrap_or(0.0), m.rtt_ms.unwrap_or(0.0));
    println!("network      1 stream {}, {n} streams {} (memory→memory, framed, hashed and sealed as a transfer)", gb(m.net_one), gb(m.net_many));
    match m.loss {
        Some(l) => println!("loss         {:.3} % of {} segments re-sent, {} reorderings (this side's TCP, {n}-stream step)", l.pct(), l.segments, l.reorderings),
        None => println!("loss         not measured: the sending side counts it (run without --pull)"),
    }
    match &w1_skip {
        None => println!(
            "destination  1 writer {} ({}), {n} writers {} ({}) (scratch file, fdatasync included)",
            gb(w1.unwrap_or(0.0)),
            mbs(w1.unwrap_or(0.0)),
            gb(wn.unwrap_or(0.0)),
            mbs(wn.unwrap_or(0.0))
        ),
        Some(why) => println!("destination  skipped: {why}"),
    }
    match &read {
        Ok(r) => println!(
            "source       1 reader {} ({}), {n} readers {} ({}) ({}{}{})",
            gb(r.one.gbps()),
            mbs(r.one.gbps()),
            gb(r.many.gbps()),
            mbs(r.many.gbps()),
            if r.scratch { "a scratch file in " } else { "" },
            r.file.display(),
            if r.warm { "; caches likely warm: an upper bound, give --source FILE for a real file" } else { "" }
        ),
        Err(why) => println!("source       skipped: {why}"),
    }
    println!("cpu here     BLAKE3 {}, seal {} per core; {cores_how}", gb(here_hash), gb(here_seal));
    match &far_cpu {
        Some(c) => println!("cpu there    BLAKE3 {}, seal {} per core; {}; {:.2} cores busy carrying with {n} streams", gb(there_hash), gb(there_seal), c.how, c.busy),
        None => println!("cpu there    BLAKE3 {}, seal {} per core", gb(there_hash), gb(there_seal)),
    }
    println!("verdict      {}", v.line);
    if let Some(fix) = &v.fix {
        println!("fix          {fix}");
    }
    println!("expected     {} for large files (the slowest component)", gb(v.expected_gbps));
    Ok(ExitCode::SUCCESS)
}

/// `--every`, `--schedules`, `--results`, `--unschedule`: the service's scheduled tests
/// (docs/service.md "Scheduled path tests").
fn scheduled(a: &TestArgs) -> Result<ExitCode> {
    let c = a.service.client()?;
    let call = |method: &str, path: &str, body: Option<&serde_json::Value>| c.call(method, path, body).map_err(|e| anyhow::anyhow!("{e}"));
    let num = |v: &serde_json::Value, k: &str| v[k].as_f64();
    if let Some(every) = &a.every {
        if a.conn.names_programs() {
            // Often set in the environment (TERN_SSH), so a note rather than a refusal.
            eprintln!("tern: note: --ssh/--remote-bin do not travel with a schedule; the service runs tests with its own ssh and the remote host's tern on its PATH");
        }
        let mut dest = a.dest.clone().unwrap_or_default();
        // The service has no working directory: a relative local path is made absolute here.
        if let Ok(Endpoint::Local(p)) = Endpoint::parse(&dest)
            && p.is_relative()
        {
            dest = std::path::absolute(&p)?.display().to_string();
        }
        let mut body = serde_json::json!({ "dest": dest, "every": every, "seconds": a.seconds, "pull": a.pull, "no_encrypt": a.no_encrypt });
        for (k, v) in [("notify", &a.notify), ("label", &a.label)] {
            if let Some(v) = v {
                body[k] = v.clone().into();
            }
        }
        if let Some(n) = a.streams {
            body["streams"] = n.into();
        }
        if let Some(f) = a.alert_below {
            body["alert_below"] = f.into();
        }
        if let Some(t) = a.conn.token_file() {
            body["token_file"] = std::path::absolute(t)?.display().to_string().into();
        }
        let v = call("POST", "/v1/path-tests", Some(&body))?;
        if a.json {
            println!("{v}")
        } else {
            println!("{}", v["id"])
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(id) = a.unschedule {
        let v = call("DELETE", &format!("/v1/path-tests/{id}"), None)?;
        if a.json {
            println!("{v}")
        } else {
            println!("deleted path test {id}")
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(id) = a.results {
        let v = call("GET", &format!("/v1/path-tests/{id}/results?limit=2000"), None)?;
        if a.json {
            println!("{v}");
            return Ok(ExitCode::SUCCESS);
        }
        println!("{:<20}  {:>10}  {:>10}  {:>9}  {:<11} NOTE", "TIME", "N STREAMS", "1 STREAM", "RTT", "LIMIT");
        for r in v["results"].as_array().into_iter().flatten() {
            let at = r["at"].as_i64().map(tern_service::model::rfc3339).unwrap_or_default();
            if r["ok"] == true {
                let note = if r["regressed"] == true { format!("REGRESSED (baseline {})", gb(num(r, "baseline_gbps").unwrap_or(0.0))) } else { String::new() };
                println!(
                    "{at:<20}  {:>10}  {:>10}  {:>6.2} ms  {:<11} {note}",
                    gb(num(r, "many_gbps").unwrap_or(0.0)),
                    gb(num(r, "one_gbps").unwrap_or(0.0)),
                    num(r, "rtt_ms").unwrap_or(0.0),
                    r["verdict"].as_str().unwrap_or("-")
                );
            } else {
                println!("{at:<20}  failed: {}", r["error"].as_str().unwrap_or(""));
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    let v = call("GET", "/v1/path-tests", None)?;
    if a.json {
        println!("{v}");
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:>4}  {:>8}  {:>10}  {:>10}  {:<9} DEST", "ID", "EVERY", "LAST", "BASELINE", "STATE");
    for s in v["path_tests"].as_array().into_iter().flatten() {
        let last = match &s["last"] {
            l if l["ok"] == true => gb(num(l, "many_gbps").unwrap_or(0.0)),
            l if l.is_null() => "-".into(),
            _ => "failed".into(),
        };
        let state = if s["regressed"] == true { "REGRESSED" } else { "ok" };
        println!(
            "{:>4}  {:>7}s  {:>10}  {:>10}  {state:<9} {}",
            s["id"],
            s["spec"]["every_s"],
            last,
            num(s, "baseline_gbps").map(gb).unwrap_or_else(|| "-".into()),
            s["spec"]["dest"].as_str().unwrap_or("")
        );
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A balanced pair of hosts on a fast path: nothing below 10 Gb/s but what each test sets.
    fn fast() -> Measures {
        Measures {
            rtt_ms: Some(0.1),
            streams: 8,
            net_one: 9.0,
            net_many: 9.4,
            encrypt: true,
            write_one: Some(20.0),
            write_many: Some(40.0),
            read_one: Some(20.0),
            read_many: Some(40.0),
            send_hash: 30.0,
            send_seal: 30.0,
            recv_hash: 30.0,
            recv_seal: 30.0,
            cores: 16.0,
            far_cores: None,
            far_how: None,
            far_busy: None,
            sock_max: Some(128 << 20),
            pull: false,
            loss: Some(Loss { segments: 1_000_000, retransmitted: 0, reorderings: 0 }),
        }
    }

    #[test]
    fn a_lossy_path_is_named_with_its_share_of_re_sent_segments() {
        // 68 ms, big buffers, one stream far below eight: loss, not buffers, holds each stream.
        let lossy = Loss { segments: 200_000, retransmitted: 400, reorderings: 3 };
        let m = Measures { rtt_ms: Some(68.0), net_one: 0.05, net_many: 0.35, loss: Some(lossy), ..fast() };
        let v = verdict(&m);
        assert_eq!(v.limit, "network", "{v:?}");
        assert!(v.line.contains("0.20 % of segments were re-sent (400 of 200000)"), "{}", v.line);
        assert!(v.fix.as_deref().unwrap().contains("use BBR"), "{v:?}");
        // Small buffers as well: the buffer fix stays first, the loss is still said.
        let v = verdict(&Measures { sock_max: Some(512 << 10), ..m.clone() });
        assert!(v.fix.as_deref().unwrap().starts_with("raise the socket-buffer") && v.line.contains("re-sent"), "{v:?}");
        // A 4 MiB limit that one stream's 425 kB window never reached is not what held it.
        let v = verdict(&Measures { sock_max: Some(4 << 20), ..m.clone() });
        assert!(v.fix.as_deref().unwrap().contains("use BBR"), "{v:?}");
        // A clean path says nothing of loss; 0.05 % is below what is worth naming.
        for retransmitted in [0, 100] {
            let v = verdict(&Measures { loss: Some(Loss { retransmitted, ..lossy }), ..m.clone() });
            assert!(!v.line.contains("re-sent"), "{v:?}");
        }
    }

    #[test]
    fn a_long_path_with_small_buffers_is_network_limited_and_names_the_sysctl() {
        let m = Measures { rtt_ms: Some(68.0), net_one: 0.38, net_many: 0.94, sock_max: Some(4 << 20), ..fast() };
        let v = verdict(&m);
        assert_eq!(v.limit, "network", "{v:?}");
        assert!(v.line.starts_with("network: 0.940 Gb/s with 8 streams, 0.380 Gb/s with one"), "{}", v.line);
        assert!(v.line.contains("4 MiB socket-buffer limit") && v.line.contains("8.0 MB"), "{}", v.line);
        let fix = v.fix.unwrap();
        assert!(fix.contains("net.ipv4.tcp_wmem='4096 16384 16777216'"), "{fix}");
        assert!((v.expected_gbps - 0.94).abs() < 1e-9);
    }

    #[test]
    fn a_capped_link_that_one_stream_fills_is_the_link() {
        let m = Measures { rtt_ms: Some(1.0), net_one: 0.29, net_many: 0.295, ..fast() };
        let v = verdict(&m);
        assert_eq!(v.limit, "network");
        assert!(v.fix.unwrap().contains("the link"));
    }

    #[test]
    fn slow_destination_writers_are_named_with_both_numbers() {
        let m = Measures {
            write_one: Some(2.1),
            write_many: Some(11.0),
            net_many: 40.0,
            net_one: 30.0,
            read_many: Some(50.0),
            send_hash: 100.0,
            send_seal: 100.0,
            recv_hash: 100.0,
            recv_seal: 100.0,
            ..fast()
        };
        let v = verdict(&m);
        assert_eq!(v.limit, "destination", "{v:?}");
        assert_eq!(v.line, "destination storage: one writer 262.5 MB/s (2.10 Gb/s), 8 writers 1375.0 MB/s (11.0 Gb/s); tern will use 8");
        assert!(v.fix.unwrap().contains("--streams 16"));
        assert_eq!(v.expected_gbps, 11.0);
        // A file system that does not scale with writers gets other advice.
        let flat = Measures { write_one: Some(0.32), write_many: Some(0.33), ..fast() };
        let v = verdict(&flat);
        assert_eq!(v.limit, "destination");
        assert!(v.fix.unwrap().contains("do not help"));
    }

    #[test]
    fn a_slow_source_is_named() {
        let m = Measures { read_one: Some(0.3), read_many: Some(0.32), ..fast() };
        let v = verdict(&m);
        assert_eq!(v.limit, "source", "{v:?}");
        assert!(v.line.contains("one reader 37.5 MB/s (0.300 Gb/s), 8 readers 40.0 MB/s (0.320 Gb/s)"), "{}", v.line);
        assert!((v.expected_gbps - 0.32).abs() < 1e-9);
    }

    #[test]
    fn sealing_on_a_slow_core_is_named_and_no_encrypt_suggested() {
        // The receiver seals at 1 Gb/s a core and has... its streams; memory→memory shows it.
        let m = Measures { net_one: 0.9, net_many: 3.6, cores: 4.0, streams: 4, recv_seal: 1.0, recv_hash: 8.0, rtt_ms: Some(0.1), ..fast() };
        let v = verdict(&m);
        assert_eq!(v.limit, "cpu", "{v:?}");
        assert!(v.line.contains("receiving side"), "{}", v.line);
        assert!(v.fix.unwrap().contains("--no-encrypt"));
        // Without encryption the same numbers are the network's (hashing alone allows 32 Gb/s).
        let v = verdict(&Measures { encrypt: false, ..m });
        assert_eq!(v.limit, "network");
    }

    #[test]
    fn a_skipped_write_test_leaves_the_others_to_judge() {
        let m = Measures { write_one: None, write_many: None, net_many: 1.0, net_one: 0.9, ..fast() };
        let v = verdict(&m);
        assert_eq!(v.limit, "network");
        assert_eq!(v.expected_gbps, 1.0);
    }

    /// Destination writes capped at 40 MB/s on a 1 Gb/s path (the bed's dstdisk case): named with
    /// both writer counts in MB/s, and more writers do not help.
    #[test]
    fn a_destination_capped_at_40_mbytes_is_named_in_mb_per_s() {
        let m = Measures { rtt_ms: Some(0.2), streams: 2, net_one: 0.93, net_many: 0.94, write_one: Some(0.317), write_many: Some(0.321), cores: 2.0, ..fast() };
        let v = verdict(&m);
        assert_eq!(v.limit, "destination", "{v:?}");
        assert_eq!(v.line, "destination storage: one writer 39.6 MB/s (0.317 Gb/s), 2 writers 40.1 MB/s (0.321 Gb/s); tern will use 2");
        assert!(v.fix.unwrap().contains("more writers do not help: the file system itself is the limit"));
        assert!((v.expected_gbps - 0.321).abs() < 1e-9);
    }

    /// Source reads capped at 40 MB/s (the bed's srcdisk case).
    #[test]
    fn a_source_capped_at_40_mbytes_is_named_in_mb_per_s() {
        let m = Measures { rtt_ms: Some(0.2), streams: 2, net_one: 0.93, net_many: 0.94, read_one: Some(0.32), read_many: Some(0.319), cores: 2.0, ..fast() };
        let v = verdict(&m);
        assert_eq!(v.limit, "source", "{v:?}");
        assert_eq!(v.line, "source storage: one reader 40.0 MB/s (0.320 Gb/s), 2 readers 39.9 MB/s (0.319 Gb/s); tern will use 2");
        assert!(v.fix.unwrap().contains("the source file system is the limit"));
        assert!((v.expected_gbps - 0.32).abs() < 1e-9);
    }

    /// A CPU quota of half a core on the receiving daemon (the bed's cpu case): its per-core rates
    /// are fast, but it may use 0.5 cores and kept them busy; named with the quota and its fix.
    #[test]
    fn a_cpu_quota_on_the_receiving_side_is_named_with_its_usable_cores() {
        let quota = "CPU quota 0.50 cores (cgroup v1 cpu.cfs_quota_us 50000 / cpu.cfs_period_us 100000)";
        let m = Measures {
            rtt_ms: Some(0.2),
            streams: 2,
            net_one: 0.55,
            net_many: 0.56,
            cores: 2.0,
            recv_hash: 8.0,
            recv_seal: 2.8,
            far_cores: Some(0.5),
            far_how: Some(quota.into()),
            far_busy: Some(0.49),
            ..fast()
        };
        let v = verdict(&m);
        assert_eq!(v.limit, "cpu", "{v:?}");
        assert_eq!(
            v.line,
            format!(
                "CPU (hashing and sealing): 0.560 Gb/s with 2 streams; the receiving side's usable cores are 0.50 ({quota}) and it kept 0.49 busy carrying: 1.14 Gb/s per busy core (hashing and sealing alone: 2.07 Gb/s per core)"
            )
        );
        let fix = v.fix.unwrap();
        assert!(fix.starts_with("the receiving side's CPU quota is the limit: raise it (cgroup cpu.max or cpu.cfs_quota_us"), "{fix}");
        assert!(fix.contains("each further core carries about 1.14 Gb/s"), "{fix}");
        assert!(fix.contains("--no-encrypt"), "{fix}");
        assert!((v.expected_gbps - 0.56).abs() < 1e-9);
        // The same daemon not busy (the link held the rate, not its quota): the network.
        let idle = Measures { far_busy: Some(0.1), recv_hash: 30.0, recv_seal: 30.0, ..m.clone() };
        assert_eq!(verdict(&idle).limit, "network");
        // A pull: the far side sends; its quota is the sending side's.
        let v = verdict(&Measures { pull: true, send_hash: 8.0, send_seal: 2.8, ..m.clone() });
        assert_eq!(v.limit, "cpu");
        assert!(v.line.contains("the sending side's usable cores are 0.50 (CPU quota"), "{}", v.line);
        // Its storage step, on the same busy cores, measured a little under the network: still
        // the CPU. Storage well under the network is the storage, busy or not.
        let starved_disk = Measures { write_one: Some(0.45), write_many: Some(0.5), ..m.clone() };
        assert_eq!(verdict(&starved_disk).limit, "cpu");
        let slow_disk = Measures { write_one: Some(0.2), write_many: Some(0.3), ..m };
        assert_eq!(verdict(&slow_disk).limit, "destination");
    }
}
