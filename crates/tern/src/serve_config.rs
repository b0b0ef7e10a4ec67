//! `tern serve --config FILE`: a TOML file whose keys are `tern serve`'s long flags without the
//! leading `--`, with the same value syntax (packaging/tern-serve.example.toml).
//!
//! The file becomes argument tokens placed before the command line's, so clap checks every
//! value exactly as it checks a flag, and nothing here has to follow new flags by hand.
//! Precedence, highest first: the command line, the environment (`TERN_TOKEN_FILE`, `TERN_DB`,
//! `TERN_STATE_DIR`), the file. A repeatable flag given on the command line replaces the
//! file's list rather than adding to it.

use std::ffi::OsString;
use std::path::Path;

use anyhow::{Context, Result, bail};

/// Where `--config FILE` is among `serve`'s arguments, if it is.
fn config_path(args: &[OsString]) -> Option<(usize, OsString)> {
    // The subcommand itself, not an operand of another one (only global flags come before it).
    let serve = args.iter().position(|a| a == "serve")?;
    if !args[1..serve].iter().all(|a| a.to_string_lossy().starts_with('-')) {
        return None;
    }
    let mut i = serve + 1;
    while i < args.len() {
        let a = args[i].to_string_lossy();
        if a == "--" {
            return None;
        }
        if a == "--config" {
            return args.get(i + 1).map(|p| (serve, p.clone()));
        }
        if let Some(p) = a.strip_prefix("--config=") {
            return Some((serve, p.into()));
        }
        i += 1;
    }
    None
}

/// The command line with the file's settings spliced in after `serve`, or as it was.
pub(crate) fn expand(args: Vec<OsString>) -> Result<Vec<OsString>> {
    let Some((serve, path)) = config_path(&args) else { return Ok(args) };
    let path = Path::new(&path);
    let text = std::fs::read_to_string(path).with_context(|| format!("tern serve --config {}: cannot read it", path.display()))?;
    // Anyone who can write it could name the roots and hooks (commands) of this daemon.
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(path)?.permissions());
    if mode & 0o002 != 0 {
        bail!("tern serve --config {}: the file is world-writable (mode {:o}), so anyone could change what this daemon serves and runs; chmod o-w it", path.display(), mode & 0o7777);
    }
    let given: Vec<String> = args[serve + 1..].iter().filter_map(|a| a.to_str()).filter_map(|a| a.strip_prefix("--")).map(|a| a.split('=').next().unwrap_or(a).to_string()).collect();
    let tokens = tokens_from(&text, path, &given, &|name| std::env::var_os(name).is_some())?;
    let mut out = args[..=serve].to_vec();
    out.extend(tokens.into_iter().map(OsString::from));
    out.extend(args[serve + 1..].iter().cloned());
    Ok(out)
}

