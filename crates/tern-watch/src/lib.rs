//! `tern watch`: ship a simulation's output while it is produced.
//!
//! A unit (a top-level file or snapshot directory of the watched directory) is shipped once its
//! ready rule says it is complete ([`rules`]), with the transfer engine as a library; after the
//! engine verified it at the destination it is handed to a hook there ([`hook`]), in production
//! order if asked, and optionally deleted at the source. Every step is recorded durably first
//! ([`state`]), so a kill -9 of the watcher neither loses nor repeats a unit. Design and state
//! format: `docs/watch.md`.

pub mod detect;
pub mod hook;
pub mod rules;
pub mod state;
pub mod stats;
pub mod units;
pub mod watcher;

pub use rules::ReadyRule;
pub use watcher::{Config, Report, Shared, Totals, WatchError, run};
