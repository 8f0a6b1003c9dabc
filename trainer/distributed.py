"""Data-parallel training under torchrun: rank 0 does the trainer's I/O, every rank trains a share.

    torchrun --nproc-per-node N -m rollwire.cli train ...      (a run: `[trainer] processes = N`)

    rank 0      Step 1: takes the batch from the log ──broadcast (msgpack event bytes)──▶ ranks 1..N-1
    every rank  Step 2: trains samples[rank::N] of each objective, each loss normalised by the whole
                batch's counts (tokens, pairs), then the gradients are summed across ranks: every
                rank holds the one-process gradient and takes the same optimizer step
    rank 0      Steps 3-6: publishes the weights once, checkpoints once (the one commit point)

Ranks start from the same checkpoint (a barrier keeps rank 0 from committing before all have
read it) and stay identical, so when one dies torchrun restarts them all from that commit point.
Gradients go over the default process group (gloo on CPU, NCCL on CUDA); batches over a gloo
group, as bytes our codec wrote (nothing pickled crosses a process).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import msgpack
import torch
import torch.distributed as dist

from rollwire.schemas.envelope import Codec
from rollwire.schemas.rollout import ScoredRollout

logger = logging.getLogger(__name__)

IDLE_TIMEOUT = timedelta(hours=12)
"""How long ranks wait for rank 0's next batch (a trainer may idle while the fleet warms up)."""
CONNECT_TIMEOUT = timedelta(minutes=2)
"""How long ranks may take to find and connect to each other; past it a rank fails, and torchrun
starts the group again (gloo waits on a connection for the group's timeout: under IDLE_TIMEOUT, a
rank that cannot connect would wait for good)."""


@dataclass
class Shard:
    """This process's place among the trainer's ranks."""

    rank: int
    world: int
    objects: Any = field(default=None, repr=False)
    """The gloo group batches travel on."""

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def mine(self, samples: Sequence[ScoredRollout]) -> Sequence[ScoredRollout]:
        return samples[self.rank::self.world]

    # -- Step 1: the batch -----------------------------------------------------------------------

    def send_batch(self, batch: Sequence[ScoredRollout] | None) -> None:
        """Rank 0: the batch to train (None: stop)."""
        codec = Codec()
        blob = b"" if batch is None else msgpack.packb([codec.encode(s, producer="trainer") for s in batch])
        self._broadcast_bytes(blob)

    def receive_batch(self) -> list[ScoredRollout] | None:
        """Ranks 1..N-1: the next batch, or None when rank 0 stops."""
        blob = self._broadcast_bytes(None)
        if not blob:
            return None
        codec = Codec()
        return [codec.decode(item).event for item in msgpack.unpackb(blob)]

    def _broadcast_bytes(self, blob: bytes | None) -> bytes:
        size = torch.tensor([len(blob) if blob is not None else 0], dtype=torch.int64)
        dist.broadcast(size, src=0, group=self.objects)
        data = (torch.frombuffer(bytearray(blob), dtype=torch.uint8) if blob else
                torch.empty(int(size.item()), dtype=torch.uint8))
        if int(size.item()):
            dist.broadcast(data, src=0, group=self.objects)
        return bytes(data.numpy().tobytes())

    # -- Step 2: the reductions ------------------------------------------------------------------

    def sum_gradients(self, model: torch.nn.Module) -> None:
        """Sums every parameter's gradient over the ranks; a parameter no rank touched keeps none
        (so the optimizer skips it, as one process would)."""
        params = [p for p in model.parameters() if p.requires_grad]
        device = params[0].device
        touched = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=device)
        dist.all_reduce(touched, op=dist.ReduceOp.MAX)
        for p, any_rank in zip(params, touched.tolist()):
            if not any_rank:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            dist.all_reduce(p.grad)

    def sum_scalars(self, values: dict[str, float]) -> dict[str, float]:
        """Sums named floats over the ranks (each rank may lack some names: they count as 0)."""
        names = sorted(self._union(values.keys()))
        tensor = torch.tensor([values.get(n, 0.0) for n in names], dtype=torch.float64)
        dist.all_reduce(tensor, group=self.objects)
        return dict(zip(names, tensor.tolist()))

    def _union(self, names) -> set[str]:
        """Every rank's names (a rank with no sample of an objective has none of its metrics)."""
        blob = msgpack.packb(sorted(names))
        sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(sizes, torch.tensor([len(blob)], dtype=torch.int64), group=self.objects)
        width = max(int(t.item()) for t in sizes)
        padded = torch.zeros(width, dtype=torch.uint8)
        padded[: len(blob)] = torch.frombuffer(bytearray(blob), dtype=torch.uint8)
        gathered = [torch.zeros(width, dtype=torch.uint8) for _ in range(self.world)]
        dist.all_gather(gathered, padded, group=self.objects)
        return {name for data, size in zip(gathered, sizes)
                for name in msgpack.unpackb(data[: int(size.item())].numpy().tobytes())}

    def barrier(self) -> None:
        dist.barrier(group=self.objects)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def _attempt_store(world: int) -> dist.Store:
    """The rendezvous store of this start of the ranks, under keys of its own. torchrun keeps one
    store across the restarts of a group (MASTER_ADDR:MASTER_PORT), and ranks started again read
    the addresses the dead ranks had left under the same keys: their gloo connections were refused
    (every restart failed) or waited for good. Each start (TORCHELASTIC_RESTART_COUNT) gets a prefix."""
    hosted_by_torchrun = os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not hosted_by_torchrun and os.environ["RANK"] == "0", timeout=CONNECT_TIMEOUT)
    return dist.PrefixStore(f"rollwire/start-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)


def _wait_longer(group) -> None:
    """Connected: from now on a rank may wait IDLE_TIMEOUT for the others (for rank 0's next batch)."""
    set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if set_timeout is None:  # an older torch: its collectives keep CONNECT_TIMEOUT
        logger.warning("this torch cannot lengthen a process group's timeout: ranks idle for over %s fail",
                       CONNECT_TIMEOUT)
        return
    set_timeout(IDLE_TIMEOUT)
    if group is not None:
        set_timeout(IDLE_TIMEOUT, group)


def from_environment(device: torch.device) -> Shard | None:
    """This process's shard when torchrun started it with more than one rank (WORLD_SIZE > 1)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return None
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend, store=_attempt_store(world), rank=int(os.environ["RANK"]), world_size=world,
                            timeout=CONNECT_TIMEOUT)
    objects = dist.new_group(backend="gloo", timeout=CONNECT_TIMEOUT) if backend != "gloo" else None
    _wait_longer(objects)
    shard = Shard(dist.get_rank(), dist.get_world_size(), objects)
    logger.info("trainer rank %d of %d (%s)", shard.rank, shard.world, backend)
    return shard
