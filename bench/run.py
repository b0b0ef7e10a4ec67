#!/usr/bin/python3
"""tern bench matrix: profiles x paths x tools, every copy verified byte for byte.

    bench/run.py --quick                      # <= 10 min: 2 paths, 2 small profiles, 1 rep
    bench/run.py                              # full matrix (about an hour or more)
    bench/run.py --paths olcf-nersc --profiles hacc:2G --tools tern-ssh,rsync --reps 5

Writes bench/results/<name>.md / .json / -<profile>.png. Needs root, bench/install-peers.sh,
and uses bench/netns.sh (namespaces tern-a -> tern-b through tern-delayline). Data lives on
tmpfs (/dev/shm) so the disk is not what is measured. Run `bench/run.py --help` for options.

Every wait is bounded: each copy runs under a timeout (a timeout is a FAILED row, never a time),
servers get bounded start checks, and the namespaces are torn down on exit, error or signal.
"""
import argparse
import datetime
import json
import os
import resource
import secrets
import shlex
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import verify  # noqa: E402  (bench/verify.py)

NETNS = os.path.join(HERE, "netns.sh")
GEN = os.path.join(HERE, "delayline", "target", "release", "tern-bench-gen")
TERN = os.environ.get("TERN_BIN") or os.path.join(REPO, "target", "release", "tern")  # TERN_BIN: test override
A, B = "198.18.0.1", "198.18.0.2"
NS_A, NS_B = "tern-a", "tern-b"
DATA = "/dev/shm/tern-bench"
PORTS = {"ssh": 2222, "gridftp": 2811, "xrootd": 1094, "tern": 7700, "iperf3": 5201}

ALL_TOOLS = ["iperf3", "scp", "rsync", "rsync4", "globus-url-copy", "rclone", "xrdcp", "bbcp", "bbcp-tar", "tern-first", "tern-ssh", "tern-daemon", "tern-ssh-base", "tern-first-base"]
# tern-ssh-base, tern-first-base: tern-ssh and tern-first with another build (TERN_BASE_BIN),
# for old-against-new in one run.
BASE = os.environ.get("TERN_BASE_BIN")
BBCP = shutil.which("bbcp", path="/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
PEERS = ["scp", "rsync", "rsync4", "globus-url-copy", "rclone", "xrdcp", "bbcp", "bbcp-tar"]
# tern-first: tern as a new user meets it (no flags, fresh ssh login, no tern on the far side:
# it installs itself in a fresh cache each run). tern-ssh: the second use (tern already there).
# rsync4: four rsyncs over a size-balanced split of the files (bench/rsync-parallel.sh).
# bbcp: not in Debian; built from source by bench/install-bbcp.sh into /usr/local/bin. bbcp-tar:
# the same flags with bbcp's documented idiom for trees of many files, tar piped through bbcp
# (-N io: both ends are programs), since bbcp -r copies one file after another.
FULL_PATHS = ["lan", "alcf-ncsa", "olcf-alcf", "olcf-nersc", "olcf-nersc-lossy"]
QUICK_PATHS = ["lan", "olcf-nersc"]
FULL_PROFILES = ["hacc:2G", "six:2G", "one:2G", "small:1"]
QUICK_PROFILES = ["hacc:256M", "small:0.02"]


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, file=sys.stderr, flush=True)


def sh(cmd, timeout=60, check=True, **kw):
    return subprocess.run(cmd, timeout=timeout, check=check, text=True, capture_output=True, **kw)


def ns(name, cmd):
    return ["ip", "netns", "exec", name] + cmd


