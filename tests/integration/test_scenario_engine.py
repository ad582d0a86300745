"""A scenario preset's arguments reach a real vLLM CPU engine (kvserve's own replica class, in this
process), adapted to the CPU, and the engine serves with them (n-gram speculative decoding included)."""

from __future__ import annotations

import asyncio

import pytest

from kvserve.config import load_config

pytestmark = pytest.mark.integration


async def _start_replica(config: dict):
    from deployments.replica import LLMReplica

    replica = LLMReplica.__new__(LLMReplica)
    await LLMReplica.__init__(replica, config)  # Serve awaits this async constructor the same way
    return replica


def test_long_document_preset_reaches_the_cpu_engine():
    from kvserve.model import prepare_model

    prepare_model()
    cfg = load_config(overrides={"engine": {"scenario": "long-document"}, "autoscaling": {"warm_prefixes": 0},
                                 "tenants": {"open_mode": True}}, environ={})

    async def run() -> tuple[object, str]:
        from deployments.vllm_compat import get

        replica = await _start_replica(cfg.model_dump(mode="json"))
        try:
            vc = replica.engine.vllm_config
            # A repetitive prompt: prompt-lookup drafts have something to match.
            words = "the cat sat on the mat and the dog sat on the log " * 8
            tokens = replica.engine.tokenizer.encode(words)
            text = ""
            params = get("SamplingParams")(max_tokens=24, temperature=0.0)
            async for out in replica.engine.generate({"prompt_token_ids": tokens}, params, "scenario-check"):
                text = out.outputs[0].text
            return vc, text
        finally:
            replica.kv.stop()
            replica.engine.shutdown()

    vc, text = asyncio.run(run())
    assert vc.scheduler_config.max_num_seqs == 8
    assert vc.scheduler_config.max_num_batched_tokens == 2048
    assert vc.scheduler_config.long_prefill_token_threshold == 512
    assert vc.model_config.max_model_len == 8192
    assert vc.cache_config.enable_prefix_caching
    assert vc.cache_config.cache_dtype == "auto"  # the CPU adaptation: no fp8 KV on this host
    assert vc.speculative_config is not None and vc.speculative_config.method == "ngram"
    assert vc.speculative_config.num_speculative_tokens == 4
    assert len(text.split()) >= 5, text
