//! Argument definitions and their translation into engine settings.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Args, Parser, Subcommand, ValueEnum};
use tern_engine::endpoint::Endpoint;
use tern_engine::progress::Progress;
use tern_engine::server::Roots;
use tern_engine::session::{ClientSpec, SshOptions};
use tern_proto::Options;

use crate::output;

#[derive(Parser)]
#[command(name = "tern", version, about = "Move scientific data at the speed of the network, as simply as scp")]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
    /// More log output (-v info, -vv debug), on stderr.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,
}

#[derive(Subcommand)]
enum Command {
    /// Copy files and directories: SRC... DST, each a path, [user@]host:path, scp://[user@]host[:port]/path or tern://host[:port]/path.
    Cp(CpArgs),
    /// Make DST a mirror of SRC's contents: skips identical files (size+mtime, or --checksum).
    Sync(SyncArgs),
    /// Run a daemon serving its roots to clients holding the token.
    Serve(ServeArgs),
    /// List a directory: a path, [user@]host:path or tern://host[:port]/path (-l long, -R recursive, --json).
    Ls(crate::fs_cli::LsArgs),
    /// Show one entry's type, size, mode and mtime (a final symlink is not followed).
    Stat(crate::fs_cli::StatArgs),
    /// Create a directory, locally, over ssh or on a daemon (-p: with its parents).
    Mkdir(crate::fs_cli::MkdirArgs),
    /// Remove a file or symlink (-r: a directory tree, never following links; -f: missing is fine).
    Rm(crate::fs_cli::RmArgs),
    /// Ship each unit (file or snapshot directory) of SRC_DIR to DST as soon as it is complete.
    Watch(crate::watch_cli::WatchArgs),
    /// The managed service's client commands: submit, jobs, status, wait, cancel, retry, token.
    #[command(flatten)]
    Service(crate::service_cli::ServiceCommand),
    /// Check this host against the data-transfer-node tuning list (socket buffers, congestion
    /// control, pacing, MTU, NIC errors, CPU governor, limits, clock, file systems of PATHs):
    /// each finding with why it matters and the command that fixes it.
    Doctor(crate::doctor::DoctorArgs),
    /// Print a shell completion script: bash, zsh, fish, elvish or powershell (see README, Install).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print tern's man page (roff) on stdout: tern man > ~/.local/share/man/man1/tern.1;
    /// `tern man cp` prints tern-cp(1), with every option of that command.
    Man {
        /// A command (cp, sync, serve, watch, ...) for its own page.
        command: Option<String>,
    },
    /// (internal) the far end of an ssh-mode transfer; speaks the protocol on stdin/stdout.
    #[command(name = "_remote", hide = true)]
    Remote {
        #[arg(long, value_parser = parse_range)]
        port_range: Option<(u16, u16)>,
        #[arg(long)]
        reverse_port: Option<u16>,
    },
}

#[derive(Args)]
struct CpArgs {
    /// Copy directories recursively.
    #[arg(short, long)]
    recursive: bool,
    /// Sources, then the destination.
    #[arg(required = true, num_args = 2.., value_name = "SRC... DST")]
    paths: Vec<String>,
    #[command(flatten)]
    common: Common,
}

