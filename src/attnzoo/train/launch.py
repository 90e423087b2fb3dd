"""``attnzoo train --nproc-per-node N ...``: torchrun's launcher, run in-process, that reports a failure as one line.

Plain ``torchrun`` ends every failed job with its own ``ChildFailedError`` traceback and a failure summary, which
bury the one line a worker printed (torchrun's launcher process re-raises the error by design; a worker cannot
change that). This launcher uses the same API (``torch.distributed.launcher.api.elastic_launch``, a standalone
c10d rendezvous on localhost, no restarts), so the workers run exactly as under
``torchrun --standalone --nproc_per_node=N -m attnzoo train ...``; when one fails, it prints nothing more if that
worker already printed its line (its error file says so: :func:`record_error_line`), else one line naming the
rank and how it ended, and exits with the worker's status.

Workers started by plain ``torchrun`` also write their line to torchrun's error file, so torchrun's summary names
it (``traceback : attnzoo train: error: ...``) instead of a link to the elastic documentation.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

__all__ = ["record_error_line", "launch"]

#: torch's loggers that report a worker's failure a second time (and the OMP_NUM_THREADS banner)
_TORCH_LOGGERS = ("torch.distributed.elastic", "torch.distributed.launcher", "torch.distributed.run")


def record_error_line(line: str) -> None:
    """Write ``line`` to torchelastic's error file of this worker (``TORCHELASTIC_ERROR_FILE``), if there is one.

    The format is the one torchelastic's own ``@record`` writes, with ``line`` in place of the traceback, which
    its failure summary shows. Writing it must never hide the error being reported, so a failed write is ignored.
    """
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            info = {"py_callstack": line, "timestamp": str(int(time.time()))}
            json.dump({"message": {"message": line, "extraInfo": info}}, f)
    except OSError:
        pass


def _quiet_torch_logging() -> None:
    for name, logger in list(logging.root.manager.loggerDict.items()):
        if isinstance(logger, logging.Logger) and name.startswith(_TORCH_LOGGERS):
            logger.setLevel(logging.CRITICAL)


def _threads_per_process(nproc: int) -> None:
    """Split the cores between the workers (torchrun instead sets 1 thread each, with a banner), unless set."""
    if "OMP_NUM_THREADS" not in os.environ:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        os.environ["OMP_NUM_THREADS"] = str(max(1, cores // nproc))


def launch(nproc: int, train_argv: list[str]) -> int:
    """Run ``python -m attnzoo train *train_argv`` in ``nproc`` processes on this machine; the exit status."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    _threads_per_process(nproc)
    _quiet_torch_logging()
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",
        max_restarts=0,
        monitor_interval=0.1,
    )
    try:
        elastic_launch(config, sys.executable)("-m", "attnzoo", "train", *train_argv)
    except ChildFailedError as e:
        return _report(e)
    except SignalException as e:
        # the agent passed the signal on to the workers, which checkpoint and stop (continue with --resume)
        return 128 + int(e.sigval)
    return 0


def _own_line(failure: ProcessFailure) -> str:
    """The line a worker printed and recorded (:func:`record_error_line`), or ``""``."""
    message = failure.message
    text = message.get("message", "") if isinstance(message, dict) else ""
    return text if isinstance(text, str) and text.startswith("attnzoo ") else ""


def _report(e: ChildFailedError) -> int:
    """Print one line for the failed worker unless it printed its own; its exit status.

    The worker that reported an error is the culprit, not the others the agent then stopped with SIGTERM (their
    failures can carry the same second as timestamp, so torchelastic's "first failure" may name one of those).
    """
    rank, failure = min(
        e.failures.items(), key=lambda kv: (not _own_line(kv[1]), kv[1].exitcode < 0, kv[1].timestamp, kv[0])
    )
    code = failure.exitcode if failure.exitcode > 0 else 128 + (-failure.exitcode or signal.SIGTERM)
    if _own_line(failure):
        return code  # already on stderr
    how = (
        f"was stopped by signal {failure.signal_name()}"
        if failure.exitcode < 0
        else f"exited with status {failure.exitcode}"
    )
    print(
        f"attnzoo train: error: process rank {rank} (pid {failure.pid}) {how} without an error message "
        "(its output above says more; `attnzoo --debug train ...` shows a traceback)",
        file=sys.stderr,
    )
    return code
