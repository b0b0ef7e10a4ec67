//! `tern ls`, `tern stat`, `tern mkdir`, `tern rm`: on a local path, `[user@]host:path` (over
//! ssh, as a transfer connects) or `tern://host[:port]/path` (a daemon, confined to its roots).
//! The work is the engine's (`tern_engine::client::remote_fs`); this prints the answer.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use tern_engine::client::session::ClientSpec;
use tern_engine::endpoint::Endpoint;
use tern_proto::msg::{FS_FORCE, FS_PARENTS, FS_RECURSIVE};
use tern_proto::{FsEntry, FsKind, FsOp, Options};

/// How to reach the far side: the same options (and environment) as `tern cp`.
#[derive(Args, Clone, Default)]
pub(crate) struct ConnArgs {
    /// The ssh command for [user@]host: endpoints, e.g. --ssh 'ssh -i KEY'.
    #[arg(short = 'e', long, visible_alias = "rsh", value_name = "CMD", env = "TERN_SSH")]
    ssh: Option<String>,
    /// tern's path on the remote host.
    #[arg(long, env = "TERN_REMOTE_BIN")]
    remote_bin: Option<String>,
    /// Send this binary to the remote host's ~/.cache/tern even if that build is there.
    #[arg(long, conflicts_with = "no_install")]
    install_remote: bool,
    /// Never install tern on the remote host.
    #[arg(long, env = "TERN_NO_INSTALL", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    no_install: bool,
    /// Log in afresh instead of reusing a shared ssh connection.
    #[arg(long, env = "TERN_NO_SSH_REUSE", value_parser = clap::builder::BoolishValueParser::new(), action = clap::ArgAction::SetTrue)]
    no_ssh_reuse: bool,
    /// Token file for tern:// daemons.
    #[arg(long, env = "TERN_TOKEN_FILE")]
    token_file: Option<PathBuf>,
}

impl ConnArgs {
    /// `--token-file` (or `TERN_TOKEN_FILE`), for a schedule the service runs.
    pub(crate) fn token_file(&self) -> Option<&std::path::Path> {
        self.token_file.as_deref()
    }

    /// Whether an ssh command or a remote tern path was given (a schedule carries neither:
    /// the service runs tests with its own).
    pub(crate) fn names_programs(&self) -> bool {
        self.ssh.is_some() || self.remote_bin.is_some()
    }
}

#[derive(Args)]
pub(crate) struct LsArgs {
    /// Long listing: type and permissions, size, modification time, name (as ls -l).
    #[arg(short = 'l')]
    long: bool,
    /// List subdirectories too (never through a symlink).
    #[arg(short = 'R', long)]
    recursive: bool,
    /// One JSON object per entry, one per line: name, type, size, mode, mtime, mtime_ns[, target].
    #[arg(long)]
    json: bool,
    /// A directory (or file): path, [user@]host:path or tern://host[:port]/path.
    endpoint: String,
    #[command(flatten)]
    conn: ConnArgs,
}

#[derive(Args)]
pub(crate) struct StatArgs {
    /// One JSON object: name, type, size, mode, mtime, mtime_ns[, target].
    #[arg(long)]
    json: bool,
    /// path, [user@]host:path or tern://host[:port]/path; a final symlink is not followed.
    endpoint: String,
    #[command(flatten)]
    conn: ConnArgs,
}

#[derive(Args)]
pub(crate) struct MkdirArgs {
    /// Make missing parents too; an existing directory is fine.
    #[arg(short = 'p', long)]
    parents: bool,
    /// One or more: path, [user@]host:path or tern://host[:port]/path.
    #[arg(required = true)]
    endpoints: Vec<String>,
    #[command(flatten)]
    conn: ConnArgs,
}

#[derive(Args)]
pub(crate) struct RmArgs {
    /// Remove a directory and everything under it (symlinks are removed, never followed).
    #[arg(short = 'r', short_alias = 'R', long)]
    recursive: bool,
    /// A path that does not exist is no error.
    #[arg(short = 'f', long)]
    force: bool,
    /// One or more: path, [user@]host:path or tern://host[:port]/path.
    #[arg(required = true)]
    endpoints: Vec<String>,
    #[command(flatten)]
    conn: ConnArgs,
}

