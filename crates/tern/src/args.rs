//! The command line as clap defines it: `Cli`, its subcommands and their arguments, and the
//! value parsers they use. Nothing here runs a command (`run.rs` does); `--help` is made from
//! these doc comments alone.

use std::path::PathBuf;

use anyhow::Result;
use clap::{Args, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "tern", version, about = "Move scientific data at the speed of the network, as simply as scp")]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
    /// More log output (-v info, -vv debug), on stderr.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    pub(crate) verbose: u8,
}

#[derive(Subcommand)]
pub(crate) enum Command {
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
    /// Check this host, and DEST's over the connection a transfer would use, against the
    /// data-transfer-node tuning list (socket buffers, congestion control, pacing, MTU, NIC
    /// errors, CPU governor, limits, clock, file systems): each finding with why it matters and
    /// the command that fixes it.
    Doctor(crate::doctor::DoctorArgs),
    /// Predict how long copying SRC... to DST will take, from this pair's past transfers
    /// (start-up, per-byte and per-file costs), with advice; --history: predictions against
    /// what happened.
    Plan(crate::plan::PlanArgs),
    /// Measure the path to DEST and name what limits a transfer there: round trip, memory→memory
    /// with one stream and with tern's count, destination writers, source readers, hashing and
    /// encryption per core on each side; then the verdict and the rate to expect.
    Test(crate::path_test::TestArgs),
    /// A cluster of data transfer nodes (`tern serve --cluster`): status, drain.
    #[command(subcommand)]
    Cluster(crate::cluster_cli::ClusterCommand),
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
        #[arg(long, value_parser = tern_engine::net::datastream::parse_port_range)]
        port_range: Option<(u16, u16)>,
        #[arg(long)]
        reverse_port: Option<u16>,
    },
}

#[derive(Args)]
pub(crate) struct CpArgs {
    /// Copy directories recursively.
    #[arg(short, long)]
    pub(crate) recursive: bool,
    /// Compare content hashes instead of size and mtime before skipping a file the destination
    /// already has (rsync -c; reads both sides). Without it, a file of the same size and mtime
    /// is taken as already copied (what lets a re-run resume).
    #[arg(short = 'c', long)]
    pub(crate) checksum: bool,
    /// Sources, then the destination.
    #[arg(required = true, num_args = 2.., value_name = "SRC... DST")]
    pub(crate) paths: Vec<String>,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Args)]
