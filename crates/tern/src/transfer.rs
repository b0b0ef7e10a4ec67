//! `tern cp` and `tern sync`: the arguments become the engine's `ClientSpec` (which `tern
//! watch` uses per unit too), local sources are checked first, and the transfer runs with its
//! progress display, `-v` file list and `--fail-fast` watcher.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tern_engine::client::session::{ClientSpec, SshOptions};
use tern_engine::endpoint::Endpoint;
use tern_engine::progress::Progress;
use tern_proto::Options;

use crate::args::{Common, Fsync, Verify};
use crate::output;

/// `-v`: transfers list each file as it lands, as rsync -v does.
pub(crate) static VERBOSE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// `sync --delete` and whether an empty source may empty the destination.
#[derive(Clone, Copy, Default)]
pub(crate) struct Delete {
    pub(crate) extras: bool,
    pub(crate) from_empty: bool,
}

pub(crate) fn transfer(srcs: &[String], dst: &str, recursive: bool, sync: bool, checksum: bool, delete: Delete, c: &Common) -> Result<ExitCode> {
    let progress = Arc::new(Progress::default());
    let srcs = &usable_sources(srcs, dst, recursive, c.dry_run, &progress)?;
    refuse_copy_into_itself(srcs, dst, sync || c.files_from.is_some() || srcs.iter().any(|s| contents_of(s)))?;
    let mut spec = client_spec(srcs, dst, recursive, sync, checksum, delete, c)?;
    // Remote globs (`'host:/dir/*.h5'`) are expanded on the far side, as scp and rsync do.
    if !sync && let Err(e) = tern_engine::client::remote_fs::expand_sources(&mut spec) {
        return Ok(output::report(&progress, Err(e), 0.0, c.json, c.dry_run, c.quiet));
    }
    let spread = crate::spread::plan(&spec, srcs.iter().any(|s| contents_of(s)), sync, c.dry_run)?;
    if c.compat.compress && !c.quiet {
        eprintln!("tern: -z ignored: tern does not compress; data moves at network speed without it (most scientific data does not compress anyway)");
    }
    let display = (!c.quiet && !c.json && std::io::IsTerminal::is_terminal(&std::io::stderr())).then(|| output::Display::start(progress.clone()));
    if VERBOSE.load(std::sync::atomic::Ordering::Relaxed) > 0 && !c.quiet {
        list_files_as_they_land(&progress, display.as_ref().map(output::Display::bar), c.json || c.progress_json);
    }
    let ticker = c.progress_json.then(|| output::JsonTicker::start(progress.clone()));
    let started = Instant::now();
    if c.fail_fast {
        let (p, json) = (progress.clone(), c.json);
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(50));
                if !p.errors.lock().unwrap().is_empty() {
                    stop_at_first_failure(&p, started, json);
                }
            }
        });
    }
    let result = match spread {
        Some(plan) => crate::spread::run(plan, &spec, &progress),
        None => tern_engine::client::session::run(&spec, &progress),
    };
    if c.fail_fast && !progress.errors.lock().unwrap().is_empty() {
        stop_at_first_failure(&progress, started, c.json);
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut tested = None;
    if result.is_ok() && !c.dry_run && Progress::get(&progress.files_failed) == 0 {
        let files = Progress::get(&progress.files_done) + Progress::get(&progress.files_skipped);
        tested = crate::plan::record(&spec.sources[0], &spec.dest, Progress::get(&progress.bytes), files, seconds, Progress::get(&progress.streams));
    }
    if let Some(d) = display {
        d.finish();
    }
    if let Some(t) = ticker {
        t.finish();
    }
    if !c.quiet {
        for n in progress.notices.lock().unwrap().iter() {
            eprintln!("tern: {}", crate::output::printable(n));
        }
        if let Some(expected) = tested {
            let rate = Progress::get(&progress.bytes) as f64 * 8.0 / seconds / 1e9;
            eprintln!("tern: {rate:.2} Gb/s; the last tern test of this path expected {expected:.2} Gb/s ({:.0} %; tern plan --history lists both)", 100.0 * rate / expected);
        }
    }
    Ok(output::report(&progress, result, seconds, c.json, c.dry_run, c.quiet))
}

/// rsync -v's file list: each file's path as it lands, on stdout (on stderr when stdout carries
/// JSON), above the live display.
fn list_files_as_they_land(progress: &Progress, bar: Option<indicatif::ProgressBar>, stdout_is_json: bool) {
    let _ = progress.on_landed.set(Box::new(move |rel: &[u8]| {
        let name = String::from_utf8_lossy(rel);
        let line = crate::output::printable(&name);
        let print = || {
            use std::io::Write;
            let _ = if stdout_is_json { writeln!(std::io::stderr().lock(), "{line}") } else { writeln!(std::io::stdout().lock(), "{line}") };
        };
        match &bar {
            Some(b) => b.suspend(print),
            None => print(),
        }
    }));
}

