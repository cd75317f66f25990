"""children: every process started is stopped, by a signal or at exit, whatever the main thread
is doing, a process group that ignores SIGTERM included."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from thunder_sgl import children

ROOT = Path(__file__).resolve().parents[2]

STUBBORN = textwrap.dedent("""
    import signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c",
                      "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    time.sleep(600)
""")
"""A process group deaf to SIGTERM: a leader and its child, both ignoring it."""


def _tagged(tag: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["environ"]):
        with contextlib.suppress(psutil.Error):
            if (p.info["environ"] or {}).get("THUNDER_TEST_TAG") == tag and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
    return out


def _wait_for(pred, timeout: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_stop_all_kills_a_group_deaf_to_sigterm(tmp_path, monkeypatch):
    tag = f"{os.getpid()}-stop-all"
    monkeypatch.setenv("THUNDER_TEST_TAG", tag)
    p, _ = children.spawn("stubborn", [sys.executable, "-c", STUBBORN], tmp_path)
    try:
        assert p.pid in children._STARTED
        assert _wait_for(lambda: len(_tagged(tag)) == 2, 60), "the stubborn group did not start"
        t0 = time.monotonic()
        children.stop_all(grace_s=0.5)
        assert time.monotonic() - t0 < 10
        assert _wait_for(lambda: not _tagged(tag), 10), [x.pid for x in _tagged(tag)]
        assert p.pid not in children._STARTED and p.returncode == -signal.SIGKILL
    finally:
        for x in _tagged(tag):
            with contextlib.suppress(psutil.Error):
                x.kill()


def test_a_signal_during_a_start_is_handled_once_the_child_is_registered():
    """Ctrl-C inside ``Popen`` (after the fork) would leave the child unknown, in its own
    session, running forever: the interrupt waits for the end of the start."""
    reached = False
    with pytest.raises(KeyboardInterrupt), children._signals_deferred():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # the handler would have run here
        reached = True
    assert reached
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_stops_every_child_even_when_the_main_thread_never_unwinds(tmp_path, sig):
    """The worst case: a main thread that swallows every interrupt. The peers still get
    SIGTERM at once and SIGKILL after the grace; the process exits (130) at the limit, with
    where each thread was."""
    tag = f"{os.getpid()}-watch-{sig}"
    script = textwrap.dedent(f"""
        import sys, time
        from thunder_sgl import children
        with children.stop_children_on_signals(grace_s=1.0, exit_after_s=4.0):
            children.spawn("stubborn", [sys.executable, "-c", {STUBBORN!r}], {str(tmp_path)!r})
            while True:
                try:
                    time.sleep(0.1)
                except KeyboardInterrupt:
                    pass
    """)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "THUNDER_TEST_TAG": tag}
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert _wait_for(lambda: len(_tagged(tag)) == 3, 60), "the stubborn group did not start"
        proc.send_signal(sig)
        t0 = time.monotonic()
        assert _wait_for(lambda: [x.pid for x in _tagged(tag)] == [proc.pid], 15), "the group outlived the grace"
        _, err = proc.communicate(timeout=30)
        took = time.monotonic() - t0
        assert proc.returncode == 130, err.decode()[-2000:]
        assert 3.5 < took < 20
        text = err.decode()
        assert "Where every thread was" in text and 'File "<string>"' in text, text[-2000:]  # the stuck main loop
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for x in _tagged(tag):
            with contextlib.suppress(psutil.Error):
                x.kill()


def test_a_signal_that_the_main_thread_unwinds_stops_the_children_and_leaves_nothing_installed(tmp_path, monkeypatch):
    """In process (as ``thunder-sgl`` commands called from a test): Ctrl-C reaches the main
    thread as KeyboardInterrupt; leaving the block stops every child, and restores the SIGTERM
    handler and the wakeup fd."""
    tag = f"{os.getpid()}-scoped"
    monkeypatch.setenv("THUNDER_TEST_TAG", tag)
    term = signal.getsignal(signal.SIGTERM)
    try:
        with pytest.raises(KeyboardInterrupt), children.stop_children_on_signals(grace_s=0.5, exit_after_s=60):
            assert signal.getsignal(signal.SIGTERM) is children._sigterm_as_sigint
            children.spawn("stubborn", [sys.executable, "-c", STUBBORN], tmp_path)
            assert _wait_for(lambda: len(_tagged(tag)) == 2, 60), "the stubborn group did not start"
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)  # the KeyboardInterrupt ends this
        assert _wait_for(lambda: not _tagged(tag), 10), [x.pid for x in _tagged(tag)]
        assert signal.getsignal(signal.SIGTERM) is term and signal.set_wakeup_fd(-1) == -1
        assert not children._interrupted.is_set()
    finally:
        for x in _tagged(tag):
            with contextlib.suppress(psutil.Error):
                x.kill()
