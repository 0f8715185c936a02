"""Small /proc and cgroup files read every tick, kept open and read again with one `pread` each.

Reading such a file by its path costs four system calls (open, read, read to the end, close); a
kept descriptor read from offset 0 costs one: the kernel writes a /proc or cgroupfs file afresh at
every read. Only pseudo-files are kept (a regular file whose size reads 0 while it has text), so a
fixture tree of plain files (the tests' fake /proc, files rewritten or replaced by rename, pid
directories removed) is read by its path every time, as before. A kept descriptor follows the
process, thread or cgroup it was opened on, not the path: any error reading it (ESRCH for a
process or thread gone, ENODEV for a cgroup removed, EBADF) closes it and the path is read
afresh, so a reused pid or a re-created cgroup reads what a new open reads. A file not read
between two `sweep()` calls is closed (a process no longer watched, a cgroup path that changed).
Use from one thread only; `close()` from that thread too (or once it has stopped).
"""

from __future__ import annotations

import os
import stat

# Kept descriptors at most: half of what the listener leaves to the sources beside its connections
# (serve.listener.DESCRIPTORS_KEPT); past it a file is read by its path and counted in `unkept`.
MAX_KEPT = 64
_CHUNK = 65536


def _pread_all(fd: int) -> bytes:
    """Return a file's whole text from offset 0 (a short read is its end, as a seq_file's is)."""
    data = os.pread(fd, _CHUNK, 0)
    if len(data) < _CHUNK:
        return data
    chunks = [data]
    while chunk := os.pread(fd, _CHUNK, sum(map(len, chunks))):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_fd(fd: int) -> bytes:
    """Return the rest of an open file's text."""
    chunks = []
    while chunk := os.read(fd, _CHUNK):
        chunks.append(chunk)
    return b"".join(chunks)


def read_path(path: str) -> bytes:
    """Return a file's text read by its path (raises OSError): open, read to the end, close, no pathlib."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return _read_fd(fd)
    finally:
        os.close(fd)


def read_head(path: str, limit: int) -> bytes:
    """Return at most `limit` bytes from a file's start, read by its path (raises OSError)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks: list[bytes] = []
        left = limit
        while left > 0 and (chunk := os.read(fd, min(left, _CHUNK))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class KeptFiles:
    """Pseudo-files kept open by path and read with `pread`; see the module's docstring."""

    def __init__(self, limit: int = MAX_KEPT) -> None:
        self.limit = limit
        self._fds: dict[str, int] = {}
        self._read: set[str] = set()  # kept paths read since the last sweep
        self.opens = 0  # files opened by path (first reads, plain files, re-opens after an error)
        self.preads = 0  # reads of a kept descriptor
        self.dropped = 0  # kept descriptors closed after an error
        self.unkept = 0  # pseudo-files read by path because `limit` were kept

    def __len__(self) -> int:
        return len(self._fds)

    def kept(self, path: str) -> bool:
        """Say whether a file is kept open (a pseudo-file, read by its path once before)."""
        return path in self._fds

    def read(self, path: str) -> bytes:
        """Return a file's whole text now; raise OSError when it cannot be read."""
        fd = self._fds.get(path)
        if fd is not None:
            try:
                data = _pread_all(fd)
            except OSError:
                del self._fds[path]
                self._read.discard(path)
                self.dropped += 1
                os.close(fd)
            else:
                self.preads += 1
                self._read.add(path)
                return data
        return self._open(path)

    def _open(self, path: str) -> bytes:
        """Read a file by its path, keeping it open when it is a pseudo-file and there is room."""
        self.opens += 1
        if len(self._fds) >= self.limit:
            data = read_path(path)
            if data:
                self.unkept += 1
            return data
        fd = os.open(path, os.O_RDONLY)
        keep = False
        try:
            data = _read_fd(fd)
            if data:
                st = os.fstat(fd)
                keep = stat.S_ISREG(st.st_mode) and st.st_size == 0
        finally:
            if not keep:
                os.close(fd)
        if keep:
            self._fds[path] = fd
            self._read.add(path)
        return data

    def sweep(self) -> None:
        """Close the kept files not read since the last sweep."""
        for path in [p for p in self._fds if p not in self._read]:
            os.close(self._fds.pop(path))
        self._read = set()

    def close(self) -> None:
        """Close every kept file."""
        fds, self._fds, self._read = self._fds, {}, set()
        for fd in fds.values():
            os.close(fd)