/// The engine's connection settings for one endpoint (no transfer options matter here).
pub(crate) fn spec(ep: &Endpoint, c: &ConnArgs) -> ClientSpec {
    ClientSpec {
        sources: vec![ep.clone()],
        dest: ep.clone(),
        options: Options { flags: 0, chunk_size: 1 << 20, streams: 1, concurrency: 0 },
        adaptive: false,
        max_streams: 1,
        ssh: crate::transfer::ssh_options(c.ssh.as_deref(), c.remote_bin.clone(), c.install_remote, c.no_install, !c.no_ssh_reuse),
        token_file: c.token_file.clone(),
        dst_token_file: None,
        bwlimit: None,
        bufsize: None,
        retry_for: Duration::ZERO,
        filters: Vec::new(),
        files_from: None,
        stripe: None,
        fences: Default::default(),
    }
}

/// Runs one request; an error is one line on stderr and exit status 1 (2: the endpoint does not
/// parse, a usage error).
pub(crate) fn ask(endpoint: &str, c: &ConnArgs, op: FsOp, flags: u8) -> Result<Vec<FsEntry>, u8> {
    let ep = Endpoint::parse(endpoint).map_err(|e| {
        eprintln!("tern: {e}");
        2
    })?;
    tern_engine::client::remote_fs::request(&spec(&ep, c), &ep, op, flags).map_err(|e| {
        eprintln!("tern: {}", crate::output::printable(&e.to_string()));
        1
    })
}

pub(crate) fn ls(a: LsArgs) -> anyhow::Result<ExitCode> {
    let flags = if a.recursive { FS_RECURSIVE } else { 0 };
    let entries = match ask(&a.endpoint, &a.conn, FsOp::List, flags) {
        Ok(e) => e,
        Err(code) => return Ok(ExitCode::from(code)),
    };
    // On a terminal names are shown with control characters escaped (as GNU ls does): a name
    // from the far side must not drive the terminal. Piped, they stay raw bytes (--json escapes).
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut out = Vec::new();
    for e in &entries {
        if a.json {
            out.extend(serde_json::to_vec(&json(e))?);
            out.push(b'\n');
        } else if a.long {
            let line = long_line(e);
            out.extend(if tty { format!("{}\n", crate::output::printable(line.trim_end_matches('\n'))) } else { line }.into_bytes());
        } else if tty {
            out.extend(crate::output::printable(&String::from_utf8_lossy(&e.name)).as_bytes());
            out.push(b'\n');
        } else {
            out.extend(&e.name);
            out.push(b'\n');
        }
    }
    write_out(&out)
}

pub(crate) fn stat(a: StatArgs) -> anyhow::Result<ExitCode> {
    let entries = match ask(&a.endpoint, &a.conn, FsOp::Stat, 0) {
        Ok(e) => e,
        Err(code) => return Ok(ExitCode::from(code)),
    };
    let mut out = String::new();
    for e in &entries {
        if a.json {
            out.push_str(&serde_json::to_string(&json(e))?);
            out.push('\n');
        } else {
            out.push_str(&format!("  Name: {}\n", crate::output::printable(&String::from_utf8_lossy(&e.name))));
            out.push_str(&format!("  Type: {}\n", e.kind.as_str()));
            out.push_str(&format!("  Size: {}\n", e.size));
            out.push_str(&format!("  Mode: {:04o} ({})\n", e.mode & 0o7777, mode_string(e)));
            out.push_str(&format!("Modify: {}.{:09}\n", local_time(e.mtime_s, true), e.mtime_ns));
            if e.kind == FsKind::Symlink {
                out.push_str(&format!("Target: {}\n", crate::output::printable(&String::from_utf8_lossy(&e.target))));
            }
        }
    }
    write_out(out.as_bytes())
}

pub(crate) fn mkdir(a: MkdirArgs) -> anyhow::Result<ExitCode> {
    let flags = if a.parents { FS_PARENTS } else { 0 };
    Ok(each(&a.endpoints, &a.conn, FsOp::Mkdir, flags))
}

pub(crate) fn rm(a: RmArgs) -> anyhow::Result<ExitCode> {
    let flags = if a.recursive { FS_RECURSIVE } else { 0 } | if a.force { FS_FORCE } else { 0 };
    Ok(each(&a.endpoints, &a.conn, FsOp::Remove, flags))
}

