"""The CLIs with real attnzoo models: SIGINT checkpoints and exits 130, --resume continues, eval and
generate read the run directory."""

import csv
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from attnzoo.train import cli as train_cli
from attnzoo.train import eval_cli, generate_cli
from attnzoo.train.checkpoint import latest_checkpoint

TINY_VIT = [
    "--model_options.dim=16",
    "--model_options.depth=1",
    "--model_options.heads=2",
    "--model_options.mlp_dim=32",
]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _steps(run):
    with open(run / "metrics.csv", newline="") as f:
        return [int(r["step"]) for r in csv.DictReader(f) if r["split"] == "train"]


def test_sigint_checkpoints_then_resume_and_eval(tmp_path, capsys):
    run = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "attnzoo",
        "train",
        "digits_vit_tiny",
        "--out",
        str(run),
        "--steps=100000",
        "--ckpt_every=100000",
        "--eval_every=100000",
        "--log_every=1",
        "--no-progress",
        *TINY_VIT,
    ]
    proc = subprocess.Popen(
        cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            if (run / "metrics.csv").is_file() and len(_steps(run)) >= 3:
                break
            assert proc.poll() is None, proc.communicate()[1]
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "checkpoint saved" in err and "--resume" in err
    stopped = int(latest_checkpoint(run / "checkpoints").name.split("_")[1])
    assert stopped >= 3 and _steps(run) == list(range(1, stopped + 1))

    assert train_cli.main(["--resume", "--out", str(run), f"--steps={stopped + 3}", "--no-progress"]) == 0
    assert _steps(run) == list(range(1, stopped + 4))
    report = tmp_path / "eval.json"
    assert eval_cli.main([str(run), "--json", str(report)]) == 0
    got = json.loads(report.read_text())
    assert got["step"] == stopped + 3 and 0.0 <= got["metrics"]["accuracy"] <= 1.0
    assert "accuracy=" in capsys.readouterr().out
    assert (run / "model" / "config.json").is_file()  # exported with save_pretrained at the end


def test_train_and_generate_language_model(tmp_path, capsys):
    run = tmp_path / "lm"
    args = [
        "shakespeare_gpt2_tiny",
        "--out",
        str(run),
        "--steps=3",
        "--eval_batches=1",
        "--no-progress",
        "--task_options.block_size=16",
        *TINY_VIT[:3],
    ]
    assert train_cli.main(args) == 0
    capsys.readouterr()
    gen = [str(run), "--prompt", "ROMEO:", "--max-new-tokens", "20", "--seed", "5"]
    assert generate_cli.main(gen) == 0
    first = capsys.readouterr().out
    assert first.startswith("ROMEO:") and len(first.rstrip("\n")) >= 26
    assert generate_cli.main(gen) == 0
    assert capsys.readouterr().out == first  # seeded sampling is reproducible
    assert generate_cli.main([str(tmp_path / "nothing")]) == 2


def test_icl_eval_reports_error_per_example_count(tmp_path):
    run = tmp_path / "icl"
    args = [
        "icl_linear_gpt",
        "--out",
        str(run),
        "--steps=2",
        "--no-progress",
        "--batch_size=8",
        "--task_options.dim=4",
        "--task_options.n_points=6",
        "--task_options.n_val=8",
        *TINY_VIT[:3],
    ]
    assert train_cli.main(args) == 0
    report, plot = tmp_path / "icl.json", tmp_path / "icl.png"
    assert eval_cli.main([str(run), "--json", str(report), "--plot", str(plot)]) == 0
    got = json.loads(report.read_text())
    assert len(got["metrics"]["normalized_error_per_position"]) == 6
    ls = got["least_squares_per_position"]
    assert len(ls) == 6 and ls[5] < 1e-6 < ls[0]  # 5 examples determine a 4-d linear function
    assert plot.stat().st_size > 1000
