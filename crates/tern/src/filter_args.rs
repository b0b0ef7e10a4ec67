//! `--exclude`, `--include`, `--exclude-from`, `--include-from` and `--filter`: one list of
//! rules in command-line order, because the first matching rule decides (rsync's idiom
//! `--include '*/' --include '*.h5' --exclude '*'` depends on it). clap keeps each flag's values
//! apart, so the order is rebuilt from the argument indices after parsing.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{ArgMatches, Args};
use tern_proto::filter::{Filter, FilterRule};

#[derive(Args, Default, Clone)]
pub(crate) struct FilterArgs {
    /// Leave out paths matching PATTERN, as rsync does: `*.tmp` (any depth), `/scratch` (only
    /// at the top), `cache/` (directories only), `**` (across directories). Repeatable; rules
    /// apply in command-line order with --include, first match wins. With sync --delete,
    /// excluded files at the destination are kept.
    #[arg(long, value_name = "PATTERN")]
    exclude: Vec<String>,
    /// Keep paths matching PATTERN even if a later --exclude matches them.
    #[arg(long, value_name = "PATTERN")]
    include: Vec<String>,
    /// Read exclude patterns from FILE, one per line (blank lines and lines starting with # or ; are skipped).
    #[arg(long, value_name = "FILE")]
    exclude_from: Vec<PathBuf>,
    /// Read include patterns from FILE, one per line.
    #[arg(long, value_name = "FILE")]
    include_from: Vec<PathBuf>,
    /// A rule in rsync's short form: '- PATTERN' excludes, '+ PATTERN' includes.
    #[arg(long, value_name = "RULE", allow_hyphen_values = true)]
    filter: Vec<String>,
    /// The rules above, in order; filled in by `collect` after parsing.
    #[arg(skip)]
    pub(crate) rules: Vec<FilterRule>,
}

impl FilterArgs {
    /// Rebuilds the rule order from `m` (the subcommand's matches) and checks every rule.
    pub(crate) fn collect(&mut self, m: &ArgMatches) -> Result<()> {
        let mut tagged: Vec<(usize, FilterRule)> = Vec::new();
        let mut each = |id: &str, make: &dyn Fn(&str) -> Result<Vec<FilterRule>>| -> Result<()> {
            let (Ok(Some(values)), Some(indices)) = (m.try_get_raw(id), m.indices_of(id)) else { return Ok(()) };
            for (v, i) in values.zip(indices) {
                let v = v.to_str().with_context(|| format!("--{}: not UTF-8", id.replace('_', "-")))?;
                tagged.extend(make(v)?.into_iter().map(|r| (i, r)));
            }
            Ok(())
        };
        each("exclude", &|p| Ok(vec![FilterRule::exclude(p)]))?;
        each("include", &|p| Ok(vec![FilterRule::include(p)]))?;
        each("filter", &|r| FilterRule::parse(r).map(|r| vec![r]).map_err(anyhow::Error::msg))?;
        each("exclude_from", &|f| Ok(read_patterns(f)?.iter().map(|p| FilterRule::exclude(p)).collect()))?;
        each("include_from", &|f| Ok(read_patterns(f)?.iter().map(|p| FilterRule::include(p)).collect()))?;
        // Stable: the lines of one file keep their order.
        tagged.sort_by_key(|(i, _)| *i);
        self.rules = tagged.into_iter().map(|(_, r)| r).collect();
        Filter::new(&self.rules).map_err(anyhow::Error::msg)?;
        Ok(())
    }
}

fn read_patterns(file: &str) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(file).with_context(|| format!("cannot read filter file {file} (source side, this host)"))?;
    Ok(text.lines().map(str::trim_end).filter(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';')).map(str::to_string).collect())
}
