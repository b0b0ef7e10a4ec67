//! tern-delayline: a userspace WAN emulator between two TUN devices.
//!
//! The kernel on the bench box has no netem, so delay and random loss are done here. Packets
//! read from TUN device A are written to TUN device B after passing through, in order:
//!
//!   random loss (Bernoulli, p)  ->  bottleneck (rate R, drop-tail queue of Q bytes)  ->  delay D
//!
//! and symmetrically from B to A, each direction with its own (p, R, Q, D), one thread each.
//!
//! The bottleneck is a virtual FIFO link: `link_free` is the time the link finishes sending
//! everything already accepted. A packet arriving at `now` sees a backlog of
//! `(link_free - now) * R` bytes; if backlog + len > Q it is dropped (drop-tail), otherwise it
//! departs the bottleneck at `max(now, link_free) + len/R` and is released at that time + D.
//! Release times are therefore non-decreasing within a direction, so a single FIFO ring of
//! packets tagged with their release time is exact (no sorting, no timer wheel). The ring is a
//! preallocated byte ring: packets are read from the TUN fd directly into it and written from
//! it, so there is no per-packet allocation and no extra copy.
//!
//! Usage: see `usage()` or `tern-delayline --help`.

use std::ffi::CString;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

static STOP: AtomicBool = AtomicBool::new(false);
static FAILED: AtomicBool = AtomicBool::new(false);

const HDR: usize = 16; // per-packet record header in the ring: len u32, pad u32, release_ns u64
const WRAP: u32 = u32::MAX; // header len value marking "continue at offset 0"
const POLL_MAX_NS: u64 = 50_000_000; // threads re-check STOP at least every 50 ms
const READ_BATCH: usize = 64; // packets read before re-checking releases
const SPIN_SHARE_DIV: u64 = 50; // spin budget refills at 1/50 = 2 % of wall time per thread
const SPIN_BURST_NS: u64 = 5_000_000; // at most 5 ms of spin saved up

fn usage() -> &'static str {
    "tern-delayline: userspace WAN emulator between two TUN devices (IFF_TUN|IFF_NO_PI)

USAGE:
  tern-delayline --a NS:DEV --b NS:DEV [options]

  --a NS:DEV, --b NS:DEV   TUN devices to attach (created beforehand, e.g. `ip -n NS tuntap add
                           dev DEV mode tun`); NS is a name under /run/netns, or '-' for the
                           current namespace. Direction 'ab' = packets read from A, written to B.
Per-direction options (plain form sets both directions; prefix ab- or ba- for one direction,
e.g. --ab-loss 1e-4):
  --delay-us N             one-way delay in microseconds (default 0)
  --delay-ms X             one-way delay in milliseconds (float)
  --loss P                 random loss probability 0..1 (default 0)
  --rate BPS               bottleneck rate in bit/s, suffixes k/m/g allowed (default 0 = none)
  --queue-bytes N          drop-tail queue at the bottleneck (default: max(BDP, 256 KiB) where
                           BDP = rate * (delay_ab + delay_ba))
Global options:
  --max-pkt N              largest packet accepted (default 65535; set the TUN MTU <= this)
  --ring-mb N              ring size per direction in MiB (default: sized from delay and queue)
  --seed N                 loss PRNG seed (default 1)
  --rt-prio N              SCHED_FIFO priority for the forwarding threads (default 10; 0 = off)
  --stats-file PATH        write JSON stats here on SIGUSR1 and at exit
  --help

Signals: SIGUSR1 prints/writes stats; SIGTERM/SIGINT/SIGHUP stop cleanly (final stats printed).
Output: a 'ready' line on stderr once both devices are attached; JSON stats on stdout at exit."
}

#[derive(Clone, Copy, Debug, Default)]
struct DirCfg {
    delay_ns: u64,
    loss: f64,
    rate_bps: u64,
    queue_bytes: Option<u64>,
}

#[derive(Debug)]
struct Cfg {
    a: (String, String),
    b: (String, String),
    ab: DirCfg,
    ba: DirCfg,
    max_pkt: usize,
    ring_mb: Option<usize>,
    seed: u64,
    rt_prio: i32,
    stats_file: Option<String>,
}