#[derive(Args)]
struct SyncArgs {
    src: String,
    dst: String,
    /// rsync -r: sync always walks the whole tree.
    #[arg(short, long, hide = true)]
    recursive: bool,
    /// Compare content hashes instead of size and mtime (reads both sides).
    #[arg(long)]
    checksum: bool,
    /// Delete destination files that are not in the source.
    #[arg(long)]
    delete: bool,
    /// With --delete, let an empty source empty the destination (rsync does so silently; tern
    /// refuses without this, since an empty source is more often an unmounted file system).
    #[arg(long, requires = "delete")]
    delete_empty_source: bool,
    #[command(flatten)]
    common: Common,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Verify {
    /// Hash every chunk as it is received and the whole file before the rename.
    Stream,
    /// Also re-read the written data from storage before declaring success.
    Full,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Fsync {
    /// Make files durable in batches (one syncfs) before renaming them into place.
    Batch,
    /// Skip syncing: a crash of the OS may lose recently renamed files.
    None,
}

#[derive(Args)]
pub(crate) struct Common {
    /// Parallel TCP data streams (default: start at 8 and add while throughput grows).
    #[arg(long)]
    streams: Option<u16>,
    /// Files in flight at once (default 16384, or half the descriptor limit; the receiver also caps wanted bytes at 512 MiB).
    #[arg(long)]
    concurrency: Option<u32>,
    /// Chunk size for striping and verification, e.g. 4M. The 1M default keeps each chunk's
    /// read, hash, encryption and send within the CPU's cache (on 2 cores, loopback: 4 GiB in
    /// 3.4 s with 1M, 3.6-3.9 s with 4M; the same on a 68 ms path).
    #[arg(long, value_parser = parse_size, default_value = "1M")]
    chunk_size: u64,
    /// Cap the rate: KiB/s like rsync (--bwlimit 1000), or with a unit: 100M (MiB/s), 500KB
    /// (decimal bytes), 800Mbit or 1Gbps (bits/s). 0 means no limit.
    #[arg(long, value_parser = parse_rate)]
    bwlimit: Option<Rate>,
    /// Send data unencrypted (every chunk stays authenticated with keyed BLAKE3).
    #[arg(long)]
    no_encrypt: bool,
    #[arg(long, value_enum, default_value = "stream")]
    verify: Verify,
    /// Keep mode and mtime (the default; -p as in scp, cp and rsync).
    #[arg(short = 'p', long, overrides_with = "no_preserve")]
    preserve: bool,
    /// Do not keep mode and mtime.
    #[arg(long)]
    no_preserve: bool,
    #[arg(long, value_enum, default_value = "batch")]
    fsync: Fsync,
    /// Show what would be done, change nothing.
    #[arg(short = 'n', long)]
    pub(crate) dry_run: bool,
    /// Print one JSON summary object on stdout at the end.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also print a JSON progress line on stdout every second (for supervisors such as the
    /// service): {"progress": {"bytes", "bytes_total", "files_done", "files_total", ...}}.
    #[arg(long)]
    pub(crate) progress_json: bool,
    /// No progress display, no notes.
    #[arg(short, long)]
    pub(crate) quiet: bool,
    /// The ssh command for [user@]host: endpoints, e.g. --ssh 'ssh -i KEY' (-e and --rsh as
    /// in rsync).
    #[arg(short = 'e', long, visible_alias = "rsh", value_name = "CMD", env = "TERN_SSH")]
    ssh: Option<String>,
    /// tern's path on the remote host.
    #[arg(long, env = "TERN_REMOTE_BIN")]
    remote_bin: Option<String>,
    /// Send this binary to the remote host's ~/.cache/tern even if that build is there
    /// (tern installs itself there by default when it is missing).
    #[arg(long, conflicts_with = "no_install")]
    install_remote: bool,
    /// Never install tern on the remote host: fail if neither ~/.cache/tern nor PATH has
    /// this version.
    #[arg(long, env = "TERN_NO_INSTALL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    no_install: bool,
    /// Ports the remote side may listen on for data streams, e.g. 50000-50100.
    #[arg(long, value_parser = parse_range)]
    port_range: Option<(u16, u16)>,
    /// The remote side connects back to us (for hosts that allow only outbound connections).
    #[arg(long)]
    reverse: bool,
    /// Log in afresh for every session instead of keeping one ssh connection per host open for
    /// a minute for the next ones (ssh's ControlMaster; left alone if your ssh config sets one).
    #[arg(long, env = "TERN_NO_SSH_REUSE", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    no_ssh_reuse: bool,
    /// Token file for tern:// daemons.
    #[arg(long, env = "TERN_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// In a tern:// to tern:// copy, the destination daemon's token when it differs from
    /// --token-file (then the source daemon's).
    #[arg(long, env = "TERN_DST_TOKEN_FILE")]
    dst_token_file: Option<PathBuf>,
    /// Set socket buffers explicitly (disables kernel autotuning), e.g. 32M.
    #[arg(long, value_parser = parse_size)]
    tcp_buffer: Option<u64>,
    /// Keep reconnecting after network errors for this many seconds.
    #[arg(long, default_value = "120")]
    retry_for: u64,
    /// Stop the whole transfer at the first file that fails (permission denied, no space, ...)
    /// and exit non-zero, instead of recording it and copying the rest.
    #[arg(long)]
    pub(crate) fail_fast: bool,
    #[command(flatten)]
    pub(crate) filters: crate::filter_args::FilterArgs,
    /// Copy only the paths listed in FILE (one per line, relative to the one SRC directory; `-`
    /// reads standard input). Each keeps its relative place under DST, with its parent
    /// directories; a listed directory brings its contents with -r.
    #[arg(long, value_name = "FILE")]
    pub(crate) files_from: Option<PathBuf>,
    /// Keep every destination file that already exists, whatever its size, time or content
    /// (rsync --ignore-existing; Globus' sync level "exists"): top up, never overwrite.
    #[arg(long)]
    ignore_existing: bool,
    /// Leave out symlinks whose targets are absolute or climb above the copied tree (rsync
    /// --safe-links). Without it links are copied as they are, as rsync -a and cp -a do.
    #[arg(long)]
    safe_links: bool,
    /// Copy every name of a file with several hard links as a separate file. By default the
    /// names stay links to one file at the destination, as cp -a and rsync -H do.
    #[arg(long)]
    no_hard_links: bool,
    /// Local sources must resolve beneath DIR when opened, never through a link that leaves it
    /// (the service confines its jobs with this).
    #[arg(long, hide = true, value_name = "DIR")]
    src_beneath: Option<PathBuf>,
    /// The local destination must resolve beneath DIR when used (see --src-beneath).
    #[arg(long, hide = true, value_name = "DIR")]
    pub(crate) dst_beneath: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) compat: Compat,
}

/// What scp and rsync users type by habit. tern already does what most of these ask for, so
/// they are accepted rather than refused with a misleading tip; the pure no-ops stay out of
/// `--help`.
#[derive(Args, Default, Clone)]
pub(crate) struct Compat {
    /// Archive mode as in rsync and cp: -r, keeping mode and mtime (which tern always does).
    #[arg(short = 'a', long)]
    pub(crate) archive: bool,
    /// rsync -P (--partial --progress): tern always resumes and shows progress on a terminal.
    #[arg(short = 'P', hide = true)]
    pub(crate) partial_progress: bool,
    /// rsync --progress: tern shows progress whenever stderr is a terminal.
    #[arg(long, hide = true)]
    progress: bool,
    /// rsync --partial: tern always keeps verified partial files and resumes them.
    #[arg(long, hide = true)]
    partial: bool,
    /// rsync/scp -z: accepted and ignored with a note (tern does not compress).
    #[arg(short = 'z', long, hide = true)]
    pub(crate) compress: bool,
}

#[derive(Args)]
struct ServeArgs {
    /// Read settings from a TOML file whose keys are these flags without `--` (see
    /// packaging/tern-serve.example.toml); the command line and the environment override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address for control and data connections, e.g. 0.0.0.0:7700 or [::]:7700.
    #[arg(long, default_value = "0.0.0.0:7700")]
    listen: String,
    /// A directory to serve: DIR (appears as /) or NAME=DIR (appears as /NAME), repeatable.
    #[arg(long, required = true)]
    root: Vec<String>,
    /// The shared secret clients must prove; created with a random secret if missing.
    #[arg(long, env = "TERN_TOKEN_FILE")]
    token_file: PathBuf,
    /// An arrival hook clients may ask for by name (`tern watch --on-arrival NAME`): NAME=CMD,
    /// repeatable. CMD runs under sh with TERN_UNIT_PATH set to the unit's path in a root.
    #[arg(long, value_parser = tern_engine::hook::parse_hook)]
    hook: Vec<(String, String)>,
    /// A peer this daemon may open data streams to when it is the source of a third-party
    /// transfer (tern://HERE to tern://ELSEWHERE): HOST, HOST:PORT, an address, [IPv6]:PORT or
    /// a CIDR like 10.0.0.0/8; repeatable. None (the default): such transfers are refused,
    /// since the client names the address. See docs/security.md.
    #[arg(long, value_name = "HOST[:PORT]|CIDR", value_parser = tern_engine::dial::parse_allow)]
    dial_allow: Vec<tern_engine::dial::Allow>,
    /// Refuse third-party transfers (the default without --dial-allow; kept for old scripts).
    #[arg(long, hide = true, conflicts_with = "dial_allow")]
    no_third_party: bool,
    /// Let clients create symlinks whose targets may resolve outside the root (absolute, or
    /// climbing above it). Off by default: such links are refused per file, since whoever later
    /// follows them (a shell, a web server) would leave the root. Writes never follow a link
    /// out either way.
    #[arg(long)]
    allow_links_out: bool,
    /// Connections held at once (control and data); more are refused with "daemon busy". A
    /// quarter of them (at least 8) may be waiting to authenticate; beyond that the oldest
    /// waiting one is dropped.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: u32,
    /// Authenticated sessions running at once; more are refused with "daemon busy".
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    max_sessions: u32,
    /// Seconds a new connection has to finish TLS and authenticate; then it is closed.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    auth_timeout: f64,
    /// The managed-transfer service (--http-listen, --state-dir, ...).
    #[command(flatten)]
    service: crate::service_cli::ServeService,
}

impl Cli {
    /// Parses the command line (exiting on usage errors, as clap does) and collects the
    /// include/exclude rules in their command-line order.
    pub(crate) fn parse_all() -> Result<Cli> {
        use clap::{CommandFactory, FromArgMatches};
        let matches = Cli::command().get_matches_from(crate::serve_config::expand(std::env::args_os().collect())?);
        let mut cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
        let Some((_, sub)) = matches.subcommand() else { return Ok(cli) };
        match &mut cli.command {
            Command::Cp(a) => a.common.filters.collect(sub)?,
            Command::Sync(a) => a.common.filters.collect(sub)?,
            Command::Watch(a) => a.common.filters.collect(sub)?,
            Command::Service(crate::service_cli::ServiceCommand::Submit(a)) => a.filters.collect(sub)?,
            _ => {}
        }
        Ok(cli)
    }
}

/// `-v`: transfers list each file as it lands, as rsync -v does.
static VERBOSE: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

pub(crate) fn run(cli: Cli) -> Result<ExitCode> {
    crate::init_logging(cli.verbose);
    VERBOSE.store(cli.verbose, std::sync::atomic::Ordering::Relaxed);
    match cli.command {
        Command::Cp(a) => {
            // scp's -P PORT: here -P is rsync's (--partial --progress), and PORT a source.
            if a.common.compat.partial_progress
                && let Some(port) = a.paths.iter().find(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !std::path::Path::new(p).exists())
            {
                bail!("-P is rsync's --partial --progress here, so '{port}' was read as a source; for scp's -P {port} write scp://[user@]host:{port}/path or -e 'ssh -p {port}'");
            }
            let (dst, srcs) = a.paths.split_last().unwrap();
            transfer(srcs, dst, a.recursive || a.common.compat.archive, false, false, Delete::default(), &a.common)
        }
        Command::Sync(a) => transfer(std::slice::from_ref(&a.src), &a.dst, true, true, a.checksum, Delete { extras: a.delete, from_empty: a.delete_empty_source }, &a.common),
        Command::Serve(a) => serve(a),
        Command::Doctor(a) => crate::doctor::run(a),
        Command::Ls(a) => crate::fs_cli::ls(a),
        Command::Stat(a) => crate::fs_cli::stat(a),
        Command::Mkdir(a) => crate::fs_cli::mkdir(a),
        Command::Rm(a) => crate::fs_cli::rm(a),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "tern", &mut script);
            write_stdout(&script)
        }
        Command::Man { command } => {
            use clap::CommandFactory;
            let mut page = Cli::command();
            if let Some(name) = command {
                let Some(sub) = page.find_subcommand(&name).filter(|c| !c.is_hide_set()).cloned() else {
                    bail!("tern man {name}: no such command; see tern --help");
                };
                page = sub.name(&*format!("tern-{name}").leak()).version(env!("CARGO_PKG_VERSION"));
            }
            let mut roff = Vec::new();
            clap_mangen::Man::new(page).render(&mut roff)?;
            write_stdout(&roff)
        }
        Command::Watch(a) => crate::watch_cli::run(a),
        Command::Service(c) => crate::service_cli::run(c),
        Command::Remote { port_range, reverse_port } => match tern_engine::server::serve_remote(port_range, reverse_port) {
            Ok(()) => Ok(ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("tern (remote): {e}");
                Ok(ExitCode::from(1))
            }
        },
    }
}

