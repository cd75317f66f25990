"""Start-up hook of the real-engine tier's CPU HiCache patches (``thunder_cpu_hicache``).

``thunder-sgl engine serve --hicache-ratio R`` puts this directory on the SGLang servers'
``PYTHONPATH`` and sets ``THUNDER_SGL_CPU_HICACHE=1``; Python then imports this module at start-up
in every process of the server (the scheduler is a spawned child). Without the switch it does
nothing. Nothing is ever written into the SGLang venv.

Python imports only the first ``sitecustomize`` on its path, so this one, being first, would hide
another: it hands over to the next one found further down the path, if any.
"""

import os
import sys


def _next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("THUNDER_SGL_CPU_HICACHE") == "1":
    import thunder_cpu_hicache

    thunder_cpu_hicache.install()
_next_sitecustomize()