fn parse_rate(s: &str) -> Result<u64, String> {
    let s = s.trim().to_ascii_lowercase();
    let s = s.trim_end_matches("bit/s").trim_end_matches("bps").trim_end_matches("bit");
    let (num, mult) = match s.chars().last() {
        Some('k') => (&s[..s.len() - 1], 1e3),
        Some('m') => (&s[..s.len() - 1], 1e6),
        Some('g') => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    let v: f64 = num.parse().map_err(|_| format!("bad rate '{s}'"))?;
    if !(v >= 0.0) {
        return Err(format!("bad rate '{s}'"));
    }
    Ok((v * mult).round() as u64)
}

fn parse_args() -> Result<Cfg, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut cfg = Cfg {
        a: (String::new(), String::new()),
        b: (String::new(), String::new()),
        ab: DirCfg::default(),
        ba: DirCfg::default(),
        max_pkt: 65535,
        ring_mb: None,
        seed: 1,
        rt_prio: 10,
        stats_file: None,
    };
    let mut i = 0;
    while i < args.len() {
        let flag = args[i].as_str();
        if flag == "--help" || flag == "-h" {
            println!("{}", usage());
            std::process::exit(0);
        }
        let val = args.get(i + 1).ok_or_else(|| format!("{flag} needs a value"))?.clone();
        i += 2;
        let dev = |v: &str| -> Result<(String, String), String> {
            let (ns, d) = v.split_once(':').ok_or("device must be NS:DEV")?;
            if d.is_empty() || d.len() > 15 {
                return Err(format!("bad device name '{d}'"));
            }
            Ok((ns.to_string(), d.to_string()))
        };
        let num = |v: &str| -> Result<f64, String> { v.parse::<f64>().map_err(|_| format!("{flag}: bad number '{v}'")) };
        let (dirs, name): (Vec<&mut DirCfg>, &str) = if let Some(n) = flag.strip_prefix("--ab-") {
            (vec![&mut cfg.ab], n)
        } else if let Some(n) = flag.strip_prefix("--ba-") {
            (vec![&mut cfg.ba], n)
        } else {
            match flag {
                "--delay-us" | "--delay-ms" | "--loss" | "--rate" | "--queue-bytes" => {
                    (vec![&mut cfg.ab, &mut cfg.ba], &flag[2..])
                }
                "--a" => {
                    cfg.a = dev(&val)?;
                    continue;
                }
                "--b" => {
                    cfg.b = dev(&val)?;
                    continue;
                }
                "--max-pkt" => {
                    cfg.max_pkt = num(&val)? as usize;
                    continue;
                }
                "--ring-mb" => {
                    cfg.ring_mb = Some(num(&val)? as usize);
                    continue;
                }
                "--seed" => {
                    cfg.seed = num(&val)? as u64;
                    continue;
                }
                "--rt-prio" => {
                    cfg.rt_prio = num(&val)? as i32;
                    continue;
                }
                "--stats-file" => {
                    cfg.stats_file = Some(val);
                    continue;
                }
                _ => return Err(format!("unknown option {flag} (see --help)")),
            }
        };
        for d in dirs {
            match name {
                "delay-us" => d.delay_ns = (num(&val)? * 1e3).round() as u64,
                "delay-ms" => d.delay_ns = (num(&val)? * 1e6).round() as u64,
                "loss" => {
                    let p = num(&val)?;
                    if !(0.0..=1.0).contains(&p) {
                        return Err(format!("loss must be in [0,1], got {p}"));
                    }
                    d.loss = p
                }
                "rate" => d.rate_bps = parse_rate(&val)?,
                "queue-bytes" => d.queue_bytes = Some(num(&val)? as u64),
                _ => return Err(format!("unknown option {flag} (see --help)")),
            }
        }
    }
    if cfg.a.1.is_empty() || cfg.b.1.is_empty() {
        return Err("--a and --b are required (see --help)".into());
    }
    if cfg.max_pkt < 576 || cfg.max_pkt > 65535 {
        return Err("--max-pkt must be in 576..=65535".into());
    }
    Ok(cfg)
}

