#!/usr/bin/python3
"""A passthrough FUSE file system that adds a fixed latency to every metadata operation, the way
a parallel file system (Lustre, GPFS) makes each create, rename, chmod or utime a round trip to
its metadata server. Data reads and writes pass through at local speed. Requests are served on
many threads, so concurrent operations overlap as they would against a real metadata server.

    bench/slowmeta.py BACKING_DIR MOUNTPOINT [--latency-ms 1]    # foreground; fusermount -u to stop

Needs fusepy (pip) and libfuse2 (apt). Used by bench/smallfiles-slowfs.sh.
"""
import argparse
import errno
import os
import time

from fuse import FUSE, FuseOSError, Operations


class SlowMeta(Operations):
    def __init__(self, root, latency_s):
        self.root = root
        self.latency_s = latency_s

    def _p(self, path):
        return os.path.join(self.root, path.lstrip("/"))

    def _meta(self):
        time.sleep(self.latency_s)

    # metadata: each pays the latency
    def getattr(self, path, fh=None):
        try:
            st = os.lstat(self._p(path))
        except OSError as e:
            raise FuseOSError(e.errno)
        return {k: getattr(st, k) for k in ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")}

    def create(self, path, mode, fi=None):
        self._meta()
        return os.open(self._p(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)

    def open(self, path, flags):
        return os.open(self._p(path), flags)

    def mkdir(self, path, mode):
        self._meta()
        os.mkdir(self._p(path), mode)

    def rename(self, old, new):
        self._meta()
        os.rename(self._p(old), self._p(new))

    def chmod(self, path, mode):
        self._meta()
        os.chmod(self._p(path), mode)

    def utimens(self, path, times=None):
        self._meta()
        os.utime(self._p(path), times)

    def truncate(self, path, length, fh=None):
        self._meta()
        os.truncate(self._p(path), length)

    def unlink(self, path):
        self._meta()
        os.unlink(self._p(path))

    def rmdir(self, path):
        self._meta()
        os.rmdir(self._p(path))

    def symlink(self, target, source):
        self._meta()
        os.symlink(source, self._p(target))

    def readlink(self, path):
        return os.readlink(self._p(path))

    def readdir(self, path, fh):
        return [".", ".."] + os.listdir(self._p(path))

    def statfs(self, path):
        st = os.statvfs(self._p(path))
        return {k: getattr(st, k) for k in ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")}

    # data: local speed
    def read(self, path, size, offset, fh):
        return os.pread(fh, size, offset)

    def write(self, path, data, offset, fh):
        return os.pwrite(fh, data, offset)

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
    ap.add_argument("--latency-ms", type=float, default=1.0)
    a = ap.parse_args()
    FUSE(SlowMeta(os.path.abspath(a.backing), a.latency_ms / 1000), a.mountpoint, foreground=True, nothreads=False, allow_other=False)


if __name__ == "__main__":
    main()
