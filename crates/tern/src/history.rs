//! Every finished transfer leaves one line in a local history (JSON lines): the pair of
//! endpoints, bytes moved, files, seconds, streams, and what the model predicted before it ran.
//! `tern plan` fits its model from it and shows how good the predictions were. A `tern test`
//! leaves one too (`expected_gbps`, no transfer fields), so a later large transfer of the pair
//! is compared with what the test expected (`test_expected_gbps`).
//!
//! Where: `$TERN_HISTORY` (a file; `off` turns recording off), else
//! `$XDG_STATE_HOME/tern/history.jsonl`, else `~/.local/state/tern/history.jsonl`. Bounded: past
//! `MAX_BYTES` the oldest half is dropped, so a machine running transfers for years keeps a few
//! thousand lines.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use tern_engine::endpoint::Endpoint;

/// About 8,000 records; the file is rewritten with the newest half when it grows past this.
const MAX_BYTES: u64 = 2 << 20;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct Record {
    /// Unix seconds at the end of the transfer.
    pub(crate) time: u64,
    /// `pair_key` of the transfer's endpoints.
    pub(crate) pair: String,
    /// Payload bytes that crossed the network (resends included).
    pub(crate) bytes: u64,
    /// Files the transfer handled (moved or found identical).
    pub(crate) files: u64,
    pub(crate) seconds: f64,
    pub(crate) streams: u64,
    /// What the model fitted from the earlier records said, if it had enough of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) predicted: Option<f64>,
    /// A path test's line: the rate it expected for transfers of this pair (nothing moved).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) expected_gbps: Option<f64>,
    /// A transfer's line: what the pair's newest path test expected, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) test_expected_gbps: Option<f64>,
}

impl Record {
    /// A transfer's line (not a path test's).
    pub(crate) fn is_transfer(&self) -> bool {
        self.expected_gbps.is_none()
    }
}

pub(crate) fn path() -> Option<PathBuf> {
    match std::env::var_os("TERN_HISTORY") {
        Some(p) if p == "off" => None,
        Some(p) if !p.is_empty() => Some(PathBuf::from(p)),
        _ => {
            let state = std::env::var_os("XDG_STATE_HOME").filter(|s| !s.is_empty()).map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))?;
            Some(state.join("tern/history.jsonl"))
        }
    }
}

/// One endpoint as the history names it: the host (and how it is reached), not the path, so
/// every transfer between the same two machines teaches the same model.
pub(crate) fn endpoint_key(ep: &Endpoint) -> String {
    match ep {
        Endpoint::Local(_) => "local".into(),
        Endpoint::Ssh { host, port: None, .. } => format!("ssh:{host}"),
        Endpoint::Ssh { host, port: Some(p), .. } => format!("ssh:{host}:{p}"),
        Endpoint::Daemon { host, port, .. } => format!("tern://{host}:{port}"),
    }
}

pub(crate) fn pair_key(source: &Endpoint, dest: &Endpoint) -> String {
    format!("{} -> {}", endpoint_key(source), endpoint_key(dest))
}

/// Every readable record, oldest first; unreadable lines (another version's, a torn write) are
/// skipped.
pub(crate) fn load() -> Vec<Record> {
    let Some(p) = path() else { return Vec::new() };
    let Ok(text) = fs::read_to_string(&p) else { return Vec::new() };
    text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

/// Appends one record; a history that cannot be written costs the transfer nothing (the reason
/// is logged at debug level).
pub(crate) fn append(record: &Record) {
    let Some(p) = path() else { return };
    if let Err(e) = try_append(&p, record) {
        tracing::debug!("transfer history {}: {e}", p.display());
    }
}

fn try_append(p: &std::path::Path, record: &Record) -> std::io::Result<()> {
    if let Some(dir) = p.parent() {
        fs::create_dir_all(dir)?;
    }
    let mut line = serde_json::to_vec(record)?;
    line.push(b'\n');
    // One write of a whole line with O_APPEND: concurrent transfers do not interleave lines.
    let mut f = OpenOptions::new().create(true).append(true).open(p)?;
    f.write_all(&line)?;
    if f.metadata()?.len() > MAX_BYTES {
        let text = fs::read_to_string(p)?;
        let lines: Vec<&str> = text.lines().collect();
        let keep = lines[lines.len() / 2..].join("\n") + "\n";
        let tmp = p.with_extension("jsonl.tmp");
        fs::write(&tmp, keep)?;
        fs::rename(&tmp, p)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_hosts_not_paths() {
        let a = Endpoint::parse("/data/run1").unwrap();
        let b = Endpoint::parse("alice@dtn:/scratch/x").unwrap();
        let c = Endpoint::parse("tern://dtn2:7000/p").unwrap();
        assert_eq!(pair_key(&a, &b), "local -> ssh:alice@dtn");
        assert_eq!(pair_key(&c, &a), "tern://dtn2:7000 -> local");
        assert_eq!(pair_key(&Endpoint::parse("/other").unwrap(), &Endpoint::parse("alice@dtn:/y").unwrap()), pair_key(&a, &b));
    }

    #[test]
    fn a_growing_history_keeps_its_newest_half() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("h.jsonl");
        let r = |i: u64| Record { time: i, pair: "local -> local".into(), bytes: i, files: 1, seconds: 1.0, streams: 1, predicted: None, expected_gbps: None, test_expected_gbps: None };
        let mut i = 0;
        while fs::metadata(&p).map(|m| m.len()).unwrap_or(0) <= MAX_BYTES - 200 {
            try_append(&p, &r(i)).unwrap();
            i += 1;
        }
        for _ in 0..10 {
            try_append(&p, &r(i)).unwrap();
            i += 1;
        }
        let text = fs::read_to_string(&p).unwrap();
        let kept: Vec<Record> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert!(fs::metadata(&p).unwrap().len() <= MAX_BYTES);
        assert_eq!(kept.last().unwrap().time, i - 1, "the newest record is kept");
        assert!(kept.len() < i as usize && kept.len() > i as usize / 3, "kept {} of {i}", kept.len());
    }
}