/// `sync --delete` and whether an empty source may empty the destination.
#[derive(Clone, Copy, Default)]
pub(crate) struct Delete {
    extras: bool,
    from_empty: bool,
}

/// Generated text on stdout; a reader that stops early (`| head`) is no error.
fn write_stdout(bytes: &[u8]) -> Result<ExitCode> {
    match std::io::Write::write_all(&mut std::io::stdout().lock(), bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("cannot write to standard output"),
        _ => Ok(ExitCode::SUCCESS),
    }
}

fn transfer(srcs: &[String], dst: &str, recursive: bool, sync: bool, checksum: bool, delete: Delete, c: &Common) -> Result<ExitCode> {
    let progress = Arc::new(Progress::default());
    let srcs = &usable_sources(srcs, dst, recursive, c.dry_run, &progress)?;
    refuse_copy_into_itself(srcs, dst, sync || c.files_from.is_some() || srcs.iter().any(|s| contents_of(s)))?;
    let mut spec = client_spec(srcs, dst, recursive, sync, checksum, delete, c)?;
    // Remote globs (`'host:/dir/*.h5'`) are expanded on the far side, as scp and rsync do.
    if !sync && let Err(e) = tern_engine::remote_fs::expand_sources(&mut spec) {
        return Ok(output::report(&progress, Err(e), 0.0, c.json, c.dry_run, c.quiet));
    }
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
    let result = tern_engine::session::run(&spec, &progress);
    if c.fail_fast && !progress.errors.lock().unwrap().is_empty() {
        stop_at_first_failure(&progress, started, c.json);
    }
    let seconds = started.elapsed().as_secs_f64();
    if let Some(d) = display {
        d.finish();
    }
    if let Some(t) = ticker {
        t.finish();
    }
    if !c.quiet {
        for n in progress.notices.lock().unwrap().iter() {
            eprintln!("tern: {n}");
        }
    }
    Ok(output::report(&progress, result, seconds, c.json, c.dry_run, c.quiet))
}

