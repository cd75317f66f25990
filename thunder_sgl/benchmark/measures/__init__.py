"""Measures of a run: ``stats`` (step and program records, steps/min, hit rate, percentiles),
``derived`` (what the driver's summary does not give: recompute, imbalance, Prometheus
histograms and counters, engine time) and ``ideal`` (the physical bound, calibration.md §10)."""
