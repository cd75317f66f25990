"""SGLang's HiCache on a CPU: two import-time patches, for the real-engine tier only.

SGLang 0.5.23's HiCache (host tier, file storage tier) runs its real logic on a CPU except at two
CUDA-only spots (``../shared/docs/real-hicache-cpu.md``, docs/real-engine.md "HiCache"):

1. ``sglang.srt.mem_cache.pool_host.base.HostKVCache.__init__`` allocates the host pool with
   ``pin_memory=True``, which reaches ``cudaHostRegister`` ("Found no NVIDIA driver"). Patched:
   the original is called with ``pin_memory=False``.
2. ``sglang.srt.mem_cache.pool_host.mha`` imports the transfer op ``transfer_kv_direct`` from
   ``sgl_kernel`` only on CUDA/ROCm, so the first copy is a ``NameError``. Patched: where the
   module lacks it, a CPU version with the op's contract ``(src_layers, dst_layers, src_indices,
   dst_indices, page_size)``: for every layer pair ``dst[dst_indices] = src[src_indices]`` along
   dim 0 (token slots), with ``index_select`` and ``index_copy_``.

How: a ``sys.meta_path`` finder wraps those two modules' ``exec_module`` and patches each right
after it is executed. ``sitecustomize.py`` beside this file installs it when
``THUNDER_SGL_CPU_HICACHE=1``. Rules:

- never active where a GPU is present (``torch.cuda.is_available()``): it says so and patches
  nothing;
- one line on stderr per patched module (``thunder_sgl.cpu_hicache: patched ...``), which
  ``thunder-sgl engine serve`` looks for in each server's log;
- a module whose shape no longer matches (no ``HostKVCache`` with a ``pin_memory`` parameter, no
  function of ``mha`` that calls ``transfer_kv_direct``) raises ``PatchError`` while it is
  imported: the server fails to start with the reason, never runs unpatched in silence;
- ``python thunder_cpu_hicache.py --check`` (what ``thunder-sgl engine status`` runs in the SGLang
  venv) imports both modules with the patches and exits 0 only if both applied.

This file runs inside the SGLang venv: it imports nothing from thunder_sgl.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import inspect
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any

BASE = "sglang.srt.mem_cache.pool_host.base"
MHA = "sglang.srt.mem_cache.pool_host.mha"
TESTED_SGLANG = "0.5.23"
PREFIX = "thunder_sgl.cpu_hicache:"

APPLIED: list[str] = []
"""One line per module patched in this process."""


class PatchError(RuntimeError):
    """The installed SGLang no longer has the shape these patches were written for."""


def _say(msg: str) -> None:
    print(f"{PREFIX} {msg}", file=sys.stderr, flush=True)


def _gpu_present() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _sglang_version() -> str:
    try:
        from sglang.version import __version__

        return str(__version__)
    except Exception:  # noqa: BLE001 — only a label in a log line
        return "?"


# ---- patch 1: the host pool without pinned memory ---------------------------------------
def _patch_base(module: ModuleType) -> None:
    cls = getattr(module, "HostKVCache", None)
    if cls is None:
        raise PatchError(f"{BASE} has no HostKVCache (sglang {_sglang_version()}; written for {TESTED_SGLANG})")
    orig = cls.__init__
    if getattr(orig, "_thunder_cpu_hicache", False):
        return
    sig = inspect.signature(orig)
    if "pin_memory" not in sig.parameters:
        raise PatchError(f"{BASE}.HostKVCache.__init__ takes no pin_memory (sglang {_sglang_version()}; "
                         f"written for {TESTED_SGLANG})")

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = sig.bind(self, *args, **kwargs)
        bound.arguments["pin_memory"] = False
        orig(*bound.args, **bound.kwargs)

    __init__._thunder_cpu_hicache = True  # type: ignore[attr-defined]
    __init__.__wrapped__ = orig  # type: ignore[attr-defined]
    cls.__init__ = __init__
    _applied(BASE, "HostKVCache.__init__ called with pin_memory=False")


# ---- patch 2: the transfer op ------------------------------------------------------------
def transfer_kv_direct(src_layers: Any, dst_layers: Any, src_indices: Any, dst_indices: Any,
                       page_size: int) -> None:
    """CPU stand-in for ``sgl_kernel.kvcacheio.transfer_kv_direct``: for each layer pair, the
    token slots ``src_indices`` of ``src`` are copied to the slots ``dst_indices`` of ``dst``
    (dim 0). Counts must match and be whole pages, as the kernel requires."""
    n = int(src_indices.numel())
    if n != int(dst_indices.numel()):
        raise ValueError(f"transfer_kv_direct: {n} source slots but {int(dst_indices.numel())} destination slots")
    if page_size > 0 and n % page_size:
        raise ValueError(f"transfer_kv_direct: {n} slots is not a multiple of page_size {page_size}")
    if len(src_layers) != len(dst_layers):
        raise ValueError(f"transfer_kv_direct: {len(src_layers)} source layers but {len(dst_layers)} destination")
    if n == 0:
        return
    for src, dst in zip(src_layers, dst_layers, strict=True):
        s_idx = src_indices.to(device=src.device, dtype=_long())
        d_idx = dst_indices.to(device=dst.device, dtype=_long())
        rows = src.index_select(0, s_idx)
        dst.index_copy_(0, d_idx, rows.to(device=dst.device, dtype=dst.dtype))


def _long() -> Any:
    import torch

    return torch.int64


def _calls(module: ModuleType, name: str) -> bool:
    """Whether any function or method defined in ``module`` refers to the global ``name``."""
    for obj in vars(module).values():
        funcs: list[Any] = []
        if inspect.isfunction(obj) and obj.__module__ == module.__name__:
            funcs.append(obj)
        elif inspect.isclass(obj) and obj.__module__ == module.__name__:
            funcs += [f for f in vars(obj).values() if inspect.isfunction(f)]
        if any(name in f.__code__.co_names for f in funcs):
            return True
    return False


def _patch_mha(module: ModuleType) -> None:
    if not _calls(module, "transfer_kv_direct"):
        raise PatchError(f"{MHA} no longer calls transfer_kv_direct (sglang {_sglang_version()}; "
                         f"written for {TESTED_SGLANG})")
    if callable(getattr(module, "transfer_kv_direct", None)):
        _applied(MHA, "transfer_kv_direct present already: left as is")
        return
    module.transfer_kv_direct = transfer_kv_direct  # type: ignore[attr-defined]
    _applied(MHA, "transfer_kv_direct supplied (index_select / index_copy_ on the CPU)")


PATCHES: dict[str, Callable[[ModuleType], None]] = {BASE: _patch_base, MHA: _patch_mha}


def _applied(name: str, what: str) -> None:
    line = f"patched {name}: {what} (sglang {_sglang_version()})"
    APPLIED.append(line)
    _say(line)


# ---- the import hook ---------------------------------------------------------------------
class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            if _gpu_present():
                _say(f"a GPU is present: {fullname} left unpatched")
                return
            patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


_FINDER = _Finder()


def install() -> None:
    """Put the finder first on ``sys.meta_path`` (once); patch modules imported already."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    for name, patch in PATCHES.items():
        module = sys.modules.get(name)
        if module is not None and not any(line.startswith(f"patched {name}:") for line in APPLIED):
            if not _gpu_present():
                patch(module)


def check() -> int:
    """Import both modules with the patches on; 0 if both applied, else 1 (reason on stderr)."""
    install()
    try:
        if _gpu_present():
            _say("a GPU is present: the CPU patches are never applied there")
            return 1
        import importlib

        for name in PATCHES:
            importlib.import_module(name)
    except PatchError as e:
        _say(f"do not apply: {e}")
        return 1
    except Exception as e:  # noqa: BLE001 — any import failure means: does not apply
        _say(f"do not apply: importing failed: {type(e).__name__}: {e}")
        return 1
    done = {line.split(":", 1)[0].removeprefix("patched ") for line in APPLIED}
    missing = [n for n in PATCHES if n not in done]
    if missing:
        _say(f"do not apply: {', '.join(missing)} imported but not patched")
        return 1
    _say(f"both patches apply ({len(PATCHES)} of {len(PATCHES)}, sglang {_sglang_version()})")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] != ["--check"]:
        print("usage: python thunder_cpu_hicache.py --check", file=sys.stderr)
        sys.exit(2)
    sys.exit(check())
