//! Every integration test of the `tern` binary in one test binary: one build and one link
//! instead of twenty, and one scheduler over all of them (`cargo test` runs test binaries one
//! after another, so a file with one long test left the other test thread idle). Each file is a
//! module; run one with `cargo test -p tern --test integration FILE::` (or any part of a name).
//! Tests in different files now run side by side: none may take a fixed port, namespace name or
//! process-wide setting that another file's test uses (common/ hands out what they share).

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

mod common;
#[path = "../../tern-service/tests/support/pg.rs"]
mod pg;

mod bad_input;
mod cli_habits;
mod cluster;
mod cluster_spread;
mod corruption;
mod daemon_limits;
mod dashboard;
mod deep_trees;
mod doctor;
mod faults;
mod filters;
mod install;
mod names;
mod path_test;
mod plan;
mod remote_fs;
mod service;
mod third_party;
mod transfers;
mod watch;
