//! `tern serve`: the daemon's roots, token file and limits; the managed service beside it when
//! asked for (`service_cli.rs`).

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use tern_engine::store::roots::Roots;

use crate::args::ServeArgs;

pub(crate) fn serve(a: ServeArgs) -> Result<ExitCode> {
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
    let dirs: Vec<PathBuf> = roots.iter().map(|(_, d)| d.clone()).collect();
    // Before the listening line: a refused node says one line and serves nothing.
    let member = crate::service_cli::join_cluster(&a.service, &dirs, &secret, &advertised(listener.local_addr()?))?;
    let fence = member.as_ref().map(|m| m.fence());
    if let Some(member) = member {
        tern_engine::server::cluster::set_view(Box::new(member.view()));
        // A clean stop leaves the cluster at once; kill -9 shows as unreachable after 3 heartbeats.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
            signal_hook::flag::register(sig, stop.clone())?;
        }
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            member.leave();
            eprintln!("tern serve: left the cluster; stopping");
            std::process::exit(0);
        });
    }
    eprintln!("tern serve: listening on {} for {}", listener.local_addr()?, roots.iter().map(|(n, d)| format!("/{n} = {}", d.display())).collect::<Vec<_>>().join(", "));
    crate::service_cli::start(&a.service, &dirs, fence)?;
    if !(a.auth_timeout > 0.0 && a.auth_timeout <= 3600.0) {
        bail!("--auth-timeout {}: give seconds between 0 and 3600", a.auth_timeout);
    }
    let limits = tern_engine::limits::Limits { max_connections: a.max_connections as usize, max_sessions: a.max_sessions as usize, auth_timeout: std::time::Duration::from_secs_f64(a.auth_timeout) };
    let config = tern_engine::server::session::DaemonConfig {
        limits,
        dial: tern_engine::net::dial::DialPolicy { allow: if a.no_third_party { Vec::new() } else { a.dial_allow } },
        allow_links_out: a.allow_links_out,
    };
    if a.no_tests {
        tern_engine::server::probe::refuse_tests();
    }
    tern_engine::server::session::serve_daemon(listener, Roots::Confined(roots), secret, Arc::new(a.hook.into_iter().collect()), config)?;
    Ok(ExitCode::SUCCESS)
}

/// Where clients of a cluster reach this node: the listening address, or this host's name where
/// it listens on every address (`0.0.0.0:7700` would send them to themselves).
fn advertised(local: std::net::SocketAddr) -> String {
    if !local.ip().is_unspecified() {
        return local.to_string();
    }
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "localhost".into());
    format!("{host}:{}", local.port())
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
            let secret = tern_engine::client::session::hex(&tern_engine::net::transport::random::<32>());
            let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).with_context(|| format!("cannot create token file {}", path.display()))?;
            f.write_all(secret.as_bytes())?;
            f.write_all(b"\n")?;
            eprintln!("tern serve: created token file {} (give it to clients as --token-file)", path.display());
            Ok(secret.into_bytes())
        }
        Err(e) => Err(e).with_context(|| format!("cannot read token file {}", path.display())),
    }
}
