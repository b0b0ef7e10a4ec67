//! This host's tuning facts (`tern doctor`), read from /proc and /sys: socket-buffer limits,
//! congestion control, qdisc, NICs, CPU governors, descriptor limits, clock, file systems.
//! Judging them is the CLI's (a pure function of `Facts`, tested with made-up hosts).
//!
//! A far side's facts cross the wire as the note of a path test's `host` step
//! (docs/protocol.md "Path tests"): `key value` lines, at most `MAX_MESSAGE` bytes, so a
//! server's answer is bounded whatever its host looks like, and unknown keys are skipped so
//! either side may learn new ones.

use std::path::Path;

/// What was read from the host (None: could not be read).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Facts {
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

#[derive(Debug, Clone, PartialEq)]
pub struct Nic {
    pub name: String,
    pub mtu: Option<u32>,
    pub speed_mbps: Option<u64>,
    pub errors: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Fs {
    pub path: String,
    pub kind: String,
}

/// Most NICs and governors a far side reports (a host with more lists its first ones).
const MAX_LISTED: usize = 8;
/// Longest name (NIC, algorithm, governor, file-system kind) a far side's answer keeps.
const MAX_NAME: usize = 32;

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
    /// This host, with the file systems of `paths`.
    pub fn gather(paths: &[&Path]) -> Self {
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
        let nofile = rustix::process::getrlimit(rustix::process::Resource::Nofile);
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
            nofile_soft: nofile.current.unwrap_or(u64::MAX),
            nofile_hard: nofile.maximum.unwrap_or(u64::MAX),
            clock_synchronised: clock_synchronised(),
            filesystems: paths.iter().map(|p| Fs { path: p.display().to_string(), kind: fs_kind(p) }).collect(),
        }
    }

    /// The wire form: `key value` lines within `MAX_MESSAGE` bytes (the lists are cut first).
    pub fn to_lines(&self) -> String {
        let name = |s: &str| -> String {
            let mut n: String = s.chars().filter(|c| c.is_ascii_graphic()).collect();
            n.truncate(MAX_NAME);
            if n.is_empty() { "?".into() } else { n }
        };
        let num = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        let mut out = Vec::new();
        for (k, v) in [("rmem_max", self.rmem_max), ("wmem_max", self.wmem_max), ("tcp_rmem_max", self.tcp_rmem_max), ("tcp_wmem_max", self.tcp_wmem_max)] {
            out.push(format!("{k} {}", num(v)));
        }
        if let Some(cc) = &self.congestion_control {
            out.push(format!("cc {}", name(cc)));
        }
        out.push(format!("cc_available {}", self.available_congestion_control.iter().take(MAX_LISTED).map(|c| name(c)).collect::<Vec<_>>().join(" ")));
        if let Some(q) = &self.default_qdisc {
            out.push(format!("qdisc {}", name(q)));
        }
        out.push(format!("nofile {} {}", self.nofile_soft, self.nofile_hard));
        if let Some(c) = self.clock_synchronised {
            out.push(format!("clock {}", u8::from(c)));
        }
        for fs in &self.filesystems {
            out.push(format!("fs {}", name(&fs.kind)));
        }
        if !self.cpu_governors.is_empty() {
            out.push(format!("governor {}", self.cpu_governors.iter().take(MAX_LISTED).map(|g| name(g)).collect::<Vec<_>>().join(" ")));
        }
        for n in self.nics.iter().take(MAX_LISTED) {
            out.push(format!("nic {} {} {} {}", name(&n.name), num(n.mtu.map(u64::from)), num(n.speed_mbps), n.errors));
        }
        // Whole lines only: the NICs are last, so a host with many loses some of those.
        let mut text = String::new();
        for line in out {
            if text.len() + line.len() + 1 > tern_proto::limits::MAX_MESSAGE {
                break;
            }
            text.push_str(&line);
            text.push('\n');
        }
        text
    }

    /// A far side's facts from `to_lines`, its file systems named `fs_path`. Lines that do
    /// not parse and unknown keys are skipped: the answer is advice, not a contract.
    pub fn from_lines(text: &str, fs_path: &str) -> Self {
        let mut f = Facts::default();
        let bounded = |s: &str| s.chars().take(MAX_NAME).collect::<String>();
        for line in text.lines().take(4 * MAX_LISTED + 16) {
            let mut w = line.split_whitespace();
            let (Some(key), rest) = (w.next(), w.collect::<Vec<_>>()) else { continue };
            let num = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok());
            match key {
                "rmem_max" => f.rmem_max = num(0),
                "wmem_max" => f.wmem_max = num(0),
                "tcp_rmem_max" => f.tcp_rmem_max = num(0),
                "tcp_wmem_max" => f.tcp_wmem_max = num(0),
                "cc" => f.congestion_control = rest.first().map(|s| bounded(s)),
                "cc_available" => f.available_congestion_control = rest.iter().take(MAX_LISTED).map(|s| bounded(s)).collect(),
                "qdisc" => f.default_qdisc = rest.first().map(|s| bounded(s)),
                "nofile" => (f.nofile_soft, f.nofile_hard) = (num(0).unwrap_or(0), num(1).unwrap_or(0)),
                "clock" => f.clock_synchronised = num(0).map(|c| c != 0),
                "fs" if f.filesystems.len() < MAX_LISTED => f.filesystems.push(Fs { path: fs_path.to_string(), kind: rest.first().map_or("?".into(), |s| bounded(s)) }),
                "governor" => f.cpu_governors = rest.iter().take(MAX_LISTED).map(|s| bounded(s)).collect(),
                "nic" if f.nics.len() < MAX_LISTED && !rest.is_empty() => {
                    f.nics.push(Nic { name: bounded(rest[0]), mtu: num(1).map(|m| m.min(u32::MAX as u64) as u32), speed_mbps: num(2), errors: num(3).unwrap_or(0) })
                }
                _ => {}
            }
        }
        f
    }
}

