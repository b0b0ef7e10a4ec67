#!/usr/bin/env python3
"""Loopback benchmark: tern against scp and rsync over the same sshd, side by side in one run.

    bench/loopback.py [--reps 3] [--big-gib 4] [--small 10000]

Datasets live on tmpfs (/dev/shm) so the disk is not measured. For every tool and dataset it
reports the median wall time, throughput, and CPU seconds per GB of both process trees (the
client with ssh, and the sshd with the sessions it reaped: the remote side). Rows:
  tern          encrypted (TLS 1.3 handshake, AES-256-GCM data), BLAKE3 integrity on
  tern-noenc    --no-encrypt (keyed-BLAKE3 authenticated chunks)
  tern-nohash   encrypted, integrity hashing switched off on both ends (TERN_DEBUG_NO_HASH=1):
                only to measure what integrity costs; never a user setting. Release builds
                ignore the switch, so this row runs a build with the test hooks in it:
                cargo build --release -p tern --features test-hooks --target-dir target/hooks
  tern-base     tern with another build (TERN_BASE_BIN): old binary against new in one run
  scp, rsync    OpenSSH defaults (scp speaks SFTP; rsync -a over ssh)
  disk          (--on-disk only) the disk's own limit, no network: dd conv=fdatasync of the big
                file, cp -a then sync -f of a tree. tern's durable copy is then reported
                against the larger of this and tern --fsync none (what the disk, not tern, allows)
Every copy is checked byte for byte (sha256) before its time counts. Writes
bench/results/loopback.md and .json. Needs root (it starts its own sshd on a private port).
"""
import argparse, hashlib, json, os, resource, shutil, signal, statistics, subprocess, sys, tempfile, time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TERN = Path(os.environ.get("TERN_BIN", REPO / "target/release/tern"))
# The same build with the TERN_FAULT_*/TERN_DEBUG_* switches compiled in (its own target dir,
# so target/release/tern stays the binary users get).
# tern-base: another build of tern (an older commit), for old-against-new side by side.
TERN_BASE = Path(os.environ.get("TERN_BASE_BIN", "/nonexistent"))
TERN_HOOKS = Path(os.environ.get("TERN_HOOKS_BIN", REPO / "target/hooks/release/tern"))


SSHD_PID = None


def cpu_seconds():
    """CPU of both process trees: our children (the client, ssh) and the sshd listener with every
    session it has reaped (sshd session, the remote side). Unrelated load on the machine is not
    counted."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    client = ru.ru_utime + ru.ru_stime
    with open(f"/proc/{SSHD_PID}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # fields after the comm: state=0 … utime=11 stime=12 cutime=13 cstime=14
    server = sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return client + server


def drop_caches():
    """Every run starts with the same free memory. Without this the first run after a big
    allocation pays for page reclaim while writing its 4 GiB (measured: 7.8 s instead of 4.7 s
    for the same copy). The tmpfs datasets themselves cannot be dropped."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
    except OSError:
        pass


