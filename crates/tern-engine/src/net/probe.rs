//! The data plane of a path test: chunk frames of zeros sent and drained as a transfer's, and one core's hash and seal rates.

use std::io::{BufReader, BufWriter, Read, Write};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::thread;
use std::time::{Duration, Instant};

use tern_proto::TestWhat;
use tern_proto::data::{ChunkHeader, chunk_data_len, max_data_frame};
use tern_proto::frame::{FrameHeader, HEADER_LEN};

use crate::faults::chunk_hash;
use crate::net::datastream::DataConn;
use crate::net::seal::{Sealer, TAG_LEN};
use crate::net::transport::random;
use crate::probe::Rate;

// ------------------------------------------------------------------------------------------
// The data plane: chunk frames of zeros, as a transfer's.

/// One data stream's sending or receiving state across steps (the seal's counter, the tag's
/// sequence number).
pub(crate) struct Lane {
    conn: DataConn,
    sealer: Option<Sealer>,
    seq: u64,
}

impl Lane {
    pub(crate) fn new(mut conn: DataConn) -> Self {
        let sealer = conn.sealer.take();
        Self { conn, sealer, seq: 0 }
    }
}

/// The sending counters of `lanes`' sockets, summed; None if the kernel said nothing for any.
pub(crate) fn counters(lanes: &[Lane]) -> Option<crate::net::transport::TcpCounters> {
    let each: Vec<_> = lanes.iter().filter_map(|l| l.conn.probe.as_ref().and_then(crate::net::transport::tcp_counters)).collect();
    (!each.is_empty()).then(|| each.into_iter().fold(Default::default(), |a, b| a + b))
}

/// Sends chunk frames of zeros on `lane` until `stop`; the payload bytes sent. Each frame is
/// built, hashed and sealed (or tagged) as a transfer's sender does.
pub(crate) fn blast(lane: &mut Lane, chunk: u32, stop: &AtomicBool) -> std::io::Result<u64> {
    const PREFIX: usize = HEADER_LEN + ChunkHeader::LEN;
    let len = chunk as usize;
    let trailer = if lane.sealer.is_some() { TAG_LEN } else { 0 };
    let mut buf = vec![0u8; PREFIX + len + TAG_LEN];
    let mut out = BufWriter::with_capacity(256 << 10, &mut lane.conn.stream);
    let mut sent = 0u64;
    while !stop.load(Relaxed) {
        let data = &mut buf[PREFIX..PREFIX + len];
        // A sealed buffer holds ciphertext: zeros again, as a read would refill it.
        data.fill(0);
        let hash = chunk_hash(data);
        let mut header = ChunkHeader { flags: 0, file_id: 0, index: lane.seq, offset: 0, hash, tag: [0; 32] };
        if let Some(key) = &lane.conn.tag_key {
            header.tag = header.compute_tag(key, lane.seq);
        }
        lane.seq += 1;
        buf[..HEADER_LEN].copy_from_slice(&ChunkHeader::frame_header(len + trailer));
        buf[HEADER_LEN..PREFIX].copy_from_slice(&header.encode());
        let end = PREFIX + len;
        if let Some(s) = lane.sealer.as_mut() {
            let (aad, body) = buf[..end].split_at_mut(HEADER_LEN);
            let tag = s.seal(aad, body);
            buf[end..end + TAG_LEN].copy_from_slice(&tag);
        }
        out.write_all(&buf[..end + trailer])?;
        sent += len as u64;
    }
    out.flush()?;
    Ok(sent)
}

