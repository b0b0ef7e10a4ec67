//! tern-bench-gen: deterministic, incompressible benchmark datasets.
//!
//!   tern-bench-gen PROFILE OUTDIR [--size BYTES] [--seed N] [--count-scale X] [--dry-run]
//!
//! Profiles
//!   hacc   Petascale DTN reference shape (19,260 files, 211 nested dirs, 0 B - 11.3 GB, 4.4 TB):
//!          per-decade file counts 7, 1, 59, 3170, 1560, 2817, 3901, 3800, 2295, 1647, 3 for
//!          sizes [0,10) B, [10,100) B, ..., [10,100) GB, scaled to --size (default 2 GiB):
//!            * counts are multiplied by c = sqrt(size / 4.4 TB) (or --count-scale), keeping at
//!              least one file in every non-empty decade, so both ends of the shape survive;
//!            * directories: max(8, 211 * sqrt(c)) (211 at full scale), nested up to 8 deep;
//!            * sizes below 1 MiB keep their real value (the small-file / metadata regime is
//!              unchanged); sizes s >= 1 MiB are compressed to 1 MiB * (s / 1 MiB)^g, with g in
//!              [0, 1] solved so the total is --size (g = 1 when nothing needs compressing).
//!   six    six equal files totalling --size
//!   one    one file of --size
//!   small  10,000 x 4 KiB (10 dirs of 1,000) + 1,000 x 1 MiB; --count-scale scales the counts
//!   edge   correctness corner cases: empty files and dirs, chunk-boundary sizes, symlinks
//!          (file, dir, dangling), odd names, a deep path, modes 0600/0755
//!
//! File contents come from xoshiro256++ seeded from (seed, profile, file index): deterministic,
//! incompressible, and different in every file (no dedup shortcuts). A JSON summary is printed.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Instant;

const HACC_COUNTS: [u64; 11] = [7, 1, 59, 3170, 1560, 2817, 3901, 3800, 2295, 1647, 3];
const HACC_TOTAL: f64 = 4.4e12;
const HACC_DIRS: usize = 211;
const HACC_MAX: f64 = 11.3e9;
const PIVOT: f64 = 1048576.0;

struct Rng([u64; 4]);
impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut sm = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([sm(), sm(), sm(), sm()])
    }
    #[inline(always)]
    fn next(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[0].wrapping_add(s[3]).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }
    fn f64(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    fn below(&mut self, n: u64) -> u64 {
        ((self.next() as u128 * n as u128) >> 64) as u64
    }
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

enum Entry {
    Dir(PathBuf),
    File { path: PathBuf, size: u64, mode: u32 },
    Link { path: PathBuf, target: String },
}

fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().to_ascii_uppercase();
    let t = t.trim_end_matches('B').trim_end_matches('I');
    let (n, m) = match t.chars().last() {
        Some('K') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M') => (&t[..t.len() - 1], 1 << 20),
        Some('G') => (&t[..t.len() - 1], 1 << 30),
        Some('T') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let v: f64 = n.parse().map_err(|_| format!("bad size '{s}' (e.g. 2G, 512M; binary units)"))?;
    Ok((v * m as f64).round() as u64)
}

fn hacc(total: u64, count_scale: Option<f64>, seed: u64) -> Result<(Vec<Entry>, String), String> {
    let mut rng = Rng::new(seed ^ fnv("hacc"));
    let mut c = count_scale.unwrap_or_else(|| (total as f64 / HACC_TOTAL).sqrt()).clamp(1e-6, 1.0);
    let compress = |sizes: &[f64], g: f64| -> f64 { sizes.iter().map(|&s| if s < PIVOT { s } else { PIVOT * (s / PIVOT).powf(g) }).sum() };
    loop {
        // nominal sizes per decade
        let mut nominal: Vec<(usize, f64)> = Vec::new();
        for (k, &n) in HACC_COUNTS.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let m = ((n as f64 * c).round() as u64).max(1);
            for _ in 0..m {
                let s = if k == 0 {
                    rng.below(10) as f64
                } else {
                    let lo = 10f64.powi(k as i32);
                    let hi = if k == 10 { HACC_MAX } else { lo * 10.0 };
                    (lo.ln() + rng.f64() * (hi.ln() - lo.ln())).exp().floor()
                };
                nominal.push((k, s));
            }
        }
        let sizes: Vec<f64> = nominal.iter().map(|x| x.1).collect();
        let t = total as f64;
        let at0 = compress(&sizes, 0.0);
        if at0 > t {
            if count_scale.is_some() {
                return Err(format!("--size {total} is too small for --count-scale {c}: needs at least {at0:.0} bytes"));
            }
            c *= 0.7;
            continue;
        }
        let at1 = compress(&sizes, 1.0);
        let (g, lin) = if at1 <= t {
            let small: f64 = sizes.iter().filter(|&&s| s < PIVOT).sum();
            (1.0, (t - small) / (at1 - small).max(1.0))
        } else {
            let (mut lo, mut hi) = (0.0, 1.0);
            for _ in 0..60 {
                let mid = (lo + hi) / 2.0;
                if compress(&sizes, mid) > t {
                    hi = mid
                } else {
                    lo = mid
                }
            }
            (lo, 1.0)
        };
        let mut final_sizes: Vec<u64> = sizes
            .iter()
            .map(|&s| if s < PIVOT { s as u64 } else { (PIVOT * (s / PIVOT).powf(g) * lin).floor() as u64 })
            .collect();
        // put the rounding remainder on the largest file so the total is exact
        let sum: u64 = final_sizes.iter().sum();
        if let Some((imax, _)) = final_sizes.iter().enumerate().max_by_key(|x| *x.1) {
            final_sizes[imax] = (final_sizes[imax] as i128 + total as i128 - sum as i128).max(0) as u64;
        }
        // directories: nested tree, parent chosen among the previous 8, depth <= 8
        let ndirs = ((HACC_DIRS as f64 * c.sqrt()).round() as usize).clamp(8, HACC_DIRS);
        let mut dirs: Vec<(PathBuf, usize)> = vec![(PathBuf::new(), 0)];
        let mut entries = Vec::new();
        for i in 1..ndirs {
            let lo = i.saturating_sub(8);
            let mut p = lo + rng.below((i - lo) as u64) as usize;
            while dirs[p].1 >= 8 {
                p -= 1;
            }
            let path = dirs[p].0.join(format!("d{i:03}"));
            entries.push(Entry::Dir(path.clone()));
            dirs.push((path, dirs[p].1 + 1));
        }
        // every directory gets at least one file (the reference set has no empty dirs)
        let mut order: Vec<usize> = (0..final_sizes.len()).collect();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for (j, &idx) in order.iter().enumerate() {
            let d = if j < ndirs.min(order.len()) { j } else { rng.below(ndirs as u64) as usize };
            entries.push(Entry::File { path: dirs[d].0.join(format!("f{idx:05}.dat")), size: final_sizes[idx], mode: 0o644 });
        }
        let counts: Vec<String> = (0..11).map(|k| nominal.iter().filter(|x| x.0 == k).count().to_string()).collect();
        let note = format!(
            "\"count_scale\":{c:.6},\"size_exponent\":{g:.4},\"nominal_decade_counts\":[{}]",
            counts.join(",")
        );
        return Ok((entries, note));
    }
}

