"""``EngineCluster.start`` when a server's port was taken between the pick and the bind (the CI
failure of 2026-12-04: SGLang logged ``address already in use`` and stayed up without serving).
A stand-in server takes SGLang's place: it fails that way on a port held by the test, and serves
``/health`` on any other."""

from __future__ import annotations

import socket
import sys
import textwrap
from pathlib import Path

import pytest

from thunder_sgl.engine import serve
from thunder_sgl.engine.serve import EngineCluster, EngineOptions, PortTaken

STAND_IN = textwrap.dedent('''
    import http.server, sys, time
    port = int(sys.argv[1])

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
        def log_message(self, *a):
            pass

    try:
        srv = http.server.HTTPServer(("127.0.0.1", port), H)
    except OSError as e:
        print(f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use", flush=True)
        time.sleep(600)  # SGLang's other processes keep it alive
        sys.exit(1)
    print("serving", flush=True)
    srv.serve_forever()
''')


class StandInCluster(EngineCluster):
    launches: list[int]

    def _argv(self, i: int) -> list[str]:
        self.launches.append(self.ports[i])
        return [sys.executable, "-c", STAND_IN, str(self.ports[i])]


def _held_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # bound, not listening: a connection is refused at once
    return s


def _cluster(tmp_path: Path) -> StandInCluster:
    c = StandInCluster(env=None, opts=EngineOptions(model=tmp_path), log_dir=tmp_path)  # type: ignore[arg-type]
    c.launches = []
    return c


def test_a_server_whose_port_was_taken_is_started_again_on_another(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = _held_port()
    taken = held.getsockname()[1]
    picks = iter([taken])
    real = serve.free_port
    monkeypatch.setattr(serve, "free_port", lambda host="127.0.0.1": next(picks, None) or real(host))
    c = _cluster(tmp_path)
    try:
        c.start(1, timeout=30)
        assert c.launches[0] == taken and len(c.launches) == 2
        assert c.ports[0] != taken and c.alive()
        assert "serving" in c.procs[0].log_tail() and "already in use" not in c.procs[0].log_tail()
    finally:
        c.stop()
        held.close()
    assert not any(p.alive() for p in c.procs)


def test_a_port_taken_on_every_try_fails_loudly_and_leaves_nothing_running(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    held = _held_port()
    taken = held.getsockname()[1]
    monkeypatch.setattr(serve, "free_port", lambda host="127.0.0.1": taken)
    c = _cluster(tmp_path)
    try:
        with pytest.raises(PortTaken, match="taken before the server bound it"):
            c.start(1, timeout=30)
        assert len(c.launches) == serve.PORT_TRIES
        assert not any(p.alive() for p in c.procs)
    finally:
        c.stop()
        held.close()