/// rsync -v's file list: each file's path as it lands, on stdout (on stderr when stdout carries
/// JSON), above the live display.
fn list_files_as_they_land(progress: &Progress, bar: Option<indicatif::ProgressBar>, stdout_is_json: bool) {
    let _ = progress.on_landed.set(Box::new(move |rel: &[u8]| {
        let line = String::from_utf8_lossy(rel);
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
    let streams = c.streams.unwrap_or(if local { 4 } else { 8 }).clamp(1, 64);
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
        ssh: SshOptions {
            command: c.ssh.as_deref().map(|s| s.split_whitespace().map(str::to_string).collect()).unwrap_or_default(),
            remote_bin: c.remote_bin.clone(),
            install: match (c.install_remote, c.no_install) {
                (true, _) => tern_engine::bootstrap::Install::Always,
                (_, true) => tern_engine::bootstrap::Install::Never,
                _ => tern_engine::bootstrap::Install::IfMissing,
            },
            port_range: c.port_range,
            reverse: c.reverse,
            reuse: !c.no_ssh_reuse,
        },
        token_file: c.token_file.clone(),
        dst_token_file: c.dst_token_file.clone(),
        bwlimit: c.bwlimit.and_then(|r| r.0),
        bufsize: c.tcp_buffer.map(|b| b as usize),
        retry_for: Duration::from_secs(c.retry_for),
        filters: c.filters.rules.clone(),
        files_from,
        fences: tern_engine::session::Fences { src: c.src_beneath.clone(), dst: c.dst_beneath.clone() },
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

fn serve(a: ServeArgs) -> Result<ExitCode> {
    let mut roots = Vec::new();
    for r in &a.root {
        let (name, dir) = match r.split_once('=') {
            Some((n, d)) if a.root.len() > 1 => (n.to_string(), PathBuf::from(d)),
            Some((_, d)) => (String::new(), PathBuf::from(d)),
            None if a.root.len() > 1 => bail!("--root {r}: with several roots, name each one: --root NAME=DIR"),
            None => (String::new(), PathBuf::from(r)),
        };
        if !dir.is_dir() {
            bail!("--root {}: not a directory", dir.display());
        }
        roots.push((name, dir));
    }
    let secret = load_or_create_token(&a.token_file)?;
    let listener = TcpListener::bind(&a.listen).with_context(|| format!("cannot listen on {}", a.listen))?;
    eprintln!("tern serve: listening on {} for {}", listener.local_addr()?, roots.iter().map(|(n, d)| format!("/{n} = {}", d.display())).collect::<Vec<_>>().join(", "));
    crate::service_cli::start(&a.service, &roots.iter().map(|(_, d)| d.clone()).collect::<Vec<_>>())?;
    if !(a.auth_timeout > 0.0 && a.auth_timeout <= 3600.0) {
        bail!("--auth-timeout {}: give seconds between 0 and 3600", a.auth_timeout);
    }
    let limits = tern_engine::limits::Limits { max_connections: a.max_connections as usize, max_sessions: a.max_sessions as usize, auth_timeout: std::time::Duration::from_secs_f64(a.auth_timeout) };
    let config =
        tern_engine::server::DaemonConfig { limits, dial: tern_engine::dial::DialPolicy { allow: if a.no_third_party { Vec::new() } else { a.dial_allow } }, allow_links_out: a.allow_links_out };
    tern_engine::server::serve_daemon(listener, Roots::Confined(roots), secret, Arc::new(a.hook.into_iter().collect()), config)?;
    Ok(ExitCode::SUCCESS)
}

fn load_or_create_token(path: &PathBuf) -> Result<Vec<u8>> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::read(path) {
        Ok(t) => {
            let t = t.trim_ascii().to_vec();
            if t.len() < 16 {
                bail!("token file {} holds fewer than 16 bytes; use a longer secret", path.display());
            }
            Ok(t)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let secret = tern_engine::session::hex(&tern_engine::transport::random::<32>());
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).with_context(|| format!("cannot create token file {}", path.display()))?;
            f.write_all(secret.as_bytes())?;
            f.write_all(b"\n")?;
            eprintln!("tern serve: created token file {} (give it to clients as --token-file)", path.display());
            Ok(secret.into_bytes())
        }
        Err(e) => Err(e).with_context(|| format!("cannot read token file {}", path.display())),
    }
}

/// `4M`, `64k`, `1G`, `1048576`: binary units.
pub(crate) fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().trim_end_matches(['B', 'b']).trim_end_matches('i');
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: f64 = num.parse().map_err(|_| format!("'{s}' is not a size like 4M or 1G"))?;
    Ok((n * mult as f64) as u64)
}

/// `--bwlimit` as rsync reads it: a plain number is KiB/s, `K`/`M`/`G`/`T` are KiB/MiB/GiB/TiB
/// per second, `KB`/`MB`/`GB` decimal bytes; bit rates are spelt as such (`800Mbit`, `1Gbps`,
/// `1Gb/s`, decimal). `0` means no limit. `None` = unlimited.
pub(crate) fn parse_rate(s: &str) -> Result<Rate, String> {
    parse_rate_value(s).map(Rate)
}

/// A parsed `--bwlimit`: bytes per second, `None` for no limit (`0`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rate(pub(crate) Option<u64>);

fn parse_rate_value(s: &str) -> Result<Option<u64>, String> {
    const FORMS: &str = "give KiB/s like rsync (1000), bytes with a unit (100M, 1G, 500KB) or bits (800Mbit, 1Gbps, 1Gb/s); 0 means no limit";
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("--bwlimit '{s}': {FORMS}"))?;
    if !n.is_finite() || n < 0.0 {
        return Err(format!("--bwlimit '{s}': {FORMS}"));
    }
    let unit = unit.trim();
    let unit = unit.strip_suffix("/s").unwrap_or(unit);
    let bytes_per_sec = match unit {
        "" => n * 1024.0,
        "K" | "k" | "KiB" => n * 1024.0,
        "M" | "m" | "MiB" => n * (1u64 << 20) as f64,
        "G" | "g" | "GiB" => n * (1u64 << 30) as f64,
        "T" | "t" | "TiB" => n * (1u64 << 40) as f64,
        "B" => n,
        "KB" | "kB" => n * 1e3,
        "MB" => n * 1e6,
        "GB" => n * 1e9,
        "TB" => n * 1e12,
        _ => {
            // Bits per second, decimal as network rates are: 1Gbit = 10^9 bits.
            let scale = ["bit", "bps", "b"].iter().find_map(|suffix| unit.strip_suffix(suffix)).and_then(|p| match p {
                "" => Some(1.0),
                "K" | "k" => Some(1e3),
                "M" | "m" => Some(1e6),
                "G" | "g" => Some(1e9),
                "T" | "t" => Some(1e12),
                _ => None,
            });
            match scale {
                Some(scale) => n * scale / 8.0,
                None => return Err(format!("--bwlimit '{s}': unknown unit '{unit}'; {FORMS}")),
            }
        }
    };
    if n == 0.0 {
        return Ok(None);
    }
    if bytes_per_sec < 1024.0 {
        return Err(format!("--bwlimit '{s}' is below 1 KiB/s; {FORMS}"));
    }
    Ok(Some(bytes_per_sec as u64))
}