/// As rm and mkdir do: every endpoint in turn, a failure reported and the rest still done;
/// exit 1 if any failed (2 if one did not parse).
fn each(endpoints: &[String], c: &ConnArgs, op: FsOp, flags: u8) -> ExitCode {
    let mut worst = 0u8;
    for ep in endpoints {
        if let Err(code) = ask(ep, c, op, flags) {
            worst = worst.max(code);
        }
    }
    ExitCode::from(worst)
}

fn json(e: &FsEntry) -> serde_json::Value {
    let mut v = serde_json::json!({
        "name": String::from_utf8_lossy(&e.name),
        "type": e.kind.as_str(),
        "size": e.size,
        "mode": format!("{:04o}", e.mode & 0o7777),
        "mtime": e.mtime_s,
        "mtime_ns": e.mtime_ns,
    });
    if e.kind == FsKind::Symlink {
        v["target"] = String::from_utf8_lossy(&e.target).into();
    }
    v
}

/// `drwxr-xr-x`, as ls prints it.
fn mode_string(e: &FsEntry) -> String {
    let t = match e.kind {
        FsKind::File => '-',
        FsKind::Dir => 'd',
        FsKind::Symlink => 'l',
        FsKind::Other => match e.mode & libc::S_IFMT {
            libc::S_IFIFO => 'p',
            libc::S_IFSOCK => 's',
            libc::S_IFCHR => 'c',
            libc::S_IFBLK => 'b',
            _ => '?',
        },
    };
    let m = e.mode;
    let bit = |mask: u32, c: char| if m & mask != 0 { c } else { '-' };
    let special = |x: u32, s: u32, lower: char, upper: char| match (m & x != 0, m & s != 0) {
        (true, true) => lower,
        (false, true) => upper,
        (true, false) => 'x',
        (false, false) => '-',
    };
    [
        t,
        bit(0o400, 'r'),
        bit(0o200, 'w'),
        special(0o100, 0o4000, 's', 'S'),
        bit(0o040, 'r'),
        bit(0o020, 'w'),
        special(0o010, 0o2000, 's', 'S'),
        bit(0o004, 'r'),
        bit(0o002, 'w'),
        special(0o001, 0o1000, 't', 'T'),
    ]
    .iter()
    .collect()
}

/// One `ls -l` line: mode, size, local modification time, name (and a link's target).
fn long_line(e: &FsEntry) -> String {
    let name = String::from_utf8_lossy(&e.name);
    let link = if e.kind == FsKind::Symlink { format!(" -> {}", String::from_utf8_lossy(&e.target)) } else { String::new() };
    format!("{} {:>12} {} {name}{link}\n", mode_string(e), e.size, local_time(e.mtime_s, false))
}

/// `2026-11-24 23:24` (with seconds: `:05`) in the local time zone.
fn local_time(secs: i64, seconds: bool) -> String {
    let t: libc::time_t = secs as libc::time_t;
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return secs.to_string();
    }
    let base = format!("{:04}-{:02}-{:02} {:02}:{:02}", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min);
    if seconds { format!("{base}:{:02}", tm.tm_sec) } else { base }
}

/// A reader that stops early (`| head`) is no error.
fn write_out(bytes: &[u8]) -> anyhow::Result<ExitCode> {
    match std::io::stdout().lock().write_all(bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(anyhow::Error::from(e).context("cannot write to standard output")),
        _ => Ok(ExitCode::SUCCESS),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_like_ls() {
        let e = |kind, mode| FsEntry { kind, name: b"x".to_vec(), size: 0, mode, mtime_s: 0, mtime_ns: 0, target: vec![] };
        assert_eq!(mode_string(&e(FsKind::Dir, libc::S_IFDIR | 0o755)), "drwxr-xr-x");
        assert_eq!(mode_string(&e(FsKind::File, libc::S_IFREG | 0o4640)), "-rwSr-----");
        assert_eq!(mode_string(&e(FsKind::Dir, libc::S_IFDIR | 0o1777)), "drwxrwxrwt");
        assert_eq!(mode_string(&e(FsKind::Other, libc::S_IFIFO | 0o600)), "prw-------");
    }
}
