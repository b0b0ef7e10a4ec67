#!/usr/bin/env python3
"""Session setup time of `tern cp` over a real sshd on loopback, binaries interleaved.

  bench/ssh-setup/bench.py --bin before=PATH --bin after=PATH [--reps 20] [--delay-ms D]
                           [--sizes 1,52428800] [--extra="--no-encrypt"] [--trace [--strace DIR]]

Counts round trips without a WAN emulator or root-only qdiscs: with --delay-ms D (one way,
RTT = 2D) ssh and the remote's data port go through delayproxy.py (every byte forwarded D
later, each direction), and the client's connect() to them is rerouted there and delayed 2D
(the TCP handshake) by delayconnect.so (LD_PRELOAD, built with cc on first use; it also makes
getpeername() answer the address asked for). Only the client side is delayed, which is all a
round trip needs. Each binary is its own remote (`--remote-bin`); the data port is fixed with
`--port-range`. Every copy is checked with SHA-256. Prints median, quartiles and minimum per
binary and size. Needs root (sshd) and /dev/shm. Not a throughput bench: the proxy is Python.
"""
import argparse, hashlib, os, shutil, socket, statistics, subprocess, sys, tempfile, time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def sha(p):
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while b := f.read(1 << 20):
            h.update(b)
    return h.hexdigest()


ap = argparse.ArgumentParser()
ap.add_argument("--bin", action="append", required=True)
ap.add_argument("--reps", type=int, default=20)
ap.add_argument("--delay-ms", type=float, default=0)
ap.add_argument("--sizes", default="1,52428800")
ap.add_argument("--extra", default="", help="extra tern cp arguments")
ap.add_argument("--trace", action="store_true", help="one -vv run per binary, timeline printed")
ap.add_argument("--strace", help="with --trace: strace the client into DIR/NAME.strace")
a = ap.parse_args()
bins = [b.split("=", 1) for b in a.bin]

work = Path(tempfile.mkdtemp(dir="/dev/shm", prefix="early-bench."))
keys = Path(tempfile.mkdtemp(prefix="early-bench-keys."))
procs = []
try:
    for k in ["hostkey", "userkey"]:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", keys / k], check=True)
    sport = free_port()
    (keys / "sshd_config").write_text(
        f"Port {sport}\nListenAddress 127.0.0.1\nHostKey {keys}/hostkey\nAuthorizedKeysFile {keys}/userkey.pub\n"
        "PasswordAuthentication no\nKbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        f"PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\nPidFile {keys}/sshd.pid\nMaxStartups 100\n"
    )
    os.makedirs("/run/sshd", exist_ok=True)
    procs.append(subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", keys / "sshd_config"], stderr=subprocess.DEVNULL))
    dport = free_port()
    env = dict(os.environ)
    if a.delay_ms > 0:
        shim = HERE / "delayconnect.so"
        if not shim.exists():
            subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", shim, HERE / "delayconnect.c", "-ldl"], check=True)
        q1, q2 = free_port(), free_port()
        px = subprocess.Popen([sys.executable, HERE / "delayproxy.py", str(a.delay_ms), f"{q1}={sport}", f"{q2}={dport}"], stdout=subprocess.PIPE, text=True)
        procs.append(px)
        assert px.stdout.readline().strip() == "ready"
        env.update(LD_PRELOAD=str(HERE / "delayconnect.so"), DELAY_MAP=f"{sport}={q1},{dport}={q2}", DELAY_CONNECT_US=str(int(2 * a.delay_ms * 1000)))
    time.sleep(0.5)
    ssh = f"ssh -p {sport} -i {keys}/userkey -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    sizes = [int(s) for s in a.sizes.split(",")]
    srcs = {}
    for n in sizes:
        p = work / f"src-{n}"
        with open(p, "wb") as f:
            left = n
            while left:
                b = os.urandom(min(left, 1 << 20))
                f.write(b)
                left -= len(b)
        srcs[n] = (p, sha(p))
    (work / "dst").mkdir()

    def run(binpath, n, i, trace=False):
        dst = work / "dst" / f"{i}"
        cmd = [binpath, "cp", "-q", "--ssh", ssh, "--remote-bin", binpath, "--port-range", f"{dport}-{dport}", *a.extra.split(), str(srcs[n][0]), f"127.0.0.1:{dst}"]
        e = dict(env)
        if trace:
            cmd.insert(2, "-vv")
            if a.strace:
                cmd = ["strace", "-f", "-tt", "-o", f"{a.strace}/{i}.strace", "-e", "trace=connect,read,write,execve", "-e", "signal=none", *cmd]
        t = time.perf_counter()
        r = subprocess.run(cmd, env=e, capture_output=True, text=True)
        took = time.perf_counter() - t
        if r.returncode != 0:
            sys.exit(f"{cmd} failed: {r.stderr}")
        assert sha(dst) == srcs[n][1], "copy differs"
        dst.unlink()
        return took, r.stderr

    if a.trace:
        for name, b in bins:
            took, log = run(b, sizes[0], f"trace-{name}", trace=True)
            print(f"--- {name}: {took*1000:.1f} ms\n{log}")
    # Warm-up (page cache, sshd), not counted.
    for name, b in bins:
        run(b, sizes[0], f"warm-{name}")
    res = {(name, n): [] for name, _ in bins for n in sizes}
    for i in range(a.reps):
        for n in sizes:
            order = bins if i % 2 == 0 else bins[::-1]
            for name, b in order:
                res[(name, n)].append(run(b, n, f"{name}-{n}-{i}")[0])
    print(f"delay one way {a.delay_ms} ms (RTT {2*a.delay_ms} ms), {a.reps} reps, extra args: {a.extra or '-'}")
    for n in sizes:
        for name, _ in bins:
            xs = sorted(res[(name, n)])
            q = statistics.quantiles(xs, n=4) if len(xs) > 1 else [xs[0]] * 3
            print(f"  {n:>10} B  {name:<8} median {statistics.median(xs)*1000:8.1f} ms   p25 {q[0]*1000:8.1f}   p75 {q[2]*1000:8.1f}   min {xs[0]*1000:8.1f}")
finally:
    for p in procs:
        p.kill()
        p.wait()
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(keys, ignore_errors=True)