/// The file's settings as argument tokens. `given`: long flags on the command line (they win);
/// `env_set`: whether an environment variable is set (it wins over the file).
fn tokens_from(text: &str, path: &Path, given: &[String], env_set: &dyn Fn(&str) -> bool) -> Result<Vec<String>> {
    use clap::CommandFactory;
    let file = path.display();
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| anyhow::anyhow!("tern serve --config {file}: not valid TOML: {}", e.message()))?;
    let cli = crate::args::Cli::command();
    let serve = cli.find_subcommand("serve").expect("serve is a subcommand");
    let mut tokens = Vec::new();
    for (key, value) in &table {
        if key == "verbose" {
            let n = value.as_integer().filter(|n| (0..=3).contains(n)).with_context(|| format!("tern serve --config {file}: verbose = {value}: expected 0, 1 or 2"))?;
            tokens.extend((0..n).map(|_| "-v".to_string()));
            continue;
        }
        if key == "config" {
            bail!("tern serve --config {file}: a configuration file cannot name another (key 'config')");
        }
        let Some(arg) = serve.get_arguments().find(|a| a.get_long() == Some(key.as_str()) && !a.is_hide_set()) else {
            let near = serve.get_arguments().filter_map(|a| a.get_long()).filter(|l| *l != "config").min_by_key(|l| strsim_distance(l, key)).unwrap_or("");
            bail!("tern serve --config {file}: unknown key '{key}' (tern serve has no --{key}; did you mean '{near}'?)");
        };
        if given.iter().any(|g| g == key) || arg.get_env().is_some_and(|e| env_set(&e.to_string_lossy())) {
            continue;
        }
        let is_switch = matches!(arg.get_action(), clap::ArgAction::SetTrue);
        let repeatable = matches!(arg.get_action(), clap::ArgAction::Append);
        let scalar = |v: &toml::Value| -> Result<String> {
            match v {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(i) => Ok(i.to_string()),
                toml::Value::Float(f) => Ok(f.to_string()),
                other => bail!("tern serve --config {file}: {key} = {other}: expected a string or a number"),
            }
        };
        match value {
            toml::Value::Boolean(on) if is_switch => {
                if *on {
                    tokens.push(format!("--{key}"));
                }
            }
            _ if is_switch => bail!("tern serve --config {file}: {key} = {value}: expected true or false"),
            toml::Value::Array(items) if repeatable => {
                for item in items {
                    tokens.push(format!("--{key}"));
                    tokens.push(scalar(item)?);
                }
            }
            toml::Value::Array(_) => bail!("tern serve --config {file}: {key} takes one value, not a list"),
            v => {
                tokens.push(format!("--{key}"));
                tokens.push(scalar(v)?);
            }
        }
    }
    // Every value checked as clap checks a flag, and an error names the file. (Required flags
    // may still come from the command line, so their absence is not an error here.)
    let mut probe = vec!["tern".to_string(), "serve".to_string()];
    probe.extend(tokens.iter().cloned());
    if let Err(e) = cli.clone().try_get_matches_from(&probe) {
        use clap::error::ErrorKind;
        if !matches!(e.kind(), ErrorKind::MissingRequiredArgument | ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
            let first = e.to_string().lines().next().unwrap_or("").trim_start_matches("error: ").to_string();
            bail!("tern serve --config {file}: {first}");
        }
    }
    Ok(tokens)
}

/// Edit distance, for "did you mean" (names are short).
fn strsim_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            cur.push((prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(text: &str, given: &[&str]) -> Result<Vec<String>> {
        let given: Vec<String> = given.iter().map(|s| s.to_string()).collect();
        tokens_from(text, Path::new("/etc/tern/serve.toml"), &given, &|_| false)
    }

    #[test]
    fn the_shipped_example_parses_into_serve_flags() {
        let example = include_str!("../../../packaging/tern-serve.example.toml");
        let t = tokens(example, &[]).unwrap();
        let joined = t.join(" ");
        for want in ["--listen 0.0.0.0:7700", "--root /data --root scratch=/scratch", "--token-file /var/lib/tern/daemon.token", "--max-sessions 64", "--http-listen 0.0.0.0:7443", "--max-jobs 4"] {
            assert!(joined.contains(want), "{want} missing from {joined}");
        }
        // And the whole command line parses as tern serve's.
        use clap::CommandFactory;
        let mut argv = vec!["tern".to_string(), "serve".to_string()];
        argv.extend(t);
        crate::args::Cli::command().try_get_matches_from(argv).unwrap();
    }

    #[test]
    fn the_command_line_wins_and_lists_are_replaced() {
        let t = tokens("listen = \"0.0.0.0:1\"\nroot = [\"/a\", \"/b\"]\nmax-sessions = 3\nallow-links-out = true\n", &["listen", "root"]).unwrap();
        assert_eq!(t, ["--allow-links-out", "--max-sessions", "3"]);
        let env = tokens_from("token-file = \"/f\"\n", Path::new("x.toml"), &[], &|name| name == "TERN_TOKEN_FILE").unwrap();
        assert!(env.is_empty(), "the environment wins over the file");
    }

    #[test]
    fn mistakes_name_the_key_and_the_file() {
        let e = tokens("max-sesions = 3\n", &[]).unwrap_err().to_string();
        assert!(e.contains("/etc/tern/serve.toml") && e.contains("unknown key 'max-sesions'") && e.contains("max-sessions"), "{e}");
        let e = tokens("max-sessions = \"many\"\n", &[]).unwrap_err().to_string();
        assert!(e.contains("/etc/tern/serve.toml") && e.contains("many") && e.contains("--max-sessions"), "{e}");
        let e = tokens("listen = [\"a\", \"b\"]\n", &[]).unwrap_err().to_string();
        assert!(e.contains("listen takes one value"), "{e}");
        let e = tokens("allow-links-out = \"yes\"\n", &[]).unwrap_err().to_string();
        assert!(e.contains("expected true or false"), "{e}");
        let e = tokens("root = \n", &[]).unwrap_err().to_string();
        assert!(e.contains("not valid TOML"), "{e}");
    }
}