fn parse_range(s: &str) -> Result<(u16, u16), String> {
    let (a, b) = s.split_once('-').unwrap_or((s, s));
    let lo: u16 = a.parse().map_err(|_| format!("bad port range '{s}'"))?;
    let hi: u16 = b.parse().map_err(|_| format!("bad port range '{s}'"))?;
    if lo > hi {
        return Err(format!("bad port range '{s}'"));
    }
    Ok((lo, hi))
}

#[cfg(test)]
mod rate_tests {
    use super::parse_rate_value as rate;

    #[test]
    fn bwlimit_reads_like_rsync() {
        assert_eq!(rate("0"), Ok(None), "0 is no limit");
        assert_eq!(rate("0.0"), Ok(None));
        assert_eq!(rate("1000"), Ok(Some(1000 * 1024)), "plain numbers are KiB/s");
        assert!(rate("0.5").is_err(), "below 1 KiB/s is refused, never a panic");
        assert_eq!(rate("1.5"), Ok(Some(1536)));
        assert_eq!(rate("100M"), Ok(Some(100 << 20)));
        assert_eq!(rate("1G"), Ok(Some(1 << 30)));
        assert_eq!(rate("500KB"), Ok(Some(500_000)));
        assert_eq!(rate("100MB/s"), Ok(Some(100_000_000)));
        assert_eq!(rate("800Mbit"), Ok(Some(100_000_000)));
        assert_eq!(rate("1Gbps"), Ok(Some(125_000_000)));
        assert_eq!(rate("1Gb/s"), Ok(Some(125_000_000)));
        assert_eq!(rate("1Gbit"), Ok(Some(125_000_000)));
        for bad in ["", "-1", "fast", "1Q", "1Gbx", "nan", "inf", "1e3"] {
            let e = rate(bad).unwrap_err();
            assert!(e.contains("--bwlimit") && e.contains("0 means no limit"), "{bad}: {e}");
        }
    }
}