/// Reads chunk frames from `conn` until it ends, opening (or checking the tag of) and hashing
/// each as a transfer's receiver does, and counts the bytes of their bodies into `count` as
/// they arrive. A frame that fails is the end of the stream (a test has nothing to repair).
pub(crate) fn drain(conn: DataConn, chunk: u32, count: Arc<AtomicU64>) {
    let mut lane = Lane::new(conn);
    let trailer = if lane.sealer.is_some() { TAG_LEN } else { 0 };
    let tag_key = lane.conn.tag_key;
    let mut r = BufReader::with_capacity(256 << 10, &mut lane.conn.stream);
    let mut buf = vec![0u8; ChunkHeader::LEN + chunk as usize + TAG_LEN];
    loop {
        let mut head = [0u8; HEADER_LEN];
        if r.read_exact(&mut head).is_err() {
            return;
        }
        let Ok(len) = FrameHeader::parse(head, max_data_frame(chunk)).and_then(|f| chunk_data_len(f, chunk, trailer)) else {
            tracing::debug!("path test: a malformed data frame; stream dropped");
            return;
        };
        let body = &mut buf[..ChunkHeader::LEN + len + trailer];
        // Counted as the bytes arrive, not once the frame is whole: at 10 Mb/s a 1 MiB frame
        // takes 0.8 s, twice a 5 s test's measuring window (0.4 s), so a slow link measured
        // nothing or a whole frame. A frame that then fails ends the stream; what it carried
        // was still carried.
        let mut got = 0;
        while got < body.len() {
            match r.read(&mut body[got..]) {
                Ok(0) => return,
                Ok(n) => {
                    got += n;
                    count.fetch_add(n as u64, Relaxed);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return,
            }
        }
        if let Some(s) = lane.sealer.as_mut()
            && !s.open(&head, body)
        {
            tracing::debug!("path test: a data frame failed decryption; stream dropped");
            return;
        }
        let h = ChunkHeader::decode(body[..ChunkHeader::LEN].try_into().unwrap());
        if let Some(key) = &tag_key
            && !tern_proto::auth::proofs_equal(&h.compute_tag(key, lane.seq), &h.tag)
        {
            tracing::debug!("path test: a data frame failed authentication; stream dropped");
            return;
        }
        lane.seq += 1;
        if chunk_hash(&body[ChunkHeader::LEN..ChunkHeader::LEN + len]) != h.hash {
            tracing::debug!("path test: a chunk's hash did not match; stream dropped");
            return;
        }
    }
}

/// Sends on every lane in `lanes` until `stop` (or `until`); the bytes sent in all.
pub(crate) fn blast_all(lanes: &mut [Lane], chunk: u32, stop: &AtomicBool, until: Option<Instant>) -> u64 {
    thread::scope(|s| {
        // A lane whose thread the system would not start sends nothing; the others still measure.
        let hs: Vec<_> = lanes.iter_mut().map(|l| crate::threads::spawn_scoped(s, "tern-probe-send", move || blast(l, chunk, stop).unwrap_or(0))).collect();
        if let Some(t) = until {
            thread::sleep(t.saturating_duration_since(Instant::now()));
            stop.store(true, Relaxed);
        }
        hs.into_iter().map(|h| h.ok().and_then(|h| h.join().ok()).unwrap_or(0)).sum()
    })
}

/// What arrives on `count` in the window from a fifth of `millis` after `start` to its end
/// (slow start and the previous step's tail stay out of it), and the CPU time this process used
/// in that window.
pub(crate) fn window(count: &AtomicU64, start: Instant, millis: u32) -> (Rate, Duration) {
    let total = Duration::from_millis(millis as u64);
    thread::sleep((start + total / 5).saturating_duration_since(Instant::now()));
    let (b0, t0, c0) = (count.load(Relaxed), Instant::now(), process_cpu());
    thread::sleep((start + total).saturating_duration_since(Instant::now()));
    (Rate::new(count.load(Relaxed) - b0, t0.elapsed()), process_cpu().saturating_sub(c0))
}

// ------------------------------------------------------------------------------------------
// Local measurements (both sides).

fn clock(id: rustix::time::ClockId) -> Duration {
    let t = rustix::time::clock_gettime(id);
    Duration::new(t.tv_sec.max(0) as u64, t.tv_nsec.clamp(0, 999_999_999) as u32)
}

/// The CPU time (user + system) this process has used, all its threads.
pub fn process_cpu() -> Duration {
    clock(rustix::time::ClockId::ProcessCPUTime)
}

/// One core's BLAKE3 (`Hash`) or AES-256-GCM seal (`Seal`) rate over 1 MiB buffers, for `millis`
/// of wall time. The rate is per second of the CPU time this thread got, so a process held to a
/// CPU quota (or sharing its cores) still reports what one core does.
pub fn cpu_rate(what: TestWhat, millis: u32) -> Rate {
    let mut buf = vec![0x5au8; 1 << 20];
    let mut sealer = Sealer::new(&random());
    let start = Instant::now();
    let cpu0 = clock(rustix::time::ClockId::ThreadCPUTime);
    let until = start + Duration::from_millis(millis as u64);
    let mut bytes = 0u64;
    while Instant::now() < until {
        match what {
            TestWhat::Seal => {
                std::hint::black_box(sealer.seal(b"header", &mut buf));
            }
            _ => {
                std::hint::black_box(blake3::hash(&buf));
            }
        }
        bytes += buf.len() as u64;
    }
    let cpu = clock(rustix::time::ClockId::ThreadCPUTime).saturating_sub(cpu0);
    Rate::new(bytes, if cpu.is_zero() { start.elapsed() } else { cpu })
}

/// The cores this process may use: the fewer of the CPUs in its affinity mask and its
/// cgroup's CPU quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`, the tightest
/// of its cgroup and their parents), with where that comes from in words. A quota is not a
/// whole number of cores and `sched_getaffinity` does not show it.
pub fn usable_cores() -> (f64, String) {
    let cpus = affinity_cpus().unwrap_or_else(|| thread::available_parallelism().map_or(1, |n| n.get()));
    let quota =
        std::fs::read_to_string("/proc/self/cgroup").ok().zip(std::fs::read_to_string("/proc/self/mountinfo").ok()).and_then(|(cg, mi)| cgroup_quota(&cg, &mi, |p| std::fs::read_to_string(p).ok()));
    match quota {
        Some((cores, how)) if cores < cpus as f64 => (cores, format!("CPU quota {cores:.2} cores ({how})")),
        _ => (cpus as f64, format!("{cpus} CPUs")),
    }
}

/// CPUs in `Cpus_allowed_list` of /proc/self/status ("0-3,8").
fn affinity_cpus() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?.trim();
    let mut n = 0;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        n += match part.split_once('-') {
            Some((a, b)) => b.parse::<usize>().ok()?.checked_sub(a.parse::<usize>().ok()?)? + 1,
            None => part.parse::<usize>().map(|_| 1).ok()?,
        };
    }
    (n > 0).then_some(n)
}