fn small(scale: f64) -> Vec<Entry> {
    let mut e = Vec::new();
    let n4k = ((10_000.0 * scale).round() as usize).max(1);
    let n1m = ((1_000.0 * scale).round() as usize).max(1);
    let per_dir = n4k.div_ceil(10);
    e.push(Entry::Dir("4k".into()));
    for d in 0..n4k.div_ceil(per_dir) {
        e.push(Entry::Dir(format!("4k/d{d}").into()));
    }
    for i in 0..n4k {
        e.push(Entry::File { path: format!("4k/d{}/f{i:05}", i / per_dir).into(), size: 4096, mode: 0o644 });
    }
    e.push(Entry::Dir("1m".into()));
    for i in 0..n1m {
        e.push(Entry::File { path: format!("1m/f{i:04}").into(), size: 1 << 20, mode: 0o644 });
    }
    e
}

fn edge() -> Vec<Entry> {
    let f = |p: &str, size: u64, mode: u32| Entry::File { path: p.into(), size, mode };
    let mut e = vec![
        Entry::Dir("empty-dir".into()),
        Entry::Dir("nested".into()),
        Entry::Dir("nested/empty-child".into()),
        Entry::Dir("sizes".into()),
        f("empty-file", 0, 0o644),
        f("one-byte", 1, 0o644),
        f("sizes/4095", 4095, 0o644),
        f("sizes/4096", 4096, 0o644),
        f("sizes/4097", 4097, 0o644),
        f("sizes/1MiB-1", (1 << 20) - 1, 0o644),
        f("sizes/1MiB", 1 << 20, 0o644),
        f("sizes/1MiB+1", (1 << 20) + 1, 0o644),
        f("sizes/4MiB+1", (4 << 20) + 1, 0o644),
        f("sizes/16MiB+7", (16 << 20) + 7, 0o644),
        f("sizes/64MiB-3", (64 << 20) - 3, 0o644),
        f("name with spaces.dat", 1000, 0o644),
        f("ünïcödé-名前.dat", 1001, 0o644),
        f("private-0600", 2048, 0o600),
        f("exec-0755", 2049, 0o755),
        Entry::Link { path: "link-to-file".into(), target: "one-byte".into() },
        Entry::Link { path: "link-to-dir".into(), target: "sizes".into() },
        Entry::Link { path: "nested/dangling-link".into(), target: "../does-not-exist".into() },
    ];
    let mut deep = PathBuf::from("deep");
    e.push(Entry::Dir(deep.clone()));
    for i in 0..20 {
        deep = deep.join(format!("level{i:02}"));
        e.push(Entry::Dir(deep.clone()));
    }
    e.push(Entry::File { path: deep.join("bottom.dat"), size: 12345, mode: 0o644 });
    e
}

