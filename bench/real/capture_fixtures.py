"""Capture the real engine's /server_info, /v1/loads and /metrics texts as test fixtures.

    python bench/real/capture_fixtures.py [--out tests/data]   (needs `thunder-sgl engine prepare`)

Starts one SGLang CPU server (model ``small``, pool 24,576 tokens, session radix cache on),
sends four concurrent chat requests with long prompts, and captures each route while they run
(``*-busy``) and again once the server is idle (``*-idle``). The pure parser tests read these
files (tests/unit/backends/test_parse.py), so parsers are proven on what SGLang 0.5.23 serves.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

import aiohttp

from thunder_sgl.engine import EngineOptions, start_engines
from thunder_sgl.engine.env import EngineEnv
from thunder_sgl.textgen import text

ROUTES = {"server_info": "/server_info", "v1_loads": "/v1/loads?include=core,queues",
          "v1_loads_all": "/v1/loads?include=all", "metrics": "/metrics"}


async def capture(url: str, out: Path, tag: str, http: aiohttp.ClientSession) -> None:
    for name, route in ROUTES.items():
        async with http.get(url + route) as r:
            body = await r.text()
        ext = "txt" if name == "metrics" else "json"
        if ext == "json":
            body = json.dumps(json.loads(body), indent=1, sort_keys=True) + "\n"
        (out / f"sglang-0.5.23-cpu-{name}-{tag}.{ext}").write_text(body)


async def main(out: Path) -> None:
    env = EngineEnv.locate()
    with start_engines(1, EngineOptions(model=env.model("small"))) as cluster:
        url = cluster.urls[0]
        async with aiohttp.ClientSession() as http:
            async def one(i: int) -> None:
                body = {"model": "default", "max_tokens": 48, "ignore_eos": True, "session_id": f"p{i}",
                        "messages": [{"role": "system", "content": text(600, "fixture-sys")},
                                     {"role": "user", "content": text(2000, f"fixture-{i}")}]}
                async with http.post(url + "/v1/chat/completions", json=body) as r:
                    await r.read()

            tasks = [asyncio.create_task(one(i)) for i in range(4)]
            await asyncio.sleep(4.0)
            await capture(url, out, "busy", http)
            await asyncio.gather(*tasks)
            await asyncio.sleep(1.0)
            await capture(url, out, "idle", http)
    print(f"fixtures written to {out}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("tests/data"))
    asyncio.run(main(ap.parse_args().out))