def proc_cpu(pid):
    """utime+stime+cutime+cstime of a live process, seconds (children already reaped included)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def ns_pids(name):
    r = subprocess.run(["ip", "netns", "pids", name], text=True, capture_output=True, timeout=10)
    return [int(p) for p in r.stdout.split()]


def ns_cpu(name):
    return sum(proc_cpu(p) for p in ns_pids(name))


def children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def wait_port(addr, port, deadline_s=10.0):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        r = subprocess.run(ns(NS_B, ["ss", "-Hltn", f"sport = :{port}"]), text=True, capture_output=True, timeout=10)
        if r.stdout.strip():
            return True
        time.sleep(0.1)
    return False


def tool_version(cmd):
    try:
        r = subprocess.run(cmd, text=True, capture_output=True, timeout=10)
        out = (r.stdout + r.stderr).strip().splitlines()
        return out[0] if out else "?"
    except (OSError, subprocess.TimeoutExpired):
        return "not installed"


# ---------------------------------------------------------------------------------------------
# Servers in tern-b


class Servers:
    def __init__(self, tmp, dst_root):
        self.tmp, self.dst_root = tmp, dst_root
        self.procs = {}
        self.errors = {}
        self.key = os.path.join(tmp, "id_ed25519")
        self.token = os.path.join(tmp, "tern-token")
        self.baseline = set()

    def ssh_cmd(self):
        # ControlPath=none: every run logs in afresh, for every ssh-based tool alike (tern would
        # otherwise keep its connection for the next run; warm numbers are measured separately).
        return (f"ssh -p {PORTS['ssh']} -i {self.key} -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
                " -o LogLevel=ERROR -o BatchMode=yes -o ControlPath=none")

    def _spawn(self, name, cmd, port, user=None):
        logf = open(os.path.join(self.tmp, f"{name}.log"), "w")
        p = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = p
        if not wait_port(B, port, 10):
            p.poll()
            self.errors[name] = f"did not listen on :{port} (see {logf.name}: " + open(logf.name).read()[-300:].replace("\n", " ") + ")"
            log(f"server {name}: FAILED to start: {self.errors[name]}")
            self.stop_one(name)
            return False
        return True

    def start(self, tools):
        os.makedirs(self.tmp, exist_ok=True)
        os.chmod(self.tmp, 0o755)
        if "iperf3" in tools:
            self._spawn("iperf3", ns(NS_B, ["iperf3", "-s", "-B", B, "-p", str(PORTS["iperf3"])]), PORTS["iperf3"])
        if {"scp", "rsync", "rsync4", "rclone", "bbcp", "bbcp-tar", "tern-ssh", "tern-first", "tern-ssh-base", "tern-first-base"} & set(tools):
            self.start_sshd()
        if "globus-url-copy" in tools:
            self._spawn("gridftp", ns(NS_B, [
                "globus-gridftp-server", "-s", "-p", str(PORTS["gridftp"]), "-aa", "-anonymous-user", "root",
                "-allow-root", "-home-dir", "/", "-control-interface", B, "-data-interface", B,
                "-d", "error,warn", "-l", os.path.join(self.tmp, "gridftp-server.log")]), PORTS["gridftp"])
        if "xrdcp" in tools:
            cfg = os.path.join(self.tmp, "xrootd.cfg")
            xdir = os.path.join(self.tmp, "xrootd")
            os.makedirs(xdir, exist_ok=True)
            shutil.chown(xdir, "xrootd", "xrootd")
            with open(cfg, "w") as f:
                f.write(f"xrd.port {PORTS['xrootd']}\nall.export {DATA}/dst/xrdcp\n"
                        f"all.adminpath {xdir}\nall.pidpath {xdir}\n")
            self._spawn("xrootd", ns(NS_B, ["runuser", "-u", "xrootd", "--", "xrootd", "-c", cfg,
                                             "-l", os.path.join(xdir, "xrootd.log")]), PORTS["xrootd"])
        if "tern-daemon" in tools and os.access(TERN, os.X_OK):
            with open(self.token, "w") as f:
                f.write(secrets.token_hex(32) + "\n")
            os.chmod(self.token, 0o600)
            os.makedirs(f"{DATA}/dst/tern-daemon", exist_ok=True)
            self._spawn("tern", ns(NS_B, [TERN, "serve", "--listen", f"{B}:{PORTS['tern']}", "--root",
                                           f"{DATA}/dst/tern-daemon", "--token-file", self.token]), PORTS["tern"])
        self.baseline = set(ns_pids(NS_B))

    def start_sshd(self):
        if not os.path.exists(self.key):
            sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", self.key])
            sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", os.path.join(self.tmp, "host_ed25519")])
            shutil.copy(self.key + ".pub", os.path.join(self.tmp, "authorized_keys"))
        cfg = os.path.join(self.tmp, "sshd_config")
        with open(cfg, "w") as f:
            f.write(f"""Port {PORTS['ssh']}
