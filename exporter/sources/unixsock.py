"""The agent socket's file-system side: a safe directory, one owner at a time, peer credentials (I/O only).

The socket lives in one directory that is owned by this user or root and not writable by anyone
else (or sticky), so nobody can swap the socket for a symlink between bind and chmod. A lock file
next to it (`agent.sock.lock`, flock) says which process owns the socket: a second instance, or a
`diagnose`/`record` that samples locally, never unlinks a live daemon's socket. Each datagram
carries its sender's credentials (SO_PASSCRED + SCM_CREDENTIALS), checked against an allow-list.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import socket
import stat
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NamedTuple

SOCKET_MODE = 0o660  # owner and group may send
DIR_MODE = 0o750  # a directory this module creates: group members may reach the socket
DEFAULT_GROUP = "boundwatch"  # the group engine users join (the systemd unit's Group=)
_UCRED = struct.Struct("iII")  # struct ucred: pid, uid, gid
_ANC_SPACE = socket.CMSG_SPACE(_UCRED.size)
# plain ints: the socket module's are enum members, whose `&` runs in Python (each datagram's flags)
MSG_DONTWAIT = int(socket.MSG_DONTWAIT)
_MSG_TRUNC, _SOL_SOCKET, _SCM_CREDENTIALS = (
    int(socket.MSG_TRUNC),
    int(socket.SOL_SOCKET),
    int(socket.SCM_CREDENTIALS),
)


class SocketInUse(OSError):
    """Another live process owns the agent socket."""


class UnsafePath(OSError):
    """The socket's directory or file could be changed by another user."""


class Peer(NamedTuple):
    """The credentials the kernel attached to one datagram (a tuple: made and hashed in C, per datagram)."""

    pid: int
    uid: int
    gid: int


def resolve_group(name: str | int) -> int:
    """Return the gid of a group name or number; raise KeyError when there is no such group."""
    if isinstance(name, int) or str(name).isdigit():
        return int(name)
    return grp.getgrnam(str(name)).gr_gid


def resolve_user(name: str | int) -> int:
    """Return the uid of a user name or number; raise KeyError when there is no such user."""
    if isinstance(name, int) or str(name).isdigit():
        return int(name)
    return pwd.getpwnam(str(name)).pw_uid


def default_group() -> int | None:
    """Return the gid of the `boundwatch` group when it exists, else None (keep this process's group)."""
    with contextlib.suppress(KeyError):
        return grp.getgrnam(DEFAULT_GROUP).gr_gid
    return None