/// The tightest CPU quota on this process's cgroup and its parents, in cores, with the setting
/// it came from (not the cgroup's path: the answer goes to a client): `cgroup` is /proc/self/cgroup, `mountinfo` /proc/self/mountinfo, `read` reads a
/// file of the cgroup file system.
fn cgroup_quota(cgroup: &str, mountinfo: &str, read: impl Fn(&str) -> Option<String>) -> Option<(f64, String)> {
    let mut best: Option<(f64, String)> = None;
    let mut consider = |cores: f64, how: String| {
        if cores > 0.0 && best.as_ref().is_none_or(|b| cores < b.0) {
            best = Some((cores, how));
        }
    };
    for line in cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        let v2 = ctrls.is_empty();
        if !v2 && !ctrls.split(',').any(|c| c == "cpu") {
            continue;
        }
        // The mount of that hierarchy: (its root within the hierarchy, where it is mounted).
        let Some((root, at)) = mountinfo.lines().find_map(|m| {
            let (pre, post) = m.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let ok = if v2 { post.first() == Some(&"cgroup2") } else { post.first() == Some(&"cgroup") && post.get(2).is_some_and(|o| o.split(',').any(|c| c == "cpu")) };
            ok.then(|| (pre.get(3).copied().unwrap_or("/").to_string(), pre.get(4).copied().unwrap_or("").to_string()))
        }) else {
            continue;
        };
        let rel = if root == "/" { path } else { path.strip_prefix(root.as_str()).unwrap_or(path) };
        // This cgroup and each parent up to the mount.
        let mut dir = format!("{at}/{}", rel.trim_start_matches('/')).trim_end_matches('/').to_string();
        loop {
            if v2 {
                if let Some(max) = read(&format!("{dir}/cpu.max")) {
                    let mut w = max.split_whitespace();
                    if let (Some(q), Some(p)) = (w.next().and_then(|q| q.parse::<f64>().ok()), w.next().and_then(|p| p.parse::<f64>().ok())) {
                        consider(q / p, format!("cgroup v2 cpu.max {q} {p}"));
                    }
                }
            } else if let (Some(q), Some(p)) =
                (read(&format!("{dir}/cpu.cfs_quota_us")).and_then(|q| q.trim().parse::<f64>().ok()), read(&format!("{dir}/cpu.cfs_period_us")).and_then(|p| p.trim().parse::<f64>().ok()))
                && q > 0.0
                && p > 0.0
            {
                consider(q / p, format!("cgroup v1 cpu.cfs_quota_us {q} / cpu.cfs_period_us {p}"));
            }
            if dir.len() <= at.len() {
                break;
            }
            match dir.rsplit_once('/') {
                Some((parent, _)) if parent.len() >= at.len() => dir = parent.to_string(),
                _ => break,
            }
        }
    }
    best
}

