#!/usr/bin/python3
"""Compare two directory trees byte for byte, independently of the tools under test.

    bench/verify.py SRC DST [--json] [--modes] [--no-links] [--no-empty-dirs]

Walks both trees without following symlinks and compares:
  * the set of relative paths and their types (dir / file / symlink / other);
  * regular files: size and SHA-256 of the content (hashlib, i.e. OpenSSL — not tern's BLAKE3);
  * symlinks: the link target string;
  * directories: presence (so empty directories count);
  * with --modes also the permission bits (off by default: several peers do not preserve them).
--no-links / --no-empty-dirs drop symlinks / empty directories from the comparison, for tools
that by design do not copy them (the report says so).
Exit status 0 when identical, 1 when different, 2 on usage errors. --json prints one object.
"""
import argparse
import hashlib
import json
import os
import stat
import sys
import time
from concurrent.futures import ThreadPoolExecutor

BUF = 1 << 20


def sha256_file(path):
    h = hashlib.sha256()
    buf = bytearray(BUF)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            n = f.readinto(buf)
            if not n:
                break
            h.update(view[:n])  # hashlib releases the GIL for large updates
    return h.hexdigest()


def scan(root):
    """relative path -> (kind, info) ; kind in d/f/l/o."""
    out = {}
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            for e in it:
                r = os.path.join(rel, e.name) if rel else e.name
                st = e.stat(follow_symlinks=False)
                mode = stat.S_IMODE(st.st_mode)
                if stat.S_ISDIR(st.st_mode):
                    out[r] = ["d", mode, None]
                    stack.append(r)
                elif stat.S_ISREG(st.st_mode):
                    out[r] = ["f", mode, st.st_size]
                elif stat.S_ISLNK(st.st_mode):
                    out[r] = ["l", mode, os.readlink(e.path)]
                else:
                    out[r] = ["o", mode, None]
    return out


def compare(src, dst, modes=False, links=True, empty_dirs=True, max_diffs=20):
    t0 = time.monotonic()
    a, b = scan(src), scan(dst)
    notes = []
    if not links:
        for t in (a, b):
            for k in [k for k, v in t.items() if v[0] == "l"]:
                del t[k]
        notes.append("symlinks not compared")
    if not empty_dirs:
        for t in (a, b):
            parents = {os.path.dirname(k) for k in t}
            for k in [k for k, v in t.items() if v[0] == "d" and k not in parents]:
                del t[k]
        notes.append("empty directories not compared")
    diffs = []

    def diff(msg):
        if len(diffs) < max_diffs:
            diffs.append(msg)
        return 1

    ndiff = 0
    for k in sorted(a.keys() - b.keys()):
        ndiff += diff(f"missing in dst: {k} ({a[k][0]})")
    for k in sorted(b.keys() - a.keys()):
        ndiff += diff(f"extra in dst: {k} ({b[k][0]})")
    to_hash = []
    for k in sorted(a.keys() & b.keys()):
        (ka, ma, ia), (kb, mb, ib) = a[k], b[k]
        if ka != kb:
            ndiff += diff(f"type differs: {k}: {ka} vs {kb}")
            continue
        if modes and ka != "l" and ma != mb:
            ndiff += diff(f"mode differs: {k}: {oct(ma)} vs {oct(mb)}")
        if ka == "l" and ia != ib:
            ndiff += diff(f"symlink target differs: {k}: {ia!r} vs {ib!r}")
        if ka == "f":
            if ia != ib:
                ndiff += diff(f"size differs: {k}: {ia} vs {ib}")
            else:
                to_hash.append(k)
    nbytes = sum(a[k][2] for k in to_hash)
    with ThreadPoolExecutor(max_workers=2) as ex:
        ha = ex.map(lambda k: sha256_file(os.path.join(src, k)), to_hash)
        hb = ex.map(lambda k: sha256_file(os.path.join(dst, k)), to_hash)
        for k, x, y in zip(to_hash, ha, hb):
            if x != y:
                ndiff += diff(f"content differs: {k}")
    kinds = lambda t, c: sum(1 for v in t.values() if v[0] == c)
    return {
        "ok": ndiff == 0,
        "differences": ndiff,
        "first_differences": diffs,
        "files": kinds(a, "f"),
        "dirs": kinds(a, "d"),
        "symlinks": kinds(a, "l"),
        "bytes_hashed": nbytes,
        "hash": "sha256",
        "notes": notes,
        "seconds": round(time.monotonic() - t0, 3),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--json", action="store_true")
    p.add_argument("--modes", action="store_true", help="also compare permission bits")
    p.add_argument("--no-links", action="store_true")
    p.add_argument("--no-empty-dirs", action="store_true")
    o = p.parse_args()
    for d in (o.src, o.dst):
        if not os.path.isdir(d):
            print(f"verify.py: not a directory: {d}", file=sys.stderr)
            sys.exit(2)
    r = compare(o.src, o.dst, modes=o.modes, links=not o.no_links, empty_dirs=not o.no_empty_dirs)
    if o.json:
        print(json.dumps(r))
    else:
        print(("IDENTICAL" if r["ok"] else "DIFFERENT") + f": {r['files']} files, {r['dirs']} dirs, {r['symlinks']} symlinks, "
              f"{r['bytes_hashed']} bytes sha256-compared in {r['seconds']} s" + (f" ({'; '.join(r['notes'])})" if r["notes"] else ""))
        for d in r["first_differences"]:
            print("  " + d)
        if r["differences"] > len(r["first_differences"]):
            print(f"  ... {r['differences'] - len(r['first_differences'])} more")
    sys.exit(0 if r["ok"] else 1)


if __name__ == "__main__":
    main()
