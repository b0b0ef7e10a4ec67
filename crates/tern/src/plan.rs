//! `tern plan SRC... DST`: how long this transfer will take, from a model of this pair of
//! endpoints fitted to tern's own past transfers (`history`), and what would make it faster.
//!
//! The model is the one the SC16 team wrote down for their transfers, without its checksum
//! term (tern hashes as it reads): T = start-up + bytes · per-byte + files · per-file. Its
//! three costs are fitted by least squares weighted by 1/T², so a 2-second and a 2-hour
//! transfer count alike in relative error, and none may be negative (an exhaustive search over
//! which terms take part: three terms, eight subsets). The fit is pure (`fit`, `Model`) and
//! tested with made-up histories.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use serde::Serialize;
use tern_engine::endpoint::Endpoint;
use tern_proto::{FsKind, FsOp};

use crate::history::{self, Record};
use crate::output::units;

/// The newest records of a pair that a fit uses: paths and hosts change over months.
const FIT_WINDOW: usize = 50;

#[derive(Args)]
pub(crate) struct PlanArgs {
    /// SRC... DST, as for `tern cp` (paths, [user@]host:path, tern://host[:port]/path).
    #[arg(required_unless_present = "history", num_args = 2..)]
    paths: Vec<String>,
    /// Show past transfers with what was predicted before each ran (DST: only that pair).
    #[arg(long)]
    history: bool,
    /// One JSON object on stdout instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    conn: crate::fs_cli::ConnArgs,
}

/// Fitted costs of one pair of endpoints.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub(crate) struct Model {
    pub(crate) startup_s: f64,
    pub(crate) per_gb_s: f64,
    pub(crate) per_1000_files_s: f64,
    /// Past transfers it was fitted to.
    pub(crate) samples: usize,
}

impl Model {
    pub(crate) fn predict(&self, bytes: u64, files: u64) -> f64 {
        self.startup_s + bytes as f64 / 1e9 * self.per_gb_s + files as f64 / 1e3 * self.per_1000_files_s
    }

    /// The file size below which per-file work costs more than a tenth of a file's time: a
    /// producer writing files at least this large keeps the per-file cost under 10 %.
    pub(crate) fn good_file_size(&self) -> Option<u64> {
        (self.per_gb_s > 0.0 && self.per_1000_files_s > 0.0).then(|| (9.0 * (self.per_1000_files_s / 1e3) / (self.per_gb_s / 1e9)) as u64)
    }
}

/// Least squares over (bytes, files, seconds), weighted by 1/seconds², costs ≥ 0. None without
/// a usable sample. With fewer samples than terms, only as many terms as samples take part.
pub(crate) fn fit(samples: &[(u64, u64, f64)]) -> Option<Model> {
    let rows: Vec<([f64; 3], f64)> = samples.iter().filter(|s| s.2 > 0.0 && s.2.is_finite()).map(|&(b, f, t)| ([1.0, b as f64 / 1e9, f as f64 / 1e3], t)).collect();
    if rows.is_empty() {
        return None;
    }
    let mut best: Option<(f64, usize, [f64; 3])> = None;
    // Bit 0 start-up, 1 per-byte, 2 per-file. On a tie between subsets of one size the earlier
    // wins: a rate before a fixed time (one record is a rate, not a constant duration).
    for mask in [0b010u8, 0b011, 0b110, 0b111, 0b001, 0b100, 0b101] {
        let terms: Vec<usize> = (0..3).filter(|i| mask & (1 << i) != 0).collect();
        if terms.len() > rows.len() {
            continue;
        }
        let Some(coef) = weighted_least_squares(&rows, &terms) else { continue };
        if coef.iter().any(|c| *c < 0.0) {
            continue;
        }
        let mut full = [0.0; 3];
        for (k, &i) in terms.iter().enumerate() {
            full[i] = coef[k];
        }
        let sse: f64 = rows.iter().map(|(x, t)| ((x[0] * full[0] + x[1] * full[1] + x[2] * full[2]) - t).powi(2) / (t * t)).sum();
        // Fewer terms win a tie (within 1e-9 relative): no cost is invented that the data do not show.
        let better = match best {
            None => true,
            Some((s, n, _)) => sse < s - 1e-9 * s.max(1e-12) || (sse <= s + 1e-9 * s.max(1e-12) && terms.len() < n),
        };
        if better {
            best = Some((sse, terms.len(), full));
        }
    }
    let (_, _, c) = best?;
    Some(Model { startup_s: c[0], per_gb_s: c[1], per_1000_files_s: c[2], samples: rows.len() })
}