/// Of several local sources, those that can be copied: as cp and rsync do, a missing one (or a
/// directory without -r) is reported as a source error, one line, and the rest are copied; the
/// exit status is then 1. The engine refuses the whole transfer when one source is missing, so
/// the CLI checks local sources first. Remote sources, a single source, or none usable: all are
/// handed on and the engine reports the first bad one as before.
fn usable_sources(srcs: &[String], dst: &str, recursive: bool, dry_run: bool, progress: &Progress) -> Result<Vec<String>> {
    use tern_engine::error::{Side, TransferError, err_text};
    if srcs.len() < 2 {
        return Ok(srcs.to_vec());
    }
    let (mut kept, mut errors) = (Vec::new(), Vec::new());
    for s in srcs {
        let Ok(Endpoint::Local(path)) = Endpoint::parse(s) else { return Ok(srcs.to_vec()) };
        match std::fs::symlink_metadata(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                errors.push(TransferError::file(Side::Source, s.clone(), format!("{} (check the source path; the other sources are copied)", err_text(&e))))
            }
            Err(e) => errors.push(TransferError::file(Side::Source, s.clone(), format!("cannot read: {} (the other sources are copied)", err_text(&e)))),
            Ok(md) if md.is_dir() && !recursive => errors.push(TransferError::file(Side::Source, s.clone(), "is a directory, skipped (use -r to copy directories)")),
            Ok(_) => kept.push(s.clone()),
        }
    }
    if errors.is_empty() || kept.is_empty() {
        return Ok(srcs.to_vec());
    }
    if kept.len() == 1 {
        // Several sources make DST a directory (created if missing); one source alone would
        // be renamed to DST, so DST is made the directory several would have made.
        let Ok(Endpoint::Local(dest)) = Endpoint::parse(dst) else { return Ok(srcs.to_vec()) };
        match std::fs::metadata(&dest) {
            Ok(md) if md.is_dir() => {}
            Ok(_) => bail!("destination: {} is a file, but a directory is needed for several sources; choose a directory path", dest.display()),
            Err(_) if dry_run => return Ok(srcs.to_vec()),
            Err(_) => std::fs::create_dir(&dest).map_err(|e| anyhow::anyhow!("destination: {}: cannot create directory: {} (create its parent first)", dest.display(), err_text(&e)))?,
        }
    }
    progress.errors.lock().unwrap().extend(errors);
    Ok(kept)
}

/// `--fail-fast`: the first per-file error ends the transfer (and this process) as a failure,
/// reported as one line naming the file. The engine's other threads and any ssh child die with
/// the process; what landed is verified and journaled, so a re-run resumes.
fn stop_at_first_failure(p: &Progress, started: Instant, json: bool) -> ! {
    static STOPPING: std::sync::Mutex<bool> = std::sync::Mutex::new(false);
    {
        let mut s = STOPPING.lock().unwrap_or_else(|e| e.into_inner());
        if *s {
            drop(s);
            // The other caller is reporting and exits the process.
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        }
        *s = true;
    }
    let mut first = std::mem::take(&mut *p.errors.lock().unwrap()).swap_remove(0);
    first.message = format!("{}; stopped at the first failure (--fail-fast)", first.message);
    let _ = output::report(p, Err(first), started.elapsed().as_secs_f64(), json, false, false);
    let _ = std::io::Write::flush(&mut std::io::stdout());
    std::process::exit(1);
}