fn clock_synchronised() -> Option<bool> {
    // SAFETY: a zeroed timex with modes 0 only reads the kernel's state.
    let mut t: libc::timex = unsafe { std::mem::zeroed() };
    let state = unsafe { libc::adjtimex(&mut t) };
    (state >= 0).then_some(state != libc::TIME_ERROR)
}

/// The file system `path` is on, by statfs(2)'s magic number.
pub fn fs_kind(path: &Path) -> String {
    let Ok(st) = rustix::fs::statfs(path) else { return "unreadable".into() };
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_host_crosses_the_wire_and_back() {
        let here = Facts::gather(&[Path::new("/")]);
        let there = Facts::from_lines(&here.to_lines(), "/");
        assert_eq!(here.nics.iter().take(MAX_LISTED).count(), there.nics.len());
        let mut expect = here.clone();
        expect.nics.truncate(MAX_LISTED);
        expect.cpu_governors.truncate(MAX_LISTED);
        assert_eq!(there, expect);
    }

    #[test]
    fn a_hostile_answer_is_bounded_and_skipped_where_it_does_not_parse() {
        let f = Facts {
            nics: (0..1000).map(|i| Nic { name: format!("eth{i}-{}", "x".repeat(200)), mtu: Some(9000), speed_mbps: None, errors: 0 }).collect(),
            congestion_control: Some("bbr\nrmem_max 1".into()),
            ..Facts::default()
        };
        let text = f.to_lines();
        assert!(text.len() <= tern_proto::limits::MAX_MESSAGE);
        let back = Facts::from_lines(&text, "/d");
        assert_eq!(back.rmem_max, None, "a name cannot smuggle a line");
        assert!(back.nics.len() <= MAX_LISTED && back.nics.iter().all(|n| n.name.len() <= MAX_NAME));
        let junk = Facts::from_lines("rmem_max lots\nnic\nclock 1\nfs\nwhat ever\n", "/d");
        assert_eq!((junk.rmem_max, junk.nics.len(), junk.clock_synchronised), (None, 0, Some(true)));
        assert_eq!(junk.filesystems[0].kind, "?");
    }
}
