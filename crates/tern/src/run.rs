//! Running a parsed command line: each subcommand to the code that carries it out.

use std::process::ExitCode;

use anyhow::{Context, Result, bail};

use crate::args::{Cli, Command};
use crate::transfer::{Delete, VERBOSE, transfer};

pub(crate) fn run(cli: Cli) -> Result<ExitCode> {
    crate::process::init_logging(cli.verbose);
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
            transfer(srcs, dst, a.recursive || a.common.compat.archive, false, a.checksum, Delete::default(), &a.common)
        }
        Command::Sync(a) => transfer(std::slice::from_ref(&a.src), &a.dst, true, true, a.checksum, Delete { extras: a.delete, from_empty: a.delete_empty_source }, &a.common),
        Command::Serve(a) => crate::serve::serve(a),
        Command::Doctor(a) => crate::doctor::run(a),
        Command::Plan(a) => crate::plan::run(a),
        Command::Test(a) => crate::path_test::run(a),
        Command::Cluster(c) => crate::cluster_cli::run(c),
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
        Command::Remote { port_range, reverse_port } => Ok(crate::process::serve_remote(port_range, reverse_port)),
    }
}

/// Generated text on stdout; a reader that stops early (`| head`) is no error.
fn write_stdout(bytes: &[u8]) -> Result<ExitCode> {
    match std::io::Write::write_all(&mut std::io::stdout().lock(), bytes) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e).context("cannot write to standard output"),
        _ => Ok(ExitCode::SUCCESS),
    }
}
