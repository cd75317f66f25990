"""The child processes this process starts: each in its own process group, its log in a file,
registered until it is stopped, and stopped on a signal or at exit whatever the main thread is
doing.

Used by the real engines (``engine.serve``), the ``thunder-sgl`` commands and the benchmark's
peers (the simulated workers and the routers under test of a run), so that every one of them
launches processes the same way: on free ports (port 0), with their logs in a file, in their
own process group so that stopping one also stops its children.

Being in their own session, the children never see the Ctrl-C of a terminal: whoever started
them stops them. Every process started here (``spawn``) is registered (``_STARTED``) until it
is stopped, and

- ``stop_all`` (also run at exit) stops every registered process group still there;
- inside ``stop_children_on_signals`` (around the ``thunder-sgl`` commands), SIGINT and
  SIGTERM stop them at once, from a thread woken by the signal itself, whatever the main thread
  is doing (an event loop unwinding, a child start, a report being written): SIGTERM to every
  group at the signal, SIGKILL to what is left ``grace_s`` later, and an exit with status 130
  (after a dump of every thread's stack) if the process is still there ``exit_after_s`` later.
  The main thread still gets its ``KeyboardInterrupt`` (or, inside ``asyncio.run``, the
  cancellation of its main task) and unwinds as before, finding its children already stopped.
"""

from __future__ import annotations

import atexit
import contextlib
import faulthandler
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path
    urls: list[str] = field(default_factory=list)
    """For a simulated cluster: one URL per worker."""
    log_from: int = 0
    """Where this process's output starts in ``log_path``: a process started again under the same
    name appends to the log of the one before it."""

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, n: int = 40) -> str:
        """The last ``n`` lines this process wrote."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_from)
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-n:])

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM the process group, then SIGKILL whatever is left (of the group too: a child
        that outlived its leader)."""
        _stop_group(self.popen, timeout)

    def kill(self) -> None:
        """SIGKILL, no grace (a crash)."""
        if self.popen.returncode is None:
            _signal_group(self.popen.pid, signal.SIGKILL)
            self.popen.wait(10)
        _STARTED.pop(self.popen.pid, None)


_STARTED: dict[int, subprocess.Popen[bytes]] = {}
"""Every process started by ``spawn`` and not yet stopped, by pid; each leads its own process
group. Plain dict operations (atomic under the GIL): read by the signal thread."""
_interrupted = threading.Event()
"""Set at the first SIGINT or SIGTERM inside ``stop_children_on_signals``: a process that starts
after it is stopped at once."""


