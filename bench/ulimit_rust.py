#!/usr/bin/python3
"""The real tree under a descriptor limit on both sides: tern pushes a copy of this machine's Rust
sysroot (~52,000 files, most < 4 KiB) over ssh, client and far side under `ulimit -n N`.

    flock /tmp/tern-bed.lock sh -c 'bench/netns.sh up olcf-nersc && \\
        bench/ulimit_rust.py before=/tmp/tern-before after=target/release/tern --reps 2; \\
        bench/netns.sh down'

Each LABEL=BINARY runs `sh -c 'ulimit -n N && exec BINARY cp -r --json --ssh SSH --remote-bin
WRAPPER SRC root@198.18.0.2:DST'` in tern-a, WRAPPER being `ulimit -n N; exec BINARY "$@"` (the
far side under the same limit); `--nofile 0` leaves the limit as it is. Runs alternate between
the binaries (rep 1 of each, then rep 2), every copy is checked with bench/verify.py's compare
(SHA-256, independent of tern) and the result is printed as JSON lines. Needs root and an
`up` bed (it does not bring the namespaces up or down: the caller holds the bed's lock).
"""
import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (bench/run.py: Servers, namespaces, clean_env)
import verify  # noqa: E402

DATA = "/dev/shm/tern-ulimit"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("binaries", nargs="+", help="LABEL=PATH of a tern binary")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--nofile", type=int, default=256, help="descriptor limit on both sides; 0: leave it")
    ap.add_argument("--timeout", type=int, default=240)
    args = ap.parse_args()
    bins = [b.split("=", 1) for b in args.binaries]
    sysroot = subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True).stdout.strip()
    src = f"{DATA}/src/rust"
    if not os.path.isdir(src):
        os.makedirs(f"{DATA}/src", exist_ok=True)
        subprocess.run(["cp", "-a", sysroot, src], check=True)
    tmp = f"{DATA}/srv"
    os.makedirs(tmp, exist_ok=True)
    os.chmod(tmp, 0o755)
    srv = run.Servers(tmp, f"{DATA}/dst")
    srv.start(["tern-ssh"])
    try:
        for rep in range(args.reps):
            for label, binary in bins:
                binary = os.path.abspath(binary)
                limit = f"ulimit -n {args.nofile}; " if args.nofile else ""
                wrapper = os.path.join(tmp, f"tern-{label}")
                with open(wrapper, "w") as f:
                    f.write(f"#!/bin/sh\n{limit}exec {binary} \"$@\"\n")
                os.chmod(wrapper, 0o755)
                dst_root = f"{DATA}/dst/{label}"
                shutil.rmtree(dst_root, ignore_errors=True)
                os.makedirs(dst_root)
                dst = f"{dst_root}/data"
                argv = [binary, "cp", "-r", "--json", "--ssh", srv.ssh_cmd(), "--remote-bin", wrapper, src, f"root@{run.B}:{dst}"]
                line = limit + "exec " + " ".join(shlex.quote(a) for a in argv)
                t0 = time.monotonic()
                p = subprocess.run(run.ns(run.NS_A, ["sh", "-c", line]), text=True, capture_output=True, timeout=args.timeout, env=run.clean_env())
                wall = time.monotonic() - t0
                summary = next((json.loads(x) for x in reversed(p.stdout.splitlines()) if x.startswith("{")), {})
                v = verify.compare(src, dst)
                print(json.dumps({"label": label, "rep": rep + 1, "nofile": args.nofile, "seconds": round(wall, 2), "rc": p.returncode,
                                  "files": summary.get("files"), "files_failed": summary.get("files_failed"),
                                  "verify": "IDENTICAL" if v["ok"] else v["first_differences"][:3], "stderr_tail": p.stderr[-300:], "cmd": line}), flush=True)
                shutil.rmtree(dst_root, ignore_errors=True)
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