fn mono_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn clock_ns(clk: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    if unsafe { libc::clock_gettime(clk, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn errno() -> i32 {
    io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

// ---------------------------------------------------------------------------------------------
// TUN attach (inside a named network namespace)

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

const TUNSETIFF: libc::c_ulong = 0x4004_54ca; // _IOW('T', 202, int)

fn open_cstr(path: &str, flags: i32) -> io::Result<i32> {
    let c = CString::new(path).unwrap();
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC) };
    if fd < 0 {
        Err(io::Error::new(io::Error::last_os_error().kind(), format!("open {path}: {}", io::Error::last_os_error())))
    } else {
        Ok(fd)
    }
}

/// Attach to TUN device `dev` in network namespace `ns` ('-' = current). The calling thread
/// enters the namespace only for the open+ioctl and returns to its original namespace.
fn open_tun(ns: &str, dev: &str) -> io::Result<i32> {
    let mut back = None;
    if ns != "-" {
        let orig = open_cstr("/proc/thread-self/ns/net", libc::O_RDONLY)?;
        let target = open_cstr(&format!("/run/netns/{ns}"), libc::O_RDONLY)?;
        let r = unsafe { libc::setns(target, libc::CLONE_NEWNET) };
        unsafe { libc::close(target) };
        if r != 0 {
            let e = io::Error::last_os_error();
            unsafe { libc::close(orig) };
            return Err(io::Error::new(e.kind(), format!("setns {ns}: {e}")));
        }
        back = Some(orig);
    }
    let res = (|| {
        let fd = open_cstr("/dev/net/tun", libc::O_RDWR | libc::O_NONBLOCK)?;
        let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short, _pad: [0; 22] };
        req.name[..dev.len()].copy_from_slice(dev.as_bytes());
        if unsafe { libc::ioctl(fd, TUNSETIFF as _, &mut req) } != 0 {
            let e = io::Error::last_os_error();
            unsafe { libc::close(fd) };
            return Err(io::Error::new(e.kind(), format!("TUNSETIFF {ns}:{dev}: {e}")));
        }
        Ok(fd)
    })();
    if let Some(orig) = back {
        let r = unsafe { libc::setns(orig, libc::CLONE_NEWNET) };
        unsafe { libc::close(orig) };
        if r != 0 {
            // We are stuck in the wrong namespace; refuse to continue.
            eprintln!("tern-delayline: FATAL: cannot return to original netns: {}", io::Error::last_os_error());
            std::process::exit(2);
        }
    }
    res
}

// ---------------------------------------------------------------------------------------------
// Byte ring of [hdr | packet] records, FIFO, release time in the header.

struct Ring {
    buf: Vec<u8>,
    head: usize,
    tail: usize,
    count: usize,
}

fn align16(n: usize) -> usize {
    (n + 15) & !15
}

impl Ring {
    fn new(bytes: usize) -> Ring {
        let cap = align16(bytes.max(1 << 20));
        // vec![0; n] is calloc: pages are only made resident as the ring first cycles through them.
        Ring { buf: vec![0u8; cap], head: 0, tail: 0, count: 0 }
    }
    fn cap(&self) -> usize {
        self.buf.len()
    }
    fn used(&self) -> usize {
        if self.count == 0 {
            0
        } else if self.tail > self.head {
            self.tail - self.head
        } else {
            self.cap() - self.head + self.tail
        }
    }
    /// Offset where a packet of up to `max` bytes can be written, or None if the ring is full.
    /// May move `tail` to 0 (writing a wrap marker) — harmless if nothing is then committed.
    fn reserve(&mut self, max: usize) -> Option<usize> {
        let need = HDR + align16(max);
        if self.count == 0 {
            self.head = 0;
            self.tail = 0;
        }
        if self.count == 0 || self.tail > self.head {
            if self.cap() - self.tail >= need {
                return Some(self.tail + HDR);
            }
            if self.head >= need {
                if self.cap() - self.tail >= HDR {
                    self.buf[self.tail..self.tail + 4].copy_from_slice(&WRAP.to_ne_bytes());
                }
                self.tail = 0;
                return Some(HDR);
            }
            None
        } else if self.head - self.tail >= need {
            // tail < head (wrapped) — or tail == head with count > 0 which means full (0 >= need false)
            Some(self.tail + HDR)
        } else {
            None
        }
    }
    fn commit(&mut self, len: usize, release_ns: u64) {
        let t = self.tail;
        self.buf[t..t + 4].copy_from_slice(&(len as u32).to_ne_bytes());
        self.buf[t + 8..t + 16].copy_from_slice(&release_ns.to_ne_bytes());
        self.tail = t + HDR + align16(len);
        if self.tail == self.cap() {
            self.tail = 0;
        }
        self.count += 1;
    }
    /// (release_ns, data offset, len) of the oldest packet.
    fn front(&mut self) -> Option<(u64, usize, usize)> {
        if self.count == 0 {
            return None;
        }
        if self.cap() - self.head < HDR || u32::from_ne_bytes(self.buf[self.head..self.head + 4].try_into().unwrap()) == WRAP {
            self.head = 0;
        }
        let h = self.head;
        let len = u32::from_ne_bytes(self.buf[h..h + 4].try_into().unwrap()) as usize;
        let rel = u64::from_ne_bytes(self.buf[h + 8..h + 16].try_into().unwrap());
        Some((rel, h + HDR, len))
    }
    fn pop(&mut self, len: usize) {
        self.head += HDR + align16(len);
        if self.head == self.cap() {
            self.head = 0;
        }
        self.count -= 1;
    }
}

// ---------------------------------------------------------------------------------------------
// Per-direction statistics (written by its forwarding thread, read by main).

#[derive(Default)]
struct Stats {
    rx_pkts: AtomicU64,
    rx_bytes: AtomicU64,
    tx_pkts: AtomicU64,
    tx_bytes: AtomicU64,
    drop_loss: AtomicU64,
    drop_queue: AtomicU64,
    drop_ring: AtomicU64,
    drop_write: AtomicU64,
    late_sum_ns: AtomicU64,
    late_max_ns: AtomicU64,
    late_over_1ms: AtomicU64,
    ring_hwm: AtomicU64,
    queue_hwm: AtomicU64,
    cpu_ns: AtomicU64,
    rt: AtomicU64,
    wake_adv: AtomicU64,
    spin_ns: AtomicU64,
}

struct Dir {
    name: &'static str,
    cfg: DirCfg,
    queue_bytes: u64,
    ring_bytes: usize,
    max_pkt: usize,
    fd_in: i32,
    fd_out: i32,
    seed: u64,
    rt_prio: i32,
    stats: Arc<Stats>,
}

struct Rng(u64);
impl Rng {
    fn next_f64(&mut self) -> f64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let v = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        (v >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

fn set_rt(prio: i32) -> bool {
    if prio <= 0 {
        return false;
    }
    let p = libc::sched_param { sched_priority: prio };
    let ok = unsafe { libc::pthread_setschedparam(libc::pthread_self(), libc::SCHED_FIFO, &p) } == 0;
    // Real-time threads get no timer slack anyway; make it explicit for the non-RT fallback.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong) };
    ok
}

fn forward(d: Dir) {
    let s = &d.stats;
    s.rt.store(set_rt(d.rt_prio) as u64, Relaxed);
    let mut ring = Ring::new(d.ring_bytes);
    let mut scratch = vec![0u8; d.max_pkt]; // for packets dropped because the ring is full
    let mut rng = Rng(d.seed | 1);
    let rate = d.cfg.rate_bps as u128;
    let mut link_free: u64 = 0;
    let mut last_cpu = 0u64;
    let mut wake_adv: u64 = 50_000; // ns; adapted to the observed timer oversleep
    let mut spin_budget: u64 = SPIN_BURST_NS;
    let mut budget_at = mono_ns();
    let mut spin_for: u64 = 0; // release time the current spin is paid for
    let mut pfd = libc::pollfd { fd: d.fd_in, events: libc::POLLIN, revents: 0 };
    let fail = |what: &str| {
        eprintln!("tern-delayline[{}]: {what}: {}", d.name, io::Error::last_os_error());
        FAILED.store(true, Relaxed);
        STOP.store(true, Relaxed);
    };

    'main: while !STOP.load(Relaxed) {
        // 1. read what is waiting (bounded batch so releases stay timely)
        let mut drained = false;
        for _ in 0..READ_BATCH {
            let (ptr, into_ring) = match ring.reserve(d.max_pkt) {
                Some(off) => (ring.buf[off..].as_mut_ptr(), true),
                None => (scratch.as_mut_ptr(), false),
            };
            let n = unsafe { libc::read(d.fd_in, ptr as *mut libc::c_void, d.max_pkt) };
            if n < 0 {
                match errno() {
                    libc::EAGAIN => {
                        drained = true;
                        break;
                    }
                    libc::EINTR => continue,
                    _ => {
                        fail("read");
                        break 'main;
                    }
                }
            }
            let len = n as usize;
            let now = mono_ns();
            s.rx_pkts.fetch_add(1, Relaxed);
            s.rx_bytes.fetch_add(len as u64, Relaxed);
            if !into_ring {
                s.drop_ring.fetch_add(1, Relaxed);
                continue;
            }
            if d.cfg.loss > 0.0 && rng.next_f64() < d.cfg.loss {
                s.drop_loss.fetch_add(1, Relaxed);
                continue;
            }
            let depart = if rate > 0 {
                let backlog = (link_free.saturating_sub(now) as u128 * rate / 8_000_000_000) as u64;
                if backlog + len as u64 > d.queue_bytes {
                    s.drop_queue.fetch_add(1, Relaxed);
                    continue;
                }
                if backlog > s.queue_hwm.load(Relaxed) {
                    s.queue_hwm.store(backlog, Relaxed);
                }
                link_free = link_free.max(now) + (len as u128 * 8_000_000_000 / rate) as u64;
                link_free
            } else {
                now
            };
            ring.commit(len, depart + d.cfg.delay_ns);
        }
        let used = ring.used() as u64;
        if used > s.ring_hwm.load(Relaxed) {
            s.ring_hwm.store(used, Relaxed);
        }

        // 2. release everything that is due
        let mut now = mono_ns();
        let mut next_release = None;
        while let Some((rel, off, len)) = ring.front() {
            if rel > now {
                next_release = Some(rel);
                break;
            }
            let n = unsafe { libc::write(d.fd_out, ring.buf[off..].as_ptr() as *const libc::c_void, len) };
            if n < 0 && errno() != libc::EAGAIN && errno() != libc::EINTR && errno() != libc::EIO {
                fail("write");
                break 'main;
            }
            if n == len as isize {
                s.tx_pkts.fetch_add(1, Relaxed);
                s.tx_bytes.fetch_add(len as u64, Relaxed);
            } else {
                s.drop_write.fetch_add(1, Relaxed); // EIO: peer device down, EAGAIN: kernel backlog
            }
            let late = now - rel;
            s.late_sum_ns.fetch_add(late, Relaxed);
            if late > s.late_max_ns.load(Relaxed) {
                s.late_max_ns.store(late, Relaxed);
            }
            if late > 1_000_000 {
                s.late_over_1ms.fetch_add(1, Relaxed);
            }
            ring.pop(len);
            now = mono_ns();
        }
        if now - last_cpu > 100_000_000 {
            s.cpu_ns.store(clock_ns(libc::CLOCK_THREAD_CPUTIME_ID), Relaxed);
            s.wake_adv.store(wake_adv, Relaxed);
            last_cpu = now;
        }

        // 3. sleep until input arrives or the next packet is due. Timer wake-ups in this VM are
        //    ~50-150 us late, so we ask to be woken `wake_adv` early (an EWMA of the observed
        //    oversleep) and cover the rest by looping without sleeping (each pass still reads
        //    input). That spin is paid from a budget of SPIN_SHARE of wall time (burst
        //    SPIN_BURST_NS) so that at high packet rates the forwarder does not burn a core the
        //    tools under test need; without budget it sleeps and the packet is late by the
        //    timer oversleep (counted in the late_* stats).
        if drained {
            let now = mono_ns();
            spin_budget = (spin_budget + (now - budget_at) / SPIN_SHARE_DIV).min(SPIN_BURST_NS);
            budget_at = now;
            let until_due = next_release.map(|rel| rel.saturating_sub(now));
            let sleep = match (until_due, next_release) {
                (Some(w), Some(rel)) if w <= wake_adv => {
                    if spin_for == rel {
                        0 // already paid for spinning towards this release time
                    } else if spin_budget >= w {
                        spin_budget -= w;
                        s.spin_ns.fetch_add(w, Relaxed);
                        spin_for = rel;
                        0
                    } else {
                        w
                    }
                }
                (Some(w), _) => (w - wake_adv).min(POLL_MAX_NS),
                _ => POLL_MAX_NS,
            };
            if sleep > 0 {
                let ts = libc::timespec { tv_sec: (sleep / 1_000_000_000) as _, tv_nsec: (sleep % 1_000_000_000) as _ };
                let r = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
                if r < 0 && errno() != libc::EINTR {
                    fail("ppoll");
                    break;
                }
                if r == 0 && until_due.is_some() {
                    let over = mono_ns().saturating_sub(now + sleep).min(1_000_000);
                    // EWMA (1/8) of the oversleep plus 5 us margin, kept within [5 us, 500 us]
                    wake_adv = ((wake_adv * 7 + over + 5_000) / 8).clamp(5_000, 500_000);
                }
            }
        }
    }
    s.cpu_ns.store(clock_ns(libc::CLOCK_THREAD_CPUTIME_ID), Relaxed);
}

fn stats_json(cfg: &Cfg, dirs: &[(&str, DirCfg, u64, usize, Arc<Stats>)], t0: u64) -> String {
    let wall = (mono_ns() - t0) as f64 / 1e9;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let proc_cpu = ru.ru_utime.tv_sec as f64 + ru.ru_utime.tv_usec as f64 / 1e6 + ru.ru_stime.tv_sec as f64 + ru.ru_stime.tv_usec as f64 / 1e6;
    let mut out = format!(
        "{{\"tool\":\"tern-delayline\",\"a\":\"{}:{}\",\"b\":\"{}:{}\",\"wall_s\":{:.3},\"process_cpu_s\":{:.3},\"directions\":{{",
        cfg.a.0, cfg.a.1, cfg.b.0, cfg.b.1, wall, proc_cpu
    );
    for (i, (name, c, q, ring, s)) in dirs.iter().enumerate() {
        let tx = s.tx_pkts.load(Relaxed);
        let rel = tx + s.drop_write.load(Relaxed);
        let late_avg_us = if rel > 0 { s.late_sum_ns.load(Relaxed) as f64 / rel as f64 / 1e3 } else { 0.0 };
        out += &format!(
            "{}\"{}\":{{\"delay_us\":{:.1},\"loss\":{},\"rate_bps\":{},\"queue_bytes\":{},\"ring_bytes\":{},\"sched_fifo\":{},\
\"rx_pkts\":{},\"rx_bytes\":{},\"tx_pkts\":{},\"tx_bytes\":{},\"drop_loss\":{},\"drop_queue\":{},\"drop_ring\":{},\"drop_write\":{},\
\"late_avg_us\":{:.2},\"late_max_us\":{:.1},\"late_over_1ms\":{},\"ring_hwm_bytes\":{},\"queue_hwm_bytes\":{},\"thread_cpu_s\":{:.3},\"wake_adv_us\":{:.1},\"spin_s\":{:.3}}}",
            if i > 0 { "," } else { "" },
            name,
            c.delay_ns as f64 / 1e3,
            c.loss,
            c.rate_bps,
            q,
            ring,
            s.rt.load(Relaxed) == 1,
            s.rx_pkts.load(Relaxed),
            s.rx_bytes.load(Relaxed),
            tx,
            s.tx_bytes.load(Relaxed),
            s.drop_loss.load(Relaxed),
            s.drop_queue.load(Relaxed),
            s.drop_ring.load(Relaxed),
            s.drop_write.load(Relaxed),
            late_avg_us,
            s.late_max_ns.load(Relaxed) as f64 / 1e3,
            s.late_over_1ms.load(Relaxed),
            s.ring_hwm.load(Relaxed),
            s.queue_hwm.load(Relaxed),
            s.cpu_ns.load(Relaxed) as f64 / 1e9,
            s.wake_adv.load(Relaxed) as f64 / 1e3,
            s.spin_ns.load(Relaxed) as f64 / 1e9,
        );
    }
    out += "}}";
    out
}

fn emit_stats(cfg: &Cfg, json: &str) {
    if let Some(path) = &cfg.stats_file {
        let tmp = format!("{path}.tmp");
        if std::fs::write(&tmp, format!("{json}\n")).and_then(|_| std::fs::rename(&tmp, path)).is_err() {
            eprintln!("tern-delayline: cannot write stats file {path}");
        }
    }
    let _ = writeln!(io::stdout(), "{json}");
    let _ = io::stdout().flush();
}

fn main() {
    let cfg = match parse_args() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tern-delayline: {e}");
            std::process::exit(2);
        }
    };
    // Block the control signals in every thread; main collects them with sigtimedwait.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP, libc::SIGUSR1] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }

    let fd_a = open_tun(&cfg.a.0, &cfg.a.1).unwrap_or_else(|e| {
        eprintln!("tern-delayline: {e}");
        std::process::exit(1)
    });
    let fd_b = open_tun(&cfg.b.0, &cfg.b.1).unwrap_or_else(|e| {
        eprintln!("tern-delayline: {e}");
        std::process::exit(1)
    });

    let rtt_ns = cfg.ab.delay_ns + cfg.ba.delay_ns;
    let mk = |name: &'static str, c: DirCfg, fd_in: i32, fd_out: i32, salt: u64| {
        let bdp = (c.rate_bps as u128 * rtt_ns as u128 / 8_000_000_000) as u64;
        let queue_bytes = c.queue_bytes.unwrap_or(bdp.max(256 * 1024));
        // In-flight bytes in one direction: what the delay stage holds plus the queue. Size for a
        // 16 Gb/s input (above the forwarder's own ceiling) plus the full queue and 16 MiB slack.
        let ring_bytes = match cfg.ring_mb {
            Some(mb) => mb << 20,
            None => (c.delay_ns as u128 * 2 /* bytes per ns = 16 Gb/s */) as usize + queue_bytes as usize + (16 << 20),
        };
        Dir {
            name,
            cfg: c,
            queue_bytes: if c.rate_bps > 0 { queue_bytes } else { 0 },
            ring_bytes,
            max_pkt: cfg.max_pkt,
            fd_in,
            fd_out,
            seed: cfg.seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(salt),
            rt_prio: cfg.rt_prio,
            stats: Arc::new(Stats::default()),
        }
    };
    let dirs = [mk("ab", cfg.ab, fd_a, fd_b, 1), mk("ba", cfg.ba, fd_b, fd_a, 2)];
    let info: Vec<(&str, DirCfg, u64, usize, Arc<Stats>)> =
        dirs.iter().map(|d| (d.name, d.cfg, d.queue_bytes, align16(d.ring_bytes.max(1 << 20)), d.stats.clone())).collect();
    let t0 = mono_ns();
    let mut handles = Vec::new();
    for d in dirs {
        let name = d.name;
        handles.push(std::thread::Builder::new().name(format!("fwd-{name}")).spawn(move || forward(d)).expect("spawn"));
    }
    std::thread::sleep(Duration::from_millis(20));
    let rt = info.iter().all(|i| i.4.rt.load(Relaxed) == 1);
    for (name, c, q, ring, _) in &info {
        eprintln!(
            "tern-delayline: {name}: delay {:.3} ms, loss {}, rate {}, queue {} B, ring {} MiB",
            c.delay_ns as f64 / 1e6,
            c.loss,
            if c.rate_bps > 0 { format!("{} bit/s", c.rate_bps) } else { "unlimited".into() },
            q,
            ring >> 20
        );
    }
    if !rt {
        eprintln!("tern-delayline: WARNING: SCHED_FIFO not available (or --rt-prio 0); the forwarder may be starved by the tools under test");
    }
    eprintln!("tern-delayline: ready (pid {}, a={}:{}, b={}:{}, sched_fifo={rt})", std::process::id(), cfg.a.0, cfg.a.1, cfg.b.0, cfg.b.1);

    // Control loop: signals and worker failure, each wait bounded.
    let ts = libc::timespec { tv_sec: 0, tv_nsec: 200_000_000 };
    loop {
        let sig = unsafe { libc::sigtimedwait(&set, std::ptr::null_mut(), &ts) };
        if sig == libc::SIGUSR1 {
            emit_stats(&cfg, &stats_json(&cfg, &info, t0));
        } else if sig > 0 {
            eprintln!("tern-delayline: signal {sig}, stopping");
            STOP.store(true, Relaxed);
        }
        if STOP.load(Relaxed) {
            break;
        }
    }
    for h in handles {
        let _ = h.join();
    }
    emit_stats(&cfg, &stats_json(&cfg, &info, t0));
    unsafe {
        libc::close(fd_a);
        libc::close(fd_b);
    }
    std::process::exit(if FAILED.load(Relaxed) { 1 } else { 0 });
}
