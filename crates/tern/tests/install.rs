//! First use over ssh: a far side without tern gets this build once, over the same login, and
//! says so in one line; a read-only or noexec home gets a clear error (`docs/install.md`).

#![allow(clippy::print_stdout, clippy::print_stderr)] // a test says what it measured or skipped

use crate::common;
use common::*;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

/// An ssh wrapper whose remote command runs with a PATH that has no tern and with the cache
/// under `cache` (as a fresh login on a host that never saw tern), after a chatty login
/// banner of the kind rc files print.
fn fresh_host_ssh(sshd: &Sshd, dir: &Path, cache: &str) -> String {
    let wrapper = dir.join(format!("ssh-{}", blake3::hash(cache.as_bytes()).to_hex()[..8].to_owned()));
    let script = format!(
        "#!/bin/bash\nargs=(\"$@\"); last=\"${{args[-1]}}\"; unset 'args[-1]'\nexec {} \"${{args[@]}}\" \"echo Welcome to the DTN; env PATH=/usr/bin:/bin XDG_CACHE_HOME={cache} $last\"\n",
        sshd.ssh_cmd()
    );
    fs::write(&wrapper, script).unwrap();
    fs::set_permissions(&wrapper, fs::Permissions::from_mode(0o755)).unwrap();
    wrapper.display().to_string()
}

/// A copy by a client that installs the far-side build, as a release `tern` does.
fn cp(ssh: &str, src: &Path, dst: &str, extra: &[&str]) -> Run {
    cp_with(ssh, src, dst, extra, &[("TERN_DEBUG_FAR_SIDE", far_side_bin())])
}

fn cp_with(ssh: &str, src: &Path, dst: &str, extra: &[&str], env: &[(&str, &str)]) -> Run {
    let mut args = vec!["cp", "--no-ssh-reuse", "--ssh", ssh];
    args.extend_from_slice(extra);
    args.extend_from_slice(&[src.to_str().unwrap(), dst]);
    tern(&args, env)
}

#[test]
fn first_copy_installs_once_and_the_second_finds_it() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let cache = t.path().join("cache");
    let ssh = fresh_host_ssh(&sshd, t.path(), cache.to_str().unwrap());
    write_file(&t.path().join("f"), 1, 100_000);
    let dst = t.path().join("g");
    let target = format!("127.0.0.1:{}", dst.display());

    let r = cp(&ssh, &t.path().join("f"), &target, &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert_eq!(fs::read(&dst).unwrap(), data(1, 100_000));
    assert!(r.stderr().contains("installed tern") && r.stderr().contains("--no-install"), "one line says what was installed where: {}", r.stderr());
    let installed: Vec<_> = fs::read_dir(cache.join("tern")).unwrap().flatten().map(|e| e.path().join("tern")).collect();
    assert_eq!(installed.len(), 1, "{installed:?}");
    let meta = fs::metadata(&installed[0]).unwrap();
    assert!(meta.permissions().mode() & 0o111 != 0);
    let v = Command::new(&installed[0]).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("tern "));
    assert!(fs::read(&installed[0]).unwrap() == fs::read(far_side_bin()).unwrap(), "the far-side build is what was installed, not the whole tern");
    let mtime = meta.modified().unwrap();

    fs::remove_file(&dst).unwrap();
    let r = cp(&ssh, &t.path().join("f"), &target, &[]);
    assert!(r.ok(), "{}", r.stderr());
    assert!(!r.stderr().contains("installed tern"), "{}", r.stderr());
    assert_eq!(fs::read(&dst).unwrap(), data(1, 100_000));
    assert_eq!(fs::metadata(&installed[0]).unwrap().modified().unwrap(), mtime, "not sent again");

    // --install-remote sends it again even though it is there.
    fs::remove_file(&dst).unwrap();
    let r = cp(&ssh, &t.path().join("f"), &target, &["--install-remote"]);
    assert!(r.ok() && r.stderr().contains("installed tern"), "{}", r.stderr());
    assert_eq!(fs::read(&dst).unwrap(), data(1, 100_000));
    assert!(fs::metadata(&installed[0]).unwrap().modified().unwrap() > mtime, "sent again");

    // A build that carries no far-side build (a developer's) installs itself, in its own directory.
    fs::remove_file(&dst).unwrap();
    let r = cp_with(&ssh, &t.path().join("f"), &target, &[], &[]);
    assert!(r.ok() && r.stderr().contains("installed tern"), "{}", r.stderr());
    assert_eq!(fs::read(&dst).unwrap(), data(1, 100_000));
    let itself = fs::read_dir(cache.join("tern")).unwrap().flatten().map(|e| e.path().join("tern")).find(|p| *p != installed[0]).expect("a second build directory");
    assert!(fs::read(itself).unwrap() == fs::read(tern_bin()).unwrap());
}

#[test]
fn no_install_refuses_with_the_fix() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let cache = t.path().join("cache");
    let ssh = fresh_host_ssh(&sshd, t.path(), cache.to_str().unwrap());
    write_file(&t.path().join("f"), 1, 1000);
    let dst = t.path().join("g");
    let r = cp(&ssh, &t.path().join("f"), &format!("127.0.0.1:{}", dst.display()), &["--no-install"]);
    assert!(!r.ok());
    assert!(r.stderr().contains("not installed there") && r.stderr().contains("--remote-bin"), "{}", r.stderr());
    assert!(!dst.exists() && !cache.exists());
}

#[test]
fn unwritable_cache_is_explained() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    // A path under a regular file: mkdir fails even for root.
    fs::write(t.path().join("file"), b"").unwrap();
    let ssh = fresh_host_ssh(&sshd, t.path(), t.path().join("file/cache").to_str().unwrap());
    write_file(&t.path().join("f"), 1, 1000);
    let dst = t.path().join("g");
    let r = cp(&ssh, &t.path().join("f"), &format!("127.0.0.1:{}", dst.display()), &[]);
    assert!(!r.ok());
    let e = r.stderr();
    assert!(e.contains("cannot install tern") && e.contains("--remote-bin"), "{e}");
    assert!(!dst.exists());
}

#[test]
fn noexec_home_is_explained() {
    let Some(sshd) = require_sshd() else { return };
    let t = scratch();
    let mnt = t.path().join("noexec");
    fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount").args(["-t", "tmpfs", "-o", "noexec,size=1g", "tmpfs"]).arg(&mnt).status().is_ok_and(|s| s.success());
    if !mounted {
        eprintln!("SKIP: cannot mount a noexec tmpfs here");
        return;
    }
    let ssh = fresh_host_ssh(&sshd, t.path(), mnt.to_str().unwrap());
    write_file(&t.path().join("f"), 1, 1000);
    let dst = t.path().join("g");
    let r = cp(&ssh, &t.path().join("f"), &format!("127.0.0.1:{}", dst.display()), &[]);
    let _ = Command::new("umount").arg(&mnt).status();
    assert!(!r.ok());
    let e = r.stderr();
    assert!(e.contains("cannot run there") && e.contains("noexec"), "{e}");
    assert!(!dst.exists());
}