/// An established control channel to a path-test server, with the session key and the
/// server's feature bits (a local path's self-test: the in-process server's thread too).
pub struct Connected {
    pub reader: crate::net::control::CtrlReader,
    pub writer: crate::net::control::CtrlWriter,
    pub key: [u8; 32],
    pub features: u64,
    pub server: thread::JoinHandle<()>,
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI_V1: &str = "30 25 0:26 / /sys/fs/cgroup/cpu rw,nosuid - cgroup cgroup rw,cpu\n31 25 0:27 / /sys/fs/cgroup/cpuacct rw - cgroup cgroup rw,cpuacct\n40 25 0:30 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n";

    fn files(list: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |p| list.iter().find(|(k, _)| *k == p).map(|(_, v)| v.to_string())
    }

    #[test]
    fn a_v1_quota_on_the_cgroup_or_a_parent_is_found_in_cores() {
        let cg = "2:cpuacct:/\n1:cpu:/jobs/tern\n0::/\n";
        let read = files(&[
            ("/sys/fs/cgroup/cpu/jobs/tern/cpu.cfs_quota_us", "-1\n"),
            ("/sys/fs/cgroup/cpu/jobs/tern/cpu.cfs_period_us", "100000\n"),
            ("/sys/fs/cgroup/cpu/jobs/cpu.cfs_quota_us", "50000\n"),
            ("/sys/fs/cgroup/cpu/jobs/cpu.cfs_period_us", "100000\n"),
            ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1\n"),
            ("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000\n"),
        ]);
        let (cores, how) = cgroup_quota(cg, MI_V1, read).unwrap();
        assert_eq!(cores, 0.5);
        assert_eq!(how, "cgroup v1 cpu.cfs_quota_us 50000 / cpu.cfs_period_us 100000");
        // No quota anywhere: none.
        let none = files(&[("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "-1"), ("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "100000")]);
        assert!(cgroup_quota("1:cpu:/\n", MI_V1, none).is_none());
    }

    #[test]
    fn a_v2_cpu_max_is_read_and_max_means_none() {
        let mi = "40 25 0:30 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n";
        let read = files(&[("/sys/fs/cgroup/a/b/cpu.max", "150000 100000\n"), ("/sys/fs/cgroup/a/cpu.max", "max 100000\n")]);
        let (cores, how) = cgroup_quota("0::/a/b\n", mi, read).unwrap();
        assert_eq!(cores, 1.5);
        assert_eq!(how, "cgroup v2 cpu.max 150000 100000");
        let read = files(&[("/sys/fs/cgroup/a/cpu.max", "max 100000\n")]);
        assert!(cgroup_quota("0::/a\n", mi, read).is_none());
    }

    #[test]
    fn this_process_has_usable_cores_and_cpu_time() {
        let (cores, how) = usable_cores();
        assert!(cores > 0.0 && !how.is_empty());
        let r = cpu_rate(TestWhat::Hash, 100);
        assert!(r.bytes > 0 && r.secs > 0.0 && r.secs < 0.2, "{r:?}");
        assert!(process_cpu() > Duration::ZERO);
    }
}
