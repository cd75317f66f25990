"""The SGLang venv and the models it serves: where they live, whether they work, how to make them.

Layout under the engine home (``$THUNDER_SGL_ENGINE_HOME``, default
``${XDG_CACHE_HOME:-~/.cache}/thunder-sgl``)::

    sglang-venv/                 python -m venv + sglang==0.5.23 (from constraints-sglang.txt)
    sglang-venv/thunder-engine.json   written last: the install completed and imports
    models/gpt2-<size>-s<seed>/  models built by ``models.build_model``

``prepare`` is idempotent: a venv whose marker exists and whose imports work is reused; a
missing venv is created; a broken one is reported with the command that repairs it
(``--reinstall``). The install takes minutes and ~11 GB (CUDA wheels, unused on the CPU):
pip's own lines are passed through with the elapsed time, so a long step shows it is alive.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from thunder_sgl.engine import models

SGLANG_VERSION = "0.5.23"
CONSTRAINTS = Path(__file__).with_name("constraints-sglang.txt")
MARKER = "thunder-engine.json"
_CHECK = ("import sglang, torch, transformers, tokenizers; "
          "print(sglang.__version__, torch.__version__, transformers.__version__)")


class EngineEnvError(RuntimeError):
    """The SGLang venv is missing or broken; the message says what to run."""


def default_home() -> Path:
    if os.environ.get("THUNDER_SGL_ENGINE_HOME"):
        return Path(os.environ["THUNDER_SGL_ENGINE_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "thunder-sgl"


@dataclass(frozen=True)
class EngineEnv:
    home: Path
    venv: Path

    @classmethod
    def locate(cls, home: str | Path | None = None, venv: str | Path | None = None) -> EngineEnv:
        h = Path(home).expanduser() if home else default_home()
        v = Path(venv).expanduser() if venv else Path(os.environ.get("THUNDER_SGLANG_VENV") or h / "sglang-venv")
        return cls(h, v)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def models_root(self) -> Path:
        return self.home / "models"

    # ---- state ---------------------------------------------------------------------------
    def check(self) -> str | None:
        """None when the venv is installed and imports; else why not (one line)."""
        if not self.python.exists():
            return f"no SGLang venv at {self.venv}"
        if not (self.venv / MARKER).exists():
            return f"the SGLang venv at {self.venv} is incomplete (an install did not finish)"
        try:
            r = subprocess.run([str(self.python), "-c", _CHECK], capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as e:
            return f"the SGLang venv at {self.venv} does not run: {e}"
        if r.returncode != 0:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            return f"the SGLang venv at {self.venv} is broken: {last}"
        version = r.stdout.split()[0] if r.stdout.split() else "?"
        if version != SGLANG_VERSION:
            return f"the SGLang venv at {self.venv} has sglang {version}, not {SGLANG_VERSION}"
        return None

    def ready(self) -> bool:
        return (self.venv / MARKER).exists() and self.python.exists()

    def require(self) -> None:
        """Raise ``EngineEnvError`` with the repair command unless the venv works."""
        why = self.check()
        if why is not None:
            fix = "thunder-sgl engine prepare" if "no SGLang venv" in why else "thunder-sgl engine prepare --reinstall"
            flags = f" --venv {self.venv}" if self.venv != EngineEnv.locate(self.home).venv else ""
            raise EngineEnvError(f"{why}; run: {fix}{flags}")

    def model(self, size: str = models.DEFAULT_SIZE, seed: int = 0) -> Path:
        """The built model directory of ``size`` and ``seed`` (EngineEnvError if not built)."""
        if Path(size).is_dir():
            return Path(size)
        d = models.model_dir(self.models_root, size, seed)
        if not models.is_built(d):
            raise EngineEnvError(f"model {d.name} is not built; run: thunder-sgl engine prepare --model {size} --seed {seed}")
        return d

    # ---- prepare -------------------------------------------------------------------------
    def prepare(self, sizes: tuple[str, ...] = (models.DEFAULT_SIZE,), seed: int = 0, reinstall: bool = False,
                say: Callable[[str], None] = print) -> list[Path]:
        """Create or repair the venv, then build the models. Returns the model directories."""
        t0 = time.monotonic()
        why = None if reinstall else self.check()
        if reinstall or why is not None:
            if why:
                say(f"engine: {why}")
            self._install(say, t0)
        else:
            say(f"engine: SGLang {SGLANG_VERSION} venv at {self.venv} is ready (reused)")
        out = [models.build_model(self.python, self.models_root, s, seed, say=lambda m: say(f"engine: {m}"))
               for s in sizes]
        for d in out:
            say(f"engine: model ready at {d}")
        say(f"engine: prepared in {time.monotonic() - t0:.0f} s")
        return out

    def _install(self, say: Callable[[str], None], t0: float) -> None:
        if self.venv.exists():
            say(f"engine: removing {self.venv}")
            shutil.rmtree(self.venv)
        self.venv.parent.mkdir(parents=True, exist_ok=True)
        say(f"engine: creating {self.venv} ({sys.executable} -m venv)")
        _run([sys.executable, "-m", "venv", str(self.venv)], say, t0)
        _run([str(self.python), "-m", "pip", "install", "-q", "--upgrade", "pip"], say, t0)
        say(f"engine: installing sglang=={SGLANG_VERSION} (about 5 minutes and 11 GB: it pulls the CUDA "
            "build of torch, unused on the CPU)")
        cons = ["-c", str(CONSTRAINTS)] if CONSTRAINTS.exists() else []
        _run([str(self.python), "-m", "pip", "install", "--progress-bar", "off", *cons,
              f"sglang=={SGLANG_VERSION}"], say, t0, echo=_pip_progress)
        why = self.check_imports()
        if why is not None:
            raise EngineEnvError(f"sglang installed but does not import: {why}")
        (self.venv / MARKER).write_text(json.dumps({
            "sglang": SGLANG_VERSION, "python": sys.version.split()[0],
            "installed": time.strftime("%Y-%m-%d %H:%M:%S"), "seconds": round(time.monotonic() - t0),
        }, indent=2) + "\n")
        say(f"engine: SGLang {SGLANG_VERSION} installed in {self.venv} ({time.monotonic() - t0:.0f} s)")

    def check_imports(self) -> str | None:
        r = subprocess.run([str(self.python), "-c", _CHECK], capture_output=True, text=True, timeout=300)
        return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]


def _pip_progress(line: str) -> str | None:
    """The pip lines worth showing: what it collects and installs, and errors."""
    s = line.strip()
    if s.startswith(("Collecting ", "Installing collected", "Successfully installed", "ERROR", "error:")):
        return s if len(s) < 160 else s[:157] + "..."
    return None


def _run(argv: list[str], say: Callable[[str], None], t0: float,
         echo: Callable[[str], str | None] | None = None) -> None:
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail: list[str] = []
    assert p.stdout is not None
    for line in p.stdout:
        tail = (tail + [line.rstrip()])[-30:]
        shown = echo(line) if echo is not None else None
        if shown:
            say(f"engine: [{time.monotonic() - t0:4.0f} s] {shown}")
    if p.wait() != 0:
        raise EngineEnvError(f"{' '.join(argv[:4])} ... failed (exit {p.returncode}):\n" + "\n".join(tail))
