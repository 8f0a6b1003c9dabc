"""Runs inside vLLM's workers (`--worker-extension-cls`): a full-weight reload that keeps a tied
output layer tied and a mixture of experts' packed weights current.

vLLM's layer-wise reload (`collective_rpc reload_weights`) gives each reloaded layer new parameter
tensors. A model with tied embeddings (`tie_word_embeddings`: Qwen2.5/3, Llama-3.2, Gemma) shares
one tensor between the input embeddings and the output layer; the reload replaces the embeddings'
tensor and leaves the output layer on the old one (on a CPU also its packed GEMM copy), so the
server would sample from new body + old head. `rollwire_reload_weights` reloads, then ties the
output layer to the new embeddings again and lets the layer rebuild what it derives from its
weight (`process_weights_after_loading`: the CPU GEMM packing). A mixture of experts gets the
same for its experts kernel (`repack_experts`), which vLLM's reload skips.

Before the pause, a version is staged in host memory while the engine serves: read from a
folder (`rollwire_stage_weights`), or received from the trainer over gloo
(`rollwire_receive_weights`, `rollwire.core.weight_transfer`); the reload inside the pause then
only copies. vLLM imports this module by name in each worker.
"""

from __future__ import annotations

import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

EXTENSION = "rollwire.consumers.vllm_worker.TiedReload"
"""What `--worker-extension-cls` names."""


class TiedReload:
    """Mixed into vLLM's worker class: `self` is the worker."""

    _rollwire_stager: ThreadPoolExecutor | None = None
    _rollwire_staged: tuple[str, Future[Any]] | None = None
    """The folder being read into host memory, and the reading."""

    def rollwire_stage_weights(self, weights_path: str) -> dict:
        """Starts reading a version's safetensors into host memory on a thread of this worker, and
        returns at once: the engine goes on serving while the files are read and parsed, so the
        pause that follows only copies tensors into the model (`rollwire_reload_weights`)."""
        stager = self._rollwire_stager
        if stager is None:
            stager = self._rollwire_stager = ThreadPoolExecutor(1, thread_name_prefix="rollwire-stage")
        self._rollwire_staged = (weights_path, stager.submit(read_weights, weights_path))
        return {"staging": weights_path}

    def rollwire_receive_weights(self, address: str, version: int, manifest_sha256: str, who: str = "") -> dict:
        """Like `rollwire_stage_weights`, with the version received from the trainer's memory over
        gloo (`rollwire.core.weight_transfer`) instead of read from files; staged under the key
        `direct:<version>:<manifest_sha256>`, which the reload then names."""
        from rollwire.core.weight_transfer import receive
        stager = self._rollwire_stager
        if stager is None:
            stager = self._rollwire_stager = ThreadPoolExecutor(1, thread_name_prefix="rollwire-stage")
        key = direct_key(version, manifest_sha256)
        self._rollwire_staged = (key, stager.submit(receive, address, version, manifest_sha256, who=who))
        return {"staging": key}

    def rollwire_staged(self, weights_path: str) -> dict:
        """Whether the staging of `weights_path` has ended, the error that ended it if any, and for
        a version received directly its verified manifest (JSON), for the replica's own checks."""
        staged = self._rollwire_staged
        done = staged is not None and staged[0] == weights_path and staged[1].done()
        error = staged[1].exception() if done and staged is not None else None
        answer: dict[str, Any] = {"done": done, "error": f"{type(error).__name__}: {error}" if error else None}
        if done and error is None and staged is not None and hasattr(staged[1].result(), "manifest"):
            answer["manifest"] = staged[1].result().manifest.model_dump_json()
        return answer

    def rollwire_reload_weights(self, weights_path: str) -> dict:
        staged, self._rollwire_staged = self._rollwire_staged, None
        if staged is not None and staged[0] == weights_path:
            tensors = staged[1].result()
            tensors = getattr(tensors, "tensors", tensors)  # a `Received` holds its manifest too
            self.reload_weights(weights_iterator=iter(tensors))  # type: ignore[attr-defined]
        elif weights_path.startswith(DIRECT_PREFIX):
            raise RuntimeError(f"{weights_path} was not received: nothing to reload from")
        else:  # nothing staged: vLLM reads the files itself, inside the pause
            self.reload_weights(weights_path=weights_path)  # type: ignore[attr-defined]
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        retied = retie_output_layer(model)
        repacked = repack_experts(model)
        return {"retied": retied, "repacked_expert_layers": repacked, "staged": staged is not None}


DIRECT_PREFIX = "direct:"


def direct_key(version: int, manifest_sha256: str) -> str:
    """What a version received directly is staged under (in place of a folder)."""
    return f"{DIRECT_PREFIX}{version}:{manifest_sha256}"


def read_weights(folder: str) -> list[tuple[str, Any]]:
    """Every tensor of the folder's safetensors files, in host memory, as (name, tensor)."""
    from safetensors import safe_open
    tensors = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            tensors += [(name, f.get_tensor(name)) for name in f.keys()]  # noqa: SIM118 - safe_open has no __iter__
    return tensors


def retie_output_layer(model) -> bool:
    """Ties the model's one output layer to its one input embedding again, if its config ties them;
    False when there is nothing to tie."""
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, "get_text_config"):
        config = config.get_text_config()
    if not getattr(config, "tie_word_embeddings", False):
        return False
    heads = [(name, m) for name, m in model.named_modules() if isinstance(m, ParallelLMHead)]
    embeddings = [m for m in model.modules() if isinstance(m, VocabParallelEmbedding)
                  and not isinstance(m, ParallelLMHead)]
    if len(heads) != 1 or len(embeddings) != 1:
        raise RuntimeError(f"cannot re-tie: {len(heads)} output layers and {len(embeddings)} input embeddings")
    (_, head), embedding = heads[0], embeddings[0]
    head.weight = embedding.weight
    head.quant_method.process_weights_after_loading(head)
    return True


def repack_experts(model) -> int:
    """Lets each mixture-of-experts layer's kernel derive its own layout from the reloaded weights
    again; returns how many layers it did.

    vLLM's reload re-runs the layer's `process_weights_after_loading`, which on a weight update skips
    the experts kernel's own step (it runs only the first time). That step is where the CPU kernel
    packs the expert weights into its grouped-GEMM layout, so after a reload the packed storage held
    the new weights unpacked and the experts computed garbage. The kernels that need no step of their
    own (CUDA's) inherit a no-op, so calling it again changes nothing there."""
    repacked = 0
    for module in model.modules():
        kernel = getattr(getattr(module, "quant_method", None), "moe_kernel", None)
        experts = getattr(kernel, "fused_experts", None)
        if experts is not None:
            experts.process_weights_after_loading(module)
            repacked += 1
    return repacked
