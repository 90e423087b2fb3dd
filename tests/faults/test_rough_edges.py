"""Rough edges a user hits: each is fixed or says what is going on."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest
import torch
from conftest import require

from attnzoo.train import batches
from attnzoo.train.config import load_config
from attnzoo.train.trainer import train

sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
from tiny_models import tiny_factory  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _cfg(**kw):
    base = dict(task="digits", steps=3, batch_size=32, eval_every=3, log_every=1, ckpt_every=3, seed=0)
    return load_config(None, {**base, **kw})


def test_a_warmup_longer_than_the_run_is_named_and_images_have_no_token_rate(tmp_path, capsys):
    train(_cfg(warmup_steps=3125, lr=1e-3), tmp_path / "run", model_factory=tiny_factory, progress=False)
    err = capsys.readouterr().err
    assert "warmup_steps=3125 is not shorter than steps=3" in err and "only rises to 9.6e-07 of lr=0.001" in err
    with open(tmp_path / "run" / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["split"] == "train"]
    # an image's token count depends on the model's patch size: no made-up tokens/s equal to samples/s
    assert rows and all(r["tokens_per_s"] == "" and float(r["samples_per_s"]) > 0 for r in rows)
    train(_cfg(warmup_steps=1), tmp_path / "quiet", model_factory=tiny_factory, progress=False)
    assert "warmup_steps" not in capsys.readouterr().err


def test_data_loading_workers_are_capped_at_the_usable_cores(monkeypatch, capsys):
    monkeypatch.setattr(batches.os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(batches, "_capped_notice_shown", False)
    assert batches._usable_workers(2) == 2 and capsys.readouterr().err == ""
    assert batches._usable_workers(8) == 2
    assert "num_workers=8 but this process may use 2 CPU core(s)" in capsys.readouterr().err
    assert batches._usable_workers(8) == 2 and capsys.readouterr().err == ""  # the notice once per process


def test_presets_tasks_says_what_val_fraction_none_means(capsys):
    from attnzoo.train import presets_cli

    assert presets_cli.main(["tasks"]) == 0
    assert "val_fraction=None (0.1 when root has no train/ and val/ folders)" in capsys.readouterr().out


def test_generate_prints_no_deprecation_of_attnzoos_own_output(capfd):
    require("transformers")
    from transformers.utils import logging as hf_logging

    from attnzoo.hf import AttnZooCausalLMConfig, AttnZooForCausalLM

    hf_logging.get_logger("transformers.utils.generic").warning_once.cache_clear()  # logged once per process
    cfg = AttnZooCausalLMConfig(dim=16, depth=1, heads=2, vocab_size=11, block_size=32)
    m = AttnZooForCausalLM(cfg).eval()
    out = m.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=3, do_sample=False)
    assert out.shape == (1, 6)
    captured = capfd.readouterr()
    assert "deprecated" not in captured.err + captured.out


@pytest.mark.slow  # a fresh interpreter importing transformers
def test_a_saved_model_loads_without_importing_attnzoo_hf(tmp_path):
    """config.json carries auto_map: transformers asks for trust_remote_code (not for a newer transformers), and
    with it loads attnzoo's own class through the small module saved beside the config."""
    require("transformers")
    import json
    import os
    import subprocess

    from attnzoo.hf import AttnZooCausalLMConfig, AttnZooForCausalLM, AttnZooVisionConfig

    AttnZooForCausalLM(AttnZooCausalLMConfig(dim=16, depth=1, heads=2, vocab_size=11, block_size=32)).save_pretrained(
        tmp_path / "lm"
    )
    assert json.loads((tmp_path / "lm" / "config.json").read_text())["auto_map"] == {
        "AutoConfig": "attnzoo_hf.AttnZooCausalLMConfig",
        "AutoModelForCausalLM": "attnzoo_hf.AttnZooForCausalLM",
    }
    AttnZooVisionConfig(dim=16, depth=1, heads=2).save_pretrained(tmp_path / "vit")
    assert json.loads((tmp_path / "vit" / "config.json").read_text())["auto_map"]["AutoConfig"].endswith(
        "AttnZooVisionConfig"
    )
    code = (
        "import sys\n"
        "from transformers import AutoModelForCausalLM\n"
        "try:\n"
        "    AutoModelForCausalLM.from_pretrained(sys.argv[1])\n"
        "except ValueError as e:\n"
        "    print('REFUSED', ' '.join(str(e).split()))\n"
        "m = AutoModelForCausalLM.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
        "print('LOADED', type(m).__module__, type(m).__name__)\n"
    )
    env = {**os.environ, "HF_HOME": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    res = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "lm")], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert "REFUSED" in res.stdout and "trust_remote_code=True" in res.stdout, res.stdout
    assert "update Transformers" not in res.stdout
    assert "LOADED attnzoo.hf.models AttnZooForCausalLM" in res.stdout
