//! One `tern cp -r` spread over every node of a cluster (docs/cluster.md "Spreading a
//! transfer"): the destination daemon (and a daemon source) name their cluster's nodes, or the
//! user gives an ssh host list (`h1,h2,h3:/dst`); the tree's regular files are cut into units,
//! node pairs pull units from one queue (a fast pair takes more), and a closing pass of the
//! whole tree on one pair makes directories, links and metadata and finds every unit's file
//! identical. Each unit is an ordinary session with a file list, so every file is verified where
//! it lands and published once, exactly as on one node; a unit whose pair fails goes back to the
//! queue and the next pair resumes it from the partial files on the shared file system.

use std::collections::VecDeque;
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tern_engine::client::session::ClientSpec;
use tern_engine::driver::sender::Stripe;
use tern_engine::endpoint::Endpoint;
use tern_engine::error::{ErrorKind, Side, TransferError};
use tern_engine::progress::Progress;
use tern_proto::msg::{FS_PARENTS, FS_RECURSIVE, MAX_FILE_LIST, Summary};
use tern_proto::{FsKind, FsOp};

/// A copy smaller than this (and with fewer entries than the next) goes to the daemon it names
/// without asking for its cluster: at 68 ms the question costs ~0.3 s, a few percent of such a
/// copy's time, and a session per pair would cost more than the pairs add.
const SPREAD_MIN_BYTES: u64 = 64 << 20;
const SPREAD_MIN_ENTRIES: usize = 100_000;
/// A unit is at most this many files (a session's file list stays small) ...
const UNIT_FILES: usize = 10_000;
/// ... and about total ÷ (pairs × this) bytes, within the bounds below: enough units per pair
/// that a fast pair can take more than its share, few enough that a session's start (a few
/// round trips and the ramp) is paid rarely.
const UNITS_PER_PAIR: u64 = 3;
const UNIT_MIN_BYTES: u64 = 32 << 20;
const UNIT_MAX_BYTES: u64 = 1 << 30;
/// A unit whose pair failed this often is left to the closing pass (which reports why).
const UNIT_ATTEMPTS: u32 = 3;
/// How long a unit's session keeps reconnecting to its pair before the unit moves on.
const UNIT_RETRY: Duration = Duration::from_secs(5);
/// How often the coordinator asks the destination cluster for nodes that joined.
const REFRESH: Duration = Duration::from_secs(5);

/// What was decided before any data moved.
pub(crate) struct Plan {
    /// One (source, destination) endpoint pair per worker, paths not yet set.
    pairs: Vec<(Endpoint, Endpoint)>,
    /// The destination directory the tree's contents land in.
    target: String,
    /// The source directory whose contents are listed.
    source_dir: String,
    units: Vec<Unit>,
    files: u64,
    bytes: u64,
    /// The destination's cluster, asked again for nodes that joined (none for a host list).
    refresh: Option<Endpoint>,
    /// The source's cluster, asked the same way (none for a local source).
    refresh_src: Option<Endpoint>,
}

#[derive(Default)]
struct Unit {
    paths: Vec<Vec<u8>>,
    /// Each path's bytes (a stripe's: the stripe's), while the unit is queued.
    sizes: Vec<u64>,
    /// A stripe of the unit's one file: its bytes move verified and unpublished; the closing
    /// pass publishes the file once every stripe is in (docs/cluster.md "Stripes").
    stripe: Option<Stripe>,
    bytes: u64,
    attempts: u32,
}

/// Whether `spec` is a copy that can be spread, and over what. `None`: run it as one session.
/// An ssh host list that cannot be spread is an error (there is no host "a,b" to copy to).
pub(crate) fn plan(spec: &ClientSpec, contents: bool, sync: bool, dry_run: bool) -> anyhow::Result<Option<Plan>> {
    let host_list = matches!(&spec.dest, Endpoint::Ssh { host, .. } if host.contains(','));
    let why_not = if sync {
        Some("sync")
    } else if dry_run {
        Some("--dry-run")
    } else if spec.files_from.is_some() {
        Some("--files-from")
    } else if !spec.filters.is_empty() {
        Some("--exclude/--include")
    } else if spec.sources.len() != 1 || !spec.options.recursive() {
        Some("anything but one directory copied with -r")
    } else if spec.ssh.reverse {
        Some("--reverse")
    } else {
        None
    };
    if let Some(why) = why_not {
        if host_list {
            anyhow::bail!("destination: a host list (h1,h2:/dir) spreads one cp -r of one directory; {why} does not spread: name one host");
        }
        return Ok(None);
    }
    if std::env::var_os("TERN_ONE_NODE").is_some_and(|v| v == "1") {
        if host_list {
            anyhow::bail!("destination: TERN_ONE_NODE=1 and a host list: name one host");
        }
        return Ok(None);
    }
    // Anything the plan cannot learn (a daemon that does not answer, a parent that cannot be
    // listed) leaves the transfer to one session, which says what is wrong in its own words.
    // Each question is a connection of a few round trips (~0.3 s at 68 ms): the two sides are
    // asked at once, and the source is listed only once the destination is known to spread.
    let src = &spec.sources[0];
    // Only a daemon or a host list at the destination spreads: nothing to ask the source then.
    if !(host_list || matches!(spec.dest, Endpoint::Daemon { .. })) {
        return Ok(None);
    }
    let (dst_nodes, src_nodes) = std::thread::scope(|scope| {
        let src_nodes = scope.spawn(|| source_nodes(spec, src, host_list));
        (destination_nodes(spec, host_list), src_nodes.join().expect("asking the source's cluster panicked"))
    });
    let Some(dst_nodes) = dst_nodes else { return Ok(None) };
    let Some(src_nodes) = src_nodes? else { return Ok(None) };
    let n = src_nodes.len().max(dst_nodes.len());
    if n < 2 {
        return Ok(None);
    }
    let pairs: Vec<(Endpoint, Endpoint)> = (0..n).map(|i| (src_nodes[i % src_nodes.len()].clone(), dst_nodes[i % dst_nodes.len()].clone())).collect();
    let (files, target) = std::thread::scope(|scope| {
        let target = scope.spawn(|| target_dir(&dest_side(spec), &dst_nodes[0], contents));
        (list_files(spec, src), target.join().expect("listing the destination panicked"))
    });
    let (files, target) = match (files, target) {
        (Ok(Some((files, total))), Ok(Some(target))) => ((files, total), target),
        (Err(e), _) | (_, Err(e)) if host_list => anyhow::bail!("{e}"),
        _ if host_list => anyhow::bail!("destination: a host list (h1,h2:/dir) spreads one cp -r of one directory into a directory; copy to one host"),
        _ => return Ok(None),
    };
    let (files, total) = files;
    let count = files.len() as u64;
    // With --checksum the sender hashes every listed file whole: a stripe would read it all.
    let stripe_chunk = (!spec.options.checksum()).then_some(spec.options.chunk_size);
    let units = cut(files, n as u64, total, stripe_chunk);
    Ok(Some(Plan {
        pairs,
        target,
        source_dir: src.path_str(),
        files: count,
        bytes: total,
        units,
        refresh: (!host_list).then(|| spec.dest.clone()),
        refresh_src: (src_nodes.len() > 1 || matches!(src, Endpoint::Daemon { .. })).then(|| src.clone()),
    }))
}

