//! `tern doctor [PATH...]`: this host against ESnet fasterdata's host-tuning list, each finding
//! with what was seen, why it matters, the command that fixes it and whether that needs root.
//!
//! Facts are gathered once (`Facts::gather`, reading /proc and /sys); the judging is a pure
//! function of them (`findings`), so it is tested with made-up hosts.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use serde::Serialize;

#[derive(Args)]
pub(crate) struct DoctorArgs {
    /// Directories data will be read from or written to (their file systems are checked).
    paths: Vec<PathBuf>,
    /// The path to tune for: its round-trip time in ms (default 100, fasterdata's reference).
    #[arg(long, default_value_t = 100.0, value_name = "MS")]
    rtt_ms: f64,
    /// ... and its bandwidth in Gb/s (default: the fastest NIC that is up, else 10).
    #[arg(long, value_name = "GBPS")]
    rate_gbps: Option<f64>,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
}

/// What was read from the host (None: could not be read).
#[derive(Debug, Default, Clone, Serialize)]
pub(crate) struct Facts {
    pub rmem_max: Option<u64>,
    pub wmem_max: Option<u64>,
    /// The third (max) field of net.ipv4.tcp_rmem / tcp_wmem.
    pub tcp_rmem_max: Option<u64>,
    pub tcp_wmem_max: Option<u64>,
    pub congestion_control: Option<String>,
    pub available_congestion_control: Vec<String>,
    pub default_qdisc: Option<String>,
    /// Interfaces that are up (not loopback): name, MTU, speed in Mb/s, errors + drops.
    pub nics: Vec<Nic>,
    /// scaling_governor of each CPU that has one, deduplicated.
    pub cpu_governors: Vec<String>,
    pub nofile_soft: u64,
    pub nofile_hard: u64,
    /// Whether the kernel says the clock is synchronised (adjtimex), None if unknown.
    pub clock_synchronised: Option<bool>,
    pub filesystems: Vec<Fs>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Nic {
    pub name: String,
    pub mtu: Option<u32>,
    pub speed_mbps: Option<u64>,
    pub errors: u64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Fs {
    pub path: String,
    pub kind: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Level {
    Ok,
    Info,
    Warn,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Finding {
    pub check: &'static str,
    pub level: Level,
    pub seen: String,
    pub why: String,
    /// The command that fixes it, when there is one.
    pub fix: Option<String>,
    pub needs_root: bool,
}

fn read(path: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

fn read_u64(path: impl AsRef<Path>) -> Option<u64> {
    read(path)?.parse().ok()
}

/// The last whitespace-separated field (the max of tcp_rmem/tcp_wmem).
fn last_field(path: &str) -> Option<u64> {
    read(path)?.split_whitespace().last()?.parse().ok()
}

impl Facts {
    pub(crate) fn gather(paths: &[PathBuf]) -> Self {
        let mut nics = Vec::new();
        if let Ok(dir) = std::fs::read_dir("/sys/class/net") {
            for e in dir.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let base = e.path();
                if name == "lo" || read(base.join("operstate")).as_deref() != Some("up") {
                    continue;
                }
                let stat = |s: &str| read_u64(base.join("statistics").join(s)).unwrap_or(0);
                nics.push(Nic {
                    mtu: read_u64(base.join("mtu")).map(|m| m as u32),
                    // -1 (unknown, e.g. virtual devices) does not parse as u64.
                    speed_mbps: read_u64(base.join("speed")),
                    errors: stat("rx_errors") + stat("tx_errors") + stat("rx_dropped") + stat("tx_dropped"),
                    name,
                });
            }
        }
        nics.sort_by(|a, b| a.name.cmp(&b.name));
        let mut cpu_governors: Vec<String> = (0..1024)
            .map_while(|i| {
                let cpu = format!("/sys/devices/system/cpu/cpu{i}");
                Path::new(&cpu).exists().then(|| read(format!("{cpu}/cpufreq/scaling_governor")))
            })
            .flatten()
            .collect();
        cpu_governors.sort();
        cpu_governors.dedup();
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: getrlimit fills the struct it is given.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        Facts {
            rmem_max: read_u64("/proc/sys/net/core/rmem_max"),
            wmem_max: read_u64("/proc/sys/net/core/wmem_max"),
            tcp_rmem_max: last_field("/proc/sys/net/ipv4/tcp_rmem"),
            tcp_wmem_max: last_field("/proc/sys/net/ipv4/tcp_wmem"),
            congestion_control: read("/proc/sys/net/ipv4/tcp_congestion_control"),
            available_congestion_control: read("/proc/sys/net/ipv4/tcp_available_congestion_control").map(|s| s.split_whitespace().map(String::from).collect()).unwrap_or_default(),
            default_qdisc: read("/proc/sys/net/core/default_qdisc"),
            nics,
            cpu_governors,
            nofile_soft: lim.rlim_cur,
            nofile_hard: lim.rlim_max,
            clock_synchronised: clock_synchronised(),
            filesystems: paths.iter().map(|p| Fs { path: p.display().to_string(), kind: fs_kind(p) }).collect(),
        }
    }
}

fn clock_synchronised() -> Option<bool> {
    // SAFETY: a zeroed timex with modes 0 only reads the kernel's state.
    let mut t: libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { libc::adjtimex(&mut t) };
    (state >= 0).then_some(state != libc::TIME_ERROR)
}

fn fs_kind(path: &Path) -> String {
    let Ok(c) = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(path.as_os_str())) else { return "unreadable".into() };
    // SAFETY: statfs fills the zeroed struct for a NUL-terminated path.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return "unreadable".into();
    }
    // Magic numbers from statfs(2) / linux/magic.h.
    match st.f_type as u64 {
        0xEF53 => "ext4",
        0x5846_5342 => "xfs",
        0x9123_683E => "btrfs",
        0x0BD0_0BD0 => "lustre",
        0x6969 => "nfs",
        0x4750_4653 => "gpfs",
        0x0102_1994 => "tmpfs",
        0x2FC1_2FC1 => "zfs",
        0xFF53_4D42 | 0xFE53_4D42 => "cifs",
        0x6573_5546 => "fuse",
        0x0027_E0EB => "cgroup",
        0x794C_7630 => "overlay",
        0x0000_9fa0 => "proc",
        other => return format!("0x{other:x}"),
    }
    .to_string()
}

/// The host against the path to tune for (`rtt_ms`, `rate_gbps`).
pub(crate) fn findings(f: &Facts, rtt_ms: f64, rate_gbps: f64) -> Vec<Finding> {
    let mut out = Vec::new();
    let bdp = (rate_gbps * 1e9 / 8.0 * rtt_ms / 1e3) as u64;
    // fasterdata: buffers of about twice the BDP, so loss recovery does not stall the window.
    let want = (2 * bdp).next_power_of_two().max(16 << 20);
    let mib = |b: u64| if b.is_multiple_of(1 << 20) { format!("{} MiB", b >> 20) } else { format!("{:.1} MiB", b as f64 / (1 << 20) as f64) };
    let path = format!("{rate_gbps} Gb/s × {rtt_ms} ms");
    let buffers = [("net.core.rmem_max", f.rmem_max), ("net.core.wmem_max", f.wmem_max), ("net.ipv4.tcp_rmem (max)", f.tcp_rmem_max), ("net.ipv4.tcp_wmem (max)", f.tcp_wmem_max)];
    let low: Vec<String> = buffers.iter().filter(|(_, v)| v.is_some_and(|v| v < bdp)).map(|(k, v)| format!("{k} = {}", mib(v.unwrap_or(0)))).collect();
    out.push(if low.is_empty() {
        Finding {
            check: "socket buffers",
            level: Level::Ok,
            seen: buffers.iter().map(|(k, v)| format!("{k} = {}", v.map_or("?".into(), mib))).collect::<Vec<_>>().join(", "),
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
                "sysctl -w net.core.rmem_max={want} net.core.wmem_max={want} net.ipv4.tcp_rmem='4096 87380 {want}' net.ipv4.tcp_wmem='4096 65536 {want}'  (persist in /etc/sysctl.d/90-tern.conf)"
            )),
            needs_root: true,
        }
    });
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
            level: if cc == "bbr" { Level::Warn } else { Level::Info },
            seen: format!("net.core.default_qdisc = {qdisc}"),
            why: "fq paces each stream's packets instead of sending bursts that overflow switch buffers; BBR relies on pacing".into(),
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

pub(crate) fn run(a: DoctorArgs) -> Result<ExitCode> {
    let facts = Facts::gather(&a.paths);
    let rate = a.rate_gbps.unwrap_or_else(|| facts.nics.iter().filter_map(|n| n.speed_mbps).max().map_or(10.0, |m| m as f64 / 1000.0)).max(0.001);
    let list = findings(&facts, a.rtt_ms.max(0.1), rate);
    let warnings = list.iter().filter(|f| f.level == Level::Warn).count();
    if a.json {
        println!("{}", serde_json::json!({ "type": "doctor", "path": { "rtt_ms": a.rtt_ms, "rate_gbps": rate }, "facts": facts, "findings": list, "warnings": warnings }));
    } else {
        println!("tern doctor: this host for a {rate} Gb/s path with {} ms round trips (--rate-gbps, --rtt-ms)", a.rtt_ms);
        for f in &list {
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
        assert!(buffers.seen.contains("net.core.rmem_max = 4 MiB") && buffers.seen.contains("tcp_wmem") && !buffers.seen.contains("wmem_max = 128"), "{buffers:?}");
        assert!(buffers.fix.as_deref().unwrap().contains("net.core.rmem_max=33554432") && buffers.needs_root);
        assert!(list.iter().any(|f| f.check == "congestion control" && f.fix.as_deref() == Some("sysctl -w net.ipv4.tcp_congestion_control=bbr")));
        for check in ["MTU", "CPU frequency", "pacing (qdisc)"] {
            assert!(list.iter().any(|f| f.check == check && f.level == Level::Info && f.fix.is_some()), "{check}: {list:?}");
        }
    }

    #[test]
    fn buffers_are_judged_against_the_path() {
        let mut f = tuned();
        f.rmem_max = Some(64 << 20);
        // 64 MiB is plenty for 10 Gb/s × 25 ms (31 MB) but short of 100 Gb/s × 68 ms (850 MB).
        assert!(warned(&findings(&f, 25.0, 10.0)).is_empty());
        assert_eq!(warned(&findings(&f, 68.0, 100.0)), ["socket buffers"]);
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
        let f = Facts::gather(&[PathBuf::from("/")]);
        assert!(f.nofile_hard > 0 && f.congestion_control.is_some(), "{f:?}");
        assert_eq!(f.filesystems.len(), 1);
        assert!(!findings(&f, 100.0, 10.0).is_empty());
    }
}
