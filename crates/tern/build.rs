//! Embeds the far-side build (`tern-remote`, gzipped) in `tern` when `TERN_FAR_SIDE_PAYLOAD`
//! names it, as `scripts/build-release.sh` does: the release binary then installs that small
//! program on hosts that lack tern instead of shipping itself (`docs/install.md`). Without
//! the variable (development and test builds) `tern` ships itself, as before.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(tern_far_side_payload)");
    println!("cargo::rerun-if-env-changed=TERN_FAR_SIDE_PAYLOAD");
    let Some(path) = std::env::var_os("TERN_FAR_SIDE_PAYLOAD").filter(|p| !p.is_empty()) else { return };
    let path = std::path::PathBuf::from(path);
    // include_bytes! would read a relative path from src/, build scripts run in crates/tern.
    assert!(path.is_absolute(), "TERN_FAR_SIDE_PAYLOAD={} must be an absolute path", path.display());
    let head = std::fs::read(&path).unwrap_or_else(|e| panic!("TERN_FAR_SIDE_PAYLOAD={}: {e}", path.display()));
    // The far side unpacks it with `gzip -dc`: anything else would fail only on a user's host.
    assert!(head.starts_with(&[0x1f, 0x8b]), "TERN_FAR_SIDE_PAYLOAD={} is not a gzip file (gzip -9n tern-remote)", path.display());
    println!("cargo::rerun-if-changed={}", path.display());
    println!("cargo::rustc-cfg=tern_far_side_payload");
    println!("cargo::rustc-env=TERN_FAR_SIDE_PAYLOAD={}", path.display());
}