fn write_file(path: &Path, size: u64, mode: u32, seed: u64, buf: &mut [u64]) -> std::io::Result<()> {
    let mut rng = Rng::new(seed);
    let mut f = fs::File::create(path)?;
    let mut left = size;
    while left > 0 {
        for w in buf.iter_mut() {
            *w = rng.next();
        }
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr() as *const u8, buf.len() * 8) };
        let n = left.min(bytes.len() as u64) as usize;
        f.write_all(&bytes[..n])?;
        left -= n as u64;
    }
    fs::set_permissions(path, fs::Permissions::from_mode(mode))?;
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: tern-bench-gen hacc|six|one|small|edge OUTDIR [--size 2G] [--seed N] [--count-scale X] [--dry-run]";
    if args.len() < 2 || args[0] == "--help" {
        eprintln!("{usage}");
        std::process::exit(2);
    }
    let (profile, out) = (args[0].as_str(), PathBuf::from(&args[1]));
    let (mut size, mut seed, mut cs, mut dry) = (2u64 << 30, 1u64, None, false);
    let mut i = 2;
    let die = |m: String| -> ! {
        eprintln!("tern-bench-gen: {m}");
        std::process::exit(2)
    };
    while i < args.len() {
        let val = || args.get(i + 1).cloned().unwrap_or_else(|| die(format!("{} needs a value", args[i])));
        match args[i].as_str() {
            "--size" => size = parse_size(&val()).unwrap_or_else(|e| die(e)),
            "--seed" => seed = val().parse().unwrap_or_else(|_| die("bad --seed".into())),
            "--count-scale" => cs = Some(val().parse::<f64>().unwrap_or_else(|_| die("bad --count-scale".into()))),
            "--dry-run" => {
                dry = true;
                i += 1;
                continue;
            }
            o => die(format!("unknown option {o}\n{usage}")),
        }
        i += 2;
    }
    let (entries, note) = match profile {
        "hacc" => hacc(size, cs, seed).unwrap_or_else(|e| die(e)),
        "six" => ((0..6).map(|i| Entry::File { path: format!("file{i}.dat").into(), size: size / 6, mode: 0o644 }).collect(), String::new()),
        "one" => (vec![Entry::File { path: "file.dat".into(), size, mode: 0o644 }], String::new()),
        "small" => (small(cs.unwrap_or(1.0)), String::new()),
        "edge" => (edge(), String::new()),
        p => die(format!("unknown profile {p}\n{usage}")),
    };
    let (mut nfiles, mut ndirs, mut nlinks, mut bytes, mut hist) = (0u64, 0u64, 0u64, 0u64, [0u64; 12]);
    for e in &entries {
        match e {
            Entry::Dir(_) => ndirs += 1,
            Entry::Link { .. } => nlinks += 1,
            Entry::File { size, .. } => {
                nfiles += 1;
                bytes += size;
                let dec = if *size < 10 { 0 } else { ((*size as f64).log10().floor() as usize).min(11) };
                hist[dec] += 1;
            }
        }
    }
    let t0 = Instant::now();
    if !dry {
        if out.exists() && fs::read_dir(&out).map(|mut d| d.next().is_some()).unwrap_or(true) {
            die(format!("{} exists and is not empty", out.display()));
        }
        fs::create_dir_all(&out).unwrap_or_else(|e| die(format!("mkdir {}: {e}", out.display())));
        let mut buf = vec![0u64; 1 << 17]; // 1 MiB
        let base = seed ^ fnv(profile);
        for (idx, e) in entries.iter().enumerate() {
            let r = match e {
                Entry::Dir(p) => fs::create_dir_all(out.join(p)),
                Entry::Link { path, target } => symlink(target, out.join(path)),
                Entry::File { path, size, mode } => {
                    let p = out.join(path);
                    if let Some(parent) = p.parent() {
                        let _ = fs::create_dir_all(parent);
                    }
                    write_file(&p, *size, *mode, base.wrapping_add((idx as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)), &mut buf)
                }
            };
            r.unwrap_or_else(|err| die(format!("writing into {}: {err}", out.display())));
        }
    }
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{{\"profile\":\"{profile}\",\"out\":\"{}\",\"seed\":{seed},\"files\":{nfiles},\"dirs\":{ndirs},\"symlinks\":{nlinks},\"bytes\":{bytes},\
\"decade_counts\":[{}],\"seconds\":{secs:.3},\"mb_per_s\":{:.0}{}{}}}",
        out.display(),
        hist.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","),
        if secs > 0.0 && !dry { bytes as f64 / secs / 1e6 } else { 0.0 },
        if note.is_empty() { "" } else { "," },
        note
    );
}
