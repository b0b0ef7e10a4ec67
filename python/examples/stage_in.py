#!/usr/bin/env python3
"""Stage data in, then run the next step of a workflow: submit, wait, run.

    export TERN_SERVER=https://dtn1:7443 TERN_TOKEN=... TERN_CA_FILE=/var/lib/tern/tls/cert.pem
    python3 stage_in.py tern://archive:7700/runs/run42 /scratch/$USER/run42 -- ./analyse /scratch/$USER/run42

The copy runs in the tern service, so a step that is restarted (a requeued batch job, a
re-run notebook cell) can submit again: files that landed already are skipped. Exit status
as `tern wait`: the command's own status once the data is there, 1 the transfer failed, 3 it
was canceled, 4 --timeout passed, 2 the service refused the request.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from tern_client import TernError, TransferClient, TransferData


def stage(tc: TransferClient, src: str, dst: str, label: str, timeout: float | None) -> int:
    """Copies src to dst through the service; 0 when it landed, else a `tern wait` status."""
    tdata = TransferData(label=label, sync_level="mtime")  # a re-run sends only what changed
    tdata.add_item(src, dst, recursive=True)
    job = tc.submit_transfer(tdata)
    print(f"stage-in: job {job['id']} {src} -> {dst}", file=sys.stderr)
    job = tc.wait(job["id"], timeout=timeout)
    if job["state"] == "succeeded":
        s = job.get("summary") or {}
        print(f"stage-in: job {job['id']} succeeded: {s.get('files', 0)} files, {s.get('bytes', 0)} bytes sent", file=sys.stderr)
        return 0
    if job["state"] == "canceled":
        print(f"stage-in: job {job['id']} was canceled", file=sys.stderr)
        return 3
    if job["state"] != "failed":
        print(f"stage-in: job {job['id']} is still {job['state']} after {timeout} s (tern wait {job['id']} to keep waiting)", file=sys.stderr)
        return 4
    print(f"stage-in: job {job['id']} failed: {job.get('error') or ''}", file=sys.stderr)
    for e in (job.get("summary") or {}).get("errors", []):
        print(f"  {e.get('path')}: {e.get('message')} ({e.get('side')})", file=sys.stderr)
    return 1


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--label", default="stage-in")
    p.add_argument("--timeout", type=float, default=None, help="seconds to wait for the data (default: as long as it takes)")
    p.epilog = "After --: the command to run once the data is there."
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a, command = p.parse_args(argv[:cut]), argv[cut + 1 :]
    try:
        tc = TransferClient()  # TERN_SERVER, TERN_TOKEN, TERN_CA_FILE
        status = stage(tc, a.src, a.dst, a.label, a.timeout)
    except TernError as e:
        print(f"stage-in: {e}", file=sys.stderr)
        return 2
    if status != 0 or not command:
        return status
    return subprocess.call(command)


if __name__ == "__main__":
    sys.exit(main())
