"""The training loop: loss goes down per task family, resume is bit-exact, the run directory is safe,
checkpoints are atomic, and 2-process DDP (gloo) equals 1 process with the same global batch."""

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnzoo.train.checkpoint import latest_checkpoint
from attnzoo.train.config import ConfigError, load_config
from attnzoo.train.run_dir import RUN_MARKER, foreign_run_files
from attnzoo.train.trainer import train

sys.path.insert(0, str(Path(__file__).parent))
from tiny_models import tiny_factory  # noqa: E402

HERE = Path(__file__).parent


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _cfg(**kw):
    base = dict(
        task="digits",
        steps=20,
        batch_size=32,
        lr=3e-3,
        eval_every=10,
        log_every=1,
        ckpt_every=5,
        warmup_steps=2,
        seed=3,
    )
    return load_config(None, {**base, **kw})


def _train_losses(out: Path) -> list[tuple[str, str]]:
    with open(out / "metrics.csv", newline="") as f:
        return [(r["step"], r["loss"]) for r in csv.DictReader(f) if r["split"] == "train"]


@pytest.mark.parametrize(
    "task, opts, extra",
    [
        ("digits", {}, {"optimizer": "lion", "lr": 1e-3}),
        ("lra_image", {"dataset": "digits"}, {"lr": 5e-2, "schedule": "constant"}),
        ("lra_retrieval", {"seq_len": 32, "n_train": 64, "n_val": 16}, {"lr": 3e-2, "schedule": "constant"}),
        ("shakespeare_char", {"block_size": 16}, {"lr": 3e-2, "schedule": "linear", "eval_batches": 4}),
        ("icl_linear", {"dim": 2, "n_points": 31}, {"lr": 0.3, "schedule": "inverse_sqrt", "warmup_steps": 5}),
    ],
)
def test_loss_decreases_for_each_task_family(tmp_path, task, opts, extra):
    cfg = _cfg(task=task, task_options=opts, steps=40, eval_every=40, **extra)
    res = train(cfg, tmp_path / "run", model_factory=tiny_factory, progress=False)
    losses = [loss for _, loss in res.train_losses]
    assert len(losses) == 40
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert last < 0.9 * first, (first, last)
    assert "loss" in res.final_metrics and json.loads((tmp_path / "run" / "final.json").read_text())["step"] == 40
    assert foreign_run_files(tmp_path / "run") == []  # --overwrite knows every file a run writes