/// Solves the weighted normal equations for the chosen columns (Gaussian elimination with
/// partial pivoting; at most 3 × 3). None when they are singular (e.g. all samples the same size).
fn weighted_least_squares(rows: &[([f64; 3], f64)], terms: &[usize]) -> Option<Vec<f64>> {
    let n = terms.len();
    let mut a = vec![vec![0.0; n + 1]; n];
    for (x, t) in rows {
        let w = 1.0 / (t * t);
        for i in 0..n {
            for j in 0..n {
                a[i][j] += w * x[terms[i]] * x[terms[j]];
            }
            a[i][n] += w * x[terms[i]] * t;
        }
    }
    let scale = a.iter().flat_map(|r| r[..n].iter()).fold(0.0f64, |m, v| m.max(v.abs()));
    for col in 0..n {
        let pivot = (col..n).max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))?;
        if a[pivot][col].abs() <= 1e-12 * scale {
            return None;
        }
        a.swap(col, pivot);
        let pivot_row = a[col].clone();
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let f = row[col] / pivot_row[col];
                for (x, p) in row[col..].iter_mut().zip(&pivot_row[col..]) {
                    *x -= f * p;
                }
            }
        }
    }
    Some((0..n).map(|i| a[i][n] / a[i][i]).collect())
}

/// Median relative error of predicting each sample from the others (leave one out); None
/// below four samples, where it would say nothing.
pub(crate) fn typical_error(samples: &[(u64, u64, f64)]) -> Option<f64> {
    if samples.len() < 4 {
        return None;
    }
    let mut errs: Vec<f64> = (0..samples.len())
        .filter_map(|i| {
            let rest: Vec<_> = samples.iter().enumerate().filter(|(j, _)| *j != i).map(|(_, s)| *s).collect();
            let (b, f, t) = samples[i];
            fit(&rest).map(|m| (m.predict(b, f) - t).abs() / t)
        })
        .collect();
    errs.sort_by(f64::total_cmp);
    errs.get(errs.len() / 2).copied()
}

fn samples_of(records: &[Record], pair: &str) -> Vec<(u64, u64, f64)> {
    let mine: Vec<_> = records.iter().filter(|r| r.pair == pair && r.is_transfer()).collect();
    mine[mine.len().saturating_sub(FIT_WINDOW)..].iter().map(|r| (r.bytes, r.files, r.seconds)).collect()
}

/// The prediction for a transfer about to be recorded, from the records before it.
pub(crate) fn predict_from_history(records: &[Record], pair: &str, bytes: u64, files: u64) -> Option<f64> {
    fit(&samples_of(records, pair)).map(|m| m.predict(bytes, files))
}

/// Transfers smaller than this end before the stream ramp has found the path's level.
const RAMPED_BYTES: u64 = 1 << 30;

/// Where the pair's newest large transfer's stream ramp ended (auto-tuning: the next transfer
/// starts there instead of climbing again). None without such a transfer.
pub(crate) fn learned_streams(pair: &str) -> Option<u16> {
    learned_streams_in(&history::load(), pair)
}

fn learned_streams_in(records: &[Record], pair: &str) -> Option<u16> {
    let r = records.iter().rev().find(|r| r.pair == pair && r.is_transfer() && r.bytes >= RAMPED_BYTES)?;
    u16::try_from(r.streams).ok().filter(|&s| s > 0).map(|s| s.min(32))
}

/// A path test's expectation stays the one to compare with for this long.
const TEST_FRESH_S: u64 = 30 * 24 * 3600;
/// Transfers this large are compared with it: start-up is then a small part of their time.
const COMPARED_BYTES: u64 = 256 << 20;

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Records a finished transfer with what the history predicted for it. For a transfer of at
/// least `COMPARED_BYTES`, returns the pair's newest path test's expectation (within 30 days)
/// to compare the achieved rate with.
pub(crate) fn record(source: &Endpoint, dest: &Endpoint, bytes: u64, files: u64, seconds: f64, streams: u64) -> Option<f64> {
    if history::path().is_none() || seconds <= 0.0 || (bytes == 0 && files == 0) {
        return None;
    }
    let pair = history::pair_key(source, dest);
    let records = history::load();
    let predicted = predict_from_history(&records, &pair, bytes, files);
    let time = now_s();
    let test_expected_gbps = tested_in(&records, &pair, time).filter(|_| bytes >= COMPARED_BYTES);
    history::append(&Record { time, pair, bytes, files, seconds, streams, predicted, expected_gbps: None, test_expected_gbps });
    test_expected_gbps
}

