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
    assert err[0].startswith("attnzoo train: error: could not write checkpoint step 2 (")
    assert "No space left on device" in err[0]
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
    from attnzoo.compare.store import Step
    from attnzoo.reproduce import runner

    def boom(ctx, step):
        raise ValueError("diverged")

    steps = [
        Step("probes/a", "probes", {"k": 1}, boom),
        Step("probes/b", "probes", {"k": 2}, lambda ctx, step: {"v": 2.0}),
        Step("probes/c", "probes", {"k": 3}, lambda ctx, step: {"v": 3.0}),
    ]
    monkeypatch.setattr(runner, "plan", lambda budget_name, seed, settings=(): ({}, steps))
    monkeypatch.setattr(runner, "machine_description", lambda device: {})
    return runner


def test_reproduce_disk_full_lists_every_failure_and_the_continue_command(tmp_path, monkeypatch, capsys):
    from attnzoo.compare import store
    from attnzoo.reproduce import ReproduceError

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


# ---- a real full disk: a tiny tmpfs (where this machine lets the tests mount one) -----------------------------
TINY_RUN = [
    "digits_vit_tiny",
    "--no-progress",
    "--model_options.dim=16",
    "--model_options.depth=1",
    "--model_options.heads=2",
    "--model_options.mlp_dim=32",
    "--warmup_steps=1",
    "--log_every=1",
]
PAGE = 4096


def _can_mount() -> bool:
    """Whether this process may mount a tmpfs (root, or CAP_SYS_ADMIN); tried once, on a scratch directory.

    ``ATTNZOO_TEST_NO_MOUNT=1`` answers no, to run the injected variant on a machine that could mount.
    """
    import shutil
    import subprocess
    import tempfile

    if os.environ.get("ATTNZOO_TEST_NO_MOUNT") or sys.platform != "linux" or shutil.which("mount") is None:
        return False
    d = tempfile.mkdtemp(prefix="attnzoo-mount-probe-")
    try:
        ok = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", d], capture_output=True).returncode == 0
        if ok:
            subprocess.run(["umount", d], check=True)
        return ok
    finally:
        os.rmdir(d)


def _pages(directory: Path, skip=()) -> int:
    """Bytes ``directory``'s files take on a tmpfs (whole pages), leaving out the top-level names in ``skip``."""
    return sum(
        -(-p.stat().st_size // PAGE) * PAGE
        for p in directory.rglob("*")
        if p.is_file() and p.relative_to(directory).parts[0] not in skip
    )


class _RealTmpfs:
    """A tmpfs of ``size`` bytes at ``root/disk``."""

    kind = "real tmpfs"

    def __init__(self, root: Path, size: int) -> None:
        import subprocess

        self.dir = root / "disk"
        self.dir.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(self.dir)], check=True)

    def train(self, argv: list[str]) -> tuple[int, str]:
        import subprocess

        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2] / "src")}
        p = subprocess.run([sys.executable, "-m", "attnzoo", "train", *argv], env=env, capture_output=True, text=True)
        return p.returncode, p.stdout + p.stderr

    def free_space(self) -> None:
        import subprocess

        subprocess.run(["mount", "-o", "remount,size=64m", str(self.dir)], check=True)  # as a user would free some

    def close(self) -> None:
        import subprocess

        subprocess.run(["umount", str(self.dir)], check=True)


class _InjectedFull:
    """Where mounting is not allowed: ENOSPC injected into the second checkpoint's tensor files, in-process."""

    kind = "injected ENOSPC"

    def __init__(self, root: Path, every: int, monkeypatch, capsys) -> None:
        self.dir, self.every, self.mp, self.capsys = root / "disk", every, monkeypatch, capsys
        self.dir.mkdir()
        self.full = True

    def train(self, argv: list[str]) -> tuple[int, str]:
        from attnzoo.train import cli

        real = ckpt_mod.save_file

        def save(tensors, path, *a, **kw):
            if self.full and f".tmp_step_{2 * self.every:08d}" in str(path):
                _full()
            return real(tensors, path, *a, **kw)

        with self.mp.context() as m:
            m.setattr(ckpt_mod, "save_file", save)
            rc = cli.main(argv)
        out = self.capsys.readouterr()
        return rc, out.out + out.err

    def free_space(self) -> None:
        self.full = False

    def close(self) -> None:
        pass


DISK_KIND = "real tmpfs" if _can_mount() else "injected ENOSPC"


