//! What every tern process does first, shared by `tern` and the far-side build (`tern-remote`,
//! `src/bin/tern-remote.rs`): logging on stderr and the descriptor limit; and `tern _remote`,
//! which both run.

/// Log lines on stderr: `-v` info, `-vv` debug, or `TERN_LOG` (an `EnvFilter` like
/// `info,tern::access=off`). A daemon's access log (`tern::access`, one line per session) is
/// on at every level; rustls' own chatter is kept to errors. No colour codes unless stderr is
/// a terminal: daemon and service logs go to files and journals.
pub(crate) fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn,tern::access=info,rustls=error",
        1 => "info,rustls=error",
        _ => "debug,rustls=error",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("TERN_LOG").unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let _ = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi).with_target(false).try_init();
    tern_engine::faults::warn_if_weakened();
}

/// Many files in flight need many descriptors; take the hard limit as the soft one.
pub(crate) fn raise_fd_limit() {
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max.min(1 << 20);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// `tern _remote`: the far end of an ssh-mode session, until the client is done.
pub(crate) fn serve_remote(port_range: Option<(u16, u16)>, reverse_port: Option<u16>) -> std::process::ExitCode {
    match tern_engine::server::session::serve_remote(port_range, reverse_port) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tern (remote): {e}");
            std::process::ExitCode::from(1)
        }
    }
}
