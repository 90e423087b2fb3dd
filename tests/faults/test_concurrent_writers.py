"""One writer per run directory: a second real process on the same directory fails at once, names the first and
writes nothing; readers share; the lock of a killed process is free again."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from attnzoo._lock import LOCK_NAME, DirectoryLocked, DirLock

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}
TINY_VIT = [
    "--model_options.dim=16",
    "--model_options.depth=1",
    "--model_options.heads=2",
    "--model_options.mlp_dim=32",
]


def _train_cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "attnzoo", "train", "digits_vit_tiny", "--out", str(out), "--no-progress"] + [
        *TINY_VIT,
        *extra,
    ]


def _rows(run: Path) -> list[tuple[int, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return [(int(r["step"]), r["split"]) for r in csv.DictReader(f)]


def _holder(directory: Path, *, mode: str = "exclusive") -> subprocess.Popen:
    """Another process that takes the lock of ``directory`` and keeps it until killed (prints 'ready' first)."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from attnzoo._lock import DirLock
        DirLock({str(directory)!r}, mode={mode!r}).acquire()
        print("ready", flush=True)
        time.sleep(600)
        """
    )
    p = subprocess.Popen([sys.executable, "-c", code], env=ENV, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.kill()
    p.wait(timeout=30)


@pytest.mark.slow  # three real training processes
def test_second_train_on_one_out_fails_cleanly_and_the_first_run_is_intact(tmp_path):
    run = tmp_path / "run"
    first = subprocess.Popen(
        _train_cmd(run, "--steps=100000", "--ckpt_every=100000", "--eval_every=100000", "--log_every=1", "--lr=0.001"),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.time() + 120
        while not ((run / "metrics.csv").is_file() and len(_rows(run)) >= 2):
            assert time.time() < deadline and first.poll() is None, first.communicate()[1]
            time.sleep(0.2)
        before = sorted(p.relative_to(run) for p in run.rglob("*") if "metrics" not in p.name)
        for extra in (["--resume"], ["--overwrite"]):  # whatever the flags
            second = subprocess.run(
                _train_cmd(run, "--steps=5", "--lr=0.5", *extra), env=ENV, capture_output=True, text=True, timeout=120
            )
            assert second.returncode == 1, second.stderr
            lines = [line for line in second.stderr.splitlines() if "error" in line]
            assert len(lines) == 1, second.stderr
            assert f"pid {first.pid}" in lines[0] and "attnzoo train digits_vit_tiny --out" in lines[0], lines[0]
            assert f"run directory {run} is in use" in lines[0]
        # nothing of the second process's run was written: the first one's config, files and rows are intact
        assert yaml.safe_load((run / "config.yaml").read_text())["lr"] == 0.001
        after = sorted(p.relative_to(run) for p in run.rglob("*") if "metrics" not in p.name)
        assert set(before) <= set(after), "the second process deleted files of the first"
        first.send_signal(signal.SIGINT)
        _, err = first.communicate(timeout=60)
    finally:
        _stop(first)
    assert first.returncode == 130, err
    steps = [s for s, split in _rows(run) if split == "train"]
    assert steps == list(range(1, len(steps) + 1)), "rows of two runs mixed or repeated"


def test_reproduce_refuses_an_out_another_process_holds_and_writes_nothing(tmp_path, capsys):
    from attnzoo.reproduce import main

    out = tmp_path / "rep"
    holder = _holder(out)
    try:
        assert main(["--budget", "smoke", "--out", str(out), "--only", "probes", "--no-progress"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"reproduce directory {out} is in use by pid {holder.pid}" in err[0], err
        assert "python -c" in err[0]
        assert sorted(p.name for p in out.iterdir()) == [LOCK_NAME], "a refused run wrote into the directory"
    finally:
        _stop(holder)


def test_train_in_process_refused_while_another_process_holds_the_run(tmp_path):
    from attnzoo.train import cli as train_cli

    run = tmp_path / "run"
    holder = _holder(run)
    try:
        with pytest.raises(DirectoryLocked, match=f"in use by pid {holder.pid}"):
            from attnzoo.train.config import load_config
            from attnzoo.train.trainer import train

            train(load_config("digits_vit_tiny", {"steps": 1}), run, progress=False)
        assert train_cli.main(["digits_vit_tiny", "--out", str(run), "--steps=1", "--no-progress"]) == 1
        assert sorted(p.name for p in run.iterdir()) == [LOCK_NAME]
    finally:
        _stop(holder)


def test_readers_share_and_exclude_writers(tmp_path):
    d = tmp_path / "run"
    d.mkdir()
    reader = _holder(d, mode="shared")
    try:
        with DirLock(d, mode="shared"):  # a second reader is fine
            pass
        with pytest.raises(DirectoryLocked, match="is being read by another process"):
            DirLock(d).acquire()
    finally:
        _stop(reader)
    writer = _holder(d)
    try:
        with pytest.raises(DirectoryLocked, match=f"is being written by pid {writer.pid}"):
            DirLock(d, mode="shared").acquire()
    finally:
        _stop(writer)


def test_a_reader_makes_no_lock_file_in_a_directory_that_is_no_run(tmp_path, capsys):
    from attnzoo.train import eval_cli

    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("x")
    assert eval_cli.main([str(d)]) == 2
    assert "is not an attnzoo run directory" in capsys.readouterr().err
    assert [p.name for p in d.iterdir()] == ["notes.txt"]


def test_eval_and_generate_refuse_a_run_being_written(tmp_path, capsys):
    from attnzoo.train import eval_cli, generate_cli

    run = tmp_path / "run"
    holder = _holder(run)
    try:
        assert eval_cli.main([str(run)]) == 2
        assert generate_cli.main([str(run)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 2 and all(f"is being written by pid {holder.pid}" in line for line in err), err
    finally:
        _stop(holder)


def test_the_lock_of_a_killed_process_is_free_again(tmp_path):
    d = tmp_path / "run"
    holder = _holder(d)
    with pytest.raises(DirectoryLocked):
        DirLock(d).acquire()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait(timeout=30)
    with DirLock(d) as lock:  # the kernel dropped the dead process's flock: no stale lock to clean by hand
        assert lock.held and f"pid={os.getpid()}" in (d / LOCK_NAME).read_text()


def test_a_lock_that_created_its_directory_leaves_nothing_behind(tmp_path):
    d = tmp_path / "new" / "run"
    with DirLock(d):
        assert (d / LOCK_NAME).is_file()
    assert not d.exists()
    d.mkdir(parents=True)
    (d / "mine.txt").write_text("x")
    with DirLock(d):
        pass
    assert (d / "mine.txt").read_text() == "x" and (d / LOCK_NAME).is_file()  # an existing directory: file kept


def test_torchrun_ranks_other_than_0_print_nothing_for_shared_errors(monkeypatch, capsys):
    from attnzoo.train import cli as train_cli
    from attnzoo.train.config import ConfigError

    monkeypatch.setenv("RANK", "1")
    assert train_cli._fail(DirectoryLocked("run directory x is in use by pid 1"), 1, "x") == 1
    assert train_cli._fail(ConfigError("--out x already holds a run"), 2, "x") == 2
    assert capsys.readouterr().err == ""
    assert train_cli._fail(OSError(5, "Input/output error"), 1, "x") == 1  # a rank's own fault is still shown
    assert "error (rank 1): OSError" in capsys.readouterr().err
