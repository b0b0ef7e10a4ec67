//! What the service talks about, one concern per file:
//! - `types.rs` job states, the job spec a client may submit, token scopes, and the rows the
//!   store returns;
//! - `validate.rs` what a spec may hold, checked at submit without touching the file system;
//! - `command.rs` the child `tern` command line the runner executes for a job;
//! - `pathtest.rs` scheduled path tests: request, bounds, child argv, results, baseline;
//! - `time.rs` deadlines: RFC 3339 and durations to unix seconds and back.
//!
//! Everything is re-exported here, so callers name `model::JobSpec`, `model::now`, ... whatever
//! file it lives in.

mod command;
pub mod pathtest;
mod time;
mod types;
mod validate;

pub use time::{now, parse_time, rfc3339};
pub use types::{Job, JobOptions, JobSpec, JobState, Scope, TokenInfo, Totals, WatchOptions};

/// A copy from `src` to `dst` with default options, for the tests of each part.
#[cfg(test)]
fn spec(src: &str, dst: &str) -> JobSpec {
    JobSpec { src: src.into(), dst: dst.into(), sync: false, label: None, notify: None, options: JobOptions::default() }
}
