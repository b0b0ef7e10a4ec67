//! `tern`: the command line. Parses arguments into engine settings, shows progress, reports.

mod cli;
mod filter_args;
mod output;
mod service_cli;
mod watch_cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    let args = match cli::Cli::parse_all() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tern: {e:#}");
            return ExitCode::from(2);
        }
    };
    raise_fd_limit();
    match cli::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tern: {e}");
            ExitCode::from(2)
        }
    }
}

/// Many files in flight need many descriptors; take the hard limit as the soft one.
fn raise_fd_limit() {
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max.min(1 << 20);
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}
