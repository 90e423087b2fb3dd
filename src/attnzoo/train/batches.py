"""The training batches of steps ``start..stop-1``, optionally made ahead by DataLoader worker processes.

The batch of step ``s`` is ``train.get_batch(schedule.local_batch(s)[, step=s])``: a pure function of the seed
and ``s`` (datasets with ``step_dependent = True``, e.g. augmented image folders, also receive the step). Workers
(the dataset's ``num_workers``) each make whole steps and the loader hands them back in step order, so the
batches, and hence the run, are the same for any number of workers, and a resumed run restarts at ``start``.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Iterator

import torch
from torch.utils.data import DataLoader, Dataset

from attnzoo.data.datasets import Batch, BatchDataset
from attnzoo.train.distributed import BatchSchedule

__all__ = ["step_batch", "train_batches"]


def step_batch(train: BatchDataset, schedule: BatchSchedule, step: int) -> Batch:
    """This process's batch of training step ``step``."""
    idx = schedule.local_batch(step)
    if getattr(train, "step_dependent", False):
        return train.get_batch(idx, step=step)
    return train.get_batch(idx)


class _Steps(Dataset):
    # item k is the batch of step start + k (a map-style dataset over steps, read in order)
    def __init__(self, train: BatchDataset, schedule: BatchSchedule, start: int, stop: int) -> None:
        self.train, self.schedule, self.start, self.stop = train, schedule, start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, k: int) -> Batch:
        return step_batch(self.train, self.schedule, self.start + k)


def _ignore_sigint(_worker_id: int) -> None:
    # Ctrl-C reaches the whole process group: the workers leave it to the main process, which finishes the
    # step and checkpoints (a worker dying on it would break the next step's batch instead)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


_capped_notice_shown = False


def _usable_workers(asked: int) -> int:
    """``asked`` DataLoader workers, at most one per CPU core this process may use (presets ask for a big
    machine's count; more workers than cores only compete for them, and DataLoader warns)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cores = os.cpu_count() or 1
    if asked <= cores:
        return asked
    global _capped_notice_shown
    if not _capped_notice_shown:
        _capped_notice_shown = True
        print(
            f"attnzoo train: num_workers={asked} but this process may use {cores} CPU core(s): using {cores} "
            "data-loading workers",
            file=sys.stderr,
        )
    return cores


def train_batches(
    train: BatchDataset, schedule: BatchSchedule, start: int, stop: int, pin_memory: bool = False
) -> Iterator[Batch]:
    """Batches of steps ``start, ..., stop - 1`` in order; with ``train.num_workers > 0`` made ahead by that many
    DataLoader worker processes (two steps each in flight)."""
    workers = _usable_workers(int(getattr(train, "num_workers", 0) or 0))
    if workers <= 0 or stop <= start:
        for s in range(start, stop):
            yield step_batch(train, schedule, s)
        return
    loader = DataLoader(
        _Steps(train, schedule, start, stop),
        batch_size=None,
        shuffle=False,
        num_workers=workers,
        pin_memory=pin_memory and torch.cuda.is_available(),
        prefetch_factor=2,
        worker_init_fn=_ignore_sigint,
    )
    yield from loader
