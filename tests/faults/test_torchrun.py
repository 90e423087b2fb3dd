"""What a user sees when a distributed run fails: real processes (2 ranks, CPU / gloo).

``attnzoo train --nproc-per-node 2`` prints the worker's one line and nothing else; plain ``torchrun`` still ends
with its own launcher's ``ChildFailedError`` traceback (torchrun re-raises it by design), but its summary names our
line instead of a link, and no traceback of attnzoo's code is shown.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from attnzoo._lock import LOCK_NAME

sys.path.insert(0, str(Path(__file__).parent))
from test_concurrent_writers import ENV, TINY_VIT, _holder, _stop  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

ENV_SRC = {**ENV, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2] / "src"), ENV.get("PYTHONPATH", "")])}
ATTNZOO_FRAME = re.compile(r'File "[^"]*[/\\]attnzoo[/\\]')  # a traceback frame in attnzoo's code


# a log record of torch's launcher ("W1127 04:31:07.123000 4242 ...": level, date, time), which it writes to the
# same stderr while a rank exits (e.g. "Sending process ... closing signal SIGTERM") and which may share a line
TORCH_LOG = re.compile(r"\[?[DIWEF]\d{4} \d\d:\d\d:\d\d")


def _error_lines(stderr: str) -> list[str]:
    """attnzoo's error lines in ``stderr``, each cut where a log record of torch's launcher joins it."""
    ours, lines = "attnzoo train: error", []
    for line in stderr.splitlines():
        if TORCH_LOG.match(line) and line.find(ours) > 0:  # a record, then our line
            line = line[line.find(ours) :]
        if line.startswith(ours):
            lines.append(TORCH_LOG.split(line)[0].rstrip())
    return lines


def test_error_lines_ignore_torch_launcher_records_on_the_same_line():
    ours = "attnzoo train: error: lr='abc' has type str; expected float"
    record = "W1127 04:31:07.123000 4242 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 7"
    assert _error_lines(f"{record}\n{ours}{record}\n{record}{ours}\n  traceback : {ours}\nother") == [ours, ours]


@pytest.mark.slow  # two training processes and torch's launcher
def test_launcher_prints_one_line_for_a_locked_run_and_writes_nothing(tmp_path):
    run = tmp_path / "run"
    holder = _holder(run)
    try:
        cmd = [sys.executable, "-m", "attnzoo", "train", "digits_vit_tiny", "--out", str(run), "--no-progress"]
        p = subprocess.run(
            [*cmd, *TINY_VIT, "--steps=2", "--nproc-per-node", "2"],
            env=ENV_SRC,
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        _stop(holder)
    lines = _error_lines(p.stderr)
    assert p.returncode == 1, p.stderr
    assert len(lines) == 1 and f"pid {holder.pid} on" in lines[0], p.stderr
    assert "Traceback" not in p.stderr and "ChildFailedError" not in p.stderr and "FAILED" not in p.stderr, p.stderr
    assert [f.name for f in run.iterdir()] == [LOCK_NAME]  # nothing of a run was written


@pytest.mark.slow
def test_plain_torchrun_summary_names_our_line_and_shows_no_traceback_of_ours(tmp_path):
    run = tmp_path / "run"
    p = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "-m", "attnzoo", "train"]
        + ["digits_vit_tiny"]
        + ["--out", str(run), "--no-progress", "--lr=abc", *TINY_VIT],
        env=ENV_SRC,
        capture_output=True,
        text=True,
        timeout=300,
    )
    expected = "attnzoo train: error: lr='abc' has type str; expected float"
    assert p.returncode != 0
    assert _error_lines(p.stderr) == [expected], p.stderr  # printed once, by rank 0
    assert f"traceback : {expected}" in p.stderr, p.stderr  # torchrun's summary quotes it
    assert "To enable traceback" not in p.stderr.split("Root Cause")[-1], p.stderr
    assert not ATTNZOO_FRAME.search(p.stderr), p.stderr
    assert not run.exists()  # a bad config writes nothing


def test_launcher_names_a_worker_that_died_without_a_message(tmp_path, capsys):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from attnzoo.train.launch import _report

    killed = ProcessFailure(local_rank=1, pid=4242, exitcode=-9, error_file=str(tmp_path / "missing.json"))
    assert _report(ChildFailedError("attnzoo", {1: killed})) == 128 + 9
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnzoo train: error: process rank 1 (pid 4242) was stopped by signal SIGKILL"), err
    assert len(err.splitlines()) == 1


def test_launcher_stays_quiet_when_the_worker_printed_its_line(tmp_path, monkeypatch, capsys):
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from attnzoo.train.launch import _report, record_error_line

    error_file = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(error_file))
    record_error_line("attnzoo train: error: --out x already holds a run")
    failed = ProcessFailure(local_rank=0, pid=7, exitcode=2, error_file=str(error_file))
    assert _report(ChildFailedError("attnzoo", {0: failed})) == 2
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "argv, nproc, rest",
    [
        (["p", "--nproc-per-node", "2", "--steps=3"], 2, ["p", "--steps=3"]),
        (["p", "--nproc_per_node=4"], 4, ["p"]),
        (["p", "--steps=3"], None, ["p", "--steps=3"]),
    ],
)
def test_nproc_option_is_taken_out_of_the_workers_arguments(argv, nproc, rest):
    from attnzoo.train.cli import _take_nproc

    assert _take_nproc(argv) == (nproc, rest)


@pytest.mark.parametrize("bad", [["--nproc-per-node"], ["--nproc-per-node=0"], ["--nproc-per-node", "two"]])
def test_a_bad_nproc_is_one_line(bad, capsys):
    from attnzoo.train.cli import main

    assert main(["digits_vit_tiny", *bad]) == 2
    err = capsys.readouterr().err
    assert len(_error_lines(err)) == 1 and "--nproc-per-node" in err
