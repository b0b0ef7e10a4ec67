#!/usr/bin/python3
"""Small-copy latency on an emulated path: the scp use case (one small file, one 10 MB file),
where setup round trips, not bandwidth, decide. Side by side in one run, median of --reps:

    scp, rsync                    a fresh ssh login each copy (their default)
    tern-ssh (fresh login)        ControlPath=none: a fresh ssh login each copy
    tern-ssh (connection reused)  tern's default: the first copy logs in, the next ones reuse
                                  that ssh connection (ControlMaster, kept for a minute)
    tern-daemon                   tern://, no ssh at all

    bench/latency.py --path olcf-nersc --reps 5       # writes bench/results/latency-<path>.md/.json

Needs root and the bench bed (bench/netns.sh); every copy is checked byte for byte.
"""
import argparse
import filecmp
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import run  # noqa: E402  (bench/run.py: the bed, the servers, the tools)

SIZES = {"1 B": 1, "10 MB": 10_000_000}


def copy_cmd(tool, src, dst, srv, control_dir):
    if tool in ("scp", "rsync"):
        argv, _ = run.tool_cmd(tool, src, "/unused", srv, 1)
        argv[-1] = f"root@{run.B}:{dst}"
        if tool == "rsync":
            argv[-2] = src
        return argv, {}
    if tool == "tern-ssh-fresh":
        return [run.TERN, "cp", "--json", "--ssh", srv.ssh_cmd(), "--remote-bin", run.TERN, src, f"root@{run.B}:{dst}"], {}
    if tool == "tern-ssh-reused":
        ssh = srv.ssh_cmd().replace(" -o ControlPath=none", "")
        return [run.TERN, "cp", "--json", "--ssh", ssh, "--remote-bin", run.TERN, src, f"root@{run.B}:{dst}"], {"TERN_SSH_CONTROL_DIR": control_dir}
    if tool == "tern-daemon":
        rel = os.path.relpath(dst, f"{run.DATA}/dst/tern-daemon")
        return [run.TERN, "cp", "--json", "--token-file", srv.token, src, f"tern://{run.B}:{run.PORTS['tern']}/{rel}"], {}
    raise ValueError(tool)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--path", default="olcf-nersc")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rate", default="1g")
    ap.add_argument("--cc", default="bbr")
    args = ap.parse_args()
    tools = ["scp", "rsync", "tern-ssh-fresh", "tern-ssh-reused", "tern-daemon"]
    tmp = tempfile.mkdtemp(prefix="tern-latency-")
    control_dir = tempfile.mkdtemp(prefix="cm-", dir="/tmp")
    os.makedirs(run.DATA + "/src", exist_ok=True)
    srcs = {}
    for label, n in SIZES.items():
        p = f"{run.DATA}/src/latency-{n}"
        with open(p, "wb") as f:
            f.write(os.urandom(n))
        srcs[label] = p
    results = {"path": args.path, "reps": args.reps, "rtt_ms": None, "times": {}}
    srv = None
    try:
        run.netns_up(args.path, argparse.Namespace(rate=args.rate, cc=args.cc, tuned=False))
        results["rtt_ms"] = run.ping_rtt(5)
        srv = run.Servers(tmp, f"{run.DATA}/dst")
        srv.start(["scp", "tern-daemon"])
        for label, src in srcs.items():
            for tool in tools:
                dst_dir = f"{run.DATA}/dst/tern-daemon/latency" if tool == "tern-daemon" else f"{run.DATA}/dst/{tool}"
                run.clear_dir(dst_dir)
                times = []
                # The reused connection's first copy logs in; it is the warm-up, not counted.
                for i in range(args.reps + (1 if tool == "tern-ssh-reused" else 0)):
                    dst = f"{dst_dir}/copy{i}"
                    argv, env = copy_cmd(tool, src, dst, srv, control_dir)
                    t0 = time.monotonic()
                    p = subprocess.run(run.ns(run.NS_A, argv), capture_output=True, text=True, timeout=120, env={**run.clean_env(), **env})
                    dt = time.monotonic() - t0
                    if p.returncode != 0 or not filecmp.cmp(src, dst, shallow=False):
                        raise RuntimeError(f"{tool} {label} failed: {(p.stdout + p.stderr)[-300:]}")
                    if not (tool == "tern-ssh-reused" and i == 0):
                        times.append(dt)
                results["times"].setdefault(label, {})[tool] = times
                run.log(f"{label:>6} {tool:<16} median {statistics.median(times):.3f} s  {[round(t, 3) for t in times]}")
    finally:
        subprocess.run(run.ns(run.NS_A, ["ssh", "-oControlPath=" + control_dir + "/%C", "-p", str(run.PORTS["ssh"]), "-O", "exit", f"root@{run.B}"]),
                       capture_output=True, timeout=10)
        if srv:
            srv.stop()
        run.netns_down()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(control_dir, ignore_errors=True)
    out = os.path.join(HERE, "results", f"latency-{args.path}")
    with open(out + ".json", "w") as f:
        json.dump(results, f, indent=1)
    names = {"scp": "scp", "rsync": "rsync", "tern-ssh-fresh": "tern over ssh, fresh login",
             "tern-ssh-reused": "tern over ssh, connection reused (default)", "tern-daemon": "tern daemon"}
    lines = [f"# Small-copy latency, {args.path} (ping {results['rtt_ms']})", "",
             f"`bench/latency.py --path {args.path} --reps {args.reps}`: seconds per copy, median of {args.reps}, "
             "every copy compared byte for byte. Includes process start, ssh login (where there is one), "
             "the transfer and the verification.", "",
             "| tool | " + " | ".join(SIZES) + " |", "|---|" + "---|" * len(SIZES)]
    for tool in tools:
        lines.append(f"| {names[tool]} | " + " | ".join(f"{statistics.median(results['times'][l][tool]):.3f}" for l in SIZES) + " |")
    with open(out + ".md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
