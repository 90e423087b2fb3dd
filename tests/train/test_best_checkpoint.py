"""Best-checkpoint selection (``select_every``): the held-out selection split, the choice of the best step, the
best weights and their validation scores, and a resumed run choosing exactly as an uninterrupted one."""

import csv
import json
import math
import os
import signal

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from attnzoo.data import build_task
from attnzoo.data.tasks import pack_task
from attnzoo.models import from_pretrained
from attnzoo.train.config import ConfigError, load_config
from attnzoo.train.run_dir import foreign_run_files
from attnzoo.train.selection import BestCheckpoint
from attnzoo.train.trainer import evaluate, train

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_selection_split_is_the_training_text_after_train_chars():
    full = build_task("shakespeare_char", block_size=16)
    t = build_task("shakespeare_char", block_size=16, train_chars=50_000, select_chars=5_000)
    assert torch.equal(t.train.tokens, full.train.tokens[:50_000])  # training unchanged by the selection split
    assert torch.equal(t.select.tokens, full.train.tokens[50_000:55_000])  # never trained on, not the val plays
    assert t.select.stride == 16 and torch.equal(t.val.tokens, full.val.tokens)
    assert t.info["select_chars"] == 5_000 and build_task("shakespeare_char", block_size=16).select is None
    packed = pack_task(t)
    assert packed.select is not None and len(packed.select) == len(t.select)


@pytest.mark.parametrize(
    "opts, match",
    [
        ({"select_chars": 1_000}, "select_chars needs train_chars"),
        ({"train_chars": 50_000, "select_chars": 17}, r"select_chars must be an integer in \[block_size \+ 2"),
        ({"train_chars": 50_000, "select_chars": 10**9}, "got 1000000000"),
        ({"train_chars": 50_000, "select_chars": True}, "select_chars=True has type bool"),
    ],
)
def test_selection_split_bad_sizes_are_named(opts, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build_task("shakespeare_char", block_size=16, **opts)


def test_best_keeps_the_strictly_best_score():
    low = BestCheckpoint("loss", "min")
    model = torch.nn.Linear(2, 1)
    assert low.consider(5, {"loss": 2.0}, model) and low.step == 5
    assert not low.consider(10, {"loss": 2.0}, model)  # a tie keeps the earlier step
    assert not low.consider(15, {"loss": math.nan}, model)
    assert low.consider(20, {"loss": 1.5}, model) and low.record() == {"step": 20, "select": {"loss": 1.5}}
    high = BestCheckpoint("accuracy", "max")
    high.consider(1, {"accuracy": 0.5}, model)
    assert high.improves({"accuracy": 0.6}) and not high.improves({"accuracy": 0.4})
    with pytest.raises(ConfigError, match=r"select_metric='acc' .* valid: \['accuracy'\]"):
        BestCheckpoint("acc").improves({"accuracy": 0.7})
    with pytest.raises(ConfigError, match=r"select_mode='lowest'.*\['min', 'max'\]"):
        BestCheckpoint("loss", "lowest")


def _cfg(**kw):
    # 600 training characters at a high constant rate: the selection loss bottoms out mid-run, then rises
    base = dict(
        task="shakespeare_char",
        task_options={"block_size": 16, "train_chars": 600, "select_chars": 2000},
        model="gpt2_base",
        model_options={"dim": 32, "depth": 1, "heads": 2},
        steps=40,
        batch_size=16,
        lr=3e-2,
        schedule="constant",
        weight_decay=0.0,
        eval_every=40,
        eval_batches=4,
        select_every=4,
        log_every=4,
        ckpt_every=4,
        keep_checkpoints=20,
        seed=0,
        amp="off",
    )
    return load_config(None, {**base, **kw})


def _select_rows(out) -> list[tuple[int, float]]:
    with open(out / "metrics.csv", newline="") as f:
        return [(int(r["step"]), float(r["loss"])) for r in csv.DictReader(f) if r["split"] == "select"]


def test_best_checkpoint_is_the_best_selection_step_and_scored_on_val(tmp_path):
    out = tmp_path / "run"
    res = train(_cfg(), out, progress=False)
    rows = _select_rows(out)
    assert [s for s, _ in rows] == list(range(4, 41, 4))
    best_step = min(rows, key=lambda r: r[1])[0]  # min keeps the first of equal losses, as the selection does
    final = json.loads((out / "final.json").read_text())
    assert final["best"]["step"] == best_step < 40  # the run over-fits: the best is not the last step
    assert final["best"]["select"]["loss"] == pytest.approx(dict(rows)[best_step])
    assert final["val"] == res.final_metrics  # the reported last-step numbers stay the last step's
    # the best weights are the checkpoint of that step, and final.json's best val is theirs
    at_best = load_file(str(out / "checkpoints" / f"step_{best_step:08d}" / "model.safetensors"))
    kept = load_file(str(out / "checkpoints" / "step_00000040" / "best_model.safetensors"))
    assert all(torch.equal(at_best[k], kept[k]) for k in at_best)
    model = from_pretrained(out / "best_model")
    task = build_task("shakespeare_char", block_size=16, train_chars=600, select_chars=2000)
    val = evaluate(model, task, 16, torch.device("cpu"), max_batches=4)
    assert val["loss"] == pytest.approx(final["best"]["val"]["loss"], rel=1e-6)
    assert final["best"]["val"]["loss"] != pytest.approx(final["val"]["loss"])
    assert foreign_run_files(out) == []  # --overwrite knows best_model/ and the checkpoints' best weights


def test_resumed_run_selects_exactly_as_an_uninterrupted_one(tmp_path):
    train(_cfg(), tmp_path / "a", progress=False)

    def stop_at_22(step, loss):  # after the best (step 16) was taken, before the checkpoint of step 24
        if step == 22:
            os.kill(os.getpid(), signal.SIGTERM)

    part = train(_cfg(), tmp_path / "b", progress=False, callback=stop_at_22)
    assert part.interrupted and not (tmp_path / "b" / "final.json").exists()
    train(None, tmp_path / "b", resume=True, progress=False)
    fa, fb = (json.loads((tmp_path / d / "final.json").read_text()) for d in "ab")
    assert fa == fb
    wa, wb = (load_file(str(tmp_path / d / "best_model" / "model.safetensors")) for d in "ab")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_selection_needs_a_selection_split(tmp_path):
    cfg = _cfg(task_options={"block_size": 16, "train_chars": 600})
    with pytest.raises(ConfigError, match=r"select_every=4 .* task_options.select_chars"):
        train(cfg, tmp_path / "none", progress=False)
    assert not (tmp_path / "none").exists() or not any((tmp_path / "none").iterdir())
    with pytest.raises(ValueError, match=r"split='test'.*valid: val, select"):
        evaluate(torch.nn.Linear(2, 2), build_task("digits"), 8, torch.device("cpu"), split="test")


def test_selection_split_rows_are_not_validation_rows(tmp_path):
    out = tmp_path / "run"
    train(_cfg(steps=8, eval_every=8, select_every=8), out, progress=False)
    with open(out / "metrics.csv", newline="") as f:
        splits = [(r["step"], r["split"]) for r in csv.DictReader(f) if r["split"] != "train"]
    assert splits == [("8", "val"), ("8", "select")]
    assert np.isfinite(json.loads((out / "final.json").read_text())["best"]["val"]["loss"])
