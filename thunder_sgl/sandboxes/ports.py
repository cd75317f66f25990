"""Port allocator: hands out host ports from ``SandboxConfig.port_range`` to programs.

A port is handed out only if no program owns it *and* it can be bound on the probe host
(127.0.0.1) right now, so a port held by something outside the router is skipped rather
than given away. The scan starts after the last port handed out (round robin), so a port
just reclaimed is reused last: a server that was killed with it may leave sockets in
TIME_WAIT. Ports a program registered itself (``reserve``) may lie outside the range; they
are only recorded, so that no other program gets them and they are reclaimed with the rest.
All methods are synchronous and cheap: call them from the event loop.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from thunder_sgl.errors import Conflict, Overloaded


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """True when a TCP socket can bind ``host:port`` now (SO_REUSEADDR, as servers set it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class PortAllocator:
    def __init__(
        self,
        port_range: tuple[int, int],
        *,
        host: str = "127.0.0.1",
        probe: Callable[[int], bool] | None = None,
    ) -> None:
        lo, hi = port_range
        if not 1 <= lo <= hi <= 65535:
            raise ValueError(f"invalid port range {port_range}")
        self.low, self.high = lo, hi
        self._probe = probe or (lambda p: port_is_free(p, host))
        self._owner: dict[int, str] = {}
        self._by_owner: dict[str, set[int]] = {}
        self._next = lo

    @property
    def capacity(self) -> int:
        return self.high - self.low + 1

    @property
    def in_use(self) -> int:
        """Ports currently owned (handed out or reserved)."""
        return len(self._owner)

    def owner_of(self, port: int) -> str | None:
        return self._owner.get(port)

    def owned(self, owner: str) -> list[int]:
        return sorted(self._by_owner.get(owner, ()))

    def allocate(self, owner: str, n: int) -> list[int]:
        """Hand ``n`` free ports to ``owner``, all or none. Raises ``Overloaded`` (503) when the
        range cannot supply ``n`` ports now."""
        if n <= 0:
            return []
        got: list[int] = []
        port = self._next
        for _ in range(self.capacity):
            if port not in self._owner and self._probe(port):
                got.append(port)
                if len(got) == n:
                    break
            port = self.low if port >= self.high else port + 1
        if len(got) < n:
            raise Overloaded(
                f"no {n} free port(s) in {self.low}..{self.high}: {self.in_use} handed out, "
                f"{self.capacity - self.in_use - len(got)} more bound by other processes",
                code="ports_exhausted",
            )
        last = got[-1]
        self._next = self.low if last >= self.high else last + 1
        for p in got:
            self._take(owner, p)
        return got

    def reserve(self, owner: str, port: int) -> None:
        """Record that ``owner`` holds ``port`` (a port it opened itself). Idempotent for the
        same owner; ``Conflict`` (409) when another owner holds it."""
        holder = self._owner.get(port)
        if holder is not None and holder != owner:
            raise Conflict(f"port {port} belongs to another program", param="port", code="port_taken")
        self._take(owner, port)

    def release(self, owner: str, ports: list[int]) -> None:
        for p in ports:
            if self._owner.get(p) == owner:
                del self._owner[p]
                self._by_owner[owner].discard(p)
        if not self._by_owner.get(owner, True):
            del self._by_owner[owner]

    def release_owner(self, owner: str) -> list[int]:
        """Reclaim every port of ``owner``; returns them. Idempotent."""
        ports = sorted(self._by_owner.pop(owner, ()))
        for p in ports:
            self._owner.pop(p, None)
        return ports

    def _take(self, owner: str, port: int) -> None:
        self._owner[port] = owner
        self._by_owner.setdefault(owner, set()).add(port)
