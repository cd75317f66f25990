"""The discrete-event benchmark: ``run`` (``run_des``: agents, a router and simulated workers in
one virtual time), ``route`` (the routers as the DES drives them: thunder's ``Controller``, the
stock policies of ``baselines``), ``tokens`` (the token ids each request sends) and ``measure``
(what a run records)."""
