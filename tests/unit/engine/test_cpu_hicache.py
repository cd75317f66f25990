"""The CPU HiCache patches (``engine/cpu_hicache``) and how ``engine serve`` launches HiCache
servers, without SGLang: the patch functions run on stand-in modules, torch is never imported
(``_gpu_present`` is replaced). Against the real SGLang: tests/sglang/test_engine_hicache.py."""

from __future__ import annotations

import importlib.util
import sys
import types
from pathlib import Path

import pytest

from thunder_sgl.engine.env import EngineEnv
from thunder_sgl.engine.serve import (
    CPU_HICACHE_DIR,
    CPU_HICACHE_SWITCH,
    PATCHED_MODULES,
    EngineOptions,
    HiCacheOptions,
    HiCachePatchError,
    check_patched,
    engine_argv,
    engine_env_vars,
    patches_applied,
)


@pytest.fixture
def hc(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location("thunder_cpu_hicache_t", CPU_HICACHE_DIR / "thunder_cpu_hicache.py")
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    monkeypatch.setattr(m, "_gpu_present", lambda: False)
    monkeypatch.setattr(m, "_sglang_version", lambda: "test")
    return m


def _base_module(with_pin: bool = True) -> types.ModuleType:
    m = types.ModuleType("sglang.srt.mem_cache.pool_host.base")
    if with_pin:
        class HostKVCache:
            def __init__(self, size: int, pin_memory: bool, layout: str = "layer_first") -> None:
                self.size, self.pin_memory, self.layout = size, pin_memory, layout
    else:
        class HostKVCache:  # type: ignore[no-redef]
            def __init__(self, size: int) -> None:
                self.size = size
    HostKVCache.__module__ = m.__name__
    m.HostKVCache = HostKVCache  # type: ignore[attr-defined]
    return m


def test_base_patch_turns_pinned_memory_off_however_it_is_passed(hc: types.ModuleType) -> None:
    m = _base_module()
    hc._patch_base(m)
    cls = m.HostKVCache

    class Sub(cls):  # SGLang's MHATokenToKVPoolHost passes pin_memory=True to the base
        def __init__(self) -> None:
            super().__init__(7, pin_memory=True, layout="page_first")

    assert Sub().pin_memory is False and Sub().layout == "page_first"
    assert cls(3, True).pin_memory is False
    hc._patch_base(m)  # a second application wraps nothing more
    assert cls.__init__.__wrapped__.__name__ == "__init__"
    assert [ln for ln in hc.APPLIED if "pin_memory=False" in ln] and len(hc.APPLIED) == 1


def test_base_patch_fails_loudly_on_another_shape(hc: types.ModuleType) -> None:
    with pytest.raises(hc.PatchError, match="takes no pin_memory"):
        hc._patch_base(_base_module(with_pin=False))
    with pytest.raises(hc.PatchError, match="no HostKVCache"):
        hc._patch_base(types.ModuleType("sglang.srt.mem_cache.pool_host.base"))
    assert hc.APPLIED == []


def _mha_module(calls: bool, has_op: bool) -> types.ModuleType:
    m = types.ModuleType("sglang.srt.mem_cache.pool_host.mha")
    src = ("class MHATokenToKVPoolHost:\n    def load_to_device_per_layer(self):\n"
           + ("        transfer_kv_direct(src_layers=[], dst_layers=[], src_indices=None, dst_indices=None, page_size=1)\n"
              if calls else "        return None\n"))
    exec(compile(src, "<mha>", "exec"), m.__dict__)  # noqa: S102 — a stand-in module's source
    m.MHATokenToKVPoolHost.__module__ = m.__name__
    if has_op:
        m.transfer_kv_direct = lambda **kw: None  # type: ignore[attr-defined]
    return m


def test_mha_patch_supplies_the_op_only_where_it_is_missing(hc: types.ModuleType) -> None:
    m = _mha_module(calls=True, has_op=False)
    hc._patch_mha(m)
    assert m.transfer_kv_direct is hc.transfer_kv_direct
    present = _mha_module(calls=True, has_op=True)
    op = present.transfer_kv_direct
    hc._patch_mha(present)
    assert present.transfer_kv_direct is op
    with pytest.raises(hc.PatchError, match="no longer calls transfer_kv_direct"):
        hc._patch_mha(_mha_module(calls=False, has_op=False))


def test_no_patch_where_a_gpu_is_present(hc: types.ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(hc, "_gpu_present", lambda: True)
    base = _base_module()
    sys.modules[base.__name__] = base
    try:
        hc.install()  # a module imported before the hook is patched at install, except with a GPU
        assert base.HostKVCache(1, True).pin_memory is True and hc.APPLIED == []
    finally:
        sys.modules.pop(base.__name__, None)
        sys.meta_path[:] = [f for f in sys.meta_path if f is not hc._FINDER]


def test_sitecustomize_does_nothing_without_the_switch(tmp_path: Path) -> None:
    import subprocess

    code = "import sys; print(any(type(f).__name__ == '_Finder' for f in sys.meta_path))"
    env = {"PYTHONPATH": str(CPU_HICACHE_DIR), "PATH": "/usr/bin:/bin"}
    off = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    on = subprocess.run([sys.executable, "-c", code], env={**env, CPU_HICACHE_SWITCH: "1"},
                        capture_output=True, text=True, check=True)
    assert off.stdout.strip() == "False" and on.stdout.strip() == "True"


def test_serve_flags_and_environment(tmp_path: Path) -> None:
    env = EngineEnv(tmp_path, tmp_path / "venv")
    plain = EngineOptions(model=tmp_path / "m")
    assert "--enable-hierarchical-cache" not in engine_argv(env, plain, 1234)
    assert CPU_HICACHE_SWITCH not in engine_env_vars(plain)
    opts = EngineOptions(model=tmp_path / "m", hicache=HiCacheOptions(3, "write_back", tmp_path / "store"))
    argv = engine_argv(env, opts, 1234, worker=1)
    joined = " ".join(argv)
    assert ("--enable-hierarchical-cache --hicache-io-backend direct --hicache-mem-layout layer_first "
            "--hicache-ratio 3 --hicache-write-policy write_back") in joined
    assert f"--hicache-storage-backend file --file-storage-path {tmp_path / 'store' / 'worker-1'}" in joined
    ev = engine_env_vars(opts)
    assert ev[CPU_HICACHE_SWITCH] == "1" and ev["PYTHONPATH"].split(":")[0] == str(CPU_HICACHE_DIR)
    with pytest.raises(ValueError, match="must be > 1"):
        HiCacheOptions(1.0)
    with pytest.raises(ValueError, match="write policy"):
        HiCacheOptions(2, "write_sometimes")


def test_a_server_without_both_patch_lines_is_refused(tmp_path: Path) -> None:
    from thunder_sgl.children import Proc

    log = tmp_path / "sglang-0.log"
    line = "thunder_sgl.cpu_hicache: patched {}: x (sglang 0.5.23)\n"
    log.write_text(line.format(PATCHED_MODULES[0]))
    proc = Proc("sglang-0", None, "http://x", log)  # type: ignore[arg-type]
    assert patches_applied(log.read_text()) == [PATCHED_MODULES[0]]
    with pytest.raises(HiCachePatchError, match="without the CPU patch of sglang.srt.mem_cache.pool_host.mha"):
        check_patched(proc)
    log.write_text("".join(line.format(m) for m in PATCHED_MODULES))
    check_patched(proc)
