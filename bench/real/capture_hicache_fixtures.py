"""Capture a real HiCache server's answers as test fixtures (issue 22, item 2).

    python bench/real/capture_hicache_fixtures.py [--out tests/data]   (needs `thunder-sgl engine prepare`)

Starts one SGLang 0.5.23 CPU server with SGLang's real HiCache (``engine serve --hicache-ratio 3
--hicache-storage DIR``: device pool 4,096 tokens, host tier 3x, write-through, file storage
tier, the CPU patches of ``thunder_sgl/engine/cpu_hicache``) and walks it through the states the
router reads: a 3,000-token prefix A cached on the device, evicted to host by fillers and loaded
back from host, the cache flushed (the host-used gauge stays stale until the next batch), A
evicted from host too and loaded back from the storage tier. At each state it captures
``/server_info``, ``/metrics`` and the answers (``/generate`` meta_info, OpenAI chat usage with
``return_cached_tokens_details``, whole and streamed) into ``sglang-0.5.23-cpu-hicache-*`` files.
The parser tests read them (tests/unit/backends/test_parse_hicache.py).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from thunder_sgl.engine import EngineOptions, start_engines
from thunder_sgl.engine.env import EngineEnv
from thunder_sgl.engine.serve import HiCacheOptions
from thunder_sgl.textgen import text

PREFIX = "sglang-0.5.23-cpu-hicache"


def _req(url: str, path: str, body: Any = None, method: str | None = None) -> bytes:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method or ("POST" if body is not None else "GET"),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return r.read()


def main(out: Path) -> None:
    env = EngineEnv.locate()
    store = Path(tempfile.mkdtemp(prefix="hicache-store-"))
    opts = EngineOptions(model=env.model("small"), max_total_tokens=4096,
                         hicache=HiCacheOptions(3.0, "write_through", store))
    with start_engines(1, opts) as cluster:
        url = cluster.urls[0]

        def save(name: str, body: bytes, kind: str = "json") -> None:
            path = out / f"{PREFIX}-{name}.{kind}"
            if kind == "json":
                path.write_text(json.dumps(json.loads(body), indent=1, sort_keys=True) + "\n")
            else:
                path.write_bytes(body)
            print(f"wrote {path.name}")

        def gen(prompt: str, tokens: int = 2) -> bytes:
            return _req(url, "/generate", {"text": prompt, "sampling_params": {"max_new_tokens": tokens},
                                           "return_cached_tokens_details": True})

        a = text(3000, "hicache-A")
        save("server_info", _req(url, "/server_info"))
        gen(a)
        save("generate-device", gen(a))
        for i in range(4):
            gen(text(1500, f"hicache-filler-{i}"))
        save("generate-host", gen(a))
        save("metrics-host", _req(url, "/metrics"), "txt")
        chat = {"model": "default", "max_tokens": 4, "ignore_eos": True, "return_cached_tokens_details": True,
                "messages": [{"role": "user", "content": a}]}
        _req(url, "/v1/chat/completions", chat)
        save("chat", _req(url, "/v1/chat/completions", chat))
        save("chat-stream", _req(url, "/v1/chat/completions",
                                 {**chat, "stream": True, "stream_options": {"include_usage": True}}), "sse")
        assert _req(url, "/flush_cache", method="POST").startswith(b"Cache flushed")
        save("metrics-flushed", _req(url, "/metrics"), "txt")
        for i in range(12):
            gen(text(1500, f"hicache-filler-b{i}"))
        save("generate-storage", gen(a))
        save("metrics-storage", _req(url, "/metrics"), "txt")
    print(f"fixtures written to {out}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("tests/data"))
    main(ap.parse_args().out)
