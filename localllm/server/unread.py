"""What a local client has left unread in its own socket, read from the kernel.

A streaming client that stops reading is paused once its frames back up into the
server (engine/stream.py). But before they back up, the client's own receive buffer takes
them, and Linux grows that buffer for a socket that is never read: a stream of small
frames filled 600 KB of it over 4,000 tokens without ever being paused. For a client on
this machine (loopback) the kernel shows that buffer: /proc/net/tcp lists every socket's
receive queue, the client's included. `Unread` looks it up, and a stream whose client
holds more than UNREAD_BYTES unread is behind from the moment it first did (until it
reads), so it is paused within that bound and its stall clock starts then.

A client on another machine keeps its buffer out of sight: there the server's own
buffers (server/connections.py) and the stream's chunks are the bound.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import struct
import time
from pathlib import Path

log = logging.getLogger(__name__)

UNREAD_BYTES = 64 * 1024  # unread in a local client's socket: its stream is behind
LOOK_S = 0.5  # how often a stream's client is looked at
_TABLES: dict[int, Path] = {
    socket.AF_INET: Path("/proc/net/tcp"),
    socket.AF_INET6: Path("/proc/net/tcp6"),
}


def _hex_address(host: str, port: int) -> tuple[int, str] | None:
    """The family and the address as /proc/net/tcp writes it (each 32-bit word of the
    address in the host's byte order, then the port), or None for what is not an IP."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return None
    family = socket.AF_INET if ip.version == 4 else socket.AF_INET6
    packed = ip.packed
    words = struct.unpack(f"={len(packed) // 4}I", packed)
    return family, "".join(f"{w:08X}" for w in words) + f":{port:04X}"


class Unread:
    """The receive queue of one local client's socket, and since when it has held more
    than UNREAD_BYTES (None: it keeps up)."""

    def __init__(self, client: tuple[str, int], server: tuple[str, int]) -> None:
        local, remote = _hex_address(*client), _hex_address(*server)
        self._key = None if local is None or remote is None else (local, remote[1])
        self.since: float | None = None
        self._last = float("-inf")

    @classmethod
    def of(cls, client: object, server: object) -> Unread | None:
        """A probe for an ASGI scope's client and server, when the client is local."""
        if not (isinstance(client, (tuple, list)) and isinstance(server, (tuple, list))):
            return None
        try:
            host, port = str(client[0]), int(client[1])
            shost, sport = str(server[0]), int(server[1])
        except (IndexError, TypeError, ValueError):
            return None
        try:
            if not ipaddress.ip_address(host).is_loopback:
                return None
        except ValueError:
            return None
        probe = cls((host, port), (shost, sport))
        return probe if probe._key is not None else None

    def queued(self) -> int | None:
        """Bytes waiting unread in the client's socket; None when it is not found."""
        if self._key is None:
            return None
        (family, local), remote = self._key
        try:
            with _TABLES[family].open("rb") as fh:
                fh.readline()
                want = local.encode()
                for line in fh:
                    fields = line.split()
                    if len(fields) > 4 and fields[1] == want and fields[2] == remote.encode():
                        return int(fields[4].split(b":")[1], 16)
        except (OSError, ValueError, IndexError):
            return None
        return None

    def look(self, now: float | None = None) -> float | None:
        """Look again (at most every LOOK_S): since when the client has held more than
        UNREAD_BYTES, or None."""
        now = time.monotonic() if now is None else now
        if now - self._last < LOOK_S:
            return self.since
        self._last = now
        queued = self.queued()
        if queued is None or queued <= UNREAD_BYTES:
            self.since = None
        elif self.since is None:
            self.since = now
        return self.since