/// The destination's nodes: the hosts of a host list, or the cluster of the daemon named;
/// `None`: nothing to spread over.
fn destination_nodes(spec: &ClientSpec, host_list: bool) -> Option<Vec<Endpoint>> {
    match &spec.dest {
        Endpoint::Ssh { host, port, path } if host_list => {
            let user = host.split_once('@').map(|(u, _)| u.to_string());
            let hosts = host.split(',').filter(|h| !h.is_empty()).map(|h| {
                let host = match (&user, h.contains('@')) {
                    (Some(u), false) => format!("{u}@{h}"),
                    _ => h.to_string(),
                };
                Endpoint::Ssh { host, port: *port, path: path.clone() }
            });
            Some(hosts.collect())
        }
        // Asking costs a connection (a few round trips): only for a copy big enough to spread.
        Endpoint::Daemon { .. } if !worth_asking(&spec.sources[0]) => None,
        Endpoint::Daemon { path, .. } => {
            let cluster = tern_engine::client::cluster::of(&dest_side(spec), &spec.dest).ok().flatten()?;
            Some(cluster.nodes.iter().filter_map(|n| daemon_at(n, path)).collect())
        }
        _ => None,
    }
}

/// The source's nodes: the cluster of the daemon named (or that daemon alone), or the local
/// tree; `Ok(None)`: a source that does not spread.
fn source_nodes(spec: &ClientSpec, src: &Endpoint, host_list: bool) -> anyhow::Result<Option<Vec<Endpoint>>> {
    Ok(Some(match src {
        Endpoint::Daemon { path, .. } => match tern_engine::client::cluster::of(spec, src).ok().flatten() {
            Some(c) => c.nodes.iter().filter_map(|n| daemon_at(n, path)).collect(),
            None => vec![src.clone()],
        },
        Endpoint::Local(_) => vec![src.clone()],
        Endpoint::Ssh { .. } if host_list => anyhow::bail!("destination: a host list (h1,h2:/dir) takes a local source directory; run tern on the source host"),
        Endpoint::Ssh { .. } => return Ok(None),
    }))
}

/// The settings to ask the destination with: in a copy between two daemons, its own token.
fn dest_side(spec: &ClientSpec) -> ClientSpec {
    let mut s = spec.clone();
    if spec.sources.first().is_some_and(|e| !e.is_local()) && s.dst_token_file.is_some() {
        s.token_file = s.dst_token_file.clone();
    }
    s
}

fn daemon_at(addr: &str, path: &str) -> Option<Endpoint> {
    Endpoint::parse(&format!("tern://{addr}{path}")).ok()
}

/// Whether a copy from `src` is big enough that asking the destination for its cluster pays: a
/// local tree of at least `SPREAD_MIN_BYTES` or `SPREAD_MIN_ENTRIES` entries (the walk stops
/// there), or a daemon's (a copy between daemons is one between sites).
fn worth_asking(src: &Endpoint) -> bool {
    let Endpoint::Local(dir) = src else { return true };
    let (mut bytes, mut entries) = (0u64, 0usize);
    let stopped = walk(dir, |_, file| {
        entries += 1;
        bytes += file.map_or(0, |md| md.len());
        if bytes >= SPREAD_MIN_BYTES || entries >= SPREAD_MIN_ENTRIES { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
    });
    stopped.is_break()
}

/// Visits every entry beneath `dir` (depth first; unreadable directories skipped) with its path
/// relative to `dir` and, for a regular file, its metadata; stops when `visit` breaks.
fn walk(dir: &Path, mut visit: impl FnMut(&Path, Option<&std::fs::Metadata>) -> ControlFlow<()>) -> ControlFlow<()> {
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(dir.join(&rel)) else { continue };
        for e in rd.flatten() {
            let Ok(ft) = e.file_type() else { continue };
            let rel = rel.join(e.file_name());
            let md = if ft.is_file() { e.metadata().ok() } else { None };
            visit(&rel, md.as_ref())?;
            if ft.is_dir() {
                stack.push(rel);
            }
        }
    }
    ControlFlow::Continue(())
}

/// A regular file of the source: its path relative to the source directory, and its size.
type Listed = (Vec<u8>, u64);