/// The newest path test's expected rate for `pair`, if it is younger than `TEST_FRESH_S`.
fn tested_in(records: &[Record], pair: &str, now: u64) -> Option<f64> {
    let t = records.iter().rev().find(|r| r.pair == pair && !r.is_transfer())?;
    t.expected_gbps.filter(|_| now.saturating_sub(t.time) <= TEST_FRESH_S)
}

/// Records what a path test expected for transfers from `source` to `dest`.
pub(crate) fn record_test(source: &Endpoint, dest: &Endpoint, expected_gbps: f64, streams: u64) {
    if history::path().is_none() || !expected_gbps.is_finite() || expected_gbps <= 0.0 {
        return;
    }
    let pair = history::pair_key(source, dest);
    history::append(&Record { time: now_s(), pair, bytes: 0, files: 0, seconds: 0.0, streams, predicted: None, expected_gbps: Some(expected_gbps), test_expected_gbps: None });
}

#[derive(Serialize)]
struct Plan {
    pair: String,
    files: u64,
    bytes: u64,
    directories: u64,
    model: Option<Model>,
    predicted_seconds: Option<f64>,
    typical_error: Option<f64>,
    advice: Vec<String>,
}

pub(crate) fn run(a: PlanArgs) -> Result<ExitCode> {
    if a.history {
        return show_history(&a);
    }
    let (dst, srcs) = a.paths.split_last().expect("clap requires two paths");
    let dest = Endpoint::parse(dst).map_err(anyhow::Error::msg)?;
    let sources = srcs.iter().map(|s| Endpoint::parse(s).map_err(anyhow::Error::msg)).collect::<Result<Vec<_>>>()?;
    let (mut files, mut bytes, mut directories) = (0u64, 0u64, 0u64);
    for text in srcs {
        // The same walk `tern ls -R` does, on whichever side the source lives.
        let Ok(top) = crate::fs_cli::ask(text, &a.conn, FsOp::Stat, 0) else { return Ok(ExitCode::from(1)) };
        let below = if top.first().is_some_and(|e| e.kind == FsKind::Dir) {
            directories += 1;
            let Ok(all) = crate::fs_cli::ask(text, &a.conn, FsOp::List, tern_proto::msg::FS_RECURSIVE) else { return Ok(ExitCode::from(1)) };
            all
        } else {
            top
        };
        for e in below {
            match e.kind {
                FsKind::File => {
                    files += 1;
                    bytes += e.size;
                }
                FsKind::Dir => directories += 1,
                _ => files += 1,
            }
        }
    }
    let pair = history::pair_key(&sources[0], &dest);
    let samples = samples_of(&history::load(), &pair);
    let model = fit(&samples);
    let predicted = model.map(|m| m.predict(bytes, files));
    let typical = typical_error(&samples);
    let mut advice = Vec::new();
    match model {
        None => advice.push(format!(
            "no past transfers from {pair} yet: the first `tern cp` between them teaches the model (the history is {})",
            history::path().map_or("off (TERN_HISTORY=off)".into(), |p| p.display().to_string())
        )),
        Some(m) => {
            if m.samples < 3 {
                advice
                    .push(format!("the model has {} past transfer(s) of this pair; it separates start-up, per-byte and per-file costs from 3 on, best with transfers of different shapes", m.samples));
            }
            if let (Some(size), Some(p)) = (m.good_file_size(), predicted)
                && files > 0
            {
                let per_file = files as f64 / 1e3 * m.per_1000_files_s;
                if per_file > 0.2 * p {
                    advice.push(format!(
                        "{:.0} % of the time goes to per-file work ({} files averaging {}): files of at least {} each would keep that under 10 % (pack small files, e.g. with tar, before they are moved)",
                        100.0 * per_file / p,
                        files,
                        units::size(bytes / files.max(1)),
                        units::size(size)
                    ));
                }
            }
        }
    }
    let plan = Plan { pair, files, bytes, directories, model, predicted_seconds: predicted, typical_error: typical, advice };
    if a.json {
        println!("{}", serde_json::to_string(&plan)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!("{}: {} files, {} in {} director{}", plan.pair, plan.files, units::size(plan.bytes), plan.directories, if plan.directories == 1 { "y" } else { "ies" });
    if let (Some(m), Some(p)) = (plan.model, plan.predicted_seconds) {
        let spread = typical.map_or(String::new(), |e| format!(" (typically within {:.0} %)", 100.0 * e));
        println!("predicted: {}{spread}, {} if the destination has none of it", secs(p), units::bits(plan.bytes as f64 / p.max(1e-9)));
        println!(
            "model of this pair, from {} past transfers: start-up {:.2} s, {:.2} s per GB ({}), {:.2} s per 1,000 files",
            m.samples,
            m.startup_s,
            m.per_gb_s,
            if m.per_gb_s > 0.0 { units::bits(1e9 / m.per_gb_s) } else { "no per-byte cost seen".into() },
            m.per_1000_files_s
        );
    }
    for line in &plan.advice {
        println!("advice: {line}");
    }
    Ok(ExitCode::SUCCESS)
}

/// Seconds with the precision that matters at their scale.
fn secs(s: f64) -> String {
    if s < 10.0 {
        format!("{s:.2} s")
    } else if s < 3600.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.0} s ({})", units::duration(s))
    }
}