pub(crate) struct SyncArgs {
    pub(crate) src: String,
    pub(crate) dst: String,
    /// rsync -r: sync always walks the whole tree.
    #[arg(short, long, hide = true)]
    pub(crate) recursive: bool,
    /// Compare content hashes instead of size and mtime (reads both sides).
    #[arg(long)]
    pub(crate) checksum: bool,
    /// Delete destination files that are not in the source.
    #[arg(long)]
    pub(crate) delete: bool,
    /// With --delete, let an empty source empty the destination (rsync does so silently; tern
    /// refuses without this, since an empty source is more often an unmounted file system).
    #[arg(long, requires = "delete")]
    pub(crate) delete_empty_source: bool,
    #[command(flatten)]
    pub(crate) common: Common,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum Verify {
    /// Hash every chunk as it is received and the whole file before the rename.
    Stream,
    /// Also re-read the written data from storage before declaring success.
    Full,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum Fsync {
    /// Make files durable in batches (one syncfs) before renaming them into place.
    Batch,
    /// Skip syncing: a crash of the OS may lose recently renamed files.
    None,
}

#[derive(Args)]
pub(crate) struct Common {
    /// Parallel TCP data streams (default: start at 8 and add while throughput grows).
    #[arg(long)]
    pub(crate) streams: Option<u16>,
    /// Files in flight at once (default 16384; files of more than one chunk also at most what the descriptor limit allows, 80 under `ulimit -n 256`; the receiver also caps wanted bytes at 512 MiB).
    #[arg(long)]
    pub(crate) concurrency: Option<u32>,
    /// Chunk size for striping and verification, e.g. 4M. The 1M default keeps each chunk's
    /// read, hash, encryption and send within the CPU's cache (on 2 cores, loopback: 4 GiB in
    /// 3.4 s with 1M, 3.6-3.9 s with 4M; the same on a 68 ms path).
    #[arg(long, value_parser = parse_size, default_value = "1M")]
    pub(crate) chunk_size: u64,
    /// Cap the rate: KiB/s like rsync (--bwlimit 1000), or with a unit: 100M (MiB/s), 500KB
    /// (decimal bytes), 800Mbit or 1Gbps (bits/s). 0 means no limit.
    #[arg(long, value_parser = parse_rate)]
    pub(crate) bwlimit: Option<Rate>,
    /// Send data unencrypted (every chunk stays authenticated with keyed BLAKE3).
    #[arg(long)]
    pub(crate) no_encrypt: bool,
    #[arg(long, value_enum, default_value = "stream")]
    pub(crate) verify: Verify,
    /// Keep mode and mtime (the default; -p as in scp, cp and rsync).
    #[arg(short = 'p', long, overrides_with = "no_preserve")]
    preserve: bool,
    /// Do not keep mode and mtime.
    #[arg(long)]
    pub(crate) no_preserve: bool,
    #[arg(long, value_enum, default_value = "batch")]
    pub(crate) fsync: Fsync,
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
    pub(crate) ssh: Option<String>,
    /// tern's path on the remote host.
    #[arg(long, env = "TERN_REMOTE_BIN")]
    pub(crate) remote_bin: Option<String>,
    /// Send this binary to the remote host's ~/.cache/tern even if that build is there
    /// (tern installs itself there by default when it is missing).
    #[arg(long, conflicts_with = "no_install")]
    pub(crate) install_remote: bool,
    /// Never install tern on the remote host: fail if neither ~/.cache/tern nor PATH has
    /// this version.
    #[arg(long, env = "TERN_NO_INSTALL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub(crate) no_install: bool,
    /// Ports the remote side may listen on for data streams, e.g. 50000-50100.
    #[arg(long, value_parser = tern_engine::net::datastream::parse_port_range)]
    pub(crate) port_range: Option<(u16, u16)>,
    /// The remote side connects back to us (for hosts that allow only outbound connections).
    #[arg(long)]
    pub(crate) reverse: bool,
    /// Log in afresh for every session instead of keeping one ssh connection per host open for
    /// a minute for the next ones (ssh's ControlMaster; left alone if your ssh config sets one).
    #[arg(long, env = "TERN_NO_SSH_REUSE", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    pub(crate) no_ssh_reuse: bool,
    /// Token file for tern:// daemons.
    #[arg(long, env = "TERN_TOKEN_FILE")]
    pub(crate) token_file: Option<PathBuf>,
    /// In a tern:// to tern:// copy, the destination daemon's token when it differs from
    /// --token-file (then the source daemon's).
    #[arg(long, env = "TERN_DST_TOKEN_FILE")]
    pub(crate) dst_token_file: Option<PathBuf>,
    /// Set socket buffers explicitly (disables kernel autotuning), e.g. 32M.
    #[arg(long, value_parser = parse_size)]
    pub(crate) tcp_buffer: Option<u64>,
    /// Keep reconnecting after network errors for this many seconds.
    #[arg(long, default_value = "120")]
    pub(crate) retry_for: u64,
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
    pub(crate) ignore_existing: bool,
    /// Leave out symlinks whose targets are absolute or climb above the copied tree (rsync
    /// --safe-links). Without it links are copied as they are, as rsync -a and cp -a do.
    #[arg(long)]
    pub(crate) safe_links: bool,
    /// Copy every name of a file with several hard links as a separate file. By default the
    /// names stay links to one file at the destination, as cp -a and rsync -H do.
    #[arg(long)]
    pub(crate) no_hard_links: bool,
    /// Local sources must resolve beneath DIR when opened, never through a link that leaves it
    /// (the service confines its jobs with this).
    #[arg(long, hide = true, value_name = "DIR")]
    pub(crate) src_beneath: Option<PathBuf>,
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
pub(crate) struct ServeArgs {
    /// Read settings from a TOML file whose keys are these flags without `--` (see
    /// packaging/tern-serve.example.toml); the command line and the environment override it.
    #[arg(long, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    /// Address for control and data connections, e.g. 0.0.0.0:7700 or [::]:7700.
    #[arg(long, default_value = "0.0.0.0:7700")]
    pub(crate) listen: String,
    /// A directory to serve: DIR (appears as /) or NAME=DIR (appears as /NAME), repeatable.
    #[arg(long, required = true)]
    pub(crate) root: Vec<String>,
    /// The shared secret clients must prove; created with a random secret if missing.
    #[arg(long, env = "TERN_TOKEN_FILE")]
    pub(crate) token_file: PathBuf,
    /// An arrival hook clients may ask for by name (`tern watch --on-arrival NAME`): NAME=CMD,
    /// repeatable. CMD runs under sh with TERN_UNIT_PATH set to the unit's path in a root.
    #[arg(long, value_parser = tern_engine::server::hook::parse_hook)]
    pub(crate) hook: Vec<(String, String)>,
    /// A peer this daemon may open data streams to when it is the source of a third-party
    /// transfer (tern://HERE to tern://ELSEWHERE): HOST, HOST:PORT, an address, [IPv6]:PORT or
    /// a CIDR like 10.0.0.0/8; repeatable. None (the default): such transfers are refused,
    /// since the client names the address. See docs/security.md.
    #[arg(long, value_name = "HOST[:PORT]|CIDR", value_parser = tern_engine::net::dial::parse_allow)]
    pub(crate) dial_allow: Vec<tern_engine::net::dial::Allow>,
    /// Refuse third-party transfers (the default without --dial-allow; kept for old scripts).
    #[arg(long, hide = true, conflicts_with = "dial_allow")]
    pub(crate) no_third_party: bool,
    /// Let clients create symlinks whose targets may resolve outside the root (absolute, or
    /// climbing above it). Off by default: such links are refused per file, since whoever later
    /// follows them (a shell, a web server) would leave the root. Writes never follow a link
    /// out either way.
    #[arg(long)]
    pub(crate) allow_links_out: bool,
    /// Refuse path tests (`tern test`): each is answered with one line saying so.
    #[arg(long)]
    pub(crate) no_tests: bool,
    /// Connections held at once (control and data); more are refused with "daemon busy". A
    /// quarter of them (at least 8) may be waiting to authenticate; beyond that the oldest
    /// waiting one is dropped.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_connections: u32,
    /// Authenticated sessions running at once; more are refused with "daemon busy".
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub(crate) max_sessions: u32,
    /// Seconds a new connection has to finish TLS and authenticate; then it is closed.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub(crate) auth_timeout: f64,
    /// The managed-transfer service (--http-listen, --state-dir, ...).
    #[command(flatten)]
    pub(crate) service: crate::service_cli::ServeService,
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