@pytest.fixture(params=[DISK_KIND])
def small_disk(request, tmp_path, monkeypatch, capsys):
    """The first checkpoint fits, the second does not: a real tmpfs where mounting works, else injected ENOSPC.

    The test id says which one ran (``[real tmpfs]`` or ``[injected ENOSPC]``), and so does every assertion message.
    """
    every = 6
    if request.param == "real tmpfs":
        measured = tmp_path / "measured"  # the same run on the ordinary disk, to size the tmpfs
        train(load_config("digits_vit_tiny", _tiny_overrides(every, steps=every)), measured, progress=False)
        ckpt = _pages(measured / "checkpoints" / f"step_{every:08d}")
        disk = _RealTmpfs(tmp_path, _pages(measured, skip=("model", "final.json")) + ckpt // 2)
    else:
        disk = _InjectedFull(tmp_path, every, monkeypatch, capsys)
    disk.every = every
    yield disk
    disk.close()


def _tiny_overrides(every: int, steps: int) -> dict:
    from attnzoo.train.config import parse_overrides

    return parse_overrides([*TINY_RUN[2:], f"--steps={steps}", f"--ckpt_every={every}", f"--eval_every={every}"])


@pytest.mark.slow  # three short training processes
def test_train_on_a_full_disk_names_the_checkpoint_keeps_the_previous_and_continues(small_disk):
    disk, every = small_disk, small_disk.every
    run = disk.dir / "run"
    rc, err = disk.train([*TINY_RUN, "--out", str(run), f"--steps={2 * every}", f"--ckpt_every={every}"])
    why = f"[{disk.kind}] {err}"
    lines = [line for line in err.splitlines() if line.startswith("attnzoo train: error")]
    assert rc == 1 and len(lines) == 1, why
    assert f"could not write checkpoint step {2 * every} ({run / 'checkpoints'}" in lines[0], why  # names the file
    assert "No space left on device" in lines[0], why
    ckpts = run / "checkpoints"
    assert latest_checkpoint(ckpts).name == f"step_{every:08d}" and ckpt_mod.verify_checkpoint(latest_checkpoint(ckpts))

    disk.free_space()
    continue_cmd = lines[0].split("continue with: attnzoo train ")[1].split()
    assert continue_cmd == ["--resume", "--out", str(run)], why
    rc, err = disk.train([*continue_cmd, "--no-progress"])
    assert rc == 0 and f"attnzoo train: done at step {2 * every}" in err, f"[{disk.kind}] {err}"
    assert latest_checkpoint(ckpts).name == f"step_{2 * every:08d}" and (run / "final.json").is_file(), disk.kind
    leftovers = [p.name for p in run.rglob("*") if p.name.startswith(".tmp") or p.name.endswith(".tmp")]
    assert leftovers == [], f"[{disk.kind}] temporary files left: {leftovers}"
    train_steps = [s for s, split in _rows(run) if split == "train"]
    assert train_steps == [str(i) for i in range(1, 2 * every + 1)], disk.kind  # no row lost or doubled


@pytest.mark.parametrize("kind", [DISK_KIND])
def test_reproduce_on_a_full_disk_names_the_step_and_continues(kind, tmp_path, monkeypatch, capsys):
    """Three steps: one fails by itself (once), one is stored, one does not fit; freeing space and running the
    printed command computes only what is missing and writes report.md together with results.json."""
    from attnzoo.compare import store
    from attnzoo.compare.store import Step
    from attnzoo.reproduce import ReproduceError, runner

    calls = {"a": 0, "b": 0, "c": 0}

    def step_fn(name, value, fail_once=False):
        def fn(ctx, step):
            calls[name] += 1
            if fail_once and calls[name] == 1:
                raise ValueError("diverged")
            return {"v": value}

        return fn

    big = [0.123456789] * 12000  # ~150 kB of JSON: more than the 64 kB disk holds
    steps = [
        Step(f"probes/{n}", "probes", {"k": i}, step_fn(n, v, n == "a"))
        for i, (n, v) in enumerate([("a", 1.0), ("b", 2.0), ("c", big)])
    ]
    budget = runner.plan("smoke", 0)[0]
    monkeypatch.setattr(runner, "plan", lambda budget_name, seed, settings=(): (budget, steps))
    monkeypatch.setattr(runner, "machine_description", lambda device: {})
    disk = _RealTmpfs(tmp_path, 64 * 1024) if kind == "real tmpfs" else None
    state = {"full": True}
    if disk is None:
        real = store.write_json

        def full_for_c(path, payload, **kw):
            if state["full"] and Path(path).name == "c.json":
                _full()
            return real(path, payload, **kw)

        monkeypatch.setattr(store, "write_json", full_for_c)
    try:
        out = (disk.dir if disk else tmp_path) / "rep"
        with pytest.raises(ReproduceError) as e:
            runner.run(out, "smoke", only="probes", progress=False)
        msg = str(e.value)
        assert f"could not write the result of step probes/c ({out / 'steps' / 'probes' / 'c.json'})" in msg, kind
        assert "No space left on device" in msg and "failed: probes/a: ValueError: diverged" in capsys.readouterr().err
        assert not (out / "report.md").exists() and not (out / "results.json").exists(), kind
        continue_cmd = msg.split("then: attnzoo reproduce ")[1].split()
        assert continue_cmd == ["--budget", "smoke", "--seed", "0", "--out", str(out), "--only", "probes"], msg
        if disk:
            disk.free_space()
        state["full"] = False
        runner.run(out, "smoke", only="probes", progress=False)  # what the printed command runs
        assert calls == {"a": 2, "b": 1, "c": 2}, f"[{kind}] b was stored and is not computed again: {calls}"
        assert (out / "report.md").is_file() and (out / "results.json").is_file(), kind
        assert [p.name for p in out.rglob("*") if ".tmp" in p.name] == [], kind
    finally:
        if disk:
            disk.close()
