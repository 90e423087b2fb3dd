"""Where a run's numbers go: ``metrics.csv`` (one row per logged step and split), TensorBoard when installed."""

from __future__ import annotations

import csv
import io
import math
import sys
from pathlib import Path
from typing import Any

from attnzoo._io import atomic_write_text
from attnzoo.train.objectives import metric_names

__all__ = ["MetricsLog"]

_TB_NOTICE_SHOWN = False


class MetricsLog:
    """Appends rows to ``out/metrics.csv`` and scalars to TensorBoard; does nothing when not ``enabled``.

    On resume (``resume_step`` given) rows logged after that step are dropped first: a hard kill can leave rows
    newer than the checkpoint, and the resumed run logs those steps again.
    """

    def __init__(self, out: Path, kind: str, *, enabled: bool, resume_step: int | None) -> None:
        self.enabled = enabled
        self.fields = ["step", "split", "lr", *metric_names(kind), "samples_per_s", "tokens_per_s", "elapsed_s"]
        self.path = out / "metrics.csv"
        self.tb = None
        if not enabled:
            return
        if resume_step is not None and self.path.is_file():
            with open(self.path, newline="") as f:
                rows = [r for r in csv.DictReader(f) if int(r["step"]) <= resume_step]
            self._rewrite(rows)
        elif not self.path.is_file():
            self._rewrite([])
        self.tb = _tensorboard_writer(out / "tb")

    def _rewrite(self, rows: list[dict]) -> None:
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=self.fields)
        w.writeheader()
        w.writerows(rows)
        atomic_write_text(self.path, buf.getvalue())

    def log(self, step: int, split: str, values: dict[str, Any]) -> None:
        """One row: the ``values`` that are columns (floats written with ``repr``: every digit kept)."""
        if not self.enabled:
            return
        row = {"step": step, "split": split}
        row.update({k: (repr(float(v)) if isinstance(v, float) else v) for k, v in values.items() if k in self.fields})
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, fieldnames=self.fields).writerow(row)
        if self.tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and math.isfinite(float(v)):
                    self.tb.add_scalar(f"{split}/{k}", float(v), step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _tensorboard_writer(directory: Path):
    """A ``SummaryWriter`` into ``directory``, or ``None`` (with a notice, once per process) without tensorboard."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # needs the optional `tensorboard` package

        return SummaryWriter(str(directory))
    except ImportError:
        global _TB_NOTICE_SHOWN
        if not _TB_NOTICE_SHOWN:  # once per process: sweeps and the reproduce runner train many models
            _TB_NOTICE_SHOWN = True
            print(
                "attnzoo train: tensorboard is not installed; logging to metrics.csv only "
                "(pip install 'attnzoo[tensorboard]' to get TensorBoard logs)",
                file=sys.stderr,
            )
        return None
