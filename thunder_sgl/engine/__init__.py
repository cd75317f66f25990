"""The real-engine tier: SGLang 0.5.23 servers on this machine's CPU, for tests, benchmarks and
the calibration of the simulator.

SGLang needs ~11 GB of CUDA wheels even on a CPU, so it never enters the project's own
environment: ``thunder-sgl engine prepare`` builds a venv of its own (``env.EngineEnv``) and a
small random-weight GPT-2-architecture model with a byte-level BPE tokenizer, made offline and
deterministic from a seed (``models``; the builder script ``_build_model.py`` runs inside that
venv). ``thunder-sgl engine serve`` starts N servers on free ports with the flags that matter
(``serve``). Why GPT-2: Llama/Qwen-shaped models crash on CPU (their rotary fallback imports
vLLM); GPT-2 has learned positions. See ``docs/real-engine.md``.
"""

from __future__ import annotations

from thunder_sgl.engine.env import SGLANG_VERSION, EngineEnv, EngineEnvError
from thunder_sgl.engine.models import MODEL_SIZES, ModelSize
from thunder_sgl.engine.serve import EngineCluster, EngineOptions, engine_argv, start_engines

__all__ = [
    "MODEL_SIZES",
    "SGLANG_VERSION",
    "EngineCluster",
    "EngineEnv",
    "EngineEnvError",
    "EngineOptions",
    "ModelSize",
    "engine_argv",
    "start_engines",
]
