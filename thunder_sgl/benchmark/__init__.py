"""The benchmark (harness, not product): agent workloads, the runs that drive them through a
router, and the reports of those runs. Nothing in the product imports it
(``tests/unit/test_layout.py``).

Commands, at this level:

- ``harness``: ``thunder-sgl bench``, a sweep of routers × concurrencies in HTTP, DES or real
  mode into one results directory.
- ``grid``: the workload grid (``thunder-sgl bench --grid``), one sweep per cell.
- ``demo``: ``thunder-sgl demo``; ``soak``: ``thunder-sgl soak``; ``overhead``: ``python -m
  thunder_sgl.benchmark.overhead``, the data-plane overhead.

Parts, by role:

- ``workloads``: profiles and the deterministic program generator, their distributions, one
  program's conversation (shared by the HTTP driver, the locust file and the DES).
- ``des``: the discrete-event simulation — agents, a router and simulated workers in one
  virtual time, with Python re-implementations of the stock routers.
- ``drivers``: real processes — the closed-loop HTTP driver, one HTTP-mode run, real SGLang
  engines, the cluster sampler, the peers (simulators and routers) started on free ports.
- ``measures``: records and measures of a run, the measures from scrapes, the physical bound.
- ``reports``: ``RunResult`` (one measured run), the tables and plots of a sweep, live progress.
- ``rollout``: RL rollouts — the workload, its DES mode, its tables.

Import from the submodules; the packages import nothing, so that a DES needs no HTTP client.
"""
