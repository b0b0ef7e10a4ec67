//! The job and token types: what a client submits (`JobSpec` and its options), the states a
//! job passes through, token scopes, and the rows the store returns.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tern_engine::endpoint::Endpoint;

use super::time::{now, parse_time};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Running,
    /// Waiting out the backoff after a transient failure; runnable again at `not_before`.
    Retrying,
    Succeeded,
    Failed,
    Canceled,
}

impl JobState {
    pub const ALL: [JobState; 6] = [Self::Queued, Self::Running, Self::Retrying, Self::Succeeded, Self::Failed, Self::Canceled];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::Retrying => "retrying",
            Self::Succeeded => "succeeded",
            Self::Failed => "failed",
            Self::Canceled => "canceled",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Terminal states are never left by the service on its own (only by an explicit retry).
    pub fn is_terminal(self) -> bool {
        matches!(self, Self::Succeeded | Self::Failed | Self::Canceled)
    }
}

/// Ordered: each scope includes the ones below it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    Read,
    Transfer,
    Admin,
}

impl Scope {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Transfer => "transfer",
            Self::Admin => "admin",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Read, Self::Transfer, Self::Admin].into_iter().find(|sc| sc.as_str() == s)
    }
}

/// `tern cp`/`tern sync` flags a client may set; each maps to exactly one flag of the child.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub streams: Option<u16>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_size: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bwlimit: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub no_encrypt: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub verify_full: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub checksum: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub delete: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_for: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<String>,
    /// tern:// to tern:// jobs: the destination daemon's token file when it differs from
    /// `token_file` (then the source daemon's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dst_token_file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remote_bin: Option<String>,
    /// A watch job (`tern submit --watch`): the child is `tern watch` instead of `tern cp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<WatchOptions>,
    /// A command the service will execute: admin tokens only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<String>,
    /// `--fail-fast`: the first failed file fails the whole transfer.
    #[serde(default, skip_serializing_if = "is_false")]
    pub fail_fast: bool,
    /// Not a flag of the child: the service fails the job if it has not finished by then.
    /// Submitted as RFC 3339 (`2026-11-22T06:00:00Z`) or a duration from now (`90m`, `6h`,
    /// `2d`); stored as RFC 3339 UTC (the API turns a duration into a time at submit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// `--ignore-existing`: keep destination files that exist, whatever their content.
    #[serde(default, skip_serializing_if = "is_false")]
    pub ignore_existing: bool,
    /// Include/exclude rules in order, rsync's short form: `- *.tmp`, `+ */`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub filters: Vec<String>,
}

/// `tern watch` flags a client may set (docs/watch.md); each maps to one flag of the child.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_arrival: Option<String>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub in_order: bool,
    #[serde(default, skip_serializing_if = "is_false")]
    pub delete_after_verified: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_units: Option<u64>,
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What a client submits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    pub src: String,
    pub dst: String,
    #[serde(default)]
    pub sync: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<String>,
    #[serde(default)]
    pub options: JobOptions,
}

impl JobSpec {
    /// The deadline as unix seconds (`options.deadline`, normalised to RFC 3339 at submit).
    pub fn deadline_at(&self) -> Option<i64> {
        self.options.deadline.as_deref().and_then(|d| parse_time(d, now()).ok())
    }

    /// Every path this job touches (for token path prefixes), local or remote.
    pub fn paths(&self) -> Vec<String> {
        let mut out: Vec<String> = [&self.src, &self.dst].iter().filter_map(|e| Endpoint::parse(e).ok()).map(|e| e.path_str()).collect();
        out.extend(self.options.token_file.iter().chain(&self.options.dst_token_file).cloned());
        out
    }
}

/// A job as stored, plus what the API adds (rate, ETA) when it shows one.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Job {
    pub id: i64,
    pub state: JobState,
    pub spec: JobSpec,
    pub owner: Option<String>,
    pub created_at: i64,
    pub updated_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
    pub not_before: i64,
    pub attempts: u32,
    pub retries: u32,
    /// The child's latest `{"progress": {...}}` object (inner part).
    pub progress: Option<Value>,
    /// The child's final summary object.
    pub summary: Option<Value>,
    /// Why the job failed (or the last transient failure), one line.
    pub error: Option<String>,
    pub notified: bool,
}

/// Token metadata: never the secret, never its hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenInfo {
    pub id: String,
    pub name: String,
    pub scope: Scope,
    pub path_prefix: Option<String>,
    pub created_by: Option<String>,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    pub last_used_at: Option<i64>,
    /// The local account a root service runs this token's transfers as (`--run-as`).
    #[serde(default)]
    pub run_as: Option<String>,
}

/// Aggregates for `/metrics`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Totals {
    pub jobs_by_state: Vec<(JobState, u64)>,
    pub bytes: u64,
    pub files: u64,
    pub files_failed: u64,
    pub retries: u64,
}
