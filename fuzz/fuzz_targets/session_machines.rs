//! `session_machines`: the body and the properties it checks are in `src/lib.rs`
//! (`tern_fuzz::session_machines`), which the stable corpus replay
//! (`crates/tern-proto/tests/fuzz_corpus.rs`) runs too.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| tern_fuzz::session_machines(data));
