"""AReaL 1.0.4's request sequence, replayed body for body against thunder in front of two real
SGLang 0.5.23 CPU engines (issue 24 item 3), without importing AReaL.

The bodies are those of ``areal/engine/sglang_remote.py`` ``SGLangBackend`` (areal==1.0.4 on
PyPI): ``/generate`` with ``input_ids``, greedy ``sampling_params`` and ``return_logprob``;
``/pause_generation {}``, ``/update_weights_from_disk {"model_path", "abort_all_requests": true}``,
``/continue_generation {}``. AReaL's ``RemoteInfEngine.agenerate`` resends an aborted generation
with its prompt plus the tokens it got and ``max_new_tokens`` reduced by them, until it has them
all. The unmodified client itself runs in ``bench/real/framework_rollout.py`` (result in
``bench/results/rl-framework-client/``); this test keeps its sequence in CI.
"""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

N_NEW = 400


@pytest.fixture(scope="module")
def engines(start_cluster):
    return start_cluster(2, max_total_tokens=16384, threads=1)


def body(ids: list[int], n: int) -> dict:
    """``SGLangBackend.build_generation_request`` for a greedy GenerationHyperparameters."""
    return {"input_ids": ids, "image_data": [], "return_logprob": True, "stream": False,
            "sampling_params": {"top_p": 1.0, "top_k": 100000000, "max_new_tokens": n, "temperature": 0.0,
                                "stop_token_ids": [], "ignore_eos": True, "skip_special_tokens": True,
                                "frequency_penalty": 0.0}}


async def agenerate(h: httpx.AsyncClient, url: str, ids: list[int], resumed: asyncio.Event) -> tuple[list, int]:
    """AReaL's loop: resend after an abort (once the trainer resumed) until every token came."""
    toks: list[list] = []
    sends = 0
    while len(toks) < N_NEW:
        if sends:
            await resumed.wait()
        sends += 1
        r = await h.post(url + "/generate", json=body(ids + [t[1] for t in toks], N_NEW - len(toks)))
        assert r.status_code == 200, r.text
        toks += r.json()["meta_info"]["output_token_logprobs"]
    return toks, sends


def test_areal_sequence_through_thunder(engines, routers):
    thunder = routers("thunder", engines.urls)
    model = str(engines.opts.model)
    rng = random.Random(0)
    prompts = [[rng.randrange(3, 833) for _ in range(48)] for _ in range(4)]

    async def main() -> None:
        async with httpx.AsyncClient(timeout=600) as h:
            resumed = asyncio.Event()
            runs = [asyncio.create_task(agenerate(h, thunder.url, p, resumed)) for p in prompts]
            # pause while generations run on the engines (a busy CI machine can take long to get there)
            deadline = asyncio.get_running_loop().time() + 180
            while True:
                loads = [(await h.get(u + "/v1/loads")).json()["loads"][0]["num_running_reqs"] for u in engines.urls]
                if sum(loads) >= 2 or asyncio.get_running_loop().time() > deadline:
                    break
                await asyncio.sleep(0.05)
            assert sum(loads) >= 1 and not all(t.done() for t in runs), f"no generation running to pause: {loads}"
            assert (await h.post(thunder.url + "/pause_generation", json={})).status_code == 200
            r = await h.post(thunder.url + "/update_weights_from_disk", json={"model_path": model, "abort_all_requests": True})
            assert r.status_code == 200 and r.json()["success"] and r.json()["workers_updated"] == 2, r.text
            assert (await h.post(thunder.url + "/continue_generation", json={})).status_code == 200
            resumed.set()
            out = await asyncio.gather(*runs)
            assert sum(sends > 1 for _, sends in out) >= 1  # the pause aborted someone, who was resent
            for p, (toks, _) in zip(prompts, out, strict=True):
                ref = (await h.post(engines.urls[0] + "/generate", json=body(p, N_NEW))).json()["meta_info"]["output_token_logprobs"]
                assert [t[1] for t in toks] == [t[1] for t in ref]  # same weights: greedy output unchanged
                assert max(abs(a[0] - b[0]) for a, b in zip(toks, ref, strict=True)) < 2e-3  # the engine's batch noise: 1e-3
            ws = (await h.get(thunder.url + "/weight_sync")).json()
            assert ws["open"] is False and ws["windows_expired"] == 0

    asyncio.run(main())
