//! `tern doctor [PATH...] [DEST]`: each host against ESnet fasterdata's host-tuning list, each
//! finding with what was seen, why it matters, the command that fixes it and whether that needs
//! root. With a DEST (ssh host or daemon) the far host is checked too, over the same connection
//! a transfer would use, and both are judged for the round trip measured to it.
//!
//! Facts are gathered by the engine (`tern_engine::host`, and the far side's through a path
//! test's `host` step); the judging is a pure function of them (`findings`), so it is tested
//! with made-up hosts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use serde_json::{Value, json};
use tern_engine::endpoint::Endpoint;
pub(crate) use tern_engine::host::Facts;
#[cfg(test)]
use tern_engine::host::{Fs, Nic};

#[derive(Args)]
pub(crate) struct DoctorArgs {
    /// Directories data will be read from or written to here (their file systems are checked),
    /// and at most one far side to check as well: [user@]host:path or tern://host[:port]/path.
    targets: Vec<String>,
    /// The path to tune for: its round-trip time in ms (default: measured to DEST, else 100,
    /// fasterdata's reference).
    #[arg(long, value_name = "MS")]
    rtt_ms: Option<f64>,
    /// ... and its bandwidth in Gb/s (default: the slower of the two hosts' fastest NICs that
    /// are up, else 10).
    #[arg(long, value_name = "GBPS")]
    rate_gbps: Option<f64>,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: crate::fs_cli::ConnArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Level {
    Ok,
    Info,
    Warn,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Finding {
    pub check: &'static str,
    pub level: Level,
    pub seen: String,
    pub why: String,
    /// The command that fixes it, when there is one.
    pub fix: Option<String>,
    pub needs_root: bool,
}

fn facts_json(f: &Facts) -> Value {
    json!({
        "rmem_max": f.rmem_max, "wmem_max": f.wmem_max, "tcp_rmem_max": f.tcp_rmem_max, "tcp_wmem_max": f.tcp_wmem_max,
        "congestion_control": f.congestion_control, "available_congestion_control": f.available_congestion_control,
        "default_qdisc": f.default_qdisc,
        "nics": f.nics.iter().map(|n| json!({"name": n.name, "mtu": n.mtu, "speed_mbps": n.speed_mbps, "errors": n.errors})).collect::<Vec<_>>(),
        "cpu_governors": f.cpu_governors, "nofile_soft": f.nofile_soft, "nofile_hard": f.nofile_hard,
        "clock_synchronised": f.clock_synchronised,
        "filesystems": f.filesystems.iter().map(|x| json!({"path": x.path, "kind": x.kind})).collect::<Vec<_>>(),
    })
}

/// The fastest NIC that is up, in Gb/s.
fn nic_gbps(f: &Facts) -> Option<f64> {
    f.nics.iter().filter_map(|n| n.speed_mbps).max().map(|m| m as f64 / 1000.0)
}

/// The host against the path to tune for (`rtt_ms`, `rate_gbps`).
pub(crate) fn findings(f: &Facts, rtt_ms: f64, rate_gbps: f64) -> Vec<Finding> {
    let mut out = Vec::new();
    let bdp = (rate_gbps * 1e9 / 8.0 * rtt_ms / 1e3) as u64;
    // fasterdata: buffers of about twice the BDP, so loss recovery does not stall the window.
    let want = (2 * bdp).next_power_of_two().max(16 << 20);
    let mib = |b: u64| if b.is_multiple_of(1 << 20) { format!("{} MiB", b >> 20) } else { format!("{:.1} MiB", b as f64 / (1 << 20) as f64) };
    let path = format!("{rate_gbps} Gb/s × {rtt_ms} ms");
    // tern leaves socket buffers to the kernel's autotuning, which grows up to tcp_rmem/tcp_wmem's
    // max: those decide a stream's window. net.core.{r,w}mem_max only cap a size set explicitly
    // (tern --bufsize, iperf3 -w, globus-url-copy -tcp-bs): advice, not a limit on tern.
    let autotuned = [("net.ipv4.tcp_rmem (max)", f.tcp_rmem_max), ("net.ipv4.tcp_wmem (max)", f.tcp_wmem_max)];
    let explicit = [("net.core.rmem_max", f.rmem_max), ("net.core.wmem_max", f.wmem_max)];
    let below = |list: &[(&str, Option<u64>)]| -> Vec<String> { list.iter().filter(|(_, v)| v.is_some_and(|v| v < bdp)).map(|(k, v)| format!("{k} = {}", mib(v.unwrap_or(0)))).collect() };
    let (low, low_explicit) = (below(&autotuned), below(&explicit));
    out.push(if low.is_empty() {
        Finding {
            check: "socket buffers",
            level: Level::Ok,
            seen: autotuned.iter().map(|(k, v)| format!("{k} = {}", v.map_or("?".into(), mib))).collect::<Vec<_>>().join(", "),
            why: format!("at least the bandwidth-delay product of {path} ({})", mib(bdp)),
            fix: None,
            needs_root: false,
        }
    } else {
        Finding {
            check: "socket buffers",
            level: Level::Warn,
            seen: low.join(", "),
            why: format!(
                "a TCP stream cannot keep more than its buffer in flight: below the bandwidth-delay product of {path} ({}), one stream cannot fill the path (tern opens more streams, at a cost)",
                mib(bdp)
            ),
            fix: Some(format!(
                "sysctl -w net.ipv4.tcp_rmem='4096 87380 {want}' net.ipv4.tcp_wmem='4096 65536 {want}' net.core.rmem_max={want} net.core.wmem_max={want}  (persist in /etc/sysctl.d/90-tern.conf)"
            )),
            needs_root: true,
        }
    });
    if !low_explicit.is_empty() {
        out.push(Finding {
            check: "socket buffers (explicit)",
            level: Level::Info,
            seen: low_explicit.join(", "),
            why: format!(
                "caps only buffers an application sets itself (tern --bufsize, iperf3 -w, globus-url-copy -tcp-bs): below the bandwidth-delay product of {path} ({}), such a stream cannot fill the path; tern's default autotuning is not affected",
                mib(bdp)
            ),
            fix: Some(format!("sysctl -w net.core.rmem_max={want} net.core.wmem_max={want}")),
            needs_root: true,
        });
    }
    let cc = f.congestion_control.clone().unwrap_or_else(|| "?".into());
    let has_bbr = f.available_congestion_control.iter().any(|c| c == "bbr");
    out.push(match cc.as_str() {
        "bbr" | "htcp" => Finding { check: "congestion control", level: Level::Ok, seen: cc.clone(), why: "recovers quickly after loss on long paths".into(), fix: None, needs_root: false },
        _ => Finding {
            check: "congestion control",
            level: Level::Warn,
            seen: format!("{cc} (available: {})", f.available_congestion_control.join(" ")),
            why: "cubic and reno halve their rate at each loss and take many round trips to recover on a long path; BBR (or htcp) keeps it".into(),
            fix: Some(if has_bbr { "sysctl -w net.ipv4.tcp_congestion_control=bbr".into() } else { "modprobe tcp_bbr && sysctl -w net.ipv4.tcp_congestion_control=bbr".into() }),
            needs_root: true,
        },
    });
    let qdisc = f.default_qdisc.clone().unwrap_or_else(|| "?".into());
    out.push(if qdisc == "fq" {
        Finding { check: "pacing (qdisc)", level: Level::Ok, seen: qdisc, why: "fq paces each stream".into(), fix: None, needs_root: false }
    } else {
        Finding {
            check: "pacing (qdisc)",
            level: Level::Info,
            seen: format!("net.core.default_qdisc = {qdisc}"),
            why: "fq paces each stream's packets instead of sending bursts that overflow switch buffers (BBR paces inside TCP without it since Linux 4.13, at a higher CPU cost)".into(),
            fix: Some("modprobe sch_fq && sysctl -w net.core.default_qdisc=fq  (applies to interfaces brought up afterwards; or: tc qdisc replace dev IFACE root fq)".into()),
            needs_root: true,
        }
    });
    for nic in &f.nics {
        let fast = nic.speed_mbps.is_some_and(|s| s >= 10_000);
        if fast && nic.mtu.is_some_and(|m| m < 9000) {
            out.push(Finding {
                check: "MTU",
                level: Level::Info,
                seen: format!("{}: MTU {} at {} Gb/s", nic.name, nic.mtu.unwrap_or(0), nic.speed_mbps.unwrap_or(0) / 1000),
                why: "science networks (ESnet, Internet2) carry 9000-byte frames end to end; jumbo frames cut the per-packet CPU cost six-fold — only if the whole path supports them".into(),
                fix: Some(format!("ip link set dev {} mtu 9000  (after checking the path: ping -M do -s 8972 PEER)", nic.name)),
                needs_root: true,
            });
        }
        if nic.errors > 0 {
            out.push(Finding {
                check: "NIC errors",
                level: Level::Warn,
                seen: format!("{}: {} errors and drops since boot", nic.name, nic.errors),
                why: "each lost packet costs a TCP stream a window reduction; a growing count points at a cable, optic, ring size or driver".into(),
                fix: Some(format!("ip -s link show {0}; ethtool -S {0}; ethtool -g {0} (raise ring buffers with ethtool -G)", nic.name)),
                needs_root: false,
            });
        }
    }
    let slow: Vec<&String> = f.cpu_governors.iter().filter(|g| *g != "performance").collect();
    if !slow.is_empty() {
        out.push(Finding {
            check: "CPU frequency",
            level: Level::Info,
            seen: format!("scaling_governor = {}", f.cpu_governors.join(", ")),
            why: "a governor other than performance lowers the clock between bursts; encryption and hashing then run slower than the network".into(),
            fix: Some("cpupower frequency-set -g performance".into()),
            needs_root: true,
        });
    }
    out.push(if f.nofile_hard < 65536 {
        Finding {
            check: "descriptor limit",
            level: Level::Warn,
            seen: format!("nofile soft {} hard {}", f.nofile_soft, f.nofile_hard),
            why: "tern keeps up to three descriptors per file in flight; a low limit caps how many small files move at once on a long path".into(),
            fix: Some(
                "raise the hard limit: '* hard nofile 1048576' in /etc/security/limits.conf, or LimitNOFILE=1048576 in a systemd unit (tern raises its soft limit to the hard one itself)".into(),
            ),
            needs_root: true,
        }
    } else {
        Finding { check: "descriptor limit", level: Level::Ok, seen: format!("nofile hard {}", f.nofile_hard), why: "enough files in flight for long paths".into(), fix: None, needs_root: false }
    });
    match f.clock_synchronised {
        Some(false) => out.push(Finding {
            check: "clock",
            level: Level::Warn,
            seen: "not synchronised (adjtimex TIME_ERROR)".into(),
            why: "`sync` compares modification times across hosts, and logs from both ends must line up".into(),
            fix: Some("timedatectl set-ntp true  (or enable chronyd)".into()),
            needs_root: true,
        }),
        Some(true) => out.push(Finding { check: "clock", level: Level::Ok, seen: "synchronised".into(), why: "mtimes and logs line up across hosts".into(), fix: None, needs_root: false }),
        None => {}
    }
    for fs in &f.filesystems {
        let (level, why, fix) = match fs.kind.as_str() {
            "lustre" => (
                Level::Info,
                "Lustre: large files move fastest when striped over several OSTs; tern writes chunks in parallel".to_string(),
                Some(format!("lfs getstripe -d {0}; for big files: lfs setstripe -c 8 -S 4M {0}", fs.path)),
            ),
            "nfs" | "cifs" | "fuse" => (Level::Info, format!("{}: every file costs metadata round trips to a server; many small files move slowly whatever the network", fs.kind), None),
            "tmpfs" => (Level::Info, "tmpfs: memory, not disk — fine for tests, gone at reboot".to_string(), None),
            "unreadable" => (Level::Warn, "cannot stat it: check the path".to_string(), None),
            _ => (Level::Ok, "a local file system".to_string(), None),
        };
        out.push(Finding { check: "file system", level, seen: format!("{}: {}", fs.path, fs.kind), why, fix, needs_root: false });
    }
    out
}

/// One host's facts and findings, as the text and JSON show them.
struct Checked {
    host: String,
    facts: Facts,
    findings: Vec<Finding>,
}

pub(crate) fn run(a: DoctorArgs) -> Result<ExitCode> {
    let mut paths = Vec::new();
    let mut far = None;
    for t in &a.targets {
        match Endpoint::parse(t) {
            Ok(Endpoint::Local(p)) => paths.push(p),
            Ok(ep) if far.is_none() => far = Some((ep, t)),
            Ok(_) => {
                eprintln!("tern: doctor checks one far side at a time; run it once per host");
                return Ok(ExitCode::from(2));
            }
            Err(e) => {
                eprintln!("tern: {e}");
                return Ok(ExitCode::from(2));
            }
        }
    }
    let here = Facts::gather(&paths.iter().map(PathBuf::as_path).collect::<Vec<&Path>>());
    let mut measured_rtt = None;
    let mut there = None;
    if let Some((ep, named)) = &far {
        let spec = crate::fs_cli::spec(ep, &a.conn);
        let _bounded = crate::path_test::Watchdog::start(std::time::Duration::from_secs(2 * crate::path_test::WATCHDOG_GRACE_S), named);
        match tern_engine::client::probe::host_check(&spec, ep, None) {
            Ok(c) => {
                measured_rtt = c.rtt.get(c.rtt.len() / 2).map(|s| s * 1e3);
                there = Some((c.peer, c.facts));
            }
            Err(e) => {
                eprintln!("tern: {e}");
                return Ok(ExitCode::from(1));
            }
        }
    }
    let rtt_ms = a.rtt_ms.or(measured_rtt).unwrap_or(100.0).max(0.1);
    let rate = a
        .rate_gbps
        .or_else(|| match (nic_gbps(&here), there.as_ref().and_then(|(_, f)| nic_gbps(f))) {
            (Some(x), Some(y)) => Some(x.min(y)),
            (x, y) => x.or(y),
        })
        .unwrap_or(10.0)
        .max(0.001);
    let mut hosts = vec![Checked { host: "this host".into(), findings: findings(&here, rtt_ms, rate), facts: here }];
    if let Some((peer, f)) = there {
        hosts.push(Checked { host: peer, findings: findings(&f, rtt_ms, rate), facts: f });
    }
    let warnings = hosts.iter().flat_map(|h| &h.findings).filter(|f| f.level == Level::Warn).count();
    let rtt_from = if a.rtt_ms.is_some() {
        "--rtt-ms"
    } else if measured_rtt.is_some() {
        "measured"
    } else {
        "default"
    };
    if a.json {
        let mut out = json!({
            "type": "doctor",
            "path": { "rtt_ms": rtt_ms, "rtt_from": rtt_from, "rate_gbps": rate },
            "hosts": hosts.iter().map(|h| json!({"host": h.host, "facts": facts_json(&h.facts), "findings": h.findings, "warnings": h.findings.iter().filter(|f| f.level == Level::Warn).count()})).collect::<Vec<_>>(),
            "warnings": warnings,
        });
        // This host's alone at the top level too, as before a far side could be checked.
        out["facts"] = facts_json(&hosts[0].facts);
        out["findings"] = serde_json::to_value(&hosts[0].findings)?;
        println!("{out}");
    } else {
        let rtt_note = match rtt_from {
            "measured" => format!("{rtt_ms:.1} ms round trips (measured)"),
            _ => format!("{rtt_ms} ms round trips"),
        };
        println!("tern doctor: for a {rate} Gb/s path with {rtt_note} (--rate-gbps, --rtt-ms)");
        for h in &hosts {
            if hosts.len() > 1 {
                println!("{}:", h.host);
            }
            for f in &h.findings {
                let mark = match f.level {
                    Level::Ok => "ok  ",
                    Level::Info => "info",
                    Level::Warn => "WARN",
                };
                println!("{mark} {}: {}", f.check, f.seen);
                if f.level != Level::Ok {
                    println!("     why: {}", f.why);
                    if let Some(fix) = &f.fix {
                        println!("     fix{}: {fix}", if f.needs_root { " (root)" } else { "" });
                    }
                }
            }
        }
        println!("{warnings} warning(s)");
    }
    // Findings are advice: exit 0 either way, so scripts can collect the JSON.
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tuned() -> Facts {
        Facts {
            rmem_max: Some(128 << 20),
            wmem_max: Some(128 << 20),
            tcp_rmem_max: Some(128 << 20),
            tcp_wmem_max: Some(128 << 20),
            congestion_control: Some("bbr".into()),
            available_congestion_control: vec!["reno".into(), "cubic".into(), "bbr".into()],
            default_qdisc: Some("fq".into()),
            nics: vec![Nic { name: "eth0".into(), mtu: Some(9000), speed_mbps: Some(100_000), errors: 0 }],
            cpu_governors: vec!["performance".into()],
            nofile_soft: 1 << 20,
            nofile_hard: 1 << 20,
            clock_synchronised: Some(true),
            filesystems: vec![Fs { path: "/data".into(), kind: "xfs".into() }],
        }
    }

    fn warned(list: &[Finding]) -> Vec<&'static str> {
        list.iter().filter(|f| f.level == Level::Warn).map(|f| f.check).collect()
    }

    #[test]
    fn a_tuned_dtn_has_nothing_to_fix() {
        let list = findings(&tuned(), 100.0, 10.0);
        assert!(warned(&list).is_empty(), "{list:?}");
        assert!(list.iter().all(|f| f.level == Level::Ok), "{list:?}");
    }

    #[test]
    fn an_untuned_host_gets_each_fix_with_its_command() {
        let mut f = tuned();
        f.rmem_max = Some(4 << 20);
        f.tcp_wmem_max = Some(4 << 20);
        f.congestion_control = Some("cubic".into());
        f.default_qdisc = Some("fq_codel".into());
        f.nics[0].mtu = Some(1500);
        f.nics[0].errors = 12;
        f.cpu_governors = vec!["powersave".into()];
        f.nofile_hard = 4096;
        f.clock_synchronised = Some(false);
        let list = findings(&f, 68.0, 1.0);
        assert_eq!(warned(&list), ["socket buffers", "congestion control", "NIC errors", "descriptor limit", "clock"]);
        let buffers = &list[0];
        // 1 Gb/s × 68 ms = 8.5 MB: 4 MiB is short, and the fix names every knob with a size
        // above twice the BDP.
        assert!(buffers.seen == "net.ipv4.tcp_wmem (max) = 4 MiB", "{buffers:?}");
        assert!(buffers.fix.as_deref().unwrap().contains("tcp_wmem='4096 65536 33554432'") && buffers.fix.as_deref().unwrap().contains("net.core.rmem_max=33554432") && buffers.needs_root);
        // net.core.rmem_max caps only explicit buffers: advice, not a warning.
        let explicit = list.iter().find(|x| x.check == "socket buffers (explicit)").unwrap();
        assert!(explicit.level == Level::Info && explicit.seen == "net.core.rmem_max = 4 MiB", "{explicit:?}");
        assert!(list.iter().any(|f| f.check == "congestion control" && f.fix.as_deref() == Some("sysctl -w net.ipv4.tcp_congestion_control=bbr")));
        for check in ["MTU", "CPU frequency", "pacing (qdisc)"] {
            assert!(list.iter().any(|f| f.check == check && f.level == Level::Info && f.fix.is_some()), "{check}: {list:?}");
        }
    }

    #[test]
    fn buffers_are_judged_against_the_path() {
        let mut f = tuned();
        f.tcp_rmem_max = Some(64 << 20);
        // 64 MiB is plenty for 10 Gb/s × 25 ms (31 MB) but short of 100 Gb/s × 68 ms (850 MB).
        assert!(warned(&findings(&f, 25.0, 10.0)).is_empty());
        assert_eq!(warned(&findings(&f, 68.0, 100.0)), ["socket buffers"]);
    }

    #[test]
    fn bbr_without_fq_is_advice_not_a_warning() {
        let mut f = tuned();
        f.default_qdisc = Some("fq_codel".into());
        let list = findings(&f, 68.0, 1.0);
        assert!(warned(&list).is_empty(), "{list:?}");
        assert!(list.iter().any(|x| x.check == "pacing (qdisc)" && x.level == Level::Info));
    }

    #[test]
    fn parallel_and_network_file_systems_get_advice() {
        let mut f = tuned();
        f.filesystems = vec![Fs { path: "/lustre/proj".into(), kind: "lustre".into() }, Fs { path: "/home".into(), kind: "nfs".into() }];
        let list = findings(&f, 68.0, 10.0);
        let lustre = list.iter().find(|x| x.seen.starts_with("/lustre/proj")).unwrap();
        assert!(lustre.fix.as_deref().unwrap().contains("lfs setstripe"));
        assert!(list.iter().any(|x| x.seen == "/home: nfs" && x.level == Level::Info));
    }

    #[test]
    fn gathering_this_host_works() {
        let f = Facts::gather(&[Path::new("/")]);
        assert!(f.nofile_hard > 0 && f.congestion_control.is_some(), "{f:?}");
        assert_eq!(f.filesystems.len(), 1);
        assert!(!findings(&f, 100.0, 10.0).is_empty());
    }
}
