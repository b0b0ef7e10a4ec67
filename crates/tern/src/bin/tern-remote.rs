//! `tern-remote`: the far-side build. What a client installs on a host that lacks tern is this
//! program, not the whole of `tern`: the far side of an ssh login only ever runs `tern _remote`
//! (and `--version`, to check that it runs), so the service, web, database, mail, watch and
//! command-line crates stay home. It is a third of `tern`'s size, so a first copy ships it in
//! two round trips fewer (`docs/install.md`). It is installed under the name `tern`.

#![allow(clippy::print_stdout, clippy::print_stderr)] // the far side's stderr reaches the user

#[path = "../process.rs"]
mod process;

use std::process::ExitCode;

const USAGE: &str = "the far-side part of tern, run by a tern client over ssh (tern _remote); install tern itself to run its commands";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (port_range, reverse_port) = match args.split_first() {
        Some((first, _)) if first == "--version" || first == "-V" => {
            println!("tern {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Some((first, rest)) if first == "_remote" => match parse_remote_args(rest) {
            Ok(parsed) => parsed,
            Err(e) => {
                eprintln!("tern (remote): {e}");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("tern-remote {}: {USAGE}", env!("CARGO_PKG_VERSION"));
            return ExitCode::from(2);
        }
    };
    process::init_logging(0);
    process::raise_fd_limit();
    process::serve_remote(port_range, reverse_port)
}

type RemoteArgs = (Option<(u16, u16)>, Option<u16>);

/// `[--port-range LO-HI] [--reverse-port PORT]`, as `tern _remote` takes them.
fn parse_remote_args(args: &[String]) -> Result<RemoteArgs, String> {
    let (mut port_range, mut reverse_port) = (None, None);
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--port-range" => port_range = Some(tern_engine::net::datastream::parse_port_range(value)?),
            "--reverse-port" => reverse_port = Some(value.parse::<u16>().map_err(|_| format!("bad port '{value}'"))?),
            _ => return Err(format!("unknown argument '{flag}' (is the client a newer tern? it installs its own far side)")),
        }
    }
    Ok((port_range, reverse_port))
}

#[cfg(test)]
mod tests {
    use super::parse_remote_args;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn reads_what_the_client_sends() {
        assert_eq!(parse_remote_args(&args("")), Ok((None, None)));
        assert_eq!(parse_remote_args(&args("--port-range 50000-50100")), Ok((Some((50000, 50100)), None)));
        assert_eq!(parse_remote_args(&args("--port-range 7000")), Ok((Some((7000, 7000)), None)));
        assert_eq!(parse_remote_args(&args("--reverse-port 4242")), Ok((None, Some(4242))));
    }

    #[test]
    fn refuses_what_it_does_not_know() {
        assert!(parse_remote_args(&args("--port-range 9-1")).is_err());
        assert!(parse_remote_args(&args("--port-range")).is_err());
        assert!(parse_remote_args(&args("--reverse-port 70000")).is_err());
        assert!(parse_remote_args(&args("--verbose 1")).unwrap_err().contains("newer tern"));
    }
}
