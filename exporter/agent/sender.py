"""Send agent messages on a non-blocking unix datagram socket: drop and count rather than block."""

from __future__ import annotations

import collections
import dataclasses
import socket

from exporter import wire


class Sender:
    """One agent's datagram socket, its message sequence and what it sent or dropped."""

    def __init__(self, path: str, log_windows: int = 20_000) -> None:
        self.path = path
        self.seq = 0
        self.sent = 0
        self.dropped = 0
        self.windows_sent = 0
        self.sent_log: collections.deque[wire.Window] = collections.deque(maxlen=log_windows)
        self._sock: socket.socket | None = None
        try:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.setblocking(False)
        except OSError:
            self._sock = None

    def next_seq(self) -> int:
        """Return the next message sequence number."""
        self.seq += 1
        return self.seq

    def send(self, msg: wire.Message) -> bool:
        """Encode and send one message (windows slimmed when it would not fit); return whether it went."""
        return self.send_data(self.encode(msg), len(msg.windows))

    def encode(self, msg: wire.Message) -> bytes | None:
        """Return the datagram of a message (windows slimmed when it would not fit); None (counted dropped) if none fits."""
        self.sent_log.extend(msg.windows)
        try:
            return wire.encode(msg)
        except wire.WireError:
            slim = tuple(dataclasses.replace(w, iv=(), slack=0) for w in msg.windows)
            try:
                return wire.encode(dataclasses.replace(msg, windows=slim))
            except wire.WireError:
                self.dropped += 1
                return None

    def send_data(self, data: bytes | None, windows: int = 0) -> bool:
        """Send one encoded message without blocking; return whether it went (a drop is counted)."""
        if data is None:
            return False
        if self._sock is None:
            self.dropped += 1
            return False
        try:
            self._sock.sendto(data, self.path)
        except OSError:  # no sidecar, socket full, permissions: drop and count
            self.dropped += 1
            return False
        self.sent += 1
        self.windows_sent += windows
        return True

    def close(self) -> None:
        """Close the socket; later sends are dropped and counted."""
        if self._sock is not None:
            self._sock.close()
            self._sock = None