/// The source's regular files (relative path, size), in walk order; `None` for a source that is
/// not a directory, or a tree larger than one transfer's file list may be.
fn list_files(spec: &ClientSpec, src: &Endpoint) -> Result<Option<(Vec<Listed>, u64)>, TransferError> {
    let mut out = Vec::new();
    match src {
        Endpoint::Local(dir) => {
            if !dir.is_dir() {
                return Ok(None);
            }
            let overflow = walk(dir, |rel, file| {
                use std::os::unix::fs::MetadataExt;
                // Hard links stay links: the closing pass sees all their names at once.
                if let Some(md) = file.filter(|md| md.nlink() == 1) {
                    out.push((rel.as_os_str().as_bytes().to_vec(), md.len()));
                }
                if out.len() > MAX_FILE_LIST { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
            });
            if overflow.is_break() {
                return Ok(None);
            }
        }
        _ => {
            let entries = tern_engine::client::remote_fs::request(spec, src, FsOp::List, FS_RECURSIVE)?;
            out.extend(entries.into_iter().filter(|e| e.kind == FsKind::File).map(|e| (e.name, e.size)));
            if out.len() > MAX_FILE_LIST {
                return Ok(None);
            }
        }
    }
    let total = out.iter().map(|(_, s)| s).sum();
    Ok(Some((out, total)))
}

/// Where the source directory's contents land, decided once, as the single session would: `SRC/.`
/// into DST; `SRC` into DST/name when DST is a directory, as DST when it does not exist yet.
/// `None` (do not spread) when DST's parent cannot be listed: the single session says why.
fn target_dir(spec: &ClientSpec, dest: &Endpoint, contents: bool) -> Result<Option<String>, TransferError> {
    let dst = spec.dest.path_str();
    if contents {
        return Ok(Some(dst));
    }
    let src = spec.sources[0].path_str();
    let Some(name) = Path::new(src.trim_end_matches('/')).file_name().map(|n| n.as_bytes().to_vec()) else { return Ok(None) };
    let trimmed = dst.trim_end_matches('/');
    let (parent, leaf) = match trimmed.rfind('/') {
        Some(i) => (if i == 0 { "/".to_string() } else { trimmed[..i].to_string() }, trimmed.as_bytes()[i + 1..].to_vec()),
        None => (".".to_string(), trimmed.as_bytes().to_vec()),
    };
    if leaf.is_empty() {
        // DST is a root ("/" or "host:"): it exists and is a directory.
        return Ok(Some(format!("{}/{}", trimmed, String::from_utf8_lossy(&name))));
    }
    let entries = tern_engine::client::remote_fs::request(spec, &with_path(dest, &parent), FsOp::List, 0)?;
    Ok(match entries.iter().find(|e| e.name == leaf) {
        None => Some(dst),
        Some(e) if e.kind == FsKind::Dir => Some(format!("{trimmed}/{}", String::from_utf8_lossy(&name))),
        Some(_) => None,
    })
}

/// Files into units: batches in walk order up to one size, the largest units first. Measured on
/// the bench's cluster bed (bench/results/cluster-scale.md): units that shrink as the work left
/// does (guided self-scheduling) balanced the tail better but started twice as many sessions,
/// each paying its handshake and ramp, and moved 4 GiB over 2 pairs in 100.5 s against 96.2 s.
///
/// A file larger than a unit is cut into stripes of about a unit each (whole chunks of
/// `stripe_chunk` bytes), so one large file moves over every pair; `None`: files stay whole.
fn cut(files: Vec<Listed>, pairs: u64, total: u64, stripe_chunk: Option<u32>) -> Vec<Unit> {
    let size = (total / (pairs * UNITS_PER_PAIR).max(1)).clamp(UNIT_MIN_BYTES, UNIT_MAX_BYTES);
    // The walk's bytes cut at n even boundaries, each file in the unit its middle falls in: n
    // units of about `size` (9 of 455 MiB for 4 GiB over 3 pairs, where filling each unit up to
    // `size` made 10 and one pair moved a fourth alone). A file larger than a unit is a unit of
    // its own (it may be striped below).
    let n = ((total + size / 2) / size).max(1);
    let mut units = Vec::new();
    let mut cur = Unit::default();
    let (mut before, mut cur_index) = (0u64, 0u64);
    for (path, len) in files {
        let index = ((u128::from(before) + u128::from(len / 2)) * u128::from(n) / u128::from(total.max(1))) as u64;
        let alone = len > size;
        if !cur.paths.is_empty() && (index != cur_index || alone || cur.paths.len() >= UNIT_FILES) {
            units.push(std::mem::take(&mut cur));
        }
        before += len;
        cur_index = index;
        cur.bytes += len;
        cur.paths.push(path);
        cur.sizes.push(len);
        if alone {
            units.push(std::mem::take(&mut cur));
        }
    }
    if !cur.paths.is_empty() {
        units.push(cur);
    }
    // Whole files balance the pairs when the largest are small against a pair's share; striping
    // then only costs (a session per stripe, and one more that publishes the file). So files
    // are striped, the largest first, only while the pairs would not finish within 10 % of each
    // other otherwise (4 × 1 GiB: none over 2 pairs, one over 3).
    if let Some(cs) = stripe_chunk.map(u64::from).filter(|&cs| cs > 0) {
        let share = total.div_ceil(pairs.max(1));
        while makespan(&units, pairs) * 10 > share * 11 {
            let Some(i) = units.iter().enumerate().filter(|(_, u)| u.stripe.is_none() && u.paths.len() == 1 && u.bytes > cs * pairs).max_by_key(|(_, u)| u.bytes).map(|(i, _)| i) else {
                break;
            };
            let (path, len) = (units[i].paths[0].clone(), units[i].bytes);
            units.swap_remove(i);
            // A multiple of the pairs, each about a unit (to the nearest whole round: a 3 GiB
            // file over 3 pairs is 9 stripes, not 10 of which one pair moves the last alone).
            let rounds = ((len + size * pairs / 2) / (size * pairs)).max(1);
            let n = (rounds * pairs).min(len.div_ceil(cs));
            let step = len.div_ceil(n).div_ceil(cs) * cs;
            let mut start = 0;
            while start < len {
                let end = (start + step).min(len);
                units.push(Unit { paths: vec![path.clone()], sizes: vec![end - start], stripe: Some(Stripe { path: path.clone(), start, end }), bytes: end - start, attempts: 0 });
                start = end;
            }
        }
    }
    units.sort_by_key(|u| std::cmp::Reverse(u.bytes));
    units
}

/// When the last of `pairs` equal pairs would finish, pulling `units` largest first (the
/// queue's order): what each pair's bytes add up to, at most.
fn makespan(units: &[Unit], pairs: u64) -> u64 {
    let mut sizes: Vec<u64> = units.iter().map(|u| u.bytes).collect();
    sizes.sort_unstable_by(|a, b| b.cmp(a));
    let mut load = vec![0u64; pairs.max(1) as usize];
    for b in sizes {
        let least = load.iter_mut().min().expect("at least one pair");
        *least += b;
    }
    load.into_iter().max().unwrap_or(0)
}

/// What each pair of the last spread transfer moved (this process runs one transfer).
static PAIRS: Mutex<Vec<PairTally>> = Mutex::new(Vec::new());

/// The per-node part of `--json`'s summary: one object per node pair; `None` when the transfer
/// was not spread.
pub(crate) fn pairs_json() -> Option<serde_json::Value> {
    let pairs = PAIRS.lock().unwrap();
    (!pairs.is_empty()).then(|| {
        pairs
            .iter()
            .map(|t| {
                serde_json::json!({
                    "source": t.source, "destination": t.name, "units": t.units, "stripes": t.stripes, "bytes": t.bytes, "seconds": t.seconds,
                    "gbps": if t.seconds > 0.0 { t.bytes as f64 * 8.0 / t.seconds / 1e9 } else { 0.0 },
                    "left": t.gave_up,
                })
            })
            .collect()
    })
}

/// What one pair moved, for the per-node lines.
#[derive(Default, Clone)]
struct PairTally {
    source: String,
    name: String,
    units: u64,
    /// Of `units`, stripes of a file spread over several pairs.
    stripes: u64,
    bytes: u64,
    seconds: f64,
    gave_up: Option<String>,
}

struct Shared {
    queue: Mutex<VecDeque<Unit>>,
    /// Stripes not yet moved, per striped file: when a file's last stripe is in, the file is
    /// published by a unit of its own at the head of the queue, while other units still move
    /// (left to the closing pass, every publish would wait for all units).
    stripes_left: Mutex<std::collections::HashMap<Vec<u8>, usize>>,
    /// Sessions running now: their progress, summed into the display's.
    live: Mutex<Vec<Arc<Progress>>>,
    /// What finished sessions moved.
    done: Mutex<Totals>,
    tallies: Mutex<Vec<PairTally>>,
    busy: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Totals {
    bytes: u64,
    bytes_resent: u64,
    chunks_resent: u64,
    bytes_skipped: u64,
    files_done: u64,
}

fn endpoint_name(ep: &Endpoint) -> String {
    match ep {
        Endpoint::Local(_) => "here".into(),
        Endpoint::Ssh { host, .. } => host.clone(),
        Endpoint::Daemon { host, port, .. } => format!("{host}:{port}"),
    }
}

/// Runs the plan: pairs pull units until the queue is empty, then one closing pass of the whole
/// tree. `progress` is what the display and the report read.
pub(crate) fn run(plan: Plan, spec: &ClientSpec, progress: &Arc<Progress>) -> Result<Summary, TransferError> {
    Progress::add(&progress.bytes_total, plan.bytes);
    Progress::add(&progress.files_total, plan.files);
    // The target exists before the pairs start: several receivers creating it at once would
    // race (one finds it made by another).
    let first_dst = with_path(&plan.pairs[0].1, &plan.target);
    tern_engine::client::remote_fs::request(&dest_side(spec), &first_dst, FsOp::Mkdir, FS_PARENTS)?;
    let mut stripes_left = std::collections::HashMap::new();
    for u in plan.units.iter().filter_map(|u| u.stripe.as_ref()) {
        *stripes_left.entry(u.path.clone()).or_insert(0) += 1;
    }
    let shared = Arc::new(Shared {
        queue: Mutex::new(plan.units.into_iter().collect()),
        stripes_left: Mutex::new(stripes_left),
        live: Mutex::default(),
        done: Mutex::default(),
        tallies: Mutex::default(),
        busy: Default::default(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    {
        let names: Vec<String> = plan.pairs.iter().map(|(_, d)| endpoint_name(d)).collect();
        progress.notices.lock().unwrap().push(format!("spread over {} node pairs (to {})", plan.pairs.len(), names.join(", ")));
    }
    std::thread::scope(|scope| {
        let summer = {
            let (shared, stop, progress) = (shared.clone(), stop.clone(), progress.clone());
            scope.spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    publish_totals(&shared, &progress);
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        let mut known: Vec<String> = plan.pairs.iter().map(|(_, d)| endpoint_name(d)).collect();
        let mut workers = Vec::new();
        for (i, (s, d)) in plan.pairs.iter().enumerate() {
            let w = worker(spec, &plan.source_dir, &plan.target, s.clone(), d.clone(), shared.clone(), i);
            workers.push(scope.spawn(w));
        }
        // Nodes that join either cluster while units remain take work: a new source node and a
        // new destination node form a pair of their own; one without a partner pairs with the
        // other side's nodes in turn.
        let mut known_src: Vec<String> = plan.pairs.iter().map(|(s, _)| endpoint_name(s)).collect();
        let (mut srcs, mut dsts): (Vec<Endpoint>, Vec<Endpoint>) = plan.pairs.iter().cloned().unzip();
        let mut waiting_src: Vec<(Endpoint, Instant)> = Vec::new();
        let mut waiting_dst: Vec<(Endpoint, Instant)> = Vec::new();
        let mut next_refresh = Instant::now() + REFRESH;
        let mut i = plan.pairs.len();
        while workers.iter().any(|w| !w.is_finished()) {
            std::thread::sleep(Duration::from_millis(100));
            if Instant::now() < next_refresh || shared.queue.lock().unwrap().is_empty() {
                continue;
            }
            next_refresh = Instant::now() + REFRESH;
            let new_nodes = |ask: &Option<Endpoint>, asker: &ClientSpec, path: &str, known: &mut Vec<String>| -> Vec<Endpoint> {
                let Some(ask) = ask else { return Vec::new() };
                let Ok(Some(c)) = tern_engine::client::cluster::of(asker, ask) else { return Vec::new() };
                let fresh: Vec<Endpoint> = c.nodes.iter().filter_map(|n| daemon_at(n, path)).filter(|e| !known.contains(&endpoint_name(e))).collect();
                known.extend(fresh.iter().map(endpoint_name));
                fresh
            };
            let now = Instant::now();
            waiting_dst.extend(new_nodes(&plan.refresh, &dest_side(spec), &plan.target, &mut known).into_iter().map(|e| (e, now)));
            waiting_src.extend(new_nodes(&plan.refresh_src, spec, &plan.source_dir, &mut known_src).into_iter().map(|e| (e, now)));
            // Nodes of both sites usually join together but are seen a heartbeat apart: a new
            // node waits two rounds for a partner before it pairs with an old one.
            let mut joined = Vec::new();
            while !waiting_src.is_empty() && !waiting_dst.is_empty() {
                joined.push((waiting_src.remove(0).0, waiting_dst.remove(0).0));
            }
            let stale = |t: &Instant| t.elapsed() >= 2 * REFRESH;
            while waiting_src.first().is_some_and(|(_, t)| stale(t)) {
                joined.push((waiting_src.remove(0).0, dsts[i % dsts.len()].clone()));
            }
            while waiting_dst.first().is_some_and(|(_, t)| stale(t)) {
                joined.push((srcs[i % srcs.len()].clone(), waiting_dst.remove(0).0));
            }
            if !joined.is_empty() {
                recut_queue(&shared, (i + joined.len()) as u64, spec.options.chunk_size);
            }
            for (s, d) in joined {
                progress.notices.lock().unwrap().push(format!("node pair {} to {} joined the transfer", endpoint_name(&s), endpoint_name(&d)));
                workers.push(scope.spawn(worker(spec, &plan.source_dir, &plan.target, s.clone(), d.clone(), shared.clone(), i)));
                srcs.push(s);
                dsts.push(d);
                i += 1;
            }
        }
        stop.store(true, Ordering::SeqCst);
        let _ = summer.join();
    });
    publish_totals(&shared, progress);
    *PAIRS.lock().unwrap() = shared.tallies.lock().unwrap().clone();
    for t in shared.tallies.lock().unwrap().iter() {
        let rate = if t.seconds > 0.0 { t.bytes as f64 * 8.0 / t.seconds / 1e9 } else { 0.0 };
        let mut line = format!("node pair {} to {}: {} units, {} bytes in {:.1} s, {rate:.2} Gb/s", t.source, t.name, t.units, t.bytes, t.seconds);
        if let Some(why) = &t.gave_up {
            line.push_str(&format!("; left the transfer: {why}"));
        }
        progress.notices.lock().unwrap().push(line);
    }
    // The closing pass: the whole tree on the first pair that still answers; every unit's file
    // is found identical, anything a unit could not move is moved (or reported) here.
    let gave_up: Vec<(String, String)> = shared.tallies.lock().unwrap().iter().filter(|t| t.gave_up.is_some()).map(|t| (t.source.clone(), t.name.clone())).collect();
    let (s, d) = plan.pairs.iter().find(|(s, d)| !gave_up.contains(&(endpoint_name(s), endpoint_name(d)))).unwrap_or(&plan.pairs[0]);
    let mut closing = spec.clone();
    closing.options.set_contents(true);
    closing.sources = vec![with_path(s, &plan.source_dir)];
    closing.dest = with_path(d, &plan.target);
    let last = Arc::new(Progress::default());
    let r = tern_engine::client::session::run(&closing, &last);
    let units_done = shared.done.lock().unwrap().files_done;
    Progress::add(&progress.bytes, Progress::get(&last.bytes));
    Progress::add(&progress.bytes_resent, Progress::get(&last.bytes_resent));
    Progress::add(&progress.chunks_resent, Progress::get(&last.chunks_resent));
    Progress::add(&progress.files_done, Progress::get(&last.files_done));
    Progress::add(&progress.files_skipped, Progress::get(&last.files_skipped).saturating_sub(units_done));
    Progress::add(&progress.files_failed, Progress::get(&last.files_failed));
    Progress::add(&progress.errors_omitted, Progress::get(&last.errors_omitted));
    progress.errors.lock().unwrap().extend(std::mem::take(&mut *last.errors.lock().unwrap()));
    progress.notices.lock().unwrap().extend(std::mem::take(&mut *last.notices.lock().unwrap()));
    // The closing pass counts unit files as found identical; they were moved by this run.
    progress.bytes_total.store(plan.bytes.max(Progress::get(&last.bytes_total)), Ordering::Relaxed);
    r.map(|last| Summary {
        files_done: Progress::get(&progress.files_done),
        files_failed: last.files_failed,
        bytes_written: Progress::get(&progress.bytes),
        chunks_resent: Progress::get(&progress.chunks_resent),
        bytes_resent: Progress::get(&progress.bytes_resent),
        deleted: 0,
    })
}

/// `ep` with its path replaced by `p`.
fn with_path(ep: &Endpoint, p: &str) -> Endpoint {
    let mut e = ep.clone();
    match &mut e {
        Endpoint::Local(l) => *l = PathBuf::from(p),
        Endpoint::Ssh { path, .. } | Endpoint::Daemon { path, .. } => *path = p.to_string(),
    }
    e
}

/// The display's counters: finished sessions plus the running ones.
fn publish_totals(shared: &Shared, progress: &Progress) {
    let live = shared.live.lock().unwrap();
    let d = shared.done.lock().unwrap();
    let sum = |f: fn(&Progress) -> u64| live.iter().map(|p| f(p)).sum::<u64>();
    progress.bytes.store(d.bytes + sum(|p| Progress::get(&p.bytes)), Ordering::Relaxed);
    progress.bytes_resent.store(d.bytes_resent + sum(|p| Progress::get(&p.bytes_resent)), Ordering::Relaxed);
    progress.chunks_resent.store(d.chunks_resent + sum(|p| Progress::get(&p.chunks_resent)), Ordering::Relaxed);
    progress.bytes_skipped.store(d.bytes_skipped + sum(|p| Progress::get(&p.bytes_skipped)), Ordering::Relaxed);
    progress.files_done.store(d.files_done + sum(|p| Progress::get(&p.files_done)), Ordering::Relaxed);
    progress.streams.store(sum(|p| Progress::get(&p.streams)), Ordering::Relaxed);
}

/// Pairs joined mid-transfer: the units still queued are cut again to about a unit each for
/// every pair there is now (as `cut` does for the whole tree), so the newcomers find work to take
/// instead of the old pairs keeping the large units cut for fewer of them (measured: with 6 units
/// for 2 pairs, a pair joining at 20 s took one and the copy ended as late as without it).
/// Stripes are cut into smaller stripes (whole chunks), batches of files into smaller batches;
/// a whole file, a unit already tried and a publish stay as they are.
fn recut_queue(shared: &Shared, pairs: u64, chunk_size: u32) {
    // The lock order of `finish_unit`: stripes, then the queue.
    let mut left = shared.stripes_left.lock().unwrap();
    let mut queue = shared.queue.lock().unwrap();
    let queued: u64 = queue.iter().map(|u| u.bytes).sum();
    let size = (queued / (pairs * UNITS_PER_PAIR).max(1)).clamp(UNIT_MIN_BYTES, UNIT_MAX_BYTES);
    let cs = u64::from(chunk_size.max(1));
    let (mut publishes, mut units) = (Vec::new(), Vec::new());
    for u in queue.drain(..) {
        let pieces = ((u.bytes + size / 2) / size).max(1);
        match &u.stripe {
            _ if u.bytes == 0 => publishes.push(u),
            _ if pieces < 2 || u.attempts > 0 => units.push(u),
            Some(st) => {
                let step = (st.end - st.start).div_ceil(pieces).div_ceil(cs) * cs;
                let mut start = st.start;
                let mut n = 0;
                while start < st.end {
                    let end = (start + step).min(st.end);
                    units.push(Unit { paths: u.paths.clone(), sizes: vec![end - start], stripe: Some(Stripe { path: st.path.clone(), start, end }), bytes: end - start, attempts: 0 });
                    start = end;
                    n += 1;
                }
                *left.get_mut(&st.path).expect("every queued stripe is counted") += n - 1;
            }
            None if u.paths.len() > 1 => {
                let mut cur = Unit::default();
                for (path, len) in u.paths.into_iter().zip(u.sizes) {
                    if !cur.paths.is_empty() && cur.bytes + len / 2 > size {
                        units.push(std::mem::take(&mut cur));
                    }
                    cur.bytes += len;
                    cur.paths.push(path);
                    cur.sizes.push(len);
                }
                units.push(cur);
            }
            None => units.push(u),
        }
    }
    units.sort_by_key(|u| std::cmp::Reverse(u.bytes));
    queue.extend(publishes);
    queue.extend(units);
}

/// One pair's loop: take a unit, move it in one session, until the queue is empty or the pair
/// fails (its unit goes back for another pair). A session's first ~0.5 s at 68 ms (its
/// connections, handshakes and ramp) and its last round trips move little: once the pair's rate
/// is known, the next unit's session starts while the last one's tail is still sending, so the
/// link is not idle between units (at most two sessions per pair).
fn worker(spec: &ClientSpec, source_dir: &str, target: &str, src: Endpoint, dst: Endpoint, shared: Arc<Shared>, index: usize) -> impl FnOnce() + Send + 'static {
    let mut base = spec.clone();
    base.options.set_contents(true);
    base.sources = vec![with_path(&src, source_dir)];
    base.dest = with_path(&dst, target);
    base.retry_for = UNIT_RETRY;
    let (name, source) = (endpoint_name(&dst), endpoint_name(&src));
    move || {
        let mut tally = PairTally { name, source, ..Default::default() };
        std::thread::scope(|scope| {
            let mut running: VecDeque<Running<'_>> = VecDeque::new();
            let mut busy_since: Option<Instant> = None;
            let mut leaving = false;
            loop {
                if let Some(i) = running.iter().position(|r| r.handle.is_finished()) {
                    let r = running.remove(i).expect("found");
                    leaving |= !finish_unit(r, &shared, &mut tally, index);
                    if running.is_empty()
                        && let Some(t) = busy_since.take()
                    {
                        tally.seconds += t.elapsed().as_secs_f64();
                    }
                    continue;
                }
                if leaving {
                    if running.is_empty() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                if running.is_empty() || (running.len() == 1 && ends_soon(&running[0], &tally)) {
                    if let Some(unit) = shared.queue.lock().unwrap().pop_front() {
                        busy_since.get_or_insert_with(Instant::now);
                        running.push_back(start_unit(scope, &base, unit, &shared));
                        continue;
                    }
                    // Units still running elsewhere may come back if their pair fails.
                    if running.is_empty() && shared.busy.load(Ordering::SeqCst) == 0 {
                        break;
                    }
                }
                std::thread::sleep(Duration::from_millis(if running.is_empty() { 100 } else { 20 }));
            }
        });
        shared.tallies.lock().unwrap().push(tally);
    }
}

/// How long before a session's predicted end the pair's next one starts: its connections and
/// handshakes (~6 round trips) and the start of its ramp.
const LOOK_AHEAD: Duration = Duration::from_millis(1000);

/// A unit's session, running on its own thread.
struct Running<'scope> {
    unit: Unit,
    spec: ClientSpec,
    progress: Arc<Progress>,
    started: Instant,
    handle: std::thread::ScopedJoinHandle<'scope, Result<Summary, TransferError>>,
}

fn start_unit<'scope>(scope: &'scope std::thread::Scope<'scope, '_>, base: &ClientSpec, mut unit: Unit, shared: &Shared) -> Running<'scope> {
    shared.busy.fetch_add(1, Ordering::SeqCst);
    let mut s = base.clone();
    s.files_from = Some(Arc::new(std::mem::take(&mut unit.paths)));
    s.stripe = unit.stripe.clone();
    let p = Arc::new(Progress::default());
    shared.live.lock().unwrap().push(p.clone());
    let (spec, progress) = (s.clone(), p.clone());
    let handle = scope.spawn(move || tern_engine::client::session::run(&spec, &progress));
    Running { unit, spec: s, progress: p, started: Instant::now(), handle }
}

/// Whether `r` should end within [`LOOK_AHEAD`]: all its data is out (a third-party session's
/// bytes count when a file's last chunk is sent), or so says the rate this pair moved its
/// finished units at.
fn ends_soon(r: &Running<'_>, tally: &PairTally) -> bool {
    if Progress::get(&r.progress.bytes) + Progress::get(&r.progress.bytes_skipped) >= r.unit.bytes {
        return true;
    }
    if tally.seconds <= 0.0 || tally.bytes == 0 {
        return false;
    }
    let rate = tally.bytes as f64 / tally.seconds;
    let expected = Duration::from_secs_f64(r.unit.bytes as f64 / rate);
    r.started.elapsed() + LOOK_AHEAD >= expected
}

/// A unit's session ended: count it, publish a striped file whose last stripe this was, or put
/// the unit back. False when the pair should leave (its network failed).
fn finish_unit(r: Running<'_>, shared: &Shared, tally: &mut PairTally, index: usize) -> bool {
    let Running { mut unit, mut spec, progress: p, handle, .. } = r;
    let result = handle.join().unwrap_or_else(|_| Err(TransferError::fatal(Side::Network, "a unit's session panicked".to_string())));
    {
        let mut live = shared.live.lock().unwrap();
        live.retain(|x| !Arc::ptr_eq(x, &p));
        let mut d = shared.done.lock().unwrap();
        d.bytes += Progress::get(&p.bytes);
        d.bytes_resent += Progress::get(&p.bytes_resent);
        d.chunks_resent += Progress::get(&p.chunks_resent);
        d.bytes_skipped += Progress::get(&p.bytes_skipped);
        // A stripe's file is published by the closing pass, and counted there.
        if unit.stripe.is_none() {
            d.files_done += Progress::get(&p.files_done);
        }
    }
    tally.bytes += Progress::get(&p.bytes);
    match result {
        Ok(_) => {
            tally.units += 1;
            tally.stripes += u64::from(unit.stripe.is_some());
            if let Some(st) = &unit.stripe {
                let mut left = shared.stripes_left.lock().unwrap();
                let n = left.get_mut(&st.path).expect("every stripe is counted");
                *n -= 1;
                if *n == 0 {
                    left.remove(&st.path);
                    // With nothing else left to move, the closing pass publishes it (one
                    // session fewer at the very end, where nothing runs beside it).
                    let mut queue = shared.queue.lock().unwrap();
                    if !queue.is_empty() || shared.busy.load(Ordering::SeqCst) > 1 {
                        queue.push_front(Unit { paths: vec![st.path.clone()], ..Unit::default() });
                    }
                }
            }
            shared.busy.fetch_sub(1, Ordering::SeqCst);
            true
        }
        Err(e) => {
            tracing::info!("pair {index} ({}): unit of {} files failed: {e}", tally.name, spec.files_from.as_ref().map_or(0, |l| l.len()));
            unit.paths = Arc::try_unwrap(spec.files_from.take().unwrap()).unwrap_or_else(|a| (*a).clone());
            unit.attempts += 1;
            if unit.attempts < UNIT_ATTEMPTS {
                shared.queue.lock().unwrap().push_front(unit);
            }
            shared.busy.fetch_sub(1, Ordering::SeqCst);
            // A pair whose network failed leaves (its unit resumes on another pair); one whose
            // unit failed on a side goes on with the next unit.
            if e.side == Side::Network || e.kind == ErrorKind::ControlClosed {
                tally.gave_up = Some(e.to_string());
                return false;
            }
            std::thread::sleep(Duration::from_millis(200));
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_are_bounded_and_cover_every_file_once() {
        let files: Vec<(Vec<u8>, u64)> = (0..25_000u64).map(|i| (format!("d/{i}").into_bytes(), if i % 1000 == 0 { 200 << 20 } else { 4096 })).collect();
        let total: u64 = files.iter().map(|f| f.1).sum();
        let units = cut(files.clone(), 3, total, None);
        let mut seen: Vec<Vec<u8>> = units.iter().flat_map(|u| u.paths.clone()).collect();
        seen.sort();
        let mut want: Vec<Vec<u8>> = files.into_iter().map(|f| f.0).collect();
        want.sort();
        assert_eq!(seen, want);
        assert!(units.iter().all(|u| u.paths.len() <= UNIT_FILES));
        assert!(units.windows(2).all(|w| w[0].bytes >= w[1].bytes), "largest first");
        assert!(units.len() >= 6, "enough units for 3 pairs to balance: {}", units.len());
    }

    #[test]
    fn a_pair_joining_finds_the_queued_units_cut_for_every_pair_now() {
        const CS: u64 = 4 << 20;
        let files: Vec<Listed> = (0..60u64).map(|i| (format!("h/{i}").into_bytes(), (1 + i % 7) << 20)).chain([(b"big".to_vec(), 3 << 30)]).collect();
        let total: u64 = files.iter().map(|f| f.1).sum();
        let units = cut(files.clone(), 2, total, Some(CS as u32));
        let mut stripes_left = std::collections::HashMap::new();
        for st in units.iter().filter_map(|u| u.stripe.as_ref()) {
            *stripes_left.entry(st.path.clone()).or_insert(0) += 1;
        }
        let shared = Shared {
            queue: Mutex::new(std::iter::once(Unit { paths: vec![b"done".to_vec()], ..Unit::default() }).chain(units).collect()),
            stripes_left: Mutex::new(stripes_left),
            live: Mutex::default(),
            done: Mutex::default(),
            tallies: Mutex::default(),
            busy: Default::default(),
        };
        let before = shared.queue.lock().unwrap().len();
        recut_queue(&shared, 4, CS as u32);
        let queue = shared.queue.lock().unwrap();
        assert!(queue.len() >= before * 2 - 2, "{before} units became {}", queue.len());
        assert_eq!(queue[0].paths, vec![b"done".to_vec()], "a publish stays at the head");
        // Every file once, every byte of the big file in exactly one stripe, the stripes counted.
        let mut seen: Vec<Vec<u8>> = queue.iter().filter(|u| u.stripe.is_none() && u.bytes > 0).flat_map(|u| u.paths.clone()).collect();
        seen.sort();
        let mut want: Vec<Vec<u8>> = files.iter().filter(|f| f.0 != b"big").map(|f| f.0.clone()).collect();
        want.sort();
        assert_eq!(seen, want);
        let mut ranges: Vec<(u64, u64)> = queue.iter().filter_map(|u| u.stripe.as_ref()).map(|s| (s.start, s.end)).collect();
        ranges.sort();
        assert!(ranges.windows(2).all(|w| w[0].1 == w[1].0) && ranges[0].0 == 0 && ranges.last().unwrap().1 == 3 << 30);
        assert!(ranges.iter().all(|&(s, _)| s % CS == 0));
        assert_eq!(shared.stripes_left.lock().unwrap()[b"big".as_slice()], ranges.len());
        let sum: u64 = queue.iter().map(|u| u.bytes).sum();
        assert_eq!(sum, total);
        assert!(queue.iter().skip(1).collect::<Vec<_>>().windows(2).all(|w| w[0].bytes >= w[1].bytes), "largest first");
    }

    #[test]
    fn a_file_larger_than_a_unit_is_a_unit_of_its_own() {
        let units = cut(vec![(b"a".to_vec(), 5 << 30), (b"b".to_vec(), 1), (b"c".to_vec(), 2 << 30)], 2, 7 << 30, None);
        assert_eq!(units.len(), 3);
        assert_eq!(units[0].paths, vec![b"a".to_vec()]);
    }

    #[test]
    fn a_file_larger_than_a_unit_is_cut_into_chunk_aligned_stripes_that_cover_it_once() {
        const CS: u64 = 4 << 20;
        let len = (3 << 30) + 12345;
        let units = cut(vec![(b"big".to_vec(), len), (b"small".to_vec(), 10)], 3, len + 10, Some(CS as u32));
        let stripes: Vec<&Stripe> = units.iter().filter_map(|u| u.stripe.as_ref()).collect();
        assert_eq!(stripes.len(), 9, "about one unit each: three per pair");
        let mut ranges: Vec<(u64, u64)> = stripes.iter().map(|s| (s.start, s.end)).collect();
        ranges.sort();
        assert_eq!(ranges[0].0, 0);
        assert_eq!(ranges.last().unwrap().1, len);
        assert!(ranges.windows(2).all(|w| w[0].1 == w[1].0), "contiguous, no overlap");
        assert!(ranges.iter().all(|&(s, e)| s % CS == 0 && (e % CS == 0 || e == len)), "whole chunks");
        assert!(units.iter().any(|u| u.stripe.is_none() && u.paths == vec![b"small".to_vec()]));
        // The bed's datasets: every pair gets the same number of stripes.
        let count = |files: Vec<Listed>, pairs: u64| {
            let total = files.iter().map(|f| f.1).sum();
            cut(files, pairs, total, Some(CS as u32)).iter().filter(|u| u.stripe.is_some()).count()
        };
        assert_eq!(count(vec![(b"one".to_vec(), 3 << 30)], 3), 9, "3 GiB over 3 pairs: 9 stripes, not 10");
        assert_eq!(count(vec![(b"one".to_vec(), 3 << 30)], 2), 6);
        assert_eq!(count((0..4).map(|i| (vec![b'f', i], 1 << 30)).collect(), 3), 3, "4 × 1 GiB over 3 pairs: one file striped");
        assert_eq!(count((0..4).map(|i| (vec![b'f', i], 1 << 30)).collect(), 2), 0, "4 × 1 GiB over 2 pairs: whole files balance");
        // Many files of mixed sizes: as many units as 3 per pair, within a few percent of each
        // other, so the pairs finish together.
        let files: Vec<Listed> = (0..600u64).map(|i| (format!("h/{i}").into_bytes(), (1 + (i * 7919) % 13) << 20)).collect();
        let total: u64 = files.iter().map(|f| f.1).sum();
        let units = cut(files, 3, total, Some(CS as u32));
        assert_eq!(units.len(), 9, "{:?}", units.iter().map(|u| u.bytes >> 20).collect::<Vec<_>>());
        assert!(makespan(&units, 3) * 100 <= total.div_ceil(3) * 105, "pairs within 5 %");
    }
}
