"""Small GPT-2-architecture models for the CPU engine, built offline and deterministic.

A model is a directory SGLang loads with ``--model-path``: random weights (``torch`` seeded),
a ``GPT2Config`` with learned positions long enough for agent contexts, and a byte-level BPE
tokenizer trained on the text our workloads send (``textgen``), with a ChatML-like chat
template that is append-only (a conversation's next prompt starts with the tokens of the
previous one, so the radix cache can match it). The same (size, seed) gives the same files.

The build runs inside the SGLang venv (``_build_model.py``: it needs torch, transformers and
tokenizers, which only that venv has); this module only decides what to build and where.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

N_POSITIONS = 16384
"""Longest context the models accept (learned position table)."""

VOCAB_SIZE = 4096
"""BPE vocabulary: enough to hold every word of the workload text with its leading space, so a
token is ≈ 4 characters, as ``textgen`` assumes."""

BUILDER = Path(__file__).with_name("_build_model.py")


@dataclass(frozen=True)
class ModelSize:
    name: str
    width: int
    """n_embd."""
    layers: int
    heads: int

    @property
    def params_m(self) -> float:
        """Parameters in millions (embeddings included; tied LM head)."""
        w = self.width
        return (VOCAB_SIZE * w + N_POSITIONS * w + self.layers * 12 * w * w) / 1e6


MODEL_SIZES: dict[str, ModelSize] = {
    s.name: s for s in (
        ModelSize("tiny", 128, 2, 2),
        ModelSize("small", 256, 2, 4),
        ModelSize("medium", 512, 4, 8),
        ModelSize("base", 768, 6, 12),
    )
}
"""Sizes measured on this machine (docs/real-engine.md): ``small`` is the default; ``tiny``
starts and answers fastest (tests)."""

DEFAULT_SIZE = "small"


def size_of(name: str) -> ModelSize:
    try:
        return MODEL_SIZES[name]
    except KeyError:
        raise ValueError(f"unknown model size {name!r}; valid: {', '.join(MODEL_SIZES)}") from None


def model_dir(models_root: Path, size: str, seed: int) -> Path:
    return models_root / f"gpt2-{size}-s{seed}"


def is_built(path: Path) -> bool:
    return (path / "thunder-model.json").is_file() and (path / "config.json").is_file()


def corpus_text() -> str:
    """Training text of the tokenizer: what the workloads send (system prompts, tasks,
    observations), a few hundred kilobytes, deterministic."""
    from thunder_sgl.textgen import text

    parts = [f"You are {name}, a software agent.\n" for name in ("mini-swe-agent", "openhands", "toolorchestra", "cpu-agent")]
    for i in range(64):
        parts.append(text(400, f"corpus:{i}", head=f"Task p{i:05d}:\n"))
        parts.append(text(200, f"corpus-obs:{i}", head=f"<output step={i} tool=bash>\n"))
    parts.append("0123456789 " * 50)
    return "\n".join(parts)


def build_model(python: Path, models_root: Path, size: str, seed: int,
                say: Callable[[str], None] = print, force: bool = False) -> Path:
    """Build (or find) the model of ``size`` and ``seed`` under ``models_root`` with the
    SGLang venv's ``python``. Idempotent: an existing complete build is returned as is."""
    spec = size_of(size)
    out = model_dir(models_root, size, seed)
    if is_built(out) and not force:
        return out
    say(f"building model {out.name} ({spec.width} wide x {spec.layers} layers, "
        f"{spec.params_m:.1f} M parameters, vocabulary {VOCAB_SIZE}, positions {N_POSITIONS})")
    models_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=models_root))
    corpus = tmp / "corpus.txt"
    corpus.write_text(corpus_text())
    argv = [str(python), str(BUILDER), "--out", str(tmp / "model"), "--corpus", str(corpus),
            "--width", str(spec.width), "--layers", str(spec.layers), "--heads", str(spec.heads),
            "--positions", str(N_POSITIONS), "--vocab", str(VOCAB_SIZE), "--seed", str(seed)]
    # One thread: BPE training and weight init are then bit-for-bit repeatable.
    env = {**os.environ, "RAYON_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if r.returncode != 0:
        raise RuntimeError(f"building the model failed (exit {r.returncode}):\n{r.stderr[-3000:]}")
    meta = {"size": size, "seed": seed, "width": spec.width, "layers": spec.layers, "heads": spec.heads,
            "positions": N_POSITIONS, "vocab": VOCAB_SIZE}
    (tmp / "model" / "thunder-model.json").write_text(json.dumps(meta, indent=2) + "\n")
    if out.exists():
        import shutil

        shutil.rmtree(out)
    os.replace(tmp / "model", out)
    corpus.unlink(missing_ok=True)
    tmp.rmdir()
    return out