/// The engine's settings for a copy, as `cp` and `sync` use them and `watch` per unit.
pub(crate) fn client_spec(srcs: &[String], dst: &str, recursive: bool, sync: bool, checksum: bool, delete: Delete, c: &Common) -> Result<ClientSpec> {
    let sources = srcs.iter().map(|s| Endpoint::parse(s).map_err(|e| anyhow::anyhow!("source: {e}"))).collect::<Result<Vec<_>>>()?;
    let dest = Endpoint::parse(dst).map_err(|e| anyhow::anyhow!("destination: {e}"))?;
    let first_host = sources[0].host_key();
    if sources.iter().any(|s| s.host_key() != first_host) {
        bail!("all sources must be on the same host (copy from each host separately)");
    }
    let third_party = !sources[0].is_local() && !dest.is_local();
    if third_party && ![&sources[0], &dest].iter().all(|e| matches!(e, Endpoint::Daemon { .. })) {
        bail!("both ends are remote: that works between two tern:// daemons only (for ssh endpoints run tern on one of the hosts)");
    }
    if third_party && (c.reverse || c.bwlimit.and_then(|r| r.0).is_some()) {
        bail!("--reverse and --bwlimit do not apply to a tern:// to tern:// copy (the daemons move the data)");
    }
    if c.reverse && ![&sources[0], &dest].iter().any(|e| matches!(e, Endpoint::Ssh { .. })) {
        bail!("--reverse works with [user@]host:path endpoints (a daemon always accepts connections)");
    }
    let chunk_size = u32::try_from(c.chunk_size).ok().filter(|&s| (tern_proto::limits::MIN_CHUNK_SIZE..=tern_proto::limits::MAX_CHUNK_SIZE).contains(&s));
    let Some(chunk_size) = chunk_size else { bail!("--chunk-size must be between 64K and 64M") };
    let files_from = match &c.files_from {
        Some(file) => {
            if sources.len() != 1 {
                bail!("--files-from takes one SRC directory (the listed paths are relative to it)");
            }
            if delete.extras {
                bail!("--delete with --files-from would remove everything not listed; use one or the other");
            }
            Some(Arc::new(read_file_list(file)?))
        }
        None => None,
    };
    let local = sources[0].is_local() && dest.is_local();
    // Eight streams fill a 1 Gb/s, 68 ms path even with 4 MiB socket buffers; more come if
    // they help (the ramp). Locally, streams are I/O workers: four keep a disk busy.
    // A pair whose last large transfer ramped higher starts there (`plan::learned_streams`).
    let default_streams = if local { 4 } else { crate::plan::learned_streams(&crate::history::pair_key(&sources[0], &dest)).unwrap_or(8).max(8) };
    let streams = c.streams.unwrap_or(default_streams).clamp(1, 64);
    let mut options = Options { flags: 0, chunk_size, streams, concurrency: c.concurrency.unwrap_or(0).min(1 << 20) };
    options.set_recursive(recursive);
    options.set_sync(sync);
    options.set_contents(sync || files_from.is_some() || srcs.iter().any(|s| contents_of(s)));
    options.set_checksum(checksum);
    options.set_delete(delete.extras);
    options.set_delete_from_empty(delete.from_empty);
    options.set_dry_run(c.dry_run);
    options.set_verify_full(c.verify == Verify::Full);
    options.set_no_encrypt(c.no_encrypt);
    options.set_preserve(!c.no_preserve);
    options.set_fsync_none(c.fsync == Fsync::None);
    options.set_ignore_existing(c.ignore_existing);
    options.set_safe_links(c.safe_links);
    options.set_hard_links(!c.no_hard_links);
    let spec = ClientSpec {
        sources,
        dest,
        options,
        adaptive: c.streams.is_none() && !local && !third_party,
        max_streams: 32,
        ssh: SshOptions { port_range: c.port_range, reverse: c.reverse, ..ssh_options(c.ssh.as_deref(), c.remote_bin.clone(), c.install_remote, c.no_install, !c.no_ssh_reuse) },
        token_file: c.token_file.clone(),
        dst_token_file: c.dst_token_file.clone(),
        bwlimit: c.bwlimit.and_then(|r| r.0),
        bufsize: c.tcp_buffer.map(|b| b as usize),
        retry_for: Duration::from_secs(c.retry_for),
        filters: c.filters.rules.clone(),
        files_from,
        stripe: None,
        fences: tern_engine::client::session::Fences { src: c.src_beneath.clone(), dst: c.dst_beneath.clone() },
    };
    Ok(spec)
}

/// `src/.` (or `.`) copies the contents, as cp does; sync always mirrors contents.
fn contents_of(s: &str) -> bool {
    let t = s.trim_end_matches('/');
    t == "." || t.ends_with("/.") || t.ends_with(":.") || t.ends_with(':')
}