def test_resume_after_signal_is_bit_exact(tmp_path):
    # dropout makes the run depend on the RNG state, which the checkpoint must restore
    cfg = _cfg(model_options={"dropout": 0.2})
    full = train(cfg, tmp_path / "a", model_factory=tiny_factory, progress=False)

    def kill_at_13(step, loss):
        if step == 13:
            os.kill(os.getpid(), signal.SIGTERM)

    part = train(cfg, tmp_path / "b", model_factory=tiny_factory, progress=False, callback=kill_at_13)
    assert part.interrupted and part.signal == signal.SIGTERM and part.step == 13
    assert latest_checkpoint(tmp_path / "b" / "checkpoints").name == "step_00000013"
    # a hard kill can leave log rows past the checkpoint: they must be dropped on resume
    with open(tmp_path / "b" / "metrics.csv", "a") as f:
        f.write("14,train,0.1,99.0,,,,\n")
    rest = train(None, tmp_path / "b", resume=True, model_factory=tiny_factory, progress=False)
    assert not rest.interrupted and rest.step == 20
    assert _train_losses(tmp_path / "a") == _train_losses(tmp_path / "b")
    wa = load_file(str(latest_checkpoint(tmp_path / "a" / "checkpoints") / "model.safetensors"))
    wb = load_file(str(latest_checkpoint(tmp_path / "b" / "checkpoints") / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert full.final_metrics == rest.final_metrics


def test_resume_of_a_finished_run_keeps_its_final_metrics(tmp_path):
    done = train(_cfg(steps=5, eval_every=5), tmp_path / "f", model_factory=tiny_factory, progress=False)
    before = json.loads((tmp_path / "f" / "final.json").read_text())
    again = train(None, tmp_path / "f", resume=True, model_factory=tiny_factory, progress=False)
    after = json.loads((tmp_path / "f" / "final.json").read_text())
    assert again.step == 5 and after == before and after["val"] == done.final_metrics and after["val"]["loss"] > 0


def test_resume_refuses_a_different_config(tmp_path):
    train(_cfg(steps=4), tmp_path / "r", model_factory=tiny_factory, progress=False)
    with pytest.raises(ConfigError, match=r"lr: 0\.003 -> 0\.1"):
        train(_cfg(steps=4, lr=0.1), tmp_path / "r", resume=True, model_factory=tiny_factory, progress=False)
    more = train(_cfg(steps=6), tmp_path / "r", resume=True, model_factory=tiny_factory, progress=False)
    assert more.step == 6 and [s for s, _ in _train_losses(tmp_path / "r")] == [str(i) for i in range(1, 7)]


def test_output_directory_is_never_silently_overwritten(tmp_path):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("precious")
    for flags in ({}, {"overwrite": True}, {"resume": True}):
        with pytest.raises(ConfigError, match="not an attnzoo run"):
            train(_cfg(steps=2), foreign, model_factory=tiny_factory, progress=False, **flags)
    assert os.listdir(foreign) == ["thesis.tex"]

    run = tmp_path / "run"
    train(_cfg(steps=2), run, model_factory=tiny_factory, progress=False)
    assert (run / RUN_MARKER).is_file()
    with pytest.raises(ConfigError, match="pass --resume to continue it or --overwrite"):
        train(_cfg(steps=2), run, model_factory=tiny_factory, progress=False)
    with pytest.raises(ConfigError, match="contradict"):
        train(_cfg(steps=2), run, model_factory=tiny_factory, progress=False, resume=True, overwrite=True)
    # --overwrite deletes only what attnzoo wrote: with the user's files there it refuses, listing them
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    (run / "notes.txt").write_text("mine")
    (run / "checkpoints" / "best_by_hand").mkdir()
    (run / "checkpoints" / "step_00000002" / "eval.json").write_text("{}")
    with pytest.raises(
        ConfigError,
        match=r"also holds files attnzoo did not write: checkpoints/best_by_hand, "
        r"checkpoints/step_00000002/eval.json, notes.txt\. --overwrite deletes only",
    ):
        train(_cfg(steps=3), run, model_factory=tiny_factory, progress=False, overwrite=True)
    (run / "notes.txt").unlink()
    (run / "checkpoints" / "best_by_hand").rmdir()
    (run / "checkpoints" / "step_00000002" / "eval.json").unlink()
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before  # nothing was deleted
    # the leftovers of writes a kill interrupted are attnzoo's own
    (run / ".final.json.k2j4_x.tmp").write_text("{")
    (run / "checkpoints" / ".tmp_step_00000003").mkdir()
    (run / "checkpoints" / ".tmp_step_00000003" / "rng_rank0.safetensors").write_bytes(b"")
    train(_cfg(steps=3), run, model_factory=tiny_factory, progress=False, overwrite=True)
    assert len(_train_losses(run)) == 3 and not (run / ".final.json.k2j4_x.tmp").exists()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step_00000003"]
    # --resume on an empty directory starts the run, so one command serves launch and restarts
    res = train(_cfg(steps=2), tmp_path / "fresh", model_factory=tiny_factory, progress=False, resume=True)
    assert res.step == 2


def test_checkpoints_are_pickle_free_and_half_written_ones_ignored(tmp_path):
    run = tmp_path / "run"
    train(_cfg(steps=10, ckpt_every=5, keep_checkpoints=1), run, model_factory=tiny_factory, progress=False)
    ck = run / "checkpoints"
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_00000010"]
    files = sorted(p.name for p in (ck / "step_00000010").iterdir())
    assert files == [
        "manifest.json",
        "model.safetensors",
        "optimizer.safetensors",
        "rng_rank0.safetensors",
        "state.json",
    ]
    state = json.loads((ck / "step_00000010" / "state.json").read_text())
    assert state["step"] == 10 and state["optimizer"]["param_groups"][0]["betas"] == [0.9, 0.999]
    # a crash while writing leaves only a hidden temporary directory, never picked up
    (ck / ".tmp_step_00000015").mkdir()
    (ck / "latest").unlink()
    assert latest_checkpoint(ck).name == "step_00000010"


@pytest.fixture
def ddp_serial():
    """One torchrun job at a time: under pytest-xdist the two DDP tests otherwise overlap on a 2-core machine, and
    one of the four gloo ranks was seen aborting ("terminate called without an active exception") when they did.
    The abort was seen once more with the jobs serialised, at teardown after the run's files were all written:
    :func:`_torchrun` runs such a job once more."""
    import fcntl
    import tempfile

    with open(os.path.join(tempfile.gettempdir(), "attnzoo-ddp-tests.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


#: what a gloo rank prints when it aborts at teardown: seen about once in ten full runs, after every step, checkpoint
#: and final.json of the run were written (both ranks had passed the trainer's closing barrier)
_TEARDOWN_ABORT = "terminate called without an active exception"


def _torchrun(cmd: list[str], env: dict, outputs: list) -> subprocess.CompletedProcess:
    """Run a torchrun job; when a rank aborted with the gloo teardown signature, run it once more from clean
    ``outputs`` (a second abort, or any other failure, is returned as it is and fails the test)."""
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    if proc.returncode != 0 and _TEARDOWN_ABORT in proc.stderr:
        for out in outputs:
            shutil.rmtree(out, ignore_errors=True)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    return proc


def test_two_process_ddp_equals_one_process(tmp_path, ddp_serial):
    script = tmp_path / "ddp_run.py"
    script.write_text(
        "import sys, torch\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "torch.set_num_threads(1)\n"
        "from tiny_models import tiny_factory\n"
        "from attnzoo.train.config import load_config\n"
        "from attnzoo.train.trainer import train\n"
        "cfg = load_config(None, dict(task='digits', steps=8, batch_size=32, lr=3e-3, eval_every=8, log_every=1,"
        " ckpt_every=4, seed=1))\n"
        "train(cfg, sys.argv[1], model_factory=tiny_factory, progress=False)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        str(tmp_path / "two"),
    ]
    proc = _torchrun(cmd, env, [tmp_path / "two"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    one = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "one")], env=env, capture_output=True, text=True, timeout=240
    )
    assert one.returncode == 0, one.stderr[-3000:]
    l1 = [float(loss) for _, loss in _train_losses(tmp_path / "one")]
    l2 = [float(loss) for _, loss in _train_losses(tmp_path / "two")]
    assert len(l1) == len(l2) == 8
    assert l1 == pytest.approx(l2, rel=1e-5, abs=1e-6)
    w1 = load_file(str(tmp_path / "one" / "checkpoints" / "step_00000008" / "model.safetensors"))
    w2 = load_file(str(tmp_path / "two" / "checkpoints" / "step_00000008" / "model.safetensors"))
    for k in w1:
        torch.testing.assert_close(w1[k], w2[k], rtol=1e-4, atol=1e-5)
    state = json.loads((tmp_path / "two" / "checkpoints" / "step_00000008" / "state.json").read_text())
    assert state["world_size"] == 2
    assert (tmp_path / "two" / "checkpoints" / "step_00000008" / "rng_rank1.safetensors").is_file()


@pytest.mark.slow  # one torchrun launch, three trainings (~15 s on 2 busy cores)
def test_two_process_ddp_resume_logs_what_an_uninterrupted_run_logs(tmp_path, ddp_serial):
    # the first train loss logged after a resume averages losses from before the checkpoint (log_every=3,
    # checkpoint at 4): every rank's part of that window must come back, not rank 0's on every rank
    script = tmp_path / "ddp_resume.py"
    script.write_text(
        "import os, signal, sys, torch\n"
        "import torch.distributed as dist\n"
        f"sys.path.insert(0, {str(HERE)!r})\n"
        "torch.set_num_threads(1)\n"
        "from tiny_models import tiny_factory\n"
        "import attnzoo.train.trainer as trainer\n"
        "from attnzoo.train.config import load_config\n"
        # one process group for the three trainings: re-creating it inside a torchrun worker is unreliable
        "dist.init_process_group('gloo')\n"
        "trainer.shutdown_distributed = lambda: None\n"
        "cfg = load_config(None, dict(task='digits', steps=8, batch_size=32, lr=3e-3, eval_every=8, log_every=3,"
        " ckpt_every=8, seed=1, model_options={'dropout': 0.2}))\n"
        "def stop_at_4(step, loss):\n"
        "    if step == 4 and os.environ['RANK'] == '0':\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "out = sys.argv[1]\n"
        "trainer.train(cfg, out + '/full', model_factory=tiny_factory, progress=False)\n"
        "part = trainer.train(cfg, out + '/part', model_factory=tiny_factory, progress=False, callback=stop_at_4)\n"
        "assert part.interrupted and part.step == 4, part\n"
        "trainer.train(None, out + '/part', resume=True, model_factory=tiny_factory, progress=False)\n"
        "dist.destroy_process_group()\n"
    )
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(script),
        str(tmp_path),
    ]
    proc = _torchrun(cmd, {**os.environ, "OMP_NUM_THREADS": "1"}, [tmp_path / "full", tmp_path / "part"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    state = json.loads((tmp_path / "part" / "checkpoints" / "step_00000004" / "state.json").read_text())
    assert state["world_size"] == 2 and [c for _, c in state["loss_windows"]] == [1, 1]
    assert state["loss_windows"][0] != state["loss_windows"][1]
    full, resumed = _train_losses(tmp_path / "full"), _train_losses(tmp_path / "part")
    assert [s for s, _ in full] == ["3", "6", "8"]
    assert resumed == full  # bit for bit, the step-6 row included
    wa = load_file(str(tmp_path / "full" / "checkpoints" / "step_00000008" / "model.safetensors"))
    wb = load_file(str(tmp_path / "part" / "checkpoints" / "step_00000008" / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_mixed_precision_settings(tmp_path):
    # bf16 autocast also runs on CPU; fp16 needs CUDA's loss scaling and is refused on CPU
    res = train(_cfg(steps=3, amp="bf16"), tmp_path / "bf16", model_factory=tiny_factory, progress=False)
    assert all(torch.isfinite(torch.tensor(loss)) for _, loss in res.train_losses)
    with pytest.raises(ConfigError, match="amp='fp16' needs CUDA"):
        train(_cfg(steps=3, amp="fp16", device="cpu"), tmp_path / "fp16", model_factory=tiny_factory, progress=False)
    assert not (tmp_path / "fp16").exists()
