//! One copy spread over the nodes of a cluster (issue 14, docs/cluster.md "Spreading a
//! transfer"): real daemons on loopback ports registered in a real PostgreSQL, a real sshd for the
//! host list. Every copy is compared file by file with the source; a node killed mid-copy costs
//! only what it had in flight.

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use crate::pg;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The petascale tree (links, an empty directory, odd names, a sparse file) plus 40 MiB more, so
/// that it makes several units.
fn source(root: &Path) -> u64 {
    let mut total = petascale_tree(root);
    for i in 0..40 {
        write_file(&root.join(format!("big/f{i:02}")), 1000 + i, 1 << 20);
        total += 1 << 20;
    }
    total
}

/// Stripes moved, over every pair of `--json`'s summary.
fn stripes(summary: &serde_json::Value) -> u64 {
    summary["nodes"].as_array().map_or(0, |n| n.iter().map(|p| p["stripes"].as_u64().unwrap_or(0)).sum())
}

/// Node pairs of `--json`'s summary that moved at least one unit.
fn pairs_with_units(summary: &serde_json::Value) -> usize {
    summary["nodes"].as_array().map_or(0, |n| n.iter().filter(|p| p["units"].as_u64().unwrap_or(0) > 0).count())
}

#[test]
fn a_copy_to_a_cluster_spreads_over_every_node_and_lands_verified() {
    let Some(pg) = pg::Postgres::start() else { return };
    let url = pg.create_db("spread");
    let t = scratch();
    let (src, root, token) = (t.path().join("run42"), t.path().join("lustre"), t.path().join("token"));
    std::fs::create_dir_all(&root).unwrap();
    let total = source(&src);
    let ds = site(&url, "site-b", &root, &token, 3, &[]);
    let r = tern(&["cp", "-r", "--token-file", token.to_str().unwrap(), src.to_str().unwrap(), &ds[0].url("/project")], &[]);
    let e = r.stderr();
    assert!(r.ok(), "{e}");
    assert!(e.contains("spread over 3 node pairs"), "{e}");
    assert!(pairs_with_units(&r.json) >= 2, "the work was shared: {}", r.json);
    assert!(e.lines().filter(|l| l.contains("node pair here to 127.0.0.1:")).count() == 3, "a line per pair: {e}");
    // `cp -r SRC DST` with DST missing makes DST the copy, as on one node.
    assert_same_tree(&src, &root.join("project"));
    assert_no_leftovers(&root);
    assert!(r.u64("bytes") >= total - (1 << 20), "moved {} of {total}", r.u64("bytes"));
    // Again, into the directory that now exists: the copy lands beneath it, as cp does; then a
    // third run finds everything identical.
    let r = tern(&["cp", "-r", "--token-file", token.to_str().unwrap(), src.to_str().unwrap(), &ds[1].url("/project")], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &root.join("project/run42"));
    let r = tern(&["cp", "-r", "--token-file", token.to_str().unwrap(), src.to_str().unwrap(), &ds[1].url("/project")], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(r.u64("bytes"), 0, "nothing sent again: {}", r.json);
}

/// A copy of the tree `make` writes to a 3-node cluster, paced at 8 MiB/s a pair so that each
/// pair's first unit takes seconds, with one destination node killed 1.5 s in: the copy must
/// finish, verified, without leftovers, and say the pair left. Returns the bytes sent beyond
/// the tree's size; `None` without PostgreSQL.
fn kill_a_destination_node_mid_copy(db: &str, make: fn(&Path) -> u64) -> Option<u64> {
    let pg = pg::Postgres::start()?;
    let url = pg.create_db(db);
    let t = scratch();
    let (src, root, token) = (t.path().join("run42"), t.path().join("lustre"), t.path().join("token"));
    std::fs::create_dir_all(&root).unwrap();
    let total = make(&src);
    let mut ds = site(&url, "site-b", &root, &token, 3, &[]);
    let mut cmd = Command::new(tern_bin());
    cmd.args(["cp", "-r", "--json", "--bwlimit", "8M", "--token-file", token.to_str().unwrap(), src.to_str().unwrap(), &ds[0].url("/project")]).stdin(Stdio::null());
    let copy = std::thread::spawn(move || run_bounded(cmd, Duration::from_secs(120)));
    std::thread::sleep(Duration::from_millis(1500));
    ds[2].kill9();
    let out = copy.join().unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{e}");
    assert!(e.contains("left the transfer"), "the killed node's pair says so: {e}");
    assert_same_tree(&src, &root.join("project"));
    assert_no_leftovers(&root);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let again = json["bytes"].as_u64().unwrap().saturating_sub(total);
    println!("{again} bytes sent again after the kill; {}", json["nodes"]);
    Some(again)
}

#[test]
fn a_destination_node_killed_mid_copy_costs_only_what_it_had_in_flight() {
    let Some(again) = kill_a_destination_node_mid_copy("spreadkill", source) else { return };
    // A unit is at most 32 MiB here; the dead node had at most one in flight.
    assert!(again <= 32 << 20, "sent again {again} bytes, more than one unit");
}

/// One 100 MiB file and two small ones: over 3 pairs the large file is cut into 3 stripes (units
/// of 32 MiB at least, a multiple of the pairs, whole 4 MiB chunks: 36, 36 and 28 MiB).
fn one_large_file(root: &Path) -> u64 {
    write_file(&root.join("data/big.h5"), 7, 100 << 20);
    write_file(&root.join("a.txt"), 8, 1000);
    write_file(&root.join("data/b.txt"), 9, 5000);
    (100 << 20) + 6000
}

#[test]
fn one_large_file_is_striped_over_every_pair_and_published_once() {
    let Some(pg) = pg::Postgres::start() else { return };
    let url = pg.create_db("stripes");
    let t = scratch();
    let (src, root, token) = (t.path().join("run42"), t.path().join("lustre"), t.path().join("token"));
    std::fs::create_dir_all(&root).unwrap();
    let total = one_large_file(&src);
    let ds = site(&url, "site-b", &root, &token, 3, &[]);
    // Paced, so that no pair takes every stripe before the others start. The publish trusts
    // the sealed stripes: a read of the source only to hash a chunk again fails the copy.
    let r = tern(&["cp", "-r", "--bwlimit", "40M", "--token-file", token.to_str().unwrap(), src.to_str().unwrap(), &ds[0].url("/project")], &[("TERN_FAULT_NO_REREAD", "1")]);
    let e = r.stderr();
    assert!(r.ok(), "{e}");
    assert_eq!(pairs_with_units(&r.json), 3, "the one large file moved over every pair: {}", r.json);
    assert_eq!(stripes(&r.json), 3, "100 MiB in a stripe per pair: {}", r.json);
    assert_same_tree(&src, &root.join("project"));
    assert_no_leftovers(&root);
    assert!(r.u64("bytes") <= total + (1 << 20), "moved {} of {total}: a stripe was sent twice", r.u64("bytes"));
    assert_eq!(r.u64("files"), 3, "every file counted once, the striped one too: {}", r.json);
    // Again: the published file is found identical by every stripe's session.
    let r = tern(&["cp", "-r", "--token-file", token.to_str().unwrap(), src.to_str().unwrap(), &ds[1].url("/project")], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_same_tree(&src, &root.join("project/run42"));
    let r = tern(&["cp", "-r", "--token-file", token.to_str().unwrap(), src.to_str().unwrap(), &ds[1].url("/project")], &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(r.u64("bytes"), 0, "nothing sent again: {}", r.json);
}

#[test]
fn a_node_killed_mid_stripe_costs_only_that_stripe_s_chunks_in_flight() {
    let Some(again) = kill_a_destination_node_mid_copy("stripekill", one_large_file) else { return };
    // The stripe resumed from the shared journal: what the dead node had not journaled, at most
    // its stripe (36 MiB), in practice a few chunks.
    assert!(again < 36 << 20, "sent again {again} bytes, a whole stripe or more");
}

#[test]
fn an_ssh_host_list_spreads_the_copy_over_its_hosts() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let (src, dst) = (t.path().join("run42"), t.path().join("global"));
    source(&src);
    // Too large for whole files to balance 2 hosts: striped, each receiving its stripes over ssh.
    write_file(&src.join("big/large.h5"), 78, 160 << 20);
    let target = format!("127.0.0.1,localhost:{}", dst.display());
    let r = tern(&["cp", "-r", "--ssh", &sshd.ssh_cmd(), src.to_str().unwrap(), &target], &[]);
    let e = r.stderr();
    assert!(r.ok(), "{e}");
    assert!(e.contains("spread over 2 node pairs (to 127.0.0.1, localhost)"), "{e}");
    assert!(stripes(&r.json) >= 2, "the large file went in stripes: {}", r.json);
    assert_same_tree(&src, &dst);
    assert_no_leftovers(&dst);
    // What a host list cannot spread is refused in one line, before anything moves.
    let r = tern(&["sync", "--ssh", &sshd.ssh_cmd(), src.to_str().unwrap(), &target], &[]);
    assert!(!r.ok());
    assert!(r.stderr().contains("a host list (h1,h2:/dir) spreads one cp -r"), "{}", r.stderr());
}

/// `k` daemons of cluster `name` on one root, every one active and each one's view of the others
/// fresh (a heartbeat after the last one joined).
fn site(url: &str, name: &str, root: &Path, token: &Path, k: usize, extra: &[&str]) -> Vec<Daemon> {
    let ds: Vec<Daemon> = (0..k)
        .map(|i| {
            let node = format!("{name}{i}");
            let mut args = vec!["--db", url, "--cluster", name, "--node-name", &node, "--cluster-heartbeat-ms", "300"];
            args.extend_from_slice(extra);
            Daemon::start_with(root, token, 0, &[], &args)
        })
        .collect();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let mut cmd = Command::new(tern_bin());
        cmd.args(["cluster", "status", "--db", url, "--cluster", name]).stdin(Stdio::null());
        let text = String::from_utf8_lossy(&run_bounded(cmd, Duration::from_secs(30)).stdout).into_owned();
        if text.matches(" active").count() == k {
            break;
        }
        assert!(Instant::now() < until, "nodes did not all join: {text}");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(700));
    ds
}

#[test]
fn a_copy_between_two_clusters_spreads_over_node_pairs_of_both_sites() {
    let Some(pg) = pg::Postgres::start() else { return };
    let (url_a, url_b) = (pg.create_db("site_a"), pg.create_db("site_b"));
    let t = scratch();
    let (root_a, root_b) = (t.path().join("lustre-a"), t.path().join("lustre-b"));
    let (token_a, token_b) = (t.path().join("token-a"), t.path().join("token-b"));
    std::fs::create_dir_all(&root_b).unwrap();
    source(&root_a.join("run42"));
    // Too large for whole files to balance 2 pairs: striped over both, third-party.
    write_file(&root_a.join("run42/big/large.h5"), 77, 160 << 20);
    // The sending nodes may dial the receiving site's data addresses.
    let a = site(&url_a, "site-a", &root_a, &token_a, 2, &["--dial-allow", "127.0.0.1"]);
    let b = site(&url_b, "site-b", &root_b, &token_b, 2, &[]);
    let r = tern(&["cp", "-r", "--token-file", token_a.to_str().unwrap(), "--dst-token-file", token_b.to_str().unwrap(), &a[0].url("/run42"), &b[1].url("/run42")], &[]);
    let e = r.stderr();
    assert!(r.ok(), "{e}");
    assert!(e.contains("spread over 2 node pairs"), "{e}");
    let sources: std::collections::BTreeSet<String> =
        r.json["nodes"].as_array().unwrap().iter().filter(|p| p["units"].as_u64().unwrap_or(0) > 0).map(|p| p["source"].as_str().unwrap().to_string()).collect();
    assert_eq!(sources.len(), 2, "both source nodes sent: {}", r.json);
    assert!(stripes(&r.json) >= 2, "the large file went in stripes: {}", r.json);
    assert_same_tree(&root_a.join("run42"), &root_b.join("run42"));
    assert_no_leftovers(&root_b);
}
