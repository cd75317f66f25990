"""Suite-wide: SIGINT handled as Python's default, whatever the suite was started under.

A shell starts a background job (``cmd &``, ``nohup cmd &``) with SIGINT ignored; a process that
starts with it ignored keeps ignoring it and passes that on to the processes it starts. The
tests of Ctrl-C (``tests/unit/test_children.py``, ``tests/benchmark/test_harness.py``) would then
test how the suite was launched, not the code: the suite restores the default, and its children
(a Python handler is reset to the default at ``exec``) start with it too."""

import signal

if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
