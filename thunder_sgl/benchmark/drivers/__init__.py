"""Runs with real processes: ``closed_loop`` (``run_workload``, agent programs against any
OpenAI endpoint), ``http_mode`` (one HTTP-mode run against the simulated cluster),
``real_mode`` (the same on real SGLang CPU engines), ``sampler`` (what the harness asks the
cluster beside the workload) and ``peers`` (simulated workers and routers started on free
ports)."""
