"""Training checkpoints are verified before use: every file has a SHA-256 in manifest.json, damage is
reported naming the file (by eval and by resume), and ``checkpoints/latest`` cannot lead out of the run."""

import hashlib
import json
import os
import shutil
import warnings

import pytest
import torch
import yaml

from attnzoo.train import eval_cli
from attnzoo.train.checkpoint import CheckpointError, latest_checkpoint, list_checkpoints, load_checkpoint
from attnzoo.train.config import load_config
from attnzoo.train.objectives import build_task_model
from attnzoo.train.run_dir import load_run
from attnzoo.train.trainer import train

TINY_VIT = {"model_options": {"dim": 16, "depth": 1, "heads": 2, "mlp_dim": 32}}


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def base_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("base") / "run"
    cfg = load_config(
        "digits_vit_tiny", {**TINY_VIT, "steps": 4, "ckpt_every": 2, "eval_every": 4, "log_every": 1, "warmup_steps": 1}
    )
    train(cfg, run, progress=False)
    return run


@pytest.fixture
def run(base_run, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(base_run, dst, symlinks=True)
    return dst


def _latest(run):
    return run / "checkpoints" / "step_00000004"


def _resume(run):
    return train(None, run, resume=True, progress=False)


def test_manifest_holds_the_sha256_of_every_file(run):
    ck = _latest(run)
    assert latest_checkpoint(run / "checkpoints") == ck
    manifest = json.loads((ck / "manifest.json").read_text())
    files = sorted(p.name for p in ck.iterdir() if p.name != "manifest.json")
    assert (
        sorted(manifest["files"])
        == files
        == ["model.safetensors", "optimizer.safetensors", "rng_rank0.safetensors", "state.json"]
    )
    for name, entry in manifest["files"].items():
        data = (ck / name).read_bytes()
        assert entry == {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def test_flipped_exponent_byte_is_reported_by_eval_and_resume(run, capsys):
    path = _latest(run) / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x7F  # high byte (sign + exponent) of the last float32: a huge or NaN weight, header intact
    path.write_bytes(bytes(data))
    assert eval_cli.main([str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{path}: corrupt (SHA-256 differs" in err and "Traceback" not in err
    assert f"--checkpoint {run / 'checkpoints' / 'step_00000002'}" in err  # the intact one
    with pytest.raises(
        CheckpointError,
        match=r"step_00000004/model.safetensors: corrupt \(SHA-256 differs.* "
        r"Other checkpoints of this run: step_00000002; to resume from one, "
        r"write its name into .*checkpoints/latest",
    ):
        _resume(run)
    # which works
    (run / "checkpoints" / "latest").write_text("step_00000002\n")
    assert _resume(run).step == 4


def _truncate(p):
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])


def _garbage_json(p):
    p.write_text('{"step": 4, "form')


def _negative_step(p):
    state = json.loads(p.read_text())
    state["step"] = -1
    p.write_text(json.dumps(state))


@pytest.mark.parametrize(
    "name, damage, manifest, message",
    [
        (
            "model.safetensors",
            _truncate,
            True,
            r"model.safetensors: corrupt \(truncated to \d+ bytes, written as \d+\)",
        ),
        ("model.safetensors", _truncate, False, r"model.safetensors: corrupt or truncated \(SafetensorError"),
        ("model.safetensors", os.remove, True, r"model.safetensors: missing \(listed in manifest.json\)"),
        ("model.safetensors", os.remove, False, r"model.safetensors: missing"),
        ("optimizer.safetensors", _truncate, True, r"optimizer.safetensors: corrupt \(truncated"),
        ("optimizer.safetensors", _truncate, False, r"optimizer.safetensors: corrupt, truncated or missing"),
        ("state.json", _garbage_json, True, r"state.json: corrupt \(truncated"),
        ("state.json", _garbage_json, False, r"state.json: corrupt \(JSONDecodeError"),
        ("state.json", _negative_step, False, r"state.json: corrupt \('step' is -1, expected an integer >= 0\)"),
        ("rng_rank0.safetensors", _truncate, False, r"rng_rank0.safetensors: corrupt \(SafetensorError"),
        ("manifest.json", _garbage_json, True, r"manifest.json: corrupt manifest"),
    ],
)
def test_damaged_checkpoint_files_are_named(run, name, damage, manifest, message):
    ck = _latest(run)
    if not manifest:
        (ck / "manifest.json").unlink()  # as written by an older attnzoo: the loaders' own checks must name the file
    damage(ck / name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the 'unverified' notice
        with pytest.raises(CheckpointError, match=message) as exc:
            _resume(run)
    assert str(ck) in str(exc.value)


def test_config_that_no_longer_fits_names_the_tensor(run, capsys):
    cfg = yaml.safe_load((run / "config.yaml").read_text())
    cfg["model_options"]["dim"] = 32
    (run / "config.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    message = r"model.safetensors: tensor '.*' has shape \(.*\) but the model built from the run's config has"
    with pytest.raises(CheckpointError, match=message):
        _resume(run)
    assert eval_cli.main([str(run)]) == 2
    assert "no longer matches this checkpoint" in capsys.readouterr().err


@pytest.mark.parametrize(
    "pointer",
    [
        "../../elsewhere/step_00000002",
        "{elsewhere}/step_00000002",
        "step_00000002/../../../elsewhere/step_00000002",
        "step_2",
        "",
    ],
)
def test_latest_may_only_name_a_checkpoint_of_the_run(run, tmp_path, capsys, pointer):
    # a complete, valid checkpoint outside the run: the old code loaded it
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run / "checkpoints" / "step_00000002", elsewhere / "step_00000002")
    (run / "checkpoints" / "latest").write_text(pointer.format(elsewhere=elsewhere) + "\n")
    with pytest.raises(CheckpointError, match=r"latest names .* which is not a checkpoint of this run"):
        latest_checkpoint(run / "checkpoints")
    with pytest.raises(CheckpointError, match="not a checkpoint of this run"):
        _resume(run)
    assert eval_cli.main([str(run)]) == 2
    assert "not a checkpoint of this run" in capsys.readouterr().err


def test_a_step_link_leading_out_of_the_run_is_refused(run, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(run / "checkpoints" / "step_00000002", elsewhere / "step_00000002")
    os.symlink(elsewhere / "step_00000002", run / "checkpoints" / "step_00000009")
    (run / "checkpoints" / "latest").write_text("step_00000009\n")
    with pytest.raises(CheckpointError, match=r"step_00000009 leads outside .*checkpoints"):
        _resume(run)
    # without a pointer, the newest checkpoint of the run itself is used, never the link
    (run / "checkpoints" / "latest").unlink()
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step_00000002", "step_00000004"]
    assert latest_checkpoint(run / "checkpoints") == _latest(run)


def test_checkpoint_without_manifest_loads_with_one_warning(run):
    ck = _latest(run)
    (ck / "manifest.json").unlink()
    cfg = load_run(run)
    from attnzoo.data.tasks import build_task

    model = build_task_model(cfg, build_task(cfg.task, **cfg.task_options))
    with pytest.warns(RuntimeWarning, match=r"step_00000004 has no manifest.json .* loading them unverified"):
        state = load_checkpoint(ck, model, restore_rng=False)
    assert state["step"] == 4
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        load_checkpoint(ck, model, restore_rng=False)
    assert not [w for w in again if "manifest" in str(w.message)]
    from safetensors.torch import load_file

    saved = load_file(str(ck / "model.safetensors"))
    own = model.state_dict()
    assert all(torch.equal(own[k], v) for k, v in saved.items())
