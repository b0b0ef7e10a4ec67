#!/usr/bin/python3
"""A passthrough FUSE file system whose data reads and writes are capped at a bandwidth, the way a
busy or narrow storage target (one disk, an overloaded OST, a throttled volume) caps them. Each
direction has its own token bucket, shared by every thread and file: 8 readers at 40 MB/s get
40 MB/s between them, not 8 x 40. The mount uses direct_io, so the kernel's page cache neither
absorbs writes (no write-back to hide behind, unlike a cgroup v1 blkio throttle) nor serves
reads again: every byte an application moves passes the cap, and fsync has nothing left to do.

    bench/slowdisk.py BACKING_DIR MOUNTPOINT [--read-mbps 40] [--write-mbps 40]   # MB/s = 1e6 B/s; 0: no cap
    fusermount -u MOUNTPOINT    # stops it

Needs fusepy (Debian python3-fusepy, or pip fusepy) and libfuse2; /usr/bin/python3. Used by
bench/diag.sh (cases dstdisk, srcdisk) and crates/tern/tests/path_test.rs.
"""
import argparse
import errno
import os
import threading
import time

try:
    from fuse import FUSE, FuseOSError, Operations  # pip's fusepy
except ImportError:
    from fusepy import FUSE, FuseOSError, Operations  # Debian's python3-fusepy


class Bucket:
    """A token bucket of `rate` bytes/s holding at most `burst_s` seconds' worth. A request
    takes its bytes from the bucket (going into debt if it must) and sleeps until the debt is paid,
    so concurrent requests queue behind one another and share the rate."""

    def __init__(self, rate, burst_s=0.02):
        self.rate = rate
        self.burst_s = burst_s
        self.lock = threading.Lock()
        self.free_at = time.monotonic()  # when the bucket is next empty of debt

    def take(self, n):
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            start = max(self.free_at, now - self.burst_s)
            self.free_at = start + n / self.rate
            wait = self.free_at - now
        if wait > 0:
            time.sleep(wait)


class SlowDisk(Operations):
    def __init__(self, root, read_bps, write_bps):
        self.root = root
        self.rd = Bucket(read_bps)
        self.wr = Bucket(write_bps)

    def _p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def _os(self, f, *a):
        try:
            return f(*a)
        except OSError as e:
            raise FuseOSError(e.errno)

    def getattr(self, path, fh=None):
        st = self._os(os.lstat, self._p(path))
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid", "st_ino", "st_dev")}

    def create(self, path, mode, fi=None):
        return self._os(os.open, self._p(path), os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)

    def open(self, path, flags):
        return self._os(os.open, self._p(path), flags & ~os.O_APPEND)

    def mkdir(self, path, mode):
        self._os(os.mkdir, self._p(path), mode)

    def rename(self, old, new):
        self._os(os.rename, self._p(old), self._p(new))

    def chmod(self, path, mode):
        self._os(os.chmod, self._p(path), mode)

    def chown(self, path, uid, gid):
        self._os(os.lchown, self._p(path), uid, gid)

    def utimens(self, path, times=None):
        self._os(os.utime, self._p(path), times)

    def truncate(self, path, length, fh=None):
        self._os(os.truncate, self._p(path), length)

    def unlink(self, path):
        self._os(os.unlink, self._p(path))

    def rmdir(self, path):
        self._os(os.rmdir, self._p(path))

    def symlink(self, target, source):
        self._os(os.symlink, source, self._p(target))

    def link(self, target, source):
        self._os(os.link, self._p(source), self._p(target))

    def readlink(self, path):
        return self._os(os.readlink, self._p(path))

    def readdir(self, path, fh):
        return [".", ".."] + self._os(os.listdir, self._p(path))

    def statfs(self, path):
        st = os.statvfs(self._p(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    # data: through the buckets
    def read(self, path, size, offset, fh):
        data = self._os(os.pread, fh, size, offset)
        self.rd.take(len(data))
        return data

    def write(self, path, data, offset, fh):
        self.wr.take(len(data))
        return self._os(os.pwrite, fh, data, offset)

    def fsync(self, path, datasync, fh):
        return 0

    def flush(self, path, fh):
        return 0

    def release(self, path, fh):
        os.close(fh)

    def access(self, path, amode):
        if not os.access(self._p(path), amode):
            raise FuseOSError(errno.EACCES)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("backing")
    ap.add_argument("mountpoint")
    ap.add_argument("--read-mbps", type=float, default=40.0, help="MB/s (1e6 bytes); 0: no cap")
    ap.add_argument("--write-mbps", type=float, default=40.0, help="MB/s (1e6 bytes); 0: no cap")
    a = ap.parse_args()
    fs = SlowDisk(os.path.abspath(a.backing), a.read_mbps * 1e6, a.write_mbps * 1e6)
    FUSE(fs, a.mountpoint, foreground=True, nothreads=False, allow_other=False, direct_io=True, big_writes=True, max_read=131072, max_write=131072)


if __name__ == "__main__":
    main()
