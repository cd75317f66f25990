"""Agent workloads and the tools that drive them.

- ``distributions``: small typed distributions profiles are made of.
- ``workload``: ``WorkloadProfile`` (``configs/workloads/*.yaml``) and the deterministic program
  generator (``program_at``, ``generate_programs``, ``ProgramSource``), shared by the HTTP driver,
  the locust file and a discrete-event simulation.
- ``conversation``: one program's texts and requests, and the parsing of responses (no I/O).
- ``driver``: ``run_workload``, the async closed-loop driver.
- ``stats``: step and program records, and the measures (steps/min, KV hit rate, latencies).

Import from the submodules; this package imports nothing so that a DES needs no HTTP client.
"""
