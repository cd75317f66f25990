"""Reports: ``results`` (``RunResult``, one measured run, the unit of every report), ``sweep``
(a sweep's CSV, JSON, markdown tables and plots) and ``progress`` (live progress of a sweep)."""