def secure_dir(directory: str, group: int | None) -> os.stat_result:
    """Create the socket directory (0750, `group`) or check an existing one; raise UnsafePath when unsafe."""
    created = False
    try:
        os.mkdir(directory, 0o700)
        created = True
    except FileExistsError:
        pass
    except FileNotFoundError:
        os.makedirs(os.path.dirname(directory), 0o755, exist_ok=True)
        os.mkdir(directory, 0o700)
        created = True
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise UnsafePath(f"{directory} is not a directory (or is a symlink): {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        if st.st_uid not in (os.geteuid(), 0):
            raise UnsafePath(f"{directory} is owned by uid {st.st_uid}, not by this user or root")
        if created:
            if group is not None and st.st_gid != group:
                os.fchown(fd, -1, group)
            os.fchmod(fd, DIR_MODE)
            st = os.fstat(fd)
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise UnsafePath(f"{directory} is writable by other users (mode {stat.S_IMODE(st.st_mode):04o})")
        return st
    finally:
        os.close(fd)


def claim(path: str) -> int:
    """Take the socket's lock file and remove a dead socket; return the lock's fd (held while bound).

    Raise SocketInUse when another process holds the lock or a live socket answers at `path`."""
    lock = path + ".lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise UnsafePath(f"{lock} belongs to another user")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SocketInUse(f"another boundwatch owns {path} (it holds {lock})") from None
        _remove_dead(path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _remove_dead(path: str) -> None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise UnsafePath(f"{path} is a directory")
    if st.st_uid != os.geteuid():
        raise UnsafePath(f"{path} belongs to uid {st.st_uid}: not removing it")
    if stat.S_ISSOCK(st.st_mode) and is_live(path):
        raise SocketInUse(f"a live socket answers at {path} (another boundwatch?)")
    os.unlink(path)


def is_live(path: str) -> bool:
    """Say whether a process has a datagram socket bound at `path` (connect succeeds)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(path)
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError:
            return True  # not ours to judge (EACCES): leave it alone
    return True


def bind(path: str, group: int | None, rcvbuf: int = 4 * 1024 * 1024) -> tuple[socket.socket, os.stat_result]:
    """Bind a non-blocking datagram socket at `path` (0660, `group`) that receives its senders' credentials."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        sock.bind(path)
        st = os.lstat(path)
        if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.geteuid():
            raise UnsafePath(f"{path} changed under us")
        # The directory is ours and closed to others (or sticky), so path is still the socket we bound.
        if group is not None and st.st_gid != group:
            os.chown(path, -1, group, follow_symlinks=False)
        os.chmod(path, SOCKET_MODE)
        sock.setblocking(False)
        return sock, os.lstat(path)
    except BaseException:
        sock.close()
        raise


def receive_one(sock: socket.socket, limit: int, flags: int = 0) -> tuple[bytes, Peer | None, bool]:
    """Wait for the next datagram and return it as (data, sender, truncated) (a blocking socket's reader thread).

    flags=MSG_DONTWAIT: take one only if one is queued, else raise BlockingIOError (a drain).
    """
    data, ancdata, msg_flags, _ = sock.recvmsg(limit + 1, _ANC_SPACE, flags)
    peer = None
    for level, kind, payload in ancdata:
        if level == _SOL_SOCKET and kind == _SCM_CREDENTIALS and len(payload) >= _UCRED.size:
            peer = Peer._make(_UCRED.unpack(payload[: _UCRED.size]))
    return data, peer, bool(msg_flags & _MSG_TRUNC) or len(data) > limit


def dgram_queue_limit(path: str = "/proc/sys/net/unix/max_dgram_qlen") -> int:
    """Return how many datagrams the kernel queues for a datagram socket made now (its netns's setting).

    The kernel gives each new socket the namespace's `net.unix.max_dgram_qlen` and queues one past it;
    10 (Linux's default) when the setting cannot be read. systemd raises it to 512 on most hosts.
    """
    try:
        with open(path, "rb") as fh:
            value = int(fh.read(32).strip())
    except (OSError, ValueError):
        return 10
    return max(0, min(value, 1 << 20))


def remove_if_ours(path: str, st: os.stat_result) -> None:
    """Unlink `path` only while it is still the socket this process bound (same device and inode)."""
    with contextlib.suppress(OSError):
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            os.unlink(path)


def _proc_status(pid: int, key: bytes) -> list[bytes]:
    """Return the values of one /proc/<pid>/status line (`key` with its colon; empty when unreadable)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(key):
                    return line.split()[1:]
    except OSError:
        pass
    return []


def _proc_groups(pid: int) -> frozenset[int]:
    """Return a process's supplementary groups from /proc/<pid>/status (empty when unreadable)."""
    try:
        return frozenset(int(g) for g in _proc_status(pid, b"Groups:"))
    except ValueError:
        return frozenset()


def inner_pid(pid: int) -> int:
    """Return a process's pid in its own PID namespace where that is not this daemon's (0: the same one,
    or unknown): the last of its NSpid (/proc/<pid>/status lists it in each namespace, outermost first)."""
    ids = _proc_status(pid, b"NSpid:")
    return int(ids[-1]) if len(ids) > 1 and ids[-1].isdigit() else 0


@dataclass
class AllowList:
    """Which senders may feed the daemon: uids, and members of groups (primary or supplementary)."""

    uids: frozenset[int]
    gids: frozenset[int]
    _cache: dict[Peer, bool] = field(default_factory=dict)
    cache_size: int = 1024

    @classmethod
    def build(cls, users: Iterable[str | int], groups: Iterable[str | int], socket_gid: int) -> AllowList:
        """Return root, this user and `users`; `groups`, or the socket's group when none is given."""
        uids = {0, os.geteuid(), *(resolve_user(u) for u in users)}
        gids = {resolve_group(g) for g in groups} or {socket_gid}
        return cls(frozenset(uids), frozenset(gids))

    def allows(self, peer: Peer) -> bool:
        """Say whether a sender may feed the daemon (remembered per pid, uid and gid)."""
        known = self._cache.get(peer)
        if known is not None:
            return known
        ok = peer.uid in self.uids or peer.gid in self.gids or bool(self.gids & _proc_groups(peer.pid))
        if len(self._cache) >= self.cache_size:
            self._cache.clear()
        self._cache[peer] = ok
        return ok
