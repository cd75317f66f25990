"""The request path without I/O: the ``Controller`` and its companions, driven alike by the
gateway (asyncio, HTTP) and the discrete-event benchmark (virtual time).

- ``controller``: submit, hold, the HBM gate, finish, tick, release, failover.
- ``tickets``: what the controller takes and gives — a request (``Ticket``), its counters
  (``Stats``), what a tick did (``TickResult``) — and ``prefix_key_of``.
- ``kvrefs``: which programs' KV the engines keep referenced, and the ``/close_session`` calls.
- ``windows``: weight-update windows (RL) that hold new requests and restores.

Import from the submodules (``from thunder_sgl.control.controller import Controller``).
"""
