"""Exact byte counters inside a loopback-only network namespace.

* :func:`loopback_bytes` -- all bytes that crossed ``lo`` (``/proc/net/dev``,
  IP packets with headers): the total wire cost of a step.
* :func:`link_bytes` -- TCP payload per link between cluster roles, from
  the kernel's per-socket counters (``ss -tinp``: ``bytes_sent`` of each
  end of every connection, attributed by the owning PID), so
  worker -> server (updates and requests) and server -> worker (reads) are
  told apart. gRPC keeps its connections open, so deltas between two
  snapshots are exact for the steps in between.

Example::

    before = TrafficSnapshot.take(roles)           # roles: {pid: "worker" | "ps" | "chief"}
    ... run steps ...
    delta = TrafficSnapshot.take(roles).minus(before)
    delta.links[("worker", "ps")]      # payload bytes workers sent to servers
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from typing import Mapping

# With a state filter ss omits the state column: Recv-Q Send-Q local peer users.
_SOCKET = re.compile(r"^\d+\s+\d+\s+(\S+):(\d+)\s+(\S+):(\d+)\s+users:\(\(\"[^\"]*\",pid=(\d+)")
_COUNTER = re.compile(r"\b(bytes_sent|bytes_received):(\d+)")


def loopback_bytes() -> int:
    """Bytes received on ``lo`` so far (each loopback packet counted once)."""
    with open("/proc/net/dev") as f:
        for line in f.readlines()[2:]:
            name, data = line.split(":", 1)
            if name.strip() == "lo":
                return int(data.split()[0])
    raise RuntimeError("no lo interface in /proc/net/dev")


def _sockets() -> list:
    """``[(local_port, peer_port, pid, bytes_sent, bytes_received)]`` of established TCP sockets."""
    text = subprocess.run(["ss", "-tinpH", "state", "established"], capture_output=True, text=True, check=True).stdout
    out, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        match = _SOCKET.match(line.strip())
        if match is None:
            continue
        info = lines[i + 1] if i + 1 < len(lines) else ""
        counters = dict((k, int(v)) for k, v in _COUNTER.findall(info))
        out.append((int(match.group(2)), int(match.group(4)), int(match.group(5)),
                    counters.get("bytes_sent", 0), counters.get("bytes_received", 0)))
    return out


def link_bytes(roles: Mapping[int, str]) -> dict:
    """``{(sender role, receiver role): payload bytes sent}`` over every established TCP connection.

    ``roles`` maps PID -> role (``"chief"``, ``"worker"``, ``"ps"``). Each
    connection has both ends in this namespace; each end's ``bytes_sent``
    is attributed from its owner to the peer's owner (TF moves tensors both
    ways: a server pulls a worker's update with ``RecvTensor`` on the
    connection the server opened, so who listens says nothing about the
    direction).
    """
    sockets = _sockets()
    pid_of_port = {local: pid for local, _, pid, _, _ in sockets}
    totals: dict = {}
    for _, peer, pid, sent, _ in sockets:
        key = (roles.get(pid, "other"), roles.get(pid_of_port.get(peer), "other"))
        totals[key] = totals.get(key, 0) + sent
    return totals


@dataclasses.dataclass(frozen=True)
class TrafficSnapshot:
    """Loopback total and per-link payload counters at one moment."""

    total: int
    links: dict

    @classmethod
    def take(cls, roles: Mapping[int, str]) -> "TrafficSnapshot":
        return cls(loopback_bytes(), link_bytes(roles))

    def minus(self, earlier: "TrafficSnapshot") -> "TrafficSnapshot":
        keys = set(self.links) | set(earlier.links)
        return TrafficSnapshot(self.total - earlier.total,
                               {k: self.links.get(k, 0) - earlier.links.get(k, 0) for k in keys})
