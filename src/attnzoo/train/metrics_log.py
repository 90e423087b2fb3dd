"""Where a run's numbers go: ``metrics.csv`` (one row per logged step and split), TensorBoard when installed."""

from __future__ import annotations

import csv
import io
import math
import os
import sys
from pathlib import Path
from typing import Any

from attnzoo._io import ReadError, atomic_write_text, write_error
from attnzoo.train.objectives import metric_names

__all__ = ["MetricsLog"]

_TB_NOTICE_SHOWN = False


class MetricsLog:
    """Appends rows to ``out/metrics.csv`` and scalars to TensorBoard; does nothing when not ``enabled``.

    On resume (``resume_step`` given) rows logged after that step are dropped first: a hard kill can leave rows
    newer than the checkpoint, and the resumed run logs those steps again. Every row read back is checked (see
    :meth:`_read_rows`): a damaged one is dropped with a notice naming the file and line, never kept padded.
    """

    def __init__(self, out: Path, kind: str, *, enabled: bool, resume_step: int | None) -> None:
        self.enabled = enabled
        self.fields = ["step", "split", "lr", *metric_names(kind), "samples_per_s", "tokens_per_s", "elapsed_s"]
        self.path = out / "metrics.csv"
        self.tb = None
        if not enabled:
            return
        if resume_step is not None and self.path.is_file():
            rows = [r for r in self._read_rows(resume_step) if int(r["step"]) <= resume_step]
            self._rewrite(rows)
        elif not self.path.is_file():
            self._rewrite([])
        self.tb = _tensorboard_writer(out / "tb")

    def _read_rows(self, resume_step: int) -> list[dict]:
        """The rows of ``metrics.csv`` that are whole and well-formed; the others are dropped with one notice.

        Dropped: rows with NUL bytes or bytes that are not UTF-8, torn rows (too few fields, or the last line
        without its newline), rows whose step, split or numbers do not parse, repeated ``(step, split)`` rows.
        A header that is not a metrics.csv header of this task is a :class:`~attnzoo._io.ReadError`.
        """
        data = self.path.read_bytes()
        if not data.strip():
            print(
                f"attnzoo train: {self.path} is empty; the metrics logged before step {resume_step} are lost "
                "(the checkpoint is not affected); logging continues from there",
                file=sys.stderr,
            )
            return []
        lines = data.split(b"\n")
        complete = data.endswith(b"\n")
        if complete:
            lines = lines[:-1]
        try:
            header = next(csv.reader([lines[0].decode("utf-8").rstrip("\r")]))
        except (UnicodeDecodeError, csv.Error, StopIteration):
            header = []
        if "step" not in header or "split" not in header or not set(header) <= set(self.fields):
            found = lines[0][:120].decode("utf-8", "backslashreplace").rstrip("\r")  # as text, not b'...\r'
            raise ReadError(
                f"{self.path}, line 1: not a metrics.csv header for this task ({found!r}; expected "
                f"{','.join(self.fields)}); move the file away (the run resumes with a new log) or restore it"
            )
        numeric = set(self.fields) - {"step", "split"}
        rows: list[dict] = []
        seen: set[tuple[int, str]] = set()
        dropped: list[str] = []
        for lineno, raw in enumerate(lines[1:], start=2):
            why = None
            if b"\0" in raw:
                why = "NUL bytes"
            elif lineno == len(lines) and not complete:
                why = "torn (no line end)"
            else:
                try:
                    cells = next(csv.reader([raw.decode("utf-8").rstrip("\r")]), [])
                except UnicodeDecodeError:
                    cells, why = [], "not UTF-8"
                except csv.Error as e:
                    cells, why = [], f"unparsable ({e})"
                if why is None and not cells:
                    continue  # a blank line
                if why is None and len(cells) != len(header):
                    why = f"{len(cells)} fields, the header has {len(header)}"
                if why is None:
                    row = dict(zip(header, cells, strict=True))
                    why = _bad_row(row, numeric)
                    if why is None:
                        key = (int(row["step"]), row["split"])
                        if key in seen:
                            why = f"repeats step {key[0]} {key[1]}"
                        else:
                            seen.add(key)
                            rows.append(row)
            if why is not None:
                dropped.append(f"line {lineno}: {why}")
        if dropped:
            shown = "; ".join(dropped[:5]) + (f"; ... ({len(dropped)} in all)" if len(dropped) > 5 else "")
            print(f"attnzoo train: {self.path}: dropped {len(dropped)} damaged row(s): {shown}", file=sys.stderr)
        return rows

    def _rewrite(self, rows: list[dict]) -> None:
        buf = io.StringIO(newline="")
        w = csv.DictWriter(buf, fieldnames=self.fields)
        w.writeheader()
        w.writerows(rows)
        try:
            atomic_write_text(self.path, buf.getvalue())
        except OSError as e:
            raise write_error("metrics.csv", self.path, e) from None

    def log(self, step: int, split: str, values: dict[str, Any]) -> None:
        """One row: the ``values`` that are columns (floats written with ``repr``: every digit kept)."""
        if not self.enabled:
            return
        row = {"step": step, "split": split}
        row.update({k: (repr(float(v)) if isinstance(v, float) else v) for k, v in values.items() if k in self.fields})
        buf = io.StringIO(newline="")
        csv.DictWriter(buf, fieldnames=self.fields).writerow(row)
        data = buf.getvalue().encode("utf-8")
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                size = os.fstat(fd).st_size
                try:
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view) :]
                except OSError:
                    os.ftruncate(fd, size)  # no torn row left behind (the disk may be full)
                    raise
            finally:
                os.close(fd)
        except OSError as e:
            raise write_error(f"metrics.csv (step {step} {split} row)", self.path, e) from None
        if self.tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and math.isfinite(float(v)):
                    self.tb.add_scalar(f"{split}/{k}", float(v), step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _bad_row(row: dict[str, str], numeric: set[str]) -> str | None:
    """Why a metrics.csv row read back is not one the log wrote, or ``None``."""
    step = row["step"]
    if not step.isdigit() or int(step) < 1:
        return f"step {step[:20]!r} is not a positive integer"
    if row["split"] not in ("train", "val"):
        return f"split {row['split'][:20]!r} is neither train nor val"
    for k in numeric:
        v = row.get(k, "")
        if v:
            try:
                float(v)
            except ValueError:
                return f"{k} {v[:20]!r} is not a number"
    return None


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