fn show_history(a: &PlanArgs) -> Result<ExitCode> {
    let records = history::load();
    let pair = match a.paths.as_slice() {
        [] => None,
        [.., dst] => Some(Endpoint::parse(dst).map_err(anyhow::Error::msg)?),
    };
    let only = |r: &&Record| pair.as_ref().is_none_or(|d| r.pair.ends_with(&format!("-> {}", history::endpoint_key(d))));
    let shown: Vec<&Record> = records.iter().filter(only).filter(|r| r.is_transfer()).collect();
    let errors: Vec<f64> = shown.iter().filter_map(|r| r.predicted.map(|p| (p - r.seconds).abs() / r.seconds)).collect();
    let mut sorted = errors.clone();
    sorted.sort_by(f64::total_cmp);
    let median = sorted.get(sorted.len() / 2).copied();
    let within_20 = errors.iter().filter(|e| **e <= 0.2).count();
    if a.json {
        println!("{}", serde_json::json!({"records": shown, "predicted": errors.len(), "median_error": median, "within_20_percent": within_20}));
        return Ok(ExitCode::SUCCESS);
    }
    println!("{:<21} {:<36} {:>10} {:>9} {:>9} {:>9} {:>7} {:>14}", "when (UTC)", "pair", "bytes", "files", "actual s", "predict", "error", "Gb/s vs test");
    for r in &shown {
        let when = tern_service::model::rfc3339(r.time as i64);
        let (p, e) = r.predicted.map_or(("—".into(), "—".into()), |p| (format!("{p:.2}"), format!("{:+.0} %", 100.0 * (p - r.seconds) / r.seconds)));
        let rate = r.bytes as f64 * 8.0 / r.seconds / 1e9;
        let test = r.test_expected_gbps.map_or("—".into(), |t| format!("{rate:.2} / {t:.2}"));
        println!("{when:<21} {:<36} {:>10} {:>9} {:>9.2} {p:>9} {e:>7} {test:>14}", r.pair, units::size(r.bytes), r.files, r.seconds);
    }
    if let Some(m) = median {
        println!("{} predicted: median error {:.0} %, {within_20} within 20 %", errors.len(), 100.0 * m);
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A made-up path: 1.5 s to start, 0.9 Gb/s, 4 ms per file.
    fn truth(bytes: u64, files: u64) -> f64 {
        1.5 + bytes as f64 * 8.0 / 0.9e9 + files as f64 * 0.004
    }

    #[test]
    fn a_transfer_is_compared_with_the_pair_s_newest_fresh_test_and_tests_teach_no_model() {
        let transfer = |pair: &str, time: u64| Record { time, pair: pair.into(), bytes: 1 << 30, files: 1, seconds: 2.0, streams: 4, predicted: None, expected_gbps: None, test_expected_gbps: None };
        let test = |pair: &str, time: u64, g: f64| Record { time, pair: pair.into(), bytes: 0, files: 0, seconds: 0.0, streams: 8, predicted: None, expected_gbps: Some(g), test_expected_gbps: None };
        let day = 24 * 3600;
        let h = vec![test("local -> tern://a:7788", 0, 1.0), transfer("local -> tern://a:7788", day), test("local -> tern://a:7788", 2 * day, 2.5), test("local -> ssh:b", 2 * day, 9.0)];
        assert_eq!(tested_in(&h, "local -> tern://a:7788", 3 * day), Some(2.5), "the newest test of that pair");
        assert_eq!(tested_in(&h, "local -> tern://a:7788", 2 * day + TEST_FRESH_S + 1), None, "too old");
        assert_eq!(tested_in(&h, "local -> local", 3 * day), None);
        // Test lines are no transfers: neither samples for the model nor a learned stream count.
        assert_eq!(samples_of(&h, "local -> tern://a:7788").len(), 1);
        assert_eq!(learned_streams_in(&h, "local -> ssh:b"), None);
    }

    #[test]
    fn three_shapes_recover_the_three_costs() {
        let s: Vec<_> = [(128u64 << 20, 6u64), (2 << 30, 8), (512 << 20, 3000), (64 << 20, 20_000)].iter().map(|&(b, f)| (b, f, truth(b, f))).collect();
        let m = fit(&s).unwrap();
        assert!((m.startup_s - 1.5).abs() < 1e-6, "{m:?}");
        assert!((m.per_gb_s - 8.0 / 0.9).abs() < 1e-6, "{m:?}");
        assert!((m.per_1000_files_s - 4.0).abs() < 1e-6, "{m:?}");
        // A shape it was not fitted to.
        assert!((m.predict(5 << 30, 100_000) - truth(5 << 30, 100_000)).abs() < 1e-6);
        assert_eq!(typical_error(&s).map(|e| e < 1e-6), Some(true));
    }

    #[test]
    fn one_sample_gives_a_rate_and_no_invented_costs() {
        let m = fit(&[(1 << 30, 10, 10.0)]).unwrap();
        assert_eq!(m.samples, 1);
        // A rate: twice the bytes, twice the time.
        assert_eq!((m.startup_s, m.per_1000_files_s), (0.0, 0.0), "{m:?}");
        assert!((m.predict(1 << 30, 10) - 10.0).abs() < 1e-9);
        assert!((m.predict(2 << 30, 10) - 20.0).abs() < 1e-9);
    }

    #[test]
    fn costs_are_never_negative() {
        // Noise that an unconstrained fit would explain with a negative start-up.
        let s = [(1u64 << 30, 1u64, 9.0), (2 << 30, 1, 19.5), (4 << 30, 1, 40.0), (8 << 30, 1, 81.0)];
        let m = fit(&s).unwrap();
        assert!(m.startup_s >= 0.0 && m.per_gb_s > 0.0 && m.per_1000_files_s >= 0.0, "{m:?}");
        for (b, f, t) in s {
            assert!((m.predict(b, f) - t).abs() / t < 0.1, "{m:?} at {b}");
        }
    }

    #[test]
    fn nothing_usable_is_no_model() {
        assert_eq!(fit(&[]), None);
        assert_eq!(fit(&[(1, 1, 0.0)]), None);
        assert_eq!(typical_error(&[(1, 1, 1.0), (2, 1, 2.0)]), None);
    }

    #[test]
    fn a_good_file_size_keeps_per_file_work_under_a_tenth() {
        let m = Model { startup_s: 1.0, per_gb_s: 10.0, per_1000_files_s: 5.0, samples: 5 };
        let size = m.good_file_size().unwrap();
        let per_file = 5.0 / 1e3;
        let per_byte = size as f64 / 1e9 * 10.0;
        assert!((per_file / (per_file + per_byte) - 0.1).abs() < 1e-3);
        assert_eq!(Model { per_1000_files_s: 0.0, ..m }.good_file_size(), None);
    }

    #[test]
    fn streams_are_learned_from_the_newest_large_transfer_of_the_pair() {
        let rec = |pair: &str, b: u64, streams: u64| Record { time: 0, pair: pair.into(), bytes: b, files: 1, seconds: 1.0, streams, predicted: None, expected_gbps: None, test_expected_gbps: None };
        let h = vec![rec("p", 2 << 30, 12), rec("p", 4 << 30, 16), rec("p", 1 << 20, 8), rec("q", 8 << 30, 64)];
        assert_eq!(learned_streams_in(&h, "p"), Some(16), "small transfers end before the ramp does");
        assert_eq!(learned_streams_in(&h, "q"), Some(32), "never above the ramp's cap");
        assert_eq!(learned_streams_in(&h, "r"), None);
    }

    #[test]
    fn predictions_use_the_pairs_own_newest_records() {
        let rec = |pair: &str, b: u64, t: f64| Record { time: 0, pair: pair.into(), bytes: b, files: 1, seconds: t, streams: 4, predicted: None, expected_gbps: None, test_expected_gbps: None };
        let mut h: Vec<Record> = (0..60).map(|_| rec("local -> ssh:a", 1 << 30, 100.0)).collect();
        h.extend((0..FIT_WINDOW).map(|_| rec("local -> ssh:a", 1 << 30, 10.0)));
        h.push(rec("local -> ssh:b", 1 << 30, 1000.0));
        let p = predict_from_history(&h, "local -> ssh:a", 1 << 30, 1).unwrap();
        assert!((p - 10.0).abs() < 1e-6, "{p}");
        assert_eq!(predict_from_history(&h, "local -> ssh:c", 1, 1), None);
    }
}
