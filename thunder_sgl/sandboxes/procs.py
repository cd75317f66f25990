"""Finding and killing processes through ``/proc`` (Linux), for the reaping paths.

Local sandboxes tag every process they start with ``THUNDER_INSTANCE_ID``,
``THUNDER_PROGRAM_ID`` and ``THUNDER_SANDBOX_ID`` in its environment; children inherit it,
even those that escape the process group with ``setsid``. Scanning ``/proc/*/environ`` for
the tag therefore finds everything a sandbox started, after a crash of the router too, and
never touches a process that merely reused a recorded pid. On a system without ``/proc``
these functions find nothing and callers fall back to process groups.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable, Mapping
from pathlib import Path

PROC = Path("/proc")


def _pids() -> list[int]:
    try:
        return [int(e.name) for e in os.scandir(PROC) if e.name.isdigit()]
    except OSError:
        return []


def parse_environ(raw: bytes) -> dict[str, str]:
    """``/proc/<pid>/environ`` (NUL-separated ``K=V``) as a dict."""
    env: dict[str, str] = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep:
            env[k.decode(errors="replace")] = v.decode(errors="replace")
    return env


def parse_ppid(stat: str) -> int:
    """Parent pid from ``/proc/<pid>/stat`` (the command name may hold spaces and parens)."""
    return int(stat.rsplit(")", 1)[1].split()[1])


def tagged(match: Mapping[str, str], key: str | None = None) -> dict[int, str]:
    """Live processes whose environment holds every ``match`` item; value: their ``key``
    variable (empty when ``key`` is None). Neither the caller nor zombies are included."""
    needles = [f"{k}={v}".encode() for k, v in match.items()]
    me = os.getpid()
    found: dict[int, str] = {}
    for pid in _pids():
        if pid == me:
            continue
        try:
            raw = (PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if not all(n in raw for n in needles):
            continue
        env = parse_environ(raw)
        if all(env.get(k) == v for k, v in match.items()) and state(pid) not in ("Z", "X", ""):
            found[pid] = env.get(key, "") if key else ""
    return found


def state(pid: int) -> str:
    """One-letter state of ``pid`` (R, S, D, T, Z…), or "" when it is gone."""
    try:
        return (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def descendants(root: int) -> list[int]:
    """Every live descendant of ``root`` (not ``root`` itself), from a snapshot of ``/proc``."""
    children: dict[int, list[int]] = {}
    for pid in _pids():
        try:
            ppid = parse_ppid((PROC / str(pid) / "stat").read_text())
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(pid)
    out: list[int] = []
    stack = [root]
    while stack:
        for c in children.get(stack.pop(), ()):
            out.append(c)
            stack.append(c)
    return out


def in_cgroup_of(pid: int, container_id: str) -> bool:
    """True when ``pid`` runs in the cgroup of docker container ``container_id``."""
    try:
        return container_id in (PROC / str(pid) / "cgroup").read_text()
    except OSError:
        return False


def signal_all(pids: Iterable[int], sig: int = signal.SIGKILL) -> int:
    """Send ``sig`` to each pid; returns how many existed."""
    n = 0
    for pid in pids:
        try:
            os.kill(pid, sig)
            n += 1
        except (ProcessLookupError, PermissionError):
            pass
    return n


def signal_group(pgid: int, sig: int = signal.SIGKILL) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False
