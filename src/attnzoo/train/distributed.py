"""Data parallelism: process-group set-up from torchrun's environment, and deterministic batch sharding.

The global batch of step ``s`` is a pure function of ``(seed, s)``: a fresh permutation of the
training set per epoch (from a seeded generator), cut into consecutive global batches; process ``r``
of ``w`` takes the ``r``-th contiguous slice (DistributedSampler-style sharding). So one process with
batch ``B`` and ``w`` processes with ``B / w`` each see the same samples, and a resumed run continues
from exactly the next batch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist

__all__ = [
    "DistInfo",
    "init_distributed",
    "shutdown_distributed",
    "BatchSchedule",
    "all_reduce_sum",
    "all_reduce_max",
    "all_gather_floats",
    "barrier",
]


@dataclass(frozen=True)
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


#: one process, rank 0 (frozen, so one shared instance serves as every default)
SINGLE_PROCESS = DistInfo()


def init_distributed(device_type: str) -> DistInfo:
    """Join the process group torchrun set up (``WORLD_SIZE`` > 1): NCCL on CUDA, gloo on CPU."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo()
    rank = int(os.environ["RANK"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if device_type == "cuda":
            torch.cuda.set_device(local)
        dist.init_process_group(backend=backend)
    return DistInfo(rank=rank, world_size=world, local_rank=local)


def shutdown_distributed() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def all_reduce_sum(t: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.enabled:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(value: int, info: DistInfo) -> int:
    """The largest ``value`` over all processes (e.g. a pending signal number)."""
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def all_gather_floats(values: list[float], info: DistInfo) -> list[list[float]]:
    """Every process's ``values`` (the same length on all), indexed by rank; float64, so exact for floats."""
    if not info.enabled:
        return [list(values)]
    t = torch.tensor(values, dtype=torch.float64)
    out = [torch.empty_like(t) for _ in range(info.world_size)]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


class BatchSchedule:
    """Sample indices of each step's global batch and of this process's shard of it.

    ``shuffle=False`` walks the dataset in order (used for streams of i.i.d. generated samples).
    """

    def __init__(self, n: int, batch_size: int, seed: int, info: DistInfo = SINGLE_PROCESS, shuffle: bool = True):
        if batch_size > n:
            raise ValueError(f"batch_size={batch_size} is larger than the training set ({n} samples)")
        if batch_size % info.world_size:
            raise ValueError(
                f"batch_size={batch_size} (global) must be divisible by the number of processes ({info.world_size})"
            )
        self.n, self.batch_size, self.seed, self.info, self.shuffle = n, batch_size, seed, info, shuffle
        self.steps_per_epoch = n // batch_size
        self._epoch = -1
        self._perm: np.ndarray | None = None

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = torch.randperm(self.n, generator=g).numpy()
            self._epoch = epoch
        return self._perm

    def global_batch(self, step: int) -> np.ndarray:
        epoch, k = divmod(step, self.steps_per_epoch)
        lo = k * self.batch_size
        if not self.shuffle:
            start = (step * self.batch_size) % (self.steps_per_epoch * self.batch_size)
            return np.arange(start, start + self.batch_size)
        return self._permutation(epoch)[lo : lo + self.batch_size]

    def local_batch(self, step: int) -> np.ndarray:
        g = self.global_batch(step)
        per = self.batch_size // self.info.world_size
        return g[self.info.rank * per : (self.info.rank + 1) * per]

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch
