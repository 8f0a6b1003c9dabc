"""The server rollwire starts is vLLM's, with a `keep` pause that does not sleep after pausing."""

from __future__ import annotations

import asyncio

from rollwire.consumers.vllm_api_server import quick_keep_pause


def test_a_keep_pause_pauses_the_scheduler_alone_and_other_modes_stay_vllms(monkeypatch):
    from vllm.v1.engine.async_llm import AsyncLLM
    original = AsyncLLM.pause_generation
    monkeypatch.setattr(AsyncLLM, "pause_generation", original)  # put back after the test
    assert quick_keep_pause() and not quick_keep_pause()  # once only
    paused, slept = [], []

    class EngineCore:
        async def pause_scheduler_async(self, mode, clear_cache):
            paused.append((mode, clear_cache))

    async def sleep(seconds):
        slept.append(seconds)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    engine = AsyncLLM.__new__(AsyncLLM)
    engine.engine_core = EngineCore()

    asyncio.run(engine.pause_generation(mode="keep"))
    assert paused == [("keep", False)] and slept == []

    class Renderer:
        async def clear_mm_cache_async(self):
            pass

    engine.renderer = Renderer()
    asyncio.run(engine.pause_generation(mode="wait"))
    assert paused[-1] == ("wait", True) and slept == [0.02]  # vLLM's own pause, its sleep included
