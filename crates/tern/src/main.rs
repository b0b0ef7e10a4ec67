//! `tern`: the command line. Parses arguments into engine settings, shows progress, reports.

#![allow(clippy::print_stdout, clippy::print_stderr)] // the binary talks to people

mod args;
mod cluster_cli;
mod doctor;
mod filter_args;
mod fs_cli;
mod history;
mod output;
mod path_test;
mod plan;
mod process;
mod run;
mod serve;
mod serve_config;
mod service_cli;
mod spread;
mod transfer;
mod watch_cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    // A release build carries the far-side build to install on hosts that lack tern (build.rs).
    #[cfg(tern_far_side_payload)]
    tern_engine::client::bootstrap::set_far_side_payload(include_bytes!(env!("TERN_FAR_SIDE_PAYLOAD")));
    let args = match args::Cli::parse_all() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("tern: {e:#}");
            return ExitCode::from(2);
        }
    };
    process::raise_fd_limit();
    match run::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tern: {}", output::printable(&e.to_string()));
            ExitCode::from(2)
        }
    }
}
