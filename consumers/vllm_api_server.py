"""vLLM's OpenAI-compatible server as rollwire starts it: vLLM's own `api_server` module, with one
change in the API process, a `keep` pause that does not sleep.

`AsyncLLM.pause_generation` pauses the engine's scheduler, then sleeps 20 ms so that the last
outputs of requests that finish in the step that was running reach their callers before the pause
returns ("not required for correctness", its comment says). A rollwire swap pauses with
`mode=keep`: the pause finishes and aborts nothing, and frozen requests go on after the resume.
Of the 22 ms a swap spent draining, 20 were that sleep (`bench/reload.py`), inside a pause the
issue holds to 50 ms. Here a `keep` pause is the scheduler's pause alone; `abort` and `wait` are
vLLM's. Where vLLM's class no longer has the method this replaces, vLLM's pause is left as it is.

    python -m rollwire.consumers.vllm_api_server --model DIR ...   (the arguments of vLLM's api_server)
"""

from __future__ import annotations

import logging
import runpy
import sys

logger = logging.getLogger(__name__)

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def quick_keep_pause() -> bool:
    """Makes `AsyncLLM.pause_generation(mode="keep")` pause the scheduler without the sleep after it;
    False (nothing changed) where this vLLM has no such method or engine call."""
    try:
        from vllm.v1.engine.async_llm import AsyncLLM
    except ImportError:
        return False
    original = getattr(AsyncLLM, "pause_generation", None)
    if original is None or getattr(original, "_rollwire", False):
        return False

    async def pause_generation(self, *, mode="abort", clear_cache=True):
        pause_scheduler = getattr(self.engine_core, "pause_scheduler_async", None)
        if mode != "keep" or pause_scheduler is None:
            return await original(self, mode=mode, clear_cache=clear_cache)
        await pause_scheduler(mode=mode, clear_cache=False)  # vLLM ignores clear_cache for keep

    pause_generation._rollwire = True  # type: ignore[attr-defined]
    setattr(AsyncLLM, "pause_generation", pause_generation)  # noqa: B010 - mypy refuses assigning a method
    return True


def main() -> None:
    if not quick_keep_pause():
        logger.warning("this vLLM has no AsyncLLM.pause_generation to adjust: its pause sleeps 20 ms as it is")
    sys.argv[0] = SERVER_MODULE
    runpy.run_module(SERVER_MODULE, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
