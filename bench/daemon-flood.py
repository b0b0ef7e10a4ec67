#!/usr/bin/env python3
"""Silent-connection flood against a loopback `tern serve`, and a real copy meanwhile.

    bench/daemon-flood.py TERN_BINARY [CONNECTIONS]

Starts a daemon with its default caps, opens CONNECTIONS (default 2000) TCP connections that
send nothing or only the control kind byte, prints the daemon's threads, descriptors and RSS,
then runs `tern cp -r` of 1 MiB to it and prints whether it worked. See docs/security.md, 3.
"""
import os, re, resource, shutil, socket, subprocess, sys, tempfile, time

resource.setrlimit(resource.RLIMIT_NOFILE, (20000, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
tern, n = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 2000
w = tempfile.mkdtemp(dir="/dev/shm"); os.makedirs(f"{w}/root"); os.makedirs(f"{w}/src")
open(f"{w}/src/a", "wb").write(os.urandom(1 << 20))
log = open(f"{w}/log", "w")
d = subprocess.Popen([tern, "serve", "--listen", "127.0.0.1:0", "--root", f"{w}/root", "--token-file", f"{w}/tok"], stderr=log, stdout=subprocess.DEVNULL)
for _ in range(100):
    m = re.search(r"listening on 127.0.0.1:(\d+)", open(f"{w}/log").read())
    if m: break
    time.sleep(0.05)
port = int(m.group(1)); time.sleep(0.3)
def stat():
    th = int(re.search(r"Threads:\s+(\d+)", open(f"/proc/{d.pid}/status").read()).group(1))
    rss = int(re.search(r"VmRSS:\s+(\d+)", open(f"/proc/{d.pid}/status").read()).group(1)) // 1024
    return th, len(os.listdir(f"/proc/{d.pid}/fd")), rss
print("idle: threads, fds, RSS MiB", stat())
socks = []
for i in range(n):
    s = socket.socket(); s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        if i % 2: s.send(b"C")
        socks.append(s)
    except Exception: pass
time.sleep(1)
print(f"{len(socks)} silent connections:", stat())
t0 = time.time()
r = subprocess.run([tern, "cp", "-r", f"{w}/src", f"tern://127.0.0.1:{port}/copy", "--token-file", f"{w}/tok", "--retry-for", "5"], capture_output=True, timeout=120)
print(f"real cp meanwhile: rc={r.returncode} {time.time()-t0:.2f} s {r.stderr.decode().strip()[-200:]}")
print("after cp:", stat())
d.kill(); d.wait()
for s in socks:
    s.close()
shutil.rmtree(w, ignore_errors=True)