ListenAddress {B}
HostKey {self.tmp}/host_ed25519
PidFile {self.tmp}/sshd.pid
AuthorizedKeysFile {self.tmp}/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
UseDNS no
MaxStartups 100
MaxSessions 100
Subsystem sftp /usr/lib/openssh/sftp-server
""")
        os.makedirs("/run/sshd", exist_ok=True)
        # Clean environment: root's real ~/.bashrc (pyenv etc.) costs ~1 s per ssh command, so
        # sshd runs in its own mount namespace with an empty tmpfs over /root.
        inner = f"mount -t tmpfs -o size=16m,mode=0700 tern-bench-home /root && exec /usr/sbin/sshd -D -e -f {cfg}"
        self._spawn("sshd", ns(NS_B, ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner]), PORTS["ssh"])

    def stop_one(self, name):
        p = self.procs.pop(name, None)
        if p and p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=5)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=5)
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    pass

    def stop(self):
        for name in list(self.procs):
            self.stop_one(name)


# ---------------------------------------------------------------------------------------------
# Tools (client side, in tern-a, pushing to tern-b)


def tool_cmd(tool, src, dst_root, srv, nfiles):
    """-> (argv, dst_tree, verify_opts) or raises NotAvailable"""
    ssh = srv.ssh_cmd()
    many = nfiles > 8
    if tool == "scp":
        return ["scp", "-r", "-q", "-P", str(PORTS["ssh"]), "-i", srv.key, "-o", "StrictHostKeyChecking=no",
                "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "-o", "BatchMode=yes",
                src, f"root@{B}:{dst_root}/data"], f"{dst_root}/data"
    if tool == "rsync":
        return ["rsync", "-a", "-e", ssh, src + "/", f"root@{B}:{dst_root}/data/"], f"{dst_root}/data"
    if tool == "globus-url-copy":
        cmd = ["globus-url-copy", "-r", "-cd", "-p", "4", "-tcp-bs", "8M", "-bs", "8M", "-fast"]
        if many:
            cmd += ["-cc", "8", "-pp"]
        return cmd + [f"file://{src}/", f"ftp://{B}:{PORTS['gridftp']}{dst_root}/data/"], f"{dst_root}/data"
    if tool == "rclone":
        remote = f":sftp,host={B},port={PORTS['ssh']},user=root,key_file={srv.key},shell_type=unix,disable_hashcheck=true:"
        return ["rclone", "copy", src, remote + f"{dst_root}/data", "--config", "/dev/null", "--transfers", "8" if many else "4",
                "--multi-thread-streams", "4", "--ignore-checksum", "--create-empty-src-dirs", "-q", "--stats", "0"], f"{dst_root}/data"
    if tool == "xrdcp":
        return ["xrdcp", "-r", "-N", "-s", "--parallel", "8" if many else "4", "--streams", "4", src,
                f"root://{B}:{PORTS['xrootd']}/{dst_root}/"], f"{dst_root}/data"
    if tool == "bbcp":
        # bbcp starts its far side itself over ssh: -T is that command (split on spaces; %U, %H are
        # the user and host), here the bench's sshd, fresh login like the others. The data goes
        # over -s 8 parallel TCP streams (default 4) opened by bbcp itself, outside ssh, with no
        # encryption; -w 8m: 8 MiB buffers ~ one BDP of 1 Gb/s x 68 ms (bbcp leaves the kernel's
        # socket-buffer autotuning on unless -w =SIZE; the untuned bed caps send buffers at 4 MiB,
        # ~0.4 Gb/s per stream at 68 ms, so one stream cannot fill the path; -s 4 measured the same
        # on six:128M, -s 16 slower: bench/README.md). -r: the tree.
        xeq = f"{ssh} -x -a -l %U %H {BBCP}"
        return [BBCP, "-r", "-s", "8", "-w", "8m", "-T", xeq, src, f"root@{B}:{dst_root}/"], f"{dst_root}/data"
    if tool == "bbcp-tar":
        # -N io: the input and the output are programs (bbcp splits them on spaces: the bench's
        # paths have none); one stream of bytes, so no per-file round trips.
        xeq = f"{ssh} -x -a -l %U %H {BBCP}"
        parent, base = os.path.split(src)
        return [BBCP, "-s", "8", "-w", "8m", "-N", "io", "-T", xeq, f"tar -cf - -C {parent} {base}",
                f"root@{B}:tar -xf - -C {dst_root}"], f"{dst_root}/{base}"
    if tool == "rsync4":
        return [os.path.join(HERE, "rsync-parallel.sh"), "4", ssh, src, f"root@{B}:{dst_root}/data"], f"{dst_root}/data"
    if tool in ("tern-ssh", "tern-ssh-base"):
        binary = TERN if tool == "tern-ssh" else BASE
        if not binary:
            raise ValueError("tern-ssh-base needs TERN_BASE_BIN")
        return [binary, "cp", "-r", "--json", "--ssh", ssh, "--remote-bin", binary, src, f"root@{B}:{dst_root}/data"], f"{dst_root}/data"
    if tool in ("tern-first", "tern-first-base"):
        binary = TERN if tool == "tern-first" else BASE
        if not binary:
            raise ValueError("tern-first-base needs TERN_BASE_BIN")
        # The far side's login has no tern on PATH and an empty cache (removed before each run).
        cache = dst_root + ".first-cache"
        shutil.rmtree(cache, ignore_errors=True)
        wrapper = os.path.join(srv.tmp, "ssh-first-use")
        with open(wrapper, "w") as f:
            f.write("#!/bin/bash\nargs=(\"$@\"); last=\"${args[-1]}\"; unset 'args[-1]'\n"
                    f"exec {ssh} \"${{args[@]}}\" \"env PATH=/usr/bin:/bin XDG_CACHE_HOME={cache} $last\"\n")
        os.chmod(wrapper, 0o755)
        return [binary, "cp", "-r", "--json", "--no-ssh-reuse", "--ssh", wrapper, src, f"root@{B}:{dst_root}/data"], f"{dst_root}/data"
    if tool == "tern-daemon":
        return [TERN, "cp", "-r", "--json", "--token-file", srv.token, src, f"tern://{B}:{PORTS['tern']}/data"], f"{dst_root}/data"
    raise ValueError(tool)


def clear_dir(d, owner=None):
    if os.path.isdir(d):
        for e in os.scandir(d):
            if e.is_dir(follow_symlinks=False):
                shutil.rmtree(e.path)
            else:
                os.unlink(e.path)
    else:
        os.makedirs(d)
    if owner:
        shutil.chown(d, owner, owner)


def run_copy(tool, src, meta, srv, timeout):
    dst_root = f"{DATA}/dst/{tool}"
    clear_dir(dst_root, owner="xrootd" if tool == "xrdcp" else None)
    argv, dst = tool_cmd(tool, src, dst_root, srv, meta["files"])
    server_cpu0, client_cpu0 = ns_cpu(NS_B), children_cpu()
    t0 = time.monotonic()
    res = {"cmd": " ".join(shlex.quote(x) for x in argv)}
    try:
        p = subprocess.run(ns(NS_A, argv), text=True, capture_output=True, timeout=timeout, env=clean_env())
        wall = time.monotonic() - t0
        res["rc"] = p.returncode
        out = (p.stdout + p.stderr).strip()
        res["output_tail"] = out[-600:]
    except subprocess.TimeoutExpired as e:
        wall = time.monotonic() - t0
        res.update(rc=None, error=f"TIMEOUT after {timeout} s")
        out = ""
    # let server-side session processes (sshd children, forked gridftp) exit and be reaped
    end = time.monotonic() + 5
    while time.monotonic() < end and not set(ns_pids(NS_B)) <= srv.baseline:
        time.sleep(0.05)
    res["client_cpu_s"] = round(children_cpu() - client_cpu0, 3)
    res["server_cpu_s"] = round(ns_cpu(NS_B) - server_cpu0, 3)
    res["seconds"] = round(wall, 3)
    res["loadavg_1m"] = round(os.getloadavg()[0], 2)  # the box is shared: other work slows every tool
    if tool.startswith("tern"):
        for line in reversed(out.splitlines()):
            if line.startswith("{"):
                try:
                    res["tern_json"] = json.loads(line)
                except ValueError:
                    pass
                break
    ok = res.get("rc") == 0
    if not ok and "error" not in res:
        res["error"] = f"exit status {res.get('rc')}: {res['output_tail'][-200:]}"
    if ok and tool.startswith("tern"):
        tj = res.get("tern_json")
        if not tj or tj.get("ok") is not True:
            ok, res["error"] = False, "tern --json did not report ok"
    if os.path.isdir(dst):
        v = verify.compare(src, dst)
    else:
        v = {"ok": False, "first_differences": [f"destination {dst} missing"], "differences": 1}
    res["verify"] = {k: v.get(k) for k in ("ok", "differences", "first_differences", "seconds")}
    if not v["ok"]:
        ok = False
        res.setdefault("error", "verification failed: " + "; ".join(v["first_differences"][:3]))
    res["ok"] = ok
    clear_dir(dst_root)
    return res


def clean_env():
    keep = {k: os.environ[k] for k in ("PATH", "LANG", "TERM") if k in os.environ}
    keep["HOME"] = "/root"
    # No transfer history (it would carry a learned stream count from one cell into the next);
    # TERN_HISTORY=FILE keeps one, e.g. to measure `tern plan` against what happened.
    keep["TERN_HISTORY"] = os.environ.get("TERN_HISTORY", "off")
    keep["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    return keep


def iperf(streams, secs, cc=None):
    cmd = ["iperf3", "-c", B, "-p", str(PORTS["iperf3"]), "-P", str(streams), "-t", str(secs), "-J"]
    if cc:
        cmd += ["-C", cc]
    try:
        p = sh(ns(NS_A, cmd), timeout=secs + 30, check=False)
        d = json.loads(p.stdout)
        e = d["end"]
        return {"gbps": round(e["sum_received"]["bits_per_second"] / 1e9, 3),
                "retransmits": e["sum_sent"].get("retransmits"),
                "cpu_sender_pct": round(e["cpu_utilization_percent"]["host_total"], 1),
                "cpu_receiver_pct": round(e["cpu_utilization_percent"]["remote_total"], 1),
                "streams": streams, "seconds": secs,
                # iperf3's own CPU (sender+receiver) per 10^9 bytes: the plain-TCP reference for the tools' CPU s/GB
                "cpu_s_per_gb": round((e["cpu_utilization_percent"]["host_total"] + e["cpu_utilization_percent"]["remote_total"])
                                      / 100 * 8 / (e["sum_received"]["bits_per_second"] / 1e9), 3)}
    except (ValueError, KeyError, subprocess.TimeoutExpired) as ex:
        return {"gbps": None, "error": str(ex)[:200], "streams": streams}


def ssh_login(srv, reps=3):
    """Median seconds of a fresh ssh login that runs `true` (no connection reuse)."""
    times = []
    for _ in range(reps):
        t0 = time.monotonic()
        subprocess.run(ns(NS_A, shlex.split(srv.ssh_cmd()) + [f"root@{B}", "true"]), capture_output=True, timeout=60, check=True)
        times.append(time.monotonic() - t0)
    return round(statistics.median(times), 3)


def ping_rtt(count=20):
    p = sh(ns(NS_A, ["ping", "-q", "-c", str(count), "-i", "0.2", "-W", "5", B]), timeout=count + 30, check=False)
    for line in p.stdout.splitlines():
        if "min/avg/max" in line:
            mn, avg, mx, _ = line.split("=")[1].split()[0].split("/")
            return {"min_ms": float(mn), "avg_ms": float(avg), "max_ms": float(mx)}
    return {"error": p.stdout[-200:]}


def delayline_stats():
    p = sh([NETNS, "stats"], timeout=30, check=False)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"error": p.stderr[-200:]}


def netns_up(path, args):
    cmd = [NETNS, "up", path, "--rate", args.rate, "--cc", args.cc]
    if args.tuned:
        cmd.append("--tuned")
    p = sh(cmd, timeout=900, check=False)
    if p.returncode != 0:
        raise RuntimeError(f"netns.sh up {path} failed: {p.stderr[-500:]}")


def netns_down():
    p = subprocess.run([NETNS, "down"], timeout=120, capture_output=True, text=True)
    if p.returncode != 0:
        log(f"WARNING: netns.sh down failed: {p.stderr[-300:]}")


# ---------------------------------------------------------------------------------------------
# Datasets


def dataset(spec):
    """'hacc:2G' / 'small:0.02' -> (src dir, meta). Generated once into /dev/shm and reused."""
    prof, _, arg = spec.partition(":")
    top = f"{DATA}/src/{prof}-{arg or 'default'}"
    meta_file = top + ".json"
    src = top + "/data"
    if os.path.exists(meta_file) and os.path.isdir(src):
        with open(meta_file) as f:
            return src, json.load(f)
    shutil.rmtree(top, ignore_errors=True)
    if prof == "real":
        return real_tree(spec, arg, top, src, meta_file)
    cmd = [GEN, prof, src]
    if prof == "small" and arg:
        cmd += ["--count-scale", arg]
    elif arg:
        cmd += ["--size", arg]
    p = sh(cmd, timeout=1800)
    meta = json.loads(p.stdout)
    meta["spec"] = spec
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    log(f"generated {spec}: {meta['files']} files, {meta['bytes']/1e9:.3f} GB in {meta['seconds']} s ({meta['mb_per_s']} MB/s)")
    return src, meta


# Trees nobody here wrote, copied from what the machine has installed (never committed):
# rust = the toolchain's sysroot (~52,000 files, 1.3 GB, deep, most files < 4 KiB: the tree a
# user's copy once failed on), usr-share = /usr/share (~45,000 files), python = /usr/lib/python3.
REAL_TREES = {
    "rust": lambda: subprocess.run(["rustc", "--print", "sysroot"], capture_output=True, text=True, check=True).stdout.strip(),
    "usr-share": lambda: "/usr/share",
    "python": lambda: "/usr/lib/python3",
}


def real_tree(spec, name, top, src, meta_file):
    if name not in REAL_TREES:
        sys.exit(f"unknown real tree {name!r}; known: {sorted(REAL_TREES)}")
    origin = REAL_TREES[name]()
    t0 = time.monotonic()
    os.makedirs(top)
    # cp -a keeps links as links (absolute ones too), modes and times, as the copies must.
    sh(["cp", "-a", origin, src], timeout=1800)
    files = dirs = links = nbytes = 0
    for root, dnames, fnames in os.walk(src):
        dirs += len(dnames)
        for f in fnames:
            st = os.lstat(os.path.join(root, f))
            if stat.S_ISLNK(st.st_mode):
                links += 1
            elif stat.S_ISREG(st.st_mode):
                files += 1
                nbytes += st.st_size
    secs = time.monotonic() - t0
    meta = {"files": files, "dirs": dirs, "links": links, "bytes": nbytes, "origin": origin, "spec": spec,
            "seconds": round(secs, 3), "mb_per_s": round(nbytes / 1e6 / max(secs, 1e-3))}
    with open(meta_file, "w") as f:
        json.dump(meta, f)
    log(f"copied real tree {spec} from {origin}: {files} files, {links} links, {dirs} dirs, {nbytes/1e9:.3f} GB")
    return src, meta


# ---------------------------------------------------------------------------------------------
# Report


def rate_bps(s):
    s = str(s).lower()
    mult = {"k": 1e3, "m": 1e6, "g": 1e9}.get(s[-1:], 1)
    try:
        return float(s.rstrip("kmg")) * mult
    except ValueError:
        return 0


def summarize(results):
    """Add medians and ratios per (path, profile, tool)."""
    cap = rate_bps(results["rate"])
    for path, pr in results["paths"].items():
        ceiling = (pr.get("iperf3_p8") or {}).get("gbps")
        for prof, tools in pr["profiles"].items():
            for tool, t in tools.items():
                runs = t.get("runs", [])
                t["passed"] = sum(1 for r in runs if r.get("ok"))
                t["status"] = t.get("status") or ("PASS" if runs and t["passed"] == len(runs) else "FAILED")
                if t["status"] == "PASS":
                    secs = statistics.median(r["seconds"] for r in runs)
                    t["median_s"] = secs
                    t["gbps"] = round(t["bytes"] * 8 / secs / 1e9, 4)
                    cpu = statistics.median(r["client_cpu_s"] + r["server_cpu_s"] for r in runs)
                    t["cpu_s_per_gb"] = round(cpu / (t["bytes"] / 1e9), 3)
                    t["ratio_ceiling"] = round(t["gbps"] / ceiling, 3) if ceiling else None
                    # issue 11's ideal: the ssh login plus the bytes at the iperf3 -P 8 ceiling
                    login = pr.get("ssh_login_s")
                    if ceiling and login is not None:
                        t["ratio_ideal"] = round(secs / (login + t["bytes"] * 8 / (ceiling * 1e9)), 3)
                    if cap and t["gbps"] * 1e9 > cap * 1.02:
                        # cannot have crossed the emulated bottleneck: the data took another route
                        t["status"], t["reason"] = "SUSPECT", f"faster than the {results['rate']} rate cap"
            best = max((t.get("gbps") or 0 for name, t in tools.items() if name in PEERS), default=0)
            for tool, t in tools.items():
                t["ratio_best_peer"] = round(t["gbps"] / best, 3) if t.get("gbps") and best else None


def fmt(x, nd=2):
    return "—" if x is None else f"{x:.{nd}f}"


def write_report(results, outbase):
    summarize(results)
    with open(outbase + ".json", "w") as f:
        json.dump(results, f, indent=1)
    env = results["env"]
    L = [f"# tern bench: {results['name']}", "",
         f"{env['date']} · commit `{env['commit']}` · {env['host']} · kernel {env['kernel']} · {env['cpus']} CPUs · "
         f"mode {'quick' if results['quick'] else 'full'} · {results['reps']} rep(s) per cell, median shown",
         ""]
    loads = [r["loadavg_1m"] for pr in results["paths"].values() for c in pr["profiles"].values()
             for t in c.values() for r in t.get("runs", []) if "loadavg_1m" in r]
    if loads:
        L += [f"Load average (1 min, {env['cpus']} CPUs) at the end of each copy: {min(loads):.1f}–{max(loads):.1f}, "
              f"median {statistics.median(loads):.1f} (the bed itself accounts for about 1–2: delay line, client, server; more means other work on the box competed with the copies).", ""]
    L += [
         f"**Data lives on tmpfs ({DATA}), not disk**: these are network + CPU results, the disk is not measured. "
         f"Paths are emulated by `tern-delayline` between namespaces tern-a → tern-b: rate cap {results['rate']} bit/s "
         f"per direction, MTU {results['mtu']}, congestion control {results['cc']}, "
         f"socket buffers {'tuned (--tuned: 64 MiB limits)' if results['tuned'] else 'untuned (tcp_wmem max 4 MiB, core.[rw]mem_max 4 MiB)'}. "
         "Every copy is verified with SHA-256 (bench/verify.py) against the source; a failed, partial or timed-out copy is FAILED, never a time.",
         ""]
    dc = results.get("delayline_ceiling") or {}
    if dc:
        L += ["## Delay line ceiling (RTT 0, no rate cap, iperf3 through tern-delayline)", "",
              f"iperf3 -P 8: **{fmt(dc.get('p8', {}).get('gbps'))} Gb/s**, -P 1: {fmt(dc.get('p1', {}).get('gbps'))} Gb/s; "
              f"delay line CPU {fmt(dc.get('delayline_cpu_per_s'))} core-s per s during the test "
              f"(includes the kernel TCP receive work it performs when it writes into a TUN device); "
              f"ping RTT of the bed with zero configured delay {fmt((dc.get('ping') or {}).get('avg_ms'), 3)} ms. "
              f"Any rate cap well below the ceiling measures the path, not the emulator.", ""]
    L += ["## Paths", "", "| path | RTT ping min/avg/max ms | iperf3 -P 8 Gb/s (ceiling) | iperf3 -P 1 Gb/s | iperf3 -P 8 CPU s/GB | delay line drops loss/queue/ring | delay line late avg/max µs (pkts > 1 ms) | delay line CPU s |",
          "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for path, pr in results["paths"].items():
        pg = pr.get("ping") or {}
        dl = pr.get("delayline") or {}
        dirs = dl.get("directions", {})
        drops = "/".join(str(sum(d.get(k, 0) for d in dirs.values())) for k in ("drop_loss", "drop_queue", "drop_ring"))
        late = (f"{max((d.get('late_avg_us', 0) for d in dirs.values()), default=0):.0f}/{max((d.get('late_max_us', 0) for d in dirs.values()), default=0):.0f}"
                f" ({sum(d.get('late_over_1ms', 0) for d in dirs.values())} of {sum(d.get('tx_pkts', 0) for d in dirs.values())})")
        L.append(f"| {path} | {fmt(pg.get('min_ms'), 2)}/{fmt(pg.get('avg_ms'), 2)}/{fmt(pg.get('max_ms'), 2)} | "
                 f"{fmt((pr.get('iperf3_p8') or {}).get('gbps'), 3)} | {fmt((pr.get('iperf3_p1') or {}).get('gbps'), 3)} | {fmt((pr.get('iperf3_p8') or {}).get('cpu_s_per_gb'))} | {drops} | {late} | {fmt(dl.get('process_cpu_s'), 1)} |")
    L.append("")
    profiles = []
    for pr in results["paths"].values():
        for p in pr["profiles"]:
            if p not in profiles:
                profiles.append(p)
    for prof in profiles:
        meta = results["datasets"].get(prof, {})
        L += [f"## {prof}: {meta.get('files')} files, {meta.get('dirs')} dirs, {meta.get('bytes', 0)/1e9:.3f} GB", "",
              "| path | tool | Gb/s (median) | × iperf3 ceiling | × best peer | × ideal | CPU s/GB (sender+receiver) | median s | result |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for path, pr in results["paths"].items():
            for tool, t in pr["profiles"].get(prof, {}).items():
                res = t["status"]
                if res == "SUSPECT":
                    res = f"**SUSPECT** ({t.get('reason')})"
                elif res != "PASS":
                    err = t.get("reason") or next((r.get("error") for r in t.get("runs", []) if not r.get("ok")), "")
                    res = f"**{res}** {t.get('passed', 0)}/{len(t.get('runs', []))} ok: {str(err)[:120]}".replace("|", "/").replace("\n", " ")
                else:
                    res = f"PASS {t['passed']}/{len(t['runs'])}"
                    tj = [r.get("tern_json") for r in t["runs"] if r.get("tern_json")]
                    if tj:
                        res += f" (resent {sum(x.get('bytes_resent', 0) or 0 for x in tj)} B)"
                L.append(f"| {path} | {tool} | {fmt(t.get('gbps'), 3)} | {fmt(t.get('ratio_ceiling'))} | {fmt(t.get('ratio_best_peer'))} | {fmt(t.get('ratio_ideal'))} | "
                         f"{fmt(t.get('cpu_s_per_gb'))} | {fmt(t.get('median_s'), 2)} | {res} |")
        L.append("")
        L.append(f"![{prof}]({os.path.basename(outbase)}-{prof.replace(':', '_')}.png)")
        L.append("")
    L += ["## Columns", "",
          "- **Gb/s (median)**: dataset bytes × 8 / median wall time of the passing runs, from process start to exit "
          "(includes connection setup and, for ssh tools, the ssh handshake). Shown only when every run passed.",
          "- **× iperf3 ceiling**: ratio to iperf3 -P 8 memory-to-memory on the same path (the most the path gives TCP here).",
          "- **× best peer**: ratio to the fastest non-tern tool on the same path and profile.",
          "- **× ideal**: median time ÷ (a fresh ssh login's time on this path, `ssh HOST true`, median of 3, plus the "
          "bytes at the iperf3 -P 8 ceiling): what no tool that logs in over ssh can beat (issue 11 asks ≤ 1.15 from 512 MiB, ≤ 1.3 at 128 MiB).",
          "- **CPU s/GB**: user+system CPU of the client process tree (tern-a) plus every process in tern-b "
          "(servers and their reaped children), per 10^9 bytes. Kernel TCP work done inside the delay line's "
          "threads is not included (see the delay line CPU column).",
          "", "## Commands", ""]
    seen = set()
    for pr in results["paths"].values():
        for prof, tools in pr["profiles"].items():
            for tool, t in tools.items():
                if t.get("runs") and tool not in seen:
                    seen.add(tool)
                    L.append(f"- {tool}: `{t['runs'][0]['cmd']}`")
    L += ["", "## Versions", ""] + [f"- {k}: {v}" for k, v in env["versions"].items()]
    with open(outbase + ".md", "w") as f:
        f.write("\n".join(L) + "\n")
    plot(results, outbase, profiles)


def plot(results, outbase, profiles):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not available: no plots")
        return
    paths = list(results["paths"])
    for prof in profiles:
        tools = []
        for pr in results["paths"].values():
            for t in pr["profiles"].get(prof, {}):
                if t not in tools:
                    tools.append(t)
        fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(paths) + 3.5), 4.5))
        w = 0.8 / max(1, len(tools))
        for i, tool in enumerate(tools):
            xs, ys = [], []
            for j, path in enumerate(paths):
                t = results["paths"][path]["profiles"].get(prof, {}).get(tool)
                if t is not None:
                    xs.append(j + (i - (len(tools) - 1) / 2) * w)
                    ys.append(t.get("gbps") or 0)
            bars = ax.bar(xs, ys, w, label=tool)
            for x, y, path in zip(xs, ys, paths):
                t = results["paths"][path]["profiles"].get(prof, {}).get(tool, {})
                if t.get("status") != "PASS":
                    ax.text(x, 0.01, "FAILED" if t.get("status") == "FAILED" else t.get("status", ""), rotation=90, ha="center", va="bottom", fontsize=7)
        for j, path in enumerate(paths):
            c = (results["paths"][path].get("iperf3_p8") or {}).get("gbps")
            if c:
                ax.hlines(c, j - 0.45, j + 0.45, colors="k", linestyles="dashed", label="iperf3 -P 8 ceiling" if j == 0 else None)
        ax.set_xticks(range(len(paths)))
        ax.set_xticklabels(paths)
        ax.set_ylabel("Gb/s (median, verified copies)")
        ax.set_title(f"{results['name']}: {prof} (rate cap {results['rate']}, {results['cc']}, "
                     f"{'tuned' if results['tuned'] else 'untuned'})")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        fig.savefig(f"{outbase}-{prof.replace(':', '_')}.png", dpi=110)
        plt.close(fig)


# ---------------------------------------------------------------------------------------------


def tern_status(build):
    if build and os.path.isdir(os.path.join(REPO, "crates", "tern")):
        log("building tern (cargo build --release -p tern -j1)")
        subprocess.run(["cargo", "build", "--release", "-p", "tern", "-j1"], cwd=REPO, timeout=3600)
    if not os.access(TERN, os.X_OK):
        return "not built"
    p = subprocess.run([TERN, "cp", "--help"], capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        return "not built (no `tern cp`)"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"paths {QUICK_PATHS}, profiles {QUICK_PROFILES}, 1 rep, short iperf3")
    ap.add_argument("--name", help="results name (default: quick-/full-<date>)")
    ap.add_argument("--paths", help="comma list of netns.sh presets")
    ap.add_argument("--profiles", help="comma list of PROFILE[:SIZE] (small:SCALE), e.g. hacc:2G,small:0.1")
    ap.add_argument("--tools", help=f"comma list from {ALL_TOOLS}")
    ap.add_argument("--reps", type=int, help="runs per cell (median reported); default 3, quick 1")
    ap.add_argument("--rate", default="1g", help="bottleneck rate per direction (netns.sh --rate), default 1g")
    ap.add_argument("--cc", default="bbr", help="namespace congestion control (bbr or reno)")
    ap.add_argument("--tuned", action="store_true", help="raise socket buffer limits (netns.sh --tuned)")
    ap.add_argument("--timeout", type=int, help="per-copy timeout in s (default 600, quick 90)")
    ap.add_argument("--iperf-secs", type=int, help="iperf3 duration (default 10, quick 5)")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the delay line's own ceiling measurement")
    ap.add_argument("--build-tern", action="store_true", help="cargo build --release -p tern first")
    ap.add_argument("--keep-data", action="store_true", help="keep generated datasets in /dev/shm")
    ap.add_argument("--require-tern", action="store_true", help="exit non-zero when tern is not built (CI)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        sys.exit("run.py: needs root (namespaces)")
    q = args.quick
    paths = args.paths.split(",") if args.paths else (QUICK_PATHS if q else FULL_PATHS)
    profiles = args.profiles.split(",") if args.profiles else (QUICK_PROFILES if q else FULL_PROFILES)
    tools = args.tools.split(",") if args.tools else ALL_TOOLS
    for t in tools:
        if t not in ALL_TOOLS:
            sys.exit(f"unknown tool {t}; known: {ALL_TOOLS}")
    reps = args.reps or (1 if q else 3)
    timeout = args.timeout or (90 if q else 600)
    isecs = args.iperf_secs or (5 if q else 10)
    name = args.name or f"{'quick' if q else 'full'}-{datetime.datetime.now().strftime('%Y%m%d-%H%M%S')}"
    outdir = os.path.join(HERE, "results")
    os.makedirs(outdir, exist_ok=True)
    outbase = os.path.join(outdir, name)

    # one bed per machine: hold the lock netns.sh checks, for the whole run
    import fcntl
    lockf = open("/run/tern-bench.lock", "w")
    try:
        fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        sys.exit("run.py: another bench run holds /run/tern-bench.lock")
    os.environ["TERN_BENCH_LOCKED"] = "1"

    t_start = time.monotonic()
    if not os.access(GEN, os.X_OK):
        sh(["cargo", "build", "--release", "-j1", "-q"], cwd=os.path.join(HERE, "delayline"), timeout=900)
    missing_tern = tern_status(args.build_tern) if any(t.startswith("tern") for t in tools) else None
    if missing_tern:
        log(f"tern: {missing_tern} — tern rows will say so")

    def on_signal(sig, _):
        raise KeyboardInterrupt(f"signal {sig}")
    signal.signal(signal.SIGTERM, on_signal)

    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    results = {
        "name": name, "quick": q, "reps": reps, "rate": args.rate, "cc": args.cc, "tuned": args.tuned, "mtu": 9000,
        "timeout_s": timeout, "tools": tools, "paths": {}, "datasets": {},
        "env": {"date": datetime.datetime.now().isoformat(timespec="seconds"), "commit": commit or "?",
                "host": os.uname().nodename, "kernel": os.uname().release, "cpus": os.cpu_count(),
                "versions": {
                    "iperf3": tool_version(["iperf3", "--version"]), "ssh": tool_version(["ssh", "-V"]),
                    "rsync": tool_version(["rsync", "--version"]), "globus-url-copy": tool_version(["globus-url-copy", "-version"]),
                    "rclone": tool_version(["rclone", "version"]), "xrdcp": tool_version(["xrdcp", "--version"]),
                    "bbcp": BBCP and f"{BBCP}: {tool_version([BBCP, '-#'])}" or "not installed (bench/install-bbcp.sh)",
                    "tern": missing_tern or tool_version([TERN, "--version"]),
                    "tern-base": BASE and f"{BASE}: {tool_version([BASE, '--version'])}"}},
    }
    tmp = tempfile.mkdtemp(prefix="tern-bench-")
    srv = None
    try:
        datasets = {}
        for spec in profiles:
            datasets[spec] = dataset(spec)
            results["datasets"][spec] = datasets[spec][1]
        if not args.no_ceiling:
            log("delay line ceiling: preset raw (RTT 0, no cap)")
            netns_up("raw", argparse.Namespace(rate="0", cc=args.cc, tuned=args.tuned))
            srv = Servers(tmp, DATA)
            srv.start(["iperf3"])
            d0 = delayline_stats()
            p8 = iperf(8, isecs)
            p1 = iperf(1, isecs)
            d1 = delayline_stats()
            busy = 2 * isecs
            results["delayline_ceiling"] = {
                "p8": p8, "p1": p1, "ping": ping_rtt(10),
                "delayline_cpu_per_s": round((d1.get("process_cpu_s", 0) - d0.get("process_cpu_s", 0)) / busy, 3)}
            log(f"delay line ceiling: P8 {p8.get('gbps')} Gb/s, P1 {p1.get('gbps')} Gb/s")
            srv.stop()
        for path in paths:
            log(f"=== path {path}")
            netns_up(path, args)
            srv = Servers(tmp, DATA)
            srv.start(tools)
            pr = results["paths"][path] = {"profiles": {}, "server_errors": srv.errors}
            pr["ping"] = ping_rtt(20)
            if "sshd" in srv.procs:
                pr["ssh_login_s"] = ssh_login(srv)
                log(f"{path}: fresh ssh login {pr['ssh_login_s']} s")
            if "iperf3" in tools and "iperf3" in srv.procs:
                pr["iperf3_p8"] = iperf(8, isecs)
                pr["iperf3_p1"] = iperf(1, isecs)
                log(f"{path}: ping {pr['ping'].get('avg_ms')} ms, iperf3 P8 {pr['iperf3_p8'].get('gbps')} Gb/s, P1 {pr['iperf3_p1'].get('gbps')}")
            for spec in profiles:
                src, meta = datasets[spec]
                cells = pr["profiles"][spec] = {}
                for tool in tools:
                    if tool == "iperf3":
                        continue
                    cell = cells[tool] = {"bytes": meta["bytes"], "runs": []}
                    server = {"scp": "sshd", "rsync": "sshd", "rsync4": "sshd", "rclone": "sshd", "bbcp": "sshd", "bbcp-tar": "sshd", "tern-ssh": "sshd", "tern-first": "sshd", "tern-ssh-base": "sshd", "tern-first-base": "sshd",
                              "globus-url-copy": "gridftp", "xrdcp": "xrootd", "tern-daemon": "tern"}[tool]
                    if tool.startswith("tern") and missing_tern:
                        cell["status"], cell["reason"] = "NOT BUILT", missing_tern
                        continue
                    if tool.startswith("bbcp") and not BBCP:
                        # not an error (bbcp is not in Debian; CI has no source): like NOT BUILT
                        cell["status"], cell["reason"] = "NOT INSTALLED", "no bbcp on PATH: bench/install-bbcp.sh SRC"
                        continue
                    if server not in srv.procs:
                        cell["status"], cell["reason"] = "FAILED", f"server {server} did not start: {srv.errors.get(server, '?')}"
                        continue
                    for rep in range(reps):
                        r = run_copy(tool, src, meta, srv, timeout)
                        cell["runs"].append(r)
                        log(f"{path} {spec} {tool} #{rep+1}: " + (f"{meta['bytes']*8/r['seconds']/1e9:.3f} Gb/s in {r['seconds']} s"
                                                                   if r["ok"] else f"FAILED: {r.get('error', '')[:200]}"))
                        if r.get("error", "").startswith("TIMEOUT"):
                            break  # do not spend the remaining reps on a tool that already timed out
                    write_report(results, outbase)  # partial results survive an interruption
            pr["delayline"] = delayline_stats()
            srv.stop()
            srv = None
        results["elapsed_s"] = round(time.monotonic() - t_start, 1)
        write_report(results, outbase)
        log(f"done in {results['elapsed_s']} s: {outbase}.md")
    except KeyboardInterrupt as e:
        log(f"interrupted ({e}); partial results in {outbase}.md")
        write_report(results, outbase)
        return 130
    finally:
        if srv:
            srv.stop()
        netns_down()
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(f"{DATA}/dst", ignore_errors=True)
        if not args.keep_data:
            shutil.rmtree(f"{DATA}/src", ignore_errors=True)
    bad = {"FAILED", "SUSPECT", "NOT BUILT"} if args.require_tern else {"FAILED", "SUSPECT"}
    failed = [(p, s, t) for p, pr in results["paths"].items() for s, c in pr["profiles"].items() for t, x in c.items() if x.get("status") in bad]
    for f in failed:
        log("FAILED: " + " / ".join(f))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