def _signal_group(pid: int, sig: int) -> bool:
    try:
        os.killpg(pid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _stop_group(p: subprocess.Popen[bytes], timeout: float) -> None:
    if p.returncode is not None:  # reaped before: its pid may be another process's by now
        _STARTED.pop(p.pid, None)
        return
    try:
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
            if p.poll() is not None:
                break
            if not _signal_group(p.pid, sig):
                break
            try:
                p.wait(wait)
                break
            except subprocess.TimeoutExpired:
                continue
        # the leader is gone, reaped just now (its pid stays reserved while its group lives);
        # a child of it that ignored SIGTERM may not be
        _signal_group(p.pid, signal.SIGKILL)
    finally:
        if p.returncode is not None:
            _STARTED.pop(p.pid, None)


def signal_started(sig: int) -> int:
    """Send ``sig`` to the group of every registered process not reaped yet; returns how many.
    Never blocks: safe from any thread."""
    n = 0
    for p in list(_STARTED.values()):
        if p.returncode is None and _signal_group(p.pid, sig):
            n += 1
    return n


def stop_all(grace_s: float = 5.0) -> None:
    """Stop every registered process group at once: SIGTERM, up to ``grace_s`` for all of them
    to exit, then SIGKILL. Run at exit, so no path out of this process leaves peers behind."""
    if not _STARTED:
        return
    signal_started(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(p.poll() is None for p in list(_STARTED.values())):
        time.sleep(0.05)
    for p in list(_STARTED.values()):
        _stop_group(p, 0.0)


atexit.register(stop_all)


@contextlib.contextmanager
def stop_children_on_signals(grace_s: float = 5.0, exit_after_s: float = 30.0) -> Iterator[None]:
    """Inside the block, SIGINT or SIGTERM stops every process this one started within
    ``grace_s`` seconds, and this process within ``exit_after_s`` (status 130); see the module's
    docstring. Main thread only; SIGTERM acts as SIGINT; a second signal SIGKILLs the peers at
    once. Leaving the block after a signal stops whatever is left (``stop_all``)."""
    r, w = os.pipe()
    os.set_blocking(w, False)
    # The C-level handler writes each signal's number here, in whichever thread the kernel
    # chose, before any Python code runs: the watcher does not wait for the main thread.
    old_fd = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    old_term = signal.signal(signal.SIGTERM, _sigterm_as_sigint)
    done = threading.Event()
    watcher = threading.Thread(target=_watch, args=(r, grace_s, exit_after_s, done), name="stop-on-signal",
                               daemon=True)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(old_fd)
        signal.signal(signal.SIGTERM, old_term)
        done.set()
        os.close(w)  # the watcher reads the end of the pipe and returns
        watcher.join(5.0)
        if _interrupted.is_set():
            stop_all(grace_s)
            _interrupted.clear()


def _sigterm_as_sigint(signum: int, frame: object) -> None:
    """SIGTERM takes the path of Ctrl-C: the SIGINT handler in force (asyncio's, which cancels
    the main task, or the default one, which raises KeyboardInterrupt)."""
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):
        handler(signal.SIGINT, frame)
    else:
        raise KeyboardInterrupt


def _watch(fd: int, grace_s: float, exit_after_s: float, done: threading.Event) -> None:
    try:
        while data := os.read(fd, 64):
            for sig in data:
                if sig not in (signal.SIGINT, signal.SIGTERM):
                    continue
                if not _interrupted.is_set():
                    _interrupted.set()
                    signal_started(signal.SIGTERM)
                    threading.Thread(target=_escalate, args=(grace_s, exit_after_s, done), name="stop-escalate",
                                     daemon=True).start()
                else:  # asked twice: no more grace
                    signal_started(signal.SIGKILL)
    finally:
        os.close(fd)


def _escalate(grace_s: float, exit_after_s: float, done: threading.Event) -> None:
    if done.wait(grace_s):  # the main thread unwound in time; it stopped what was left
        return
    signal_started(signal.SIGKILL)
    if done.wait(max(0.0, exit_after_s - grace_s)):
        return
    sys.stderr.write(f"\ninterrupted: still here {exit_after_s:.0f} s after the signal; exiting. "
                     "Where every thread was:\n")
    with contextlib.suppress(Exception):
        sys.stderr.flush()
        faulthandler.dump_traceback(all_threads=True)
    signal_started(signal.SIGKILL)
    os._exit(130)


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """In the main thread: a SIGINT or SIGTERM that arrives inside the block is handled at its
    end. A KeyboardInterrupt raised inside ``Popen`` after the fork would lose the child: never
    registered, in its own session, left running forever."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[tuple[int, object]] = []
    sigs = (signal.SIGINT, signal.SIGTERM)
    old = {s: signal.signal(s, lambda n, f: got.append((n, f))) for s in sigs}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for n, f in got[:1]:
            h = old[n]
            if callable(h):
                h(n, f)
            elif h == signal.SIG_DFL:
                signal.raise_signal(n)


def spawn(name: str, argv: list[str], log_dir: Path | None, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path]:
    log_dir = Path(log_dir or tempfile.mkdtemp(prefix="thunder-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{name}.log"
    fh = open(log_path, "ab")  # noqa: SIM115 - owned by the child
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    p: subprocess.Popen[bytes] | None = None
    try:
        with _signals_deferred():
            p = subprocess.Popen(argv, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True, env=full_env)
            _STARTED[p.pid] = p
            if _interrupted.is_set():  # started while everything stops: stop it too
                _signal_group(p.pid, signal.SIGTERM)
    except BaseException:  # the signal deferred during the start, raised at its end
        if p is not None:
            _stop_group(p, 5.0)
        raise
    finally:
        fh.close()
    return p, log_path


def http_ok(url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def wait_until(pred, timeout: float, what: str, proc: Proc | None = None, interval: float = 0.1) -> None:  # noqa: ANN001
    """Poll ``pred`` until true. On timeout or interruption (Ctrl-C) ``proc`` is stopped: a
    process whose start was never confirmed has no owner to stop it later."""
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            if pred():
                return
            if proc is not None and not proc.alive():
                raise RuntimeError(f"{proc.name} exited (code {proc.popen.returncode}) before {what}:\n{proc.log_tail()}")
            time.sleep(interval)
    except BaseException:
        if proc is not None:
            proc.stop()
        raise
    tail = f":\n{proc.log_tail()}" if proc is not None else ""
    if proc is not None:
        proc.stop()
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}{tail}")