/// A local copy whose destination lies in (or is) one of its source directories would copy
/// what it writes, or each file onto itself: refused in one line, as cp does.
fn refuse_copy_into_itself(srcs: &[String], dst: &str, contents: bool) -> Result<()> {
    let Ok(Endpoint::Local(dest)) = Endpoint::parse(dst) else { return Ok(()) };
    // The destination is followed when it is a link (the engine writes through it).
    let Some(dest_abs) = dest.canonicalize().ok().or_else(|| resolve(&dest)) else { return Ok(()) };
    let into_dir = srcs.len() > 1 || dest_abs.is_dir();
    for s in srcs {
        let Ok(Endpoint::Local(src)) = Endpoint::parse(s) else { return Ok(()) };
        let Ok(md) = std::fs::symlink_metadata(&src) else { continue };
        let Some(src_abs) = resolve(&src) else { continue };
        // Where this source lands, and how the user would write that place.
        let name = src_abs.file_name().map(|n| n.to_os_string());
        let (landing, shown) = match name {
            Some(n) if into_dir && !contents => (dest_abs.join(&n), format!("{}/{}", dst.trim_end_matches('/'), n.to_string_lossy())),
            _ => (dest_abs.clone(), dst.to_string()),
        };
        if landing == src_abs {
            bail!("destination: '{s}' and '{shown}' are the same {}; choose another destination", if md.is_dir() { "directory" } else { "file" });
        }
        if md.is_dir() && landing.starts_with(&src_abs) {
            bail!("destination: cannot copy a directory, '{s}', into itself, '{shown}'; choose a destination outside the source");
        }
    }
    Ok(())
}

/// `p` made absolute with symlinks resolved, except its last component (a symlink is copied as
/// a link, not followed); a path that does not exist yet resolves through its nearest existing
/// ancestor.
fn resolve(p: &std::path::Path) -> Option<PathBuf> {
    use std::path::Component;
    let abs = std::path::absolute(p).ok()?;
    let name = match abs.components().next_back()? {
        Component::Normal(n) => n.to_os_string(),
        // `.`, `..`, `/`: a directory that exists (or nothing to check).
        _ => return abs.canonicalize().ok(),
    };
    let mut existing = abs.parent()?.to_path_buf();
    let mut rest = Vec::new();
    while !existing.exists() {
        match existing.components().next_back()? {
            Component::Normal(n) => rest.push(n.to_os_string()),
            _ => return None,
        }
        existing = existing.parent()?.to_path_buf();
    }
    let mut out = existing.canonicalize().ok()?;
    out.extend(rest.iter().rev());
    out.push(name);
    Some(out)
}

/// `--files-from`: one path per line, relative to SRC (a leading `/` or `./` is dropped); blank
/// lines and lines starting with `#` are skipped. Names are bytes: non-UTF-8 names work.
fn read_file_list(file: &std::path::Path) -> Result<Vec<Vec<u8>>> {
    let text = if file.as_os_str() == "-" {
        let mut b = Vec::new();
        std::io::Read::read_to_end(&mut std::io::stdin(), &mut b).context("--files-from -: cannot read standard input")?;
        b
    } else {
        std::fs::read(file).with_context(|| format!("cannot read --files-from {} (source side, this host)", file.display()))?
    };
    let (mut out, mut bytes) = (Vec::new(), 0usize);
    for (n, line) in text.split(|&b| b == b'\n').enumerate() {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() || line.starts_with(b"#") {
            continue;
        }
        let mut p = line;
        while let Some(rest) = p.strip_prefix(b"/").or_else(|| p.strip_prefix(b"./")) {
            p = rest;
        }
        let p = p.strip_suffix(b"/").unwrap_or(p);
        if let Err(e) = tern_proto::path::validate_relative(p) {
            bail!("--files-from {} line {}: '{}': {e}; list paths inside SRC", file.display(), n + 1, String::from_utf8_lossy(line));
        }
        bytes += p.len();
        if out.len() >= tern_proto::msg::MAX_FILE_LIST || bytes > tern_proto::msg::MAX_FILE_LIST_BYTES {
            bail!(
                "--files-from {} lists more than {} paths or {} MiB of names; split it into several transfers",
                file.display(),
                tern_proto::msg::MAX_FILE_LIST,
                tern_proto::msg::MAX_FILE_LIST_BYTES >> 20
            );
        }
        out.push(p.to_vec());
    }
    Ok(out)
}

/// The ssh side of a client request, as `cp`/`sync` and the file-system commands take it from
/// their flags (`--ssh`, `--remote-bin`, `--install-remote`, `--no-install`, `--no-ssh-reuse`);
/// no port range and no `--reverse`.
pub(crate) fn ssh_options(ssh: Option<&str>, remote_bin: Option<String>, install_remote: bool, no_install: bool, reuse: bool) -> SshOptions {
    SshOptions {
        command: ssh.map(|s| s.split_whitespace().map(str::to_string).collect()).unwrap_or_default(),
        remote_bin,
        install: match (install_remote, no_install) {
            (true, _) => tern_engine::client::bootstrap::Install::Always,
            (_, true) => tern_engine::client::bootstrap::Install::Never,
            _ => tern_engine::client::bootstrap::Install::IfMissing,
        },
        port_range: None,
        reverse: false,
        reuse,
    }
}
