"""A full disk (``OSError(ENOSPC)`` injected at each write site): the error names the file and what was being
written, what was there before is kept, no temporary is left, and the command that continues works."""

from __future__ import annotations

import csv
import errno
import os
import sys
from pathlib import Path

import pytest

from attnzoo import _io
from attnzoo._io import WriteError, all_or_nothing, atomic_write_text
from attnzoo.train import checkpoint as ckpt_mod
from attnzoo.train import metrics_log
from attnzoo.train import trainer as trainer_mod
from attnzoo.train.checkpoint import latest_checkpoint, list_checkpoints
from attnzoo.train.config import load_config
from attnzoo.train.trainer import train

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from tiny_models import tiny_factory  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _full(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _cfg(**kw):
    base = dict(task="digits", steps=8, batch_size=32, lr=3e-3, eval_every=8, log_every=1, ckpt_every=4, seed=3)
    return load_config(None, {**base, **kw})


def _rows(run: Path) -> list[tuple[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return [(r["step"], r["split"]) for r in csv.DictReader(f)]


def test_atomic_write_names_the_target_and_keeps_it(tmp_path, monkeypatch):
    f = tmp_path / "a.json"
    f.write_text("old")
    monkeypatch.setattr(_io.os, "fsync", _full)
    with pytest.raises(OSError) as e:
        atomic_write_text(f, "new")
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(f)
    assert f.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["a.json"]


def test_checkpoint_write_names_the_step_and_keeps_the_previous_one(tmp_path, monkeypatch):
    run = tmp_path / "run"
    real = ckpt_mod.save_file

    def fail_at_step_8(tensors, path, *a, **kw):
        if ".tmp_step_00000008" in str(path):
            _full()
        return real(tensors, path, *a, **kw)

    monkeypatch.setattr(ckpt_mod, "save_file", fail_at_step_8)
    with pytest.raises(WriteError, match=r"could not write checkpoint step 8 \(.*\): No space left on device") as e:
        train(_cfg(), run, model_factory=tiny_factory, progress=False)
    assert e.value.errno == errno.ENOSPC
    assert latest_checkpoint(run / "checkpoints").name == "step_00000004"  # the previous checkpoint, intact
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_00000004"]  # no .tmp_step
    monkeypatch.setattr(ckpt_mod, "save_file", real)
    res = train(None, run, resume=True, model_factory=tiny_factory, progress=False)  # the continue command works
    assert res.step == 8 and [s for s, split in _rows(run) if split == "train"] == [str(i) for i in range(1, 9)]


def test_metrics_row_write_names_the_file_and_leaves_no_torn_row(tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_write = os.write
    calls = {"n": 0}

    def half_then_full(fd, data):
        if str(os.readlink(f"/proc/self/fd/{fd}")).endswith("metrics.csv"):
            calls["n"] += 1
            if calls["n"] == 6:  # write part of the row, then the disk is full
                real_write(fd, bytes(data[:5]))
                _full()
        return real_write(fd, data)

    monkeypatch.setattr(metrics_log.os, "write", half_then_full)
    with pytest.raises(WriteError, match=r"could not write metrics.csv \(step 6 train row\) \(.*metrics.csv\)"):
        train(_cfg(), run, model_factory=tiny_factory, progress=False)
    monkeypatch.setattr(metrics_log.os, "write", real_write)
    text = (run / "metrics.csv").read_text()
    assert text.endswith("\n") and [s for s, _ in _rows(run)] == ["1", "2", "3", "4", "5"]
    res = train(None, run, resume=True, model_factory=tiny_factory, progress=False)
    assert res.step == 8 and [s for s, split in _rows(run) if split == "train"] == [str(i) for i in range(1, 9)]


def test_final_json_write_names_it_and_resume_writes_it(tmp_path, monkeypatch):
    run = tmp_path / "run"
    monkeypatch.setattr(trainer_mod, "write_json", _full)
    with pytest.raises(WriteError, match=r"could not write final.json \(.*final.json\)"):
        train(_cfg(), run, model_factory=tiny_factory, progress=False)
    monkeypatch.undo()
    assert not (run / "final.json").exists() and list_checkpoints(run / "checkpoints")
    train(None, run, resume=True, model_factory=tiny_factory, progress=False)
    assert (run / "final.json").is_file()


def test_train_cli_prints_one_line_with_the_continue_command(tmp_path, monkeypatch, capsys):
    from attnzoo.train import cli

    run = tmp_path / "run"
    monkeypatch.setattr(ckpt_mod, "save_file", _full)
    rc = cli.main(["digits_vit_tiny", "--out", str(run), "--steps=2", "--no-progress", "--model_options.depth=1"])
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert rc == 1 and len(err) == 1
    assert "could not write checkpoint step 2" in err[0] and "No space left on device" in err[0]
    assert err[0].endswith(f"continue with: attnzoo train --resume --out {run}")


def test_run_config_files_write_is_named(tmp_path, monkeypatch):
    monkeypatch.setattr(_io.os, "fsync", _full)
    with pytest.raises(WriteError, match=r"could not write the run's config files \(.*\.attnzoo-run\)"):
        train(_cfg(), tmp_path / "run", model_factory=tiny_factory, progress=False)


def test_all_or_nothing_restores_every_file(tmp_path):
    a, b, c = tmp_path / "report.md", tmp_path / "report.html", tmp_path / "results.json"
    a.write_text("old md")
    c.write_text("old json")
    with pytest.raises(OSError):
        with all_or_nothing([a, b, c]):
            atomic_write_text(a, "new md")
            atomic_write_text(b, "new html")
            _full()
    assert a.read_text() == "old md" and c.read_text() == "old json" and not b.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md", "results.json"]
    with all_or_nothing([a, b, c]):
        atomic_write_text(a, "new md")
    assert a.read_text() == "new md" and sorted(p.name for p in tmp_path.iterdir()) == [a.name, c.name]


# ---- reproduce ----------------------------------------------------------------------------------------------
def _fake_plan(monkeypatch, tmp_path):
    """A two-section plan of cheap steps: one fails by itself, one more fails to be stored (disk full)."""
    from attnzoo.reproduce import runner
    from attnzoo.reproduce.store import Step

    def boom(ctx, step):
        raise ValueError("diverged")

    steps = [
        Step("probes/a", "probes", {"k": 1}, boom),
        Step("probes/b", "probes", {"k": 2}, lambda ctx, step: {"v": 2.0}),
        Step("probes/c", "probes", {"k": 3}, lambda ctx, step: {"v": 3.0}),
    ]
    monkeypatch.setattr(runner, "plan", lambda budget_name, seed: ({}, steps))
    monkeypatch.setattr(runner, "machine_description", lambda device: {})
    return runner


def test_reproduce_disk_full_lists_every_failure_and_the_continue_command(tmp_path, monkeypatch, capsys):
    from attnzoo.reproduce import ReproduceError, store

    runner = _fake_plan(monkeypatch, tmp_path)
    real = store.write_json

    def full_for_c(path, payload, **kw):
        if Path(path).name == "c.json":
            _full()
        return real(path, payload, **kw)

    monkeypatch.setattr(store, "write_json", full_for_c)
    out = tmp_path / "rep"
    with pytest.raises(ReproduceError) as e:
        runner.run(out, "smoke", only="probes", progress=False)
    msg = str(e.value)
    assert "could not write the result of step probes/c" in msg and str(out / "steps" / "probes" / "c.json") in msg
    assert "No space left on device" in msg and f"--out {out} --only probes" in msg
    assert "failed: probes/a: ValueError: diverged" in capsys.readouterr().err  # the earlier failure, too
    assert (out / "steps" / "probes" / "b.json").is_file() and not list(out.rglob("*.tmp"))


def test_reproduce_report_and_results_are_written_together(tmp_path, monkeypatch):
    from attnzoo.reproduce import ReproduceError, report

    runner = _fake_plan(monkeypatch, tmp_path)
    out = tmp_path / "rep"

    def write_report(out, *args, **kwargs):
        atomic_write_text(out / "report.md", "new")
        atomic_write_text(out / "report.html", "new")
        _full()  # results.json: the disk is full

    monkeypatch.setattr(report, "write_report", write_report)
    out.mkdir()
    with pytest.raises(ReproduceError, match=r"could not write the report .* --out"):
        runner.run(out, "smoke", only="probes", progress=False)
    assert not (out / "report.md").exists() and not (out / "report.html").exists()  # no report without results