def tree_digest(root: Path):
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h = hashlib.sha256()
            with open(p, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            out[str(p.relative_to(root))] = h.hexdigest()
    return out


def start_sshd(d: Path):
    for k in ("hostkey", "userkey"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / k)], check=True)
    port = 2400 + os.getpid() % 500
    (d / "sshd_config").write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {d}/hostkey\nAuthorizedKeysFile {d}/userkey.pub\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\n"
        f"StrictModes no\nUsePAM no\nPidFile {d}/sshd.pid\nSubsystem sftp /usr/lib/openssh/sftp-server\n"
        f"SetEnv PATH={TERN.parent}:/usr/bin:/bin\n")
    os.makedirs("/run/sshd", exist_ok=True)
    proc = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(d / "sshd_config")], stderr=subprocess.DEVNULL)
    # ControlPath=none: each run logs in afresh, tern as well as scp and rsync.
    ssh = f"ssh -p {port} -i {d}/userkey -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -o ControlPath=none"
    for _ in range(100):
        if subprocess.run(ssh.split() + ["root@127.0.0.1", "true"], capture_output=True).returncode == 0:
            return proc, ssh
        time.sleep(0.1)
    proc.kill()
    sys.exit("loopback.py: sshd did not start")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--big-gib", type=int, default=4)
    ap.add_argument("--small", type=int, default=10000)
    ap.add_argument("--real", metavar="DIR", help="also copy a tree nobody here wrote (copied first with cp -a), e.g. $(rustc --print sysroot)")
    ap.add_argument("--tools", default="tern,tern-noenc,tern-nohash,scp,rsync")
    ap.add_argument("--name", help="results name (default: loopback, or loopback-disk with --on-disk)")
    ap.add_argument("--on-disk", metavar="DIR", help="put source and copies under DIR (a disk) instead of tmpfs; caches are dropped before every run; writes loopback-disk.md")
    a = ap.parse_args()
    if not TERN.exists():
        sys.exit("loopback.py: build first: cargo build --release -p tern")
    tools = a.tools.split(",")
    if "tern-base" in tools and not TERN_BASE.exists():
        sys.exit("loopback.py: tern-base needs TERN_BASE_BIN (the other build's binary)")
    if "tern-nohash" in tools and not TERN_HOOKS.exists():
        print(f"loopback.py: no {TERN_HOOKS}, skipping tern-nohash (cargo build --release -p tern --features test-hooks --target-dir target/hooks)", file=sys.stderr)
        tools.remove("tern-nohash")
    # Source and copy both live in RAM (tmpfs); short of memory, page reclaim lands inside the
    # timed runs (one run measured 5.4 s instead of 3.4 s) or the OOM killer ends one.
    need = 2 * (a.big_gib << 30) + 2 * a.small * 8192 + (2 << 30)
    avail = next(int(l.split()[1]) * 1024 for l in open("/proc/meminfo") if l.startswith("MemAvailable:"))
    if avail < need and not a.on_disk:
        sys.exit(f"loopback.py: needs {need / 2**30:.1f} GiB of free memory for tmpfs data, {avail / 2**30:.1f} GiB available; free /dev/shm first")
    work = Path(tempfile.mkdtemp(prefix="tern-loopback-", dir=a.on_disk or "/dev/shm"))
    sshd = None
    try:
        keys = Path(tempfile.mkdtemp(prefix="tern-loopback-keys-"))
        sshd, ssh = start_sshd(keys)
        global SSHD_PID
        SSHD_PID = sshd.pid
        src = work / "src"
        big = src / "big"
        big.mkdir(parents=True)
        subprocess.run(["dd", "if=/dev/urandom", f"of={big}/big.bin", "bs=4M", f"count={a.big_gib * 256}", "status=none"], check=True)
        small = src / "small"
        for i in range(a.small):
            d = small / f"g{i % 100:02d}"
            d.mkdir(parents=True, exist_ok=True)
            (d / f"f{i:05d}").write_bytes(os.urandom(4096))
        datasets = ["big", "small"]
        if a.real:
            subprocess.run(["cp", "-a", a.real, str(src / "real")], check=True)
            datasets.append("real")
        digests = {k: tree_digest(src / k) for k in datasets}
        sizes = {k: sum((src / k / p).stat().st_size for p in v) for k, v in digests.items()}
        counts = {k: len(v) for k, v in digests.items()}
        target = "root@127.0.0.1"
        cmds = {
            "tern": lambda s, d: [str(TERN), "cp", "-r", "-q", "--ssh", ssh, "--remote-bin", str(TERN), str(s), f"{target}:{d}"],
            "tern-fsync-none": lambda s, d: [str(TERN), "cp", "-r", "-q", "--fsync", "none", "--ssh", ssh, "--remote-bin", str(TERN), str(s), f"{target}:{d}"],
            "tern-base": lambda s, d: [str(TERN_BASE), "cp", "-r", "-q", "--ssh", ssh, "--remote-bin", str(TERN_BASE), str(s), f"{target}:{d}"],
            "tern-noenc": lambda s, d: [str(TERN), "cp", "-r", "-q", "--no-encrypt", "--ssh", ssh, "--remote-bin", str(TERN), str(s), f"{target}:{d}"],
            "tern-nohash": lambda s, d: [str(TERN_HOOKS), "cp", "-r", "-q", "--ssh", ssh, "--remote-bin", f"env TERN_DEBUG_NO_HASH=1 {TERN_HOOKS}", str(s), f"{target}:{d}"],
            "scp": lambda s, d: ["scp", "-r", "-q", "-P", ssh.split()[2]] + ssh.split()[3:] + [str(s), f"{target}:{d}"],
            "rsync": lambda s, d: ["rsync", "-a", "-e", ssh, str(s) + "/", f"{target}:{d}/"],
            "disk": lambda s, d: ["sh", "-c", 'mkdir -p "$2" && if [ -f "$1/big.bin" ]; then dd if="$1/big.bin" of="$2/big.bin" bs=4M conv=fdatasync status=none; else cp -a "$1/." "$2/" && sync -f "$2"; fi', "disk", str(s), str(d)],
        }
        if a.on_disk and "disk" not in tools:
            tools.append("disk")
        results = []
        for ds in datasets:
            times = {t: [] for t in tools}
            cpus = {t: [] for t in tools}
            failed = set()
            # Round-robin over the tools, so a noisy moment hurts them all alike.
            for rep in range(a.reps):
                for tool in tools:
                    if tool in failed:
                        continue
                    dst = work / "dst"
                    shutil.rmtree(dst, ignore_errors=True)
                    drop_caches()
                    env = dict(os.environ)
                    env.setdefault("TERN_HISTORY", "off")  # no learned settings from run to run
                    if tool == "tern-nohash":
                        env["TERN_DEBUG_NO_HASH"] = "1"
                    c0, t0 = cpu_seconds(), time.monotonic()
                    r = subprocess.run(cmds[tool](src / ds, dst), env=env, capture_output=True, timeout=900)
                    t1 = time.monotonic()
                    time.sleep(0.3)  # let sshd reap the session so its CPU is counted
                    c1 = cpu_seconds()
                    if r.returncode != 0 or tree_digest(dst) != digests[ds]:
                        failed.add(tool)
                        print(f"{ds} {tool}: FAILED rc={r.returncode} {r.stderr.decode()[-300:]}", file=sys.stderr)
                        continue
                    cpu = c1 - c0
                    times[tool].append(t1 - t0)
                    cpus[tool].append(cpu)
                    print(f"{ds} {tool} #{rep + 1}: {t1 - t0:.2f} s, {cpu:.2f} CPU s", file=sys.stderr)
                    shutil.rmtree(dst, ignore_errors=True)
            for tool in tools:
                row = {"dataset": ds, "tool": tool, "ok": tool not in failed, "bytes": sizes[ds], "files": counts[ds]}
                if row["ok"]:
                    t, c = statistics.median(times[tool]), statistics.median(cpus[tool])
                    row.update(seconds=t, gbps=sizes[ds] / t / 1e9, cpu_s_per_gb=c / (sizes[ds] / 1e9), runs=times[tool])
                results.append(row)
        out = REPO / "bench/results"
        out.mkdir(exist_ok=True)
        name = a.name or ("loopback-disk" if a.on_disk else "loopback")
        (out / f"{name}.json").write_text(json.dumps(results, indent=1))
        lines = [
            f"# loopback: {a.big_gib} GiB file and {a.small} × 4 KiB files{', and ' + a.real + ' (real: ' + str(counts['real']) + ' files)' if a.real else ''}, over one sshd on 127.0.0.1",
            "",
            f"{time.strftime('%Y-%m-%d %H:%M')} · 2-core VM · data on {'disk (' + a.on_disk + '), caches dropped before each run' if a.on_disk else 'tmpfs'} · median of {a.reps} · `bench/loopback.py --reps {a.reps}{' --on-disk ' + a.on_disk if a.on_disk else ''} --big-gib {a.big_gib} --small {a.small}{' --real ' + a.real if a.real else ''} --tools {a.tools}`",
            "",
            "| dataset | tool | median s | GB/s | × scp | × rsync | CPU s/GB (both ends, ssh included) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in results:
            if not r["ok"]:
                lines.append(f"| {r['dataset']} | {r['tool']} | FAILED | | | | |")
                continue
            base = {x["tool"]: x for x in results if x["dataset"] == r["dataset"] and x["ok"]}
            ratio = lambda t: f"{base[t]['seconds'] / r['seconds']:.2f}" if t in base else "—"
            lines.append(f"| {r['dataset']} | {r['tool']} | {r['seconds']:.2f} | {r['gbps']:.3f} | {ratio('scp')} | {ratio('rsync')} | {r['cpu_s_per_gb']:.2f} |")
        ok = {(x["dataset"], x["tool"]): x for x in results if x["ok"]}
        for ds in datasets:
            if (ds, "tern") in ok and (ds, "disk") in ok:
                limit = max(ok[(ds, "disk")]["seconds"], ok.get((ds, "tern-fsync-none"), ok[(ds, "disk")])["seconds"])
                lines.append(f"Durable copy against the disk's limit ({ds}): tern {ok[(ds, 'tern')]['seconds']:.2f} s = {ok[(ds, 'tern')]['seconds'] / limit:.2f} × max(disk {ok[(ds, 'disk')]['seconds']:.2f} s, tern --fsync none {ok.get((ds, 'tern-fsync-none'), {'seconds': float('nan')})['seconds']:.2f} s).")
        nh = {x["dataset"]: x for x in results if x["tool"] == "tern-nohash" and x["ok"]}
        te = {x["dataset"]: x for x in results if x["tool"] == "tern" and x["ok"]}
        lines.append("")
        for ds in nh:
            if ds in te:
                cost = 1 - nh[ds]["seconds"] / te[ds]["seconds"]
                lines.append(f"Integrity cost ({ds}): throughput with BLAKE3 on is {100 * cost:.1f}% below hashing off.")
        (out / f"{name}.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))
    finally:
        if sshd:
            sshd.send_signal(signal.SIGTERM)
            sshd.wait(timeout=10)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
