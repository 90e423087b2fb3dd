"""``attnzoo compare`` on tiny tasks: an image folder and a directory of text files; the verdicts against the report's
own rule on the stored per-seed values, resume after a failed or interrupted step, the lock, and bad arguments."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attnzoo._lock import DirLock
from attnzoo.cli import main as attnzoo_main
from attnzoo.compare import claims
from attnzoo.compare import plan as compare_plan

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

IMAGE_ARGS = ["--mechanisms", "softmax,tssa", "--baseline", "softmax", "--seeds", "2", "--lr-grid", "1e-3,3e-2"]
IMAGE_ARGS += ["--steps", "4", "--no-progress"]


def _image_folder(root: Path) -> Path:
    """Three classes of 8x8 images: horizontal stripes, vertical stripes, plain, with noise."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:8, 0:8]
    patterns = [(yy // 2) % 2, (xx // 2) % 2, np.zeros((8, 8), int)]
    for k, name in enumerate(("ant", "bee", "cat")):
        (root / name).mkdir(parents=True)
        for i in range(8):
            a = 60 + 60 * k + 70 * patterns[k][..., None] + rng.normal(0, 15, (8, 8, 3))
            Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(root / name / f"img{i}.png")
    return root


@pytest.fixture(scope="module")
def image_config(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("images")
    folder = _image_folder(tmp / "folder")
    cfg = tmp / "images.yaml"
    cfg.write_text(
        f"task: image_folder\ntask_options:\n  root: {folder}\n  img_size: 8\n  val_fraction: 0.25\n"
        "model: vit_cifar\nmodel_options:\n  dim: 16\n  depth: 1\n  heads: 2\n  mlp_dim: 16\n  patch_size: 4\n"
        "batch_size: 8\nlog_every: 1\n"
    )
    return cfg


def _compare(*args) -> int:
    return attnzoo_main(["compare", *map(str, args)])


@pytest.fixture(scope="module")
def image_run(image_config, tmp_path_factory) -> Path:
    """The reference comparison on the image folder, run once for the tests that read it."""
    out = tmp_path_factory.mktemp("cmp") / "ref"
    n = torch.get_num_threads()
    torch.set_num_threads(1)  # as the tests' own runs (one_thread): the same numbers
    try:
        assert _compare(image_config, *IMAGE_ARGS, "--out", out) == 0
    finally:
        torch.set_num_threads(n)
    return out


def _stored(out: Path, mech: str, seeds=(0, 1), metric="accuracy") -> list[float]:
    """A row's metric per seed, read from the step records themselves (not from compare.json)."""
    recs = [json.loads((out / "steps" / "compare" / mech / f"seed{s}.json").read_text()) for s in seeds]
    return [r["result"][metric] for r in recs]


def _doc(out: Path) -> dict:
    return json.loads((out / "compare.json").read_text())


def test_image_folder_comparison_is_the_reports_rule_on_the_stored_seeds(image_run):
    doc = _doc(image_run)
    assert set(doc["rows"]) == {"softmax", "tssa"} and set(doc["effects"]) == {"tssa"}
    soft, tssa = _stored(image_run, "softmax"), _stored(image_run, "tssa")
    assert doc["rows"]["tssa"]["values"] == tssa and doc["rows"]["softmax"]["values"] == soft
    f = doc["effects"]["tssa"]
    ref = claims.compare(
        tssa, soft, claim_type="superiority", unit="accuracy", paper="x", claim="x", paper_value="x",
        a_name="tssa", b_name="softmax",
    )  # fmt: skip
    assert f["effect"] == pytest.approx(np.mean(tssa) - np.mean(soft))
    assert f["effect"] == pytest.approx(ref["effect"]) and f["ci95"] == pytest.approx(ref["ci95"])
    assert claims.numbers_verdict(claims.Finding.from_dict(f)) == ref["verdict"]
    lo, hi = f["ci95"]
    assert lo < f["effect"] < hi or lo == hi
    for mech in ("softmax", "tssa"):
        row = doc["rows"][mech]
        sweep = {lr: json.loads((image_run / "steps/compare" / mech / f"lr-sweep/lr{lr}.json").read_text())
                 for lr in ("0.001", "0.03")}  # fmt: skip
        best = max(sorted(sweep, key=float), key=lambda lr: sweep[lr]["result"]["accuracy"])
        assert row["tuned_lr"] == float(best) and row["lr_at_edge"]  # a two-rate grid: the best is at an end
    if doc["untuned"]:  # a row tuned at an end (not a flat top): its comparison is gated as in the report
        assert "not tuned" in f["gate_reasons"] and f["verdict"] == "inconclusive"
        assert row["params"] > 0 and row["step_ms"] > 0 and len(row["curve"]) == 4
    md = (image_run / "compare.md").read_text()
    assert "| tssa |" in md and "effect vs softmax [95% CI]" in md and f"{f['effect']:+.4g}" in md
    for png in ("curves.png", "effects.png"):
        assert (image_run / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_margin_rereads_the_stored_runs_as_non_inferiority(image_run, image_config):
    """The runs do not depend on the margin: a rerun with --margin trains nothing and judges by that margin."""
    assert _compare(image_config, *IMAGE_ARGS, "--margin", "0.2", "--out", image_run) == 0
    f = _doc(image_run)["effects"]["tssa"]
    soft, tssa = _stored(image_run, "softmax"), _stored(image_run, "tssa")
    ref = claims.compare(
        tssa, soft, claim_type="non-inferiority", unit="accuracy", paper="x", claim="x", paper_value="x",
        a_name="tssa", b_name="softmax", margin=0.2, margin_source="--margin",
    )  # fmt: skip
    assert f["claim_type"] == "non-inferiority" and f["margin"] == 0.2
    assert (
        claims.numbers_verdict(claims.Finding.from_dict(f)) == ref["verdict"] == claims.verdict_from_ci(f["ci95"], 0.2)
    )
    assert _doc(image_run)["steps"].keys() == {p.relative_to(image_run / "steps").with_suffix("").as_posix()
                                               for p in (image_run / "steps").rglob("*.json")}  # fmt: skip


def _fail_once(monkeypatch, step_id: str, exc: BaseException) -> list[str]:
    """Make the run of ``step_id`` raise ``exc`` the first time; returns the ids of the runs trained."""
    trained, raised, real = [], [], compare_plan.train_run

    def flaky(ctx, sid, cfg, sweep=None):
        if sid == step_id and not raised:
            raised.append(sid)
            raise exc
        trained.append(sid)
        return real(ctx, sid, cfg, sweep=sweep)

    monkeypatch.setattr(compare_plan, "train_run", flaky)
    return trained


def test_a_failed_step_is_reported_and_the_rerun_finishes_it(image_run, image_config, tmp_path, monkeypatch, capsys):
    out = tmp_path / "b"
    trained = _fail_once(monkeypatch, "compare/tssa/seed1", RuntimeError("disk on fire"))
    assert _compare(image_config, *IMAGE_ARGS, "--out", out) == 1
    err = capsys.readouterr().err
    assert "compare/tssa/seed1" in err and "disk on fire" in err
    done = {p.stem for p in (out / "steps/compare").rglob("*.json")}
    assert "seed1" in done and len(done) > 1  # the other rows' steps are stored (softmax's seed1 among them)
    trained.clear()
    assert _compare(image_config, *IMAGE_ARGS, "--out", out) == 0
    assert trained == ["compare/tssa/seed1"]  # finished steps are not trained again
    a, b = _doc(image_run), _doc(out)
    for mech in ("softmax", "tssa"):
        assert b["rows"][mech]["values"] == a["rows"][mech]["values"]
    assert b["effects"]["tssa"]["ci95"] == a["effects"]["tssa"]["ci95"]


def test_a_deleted_step_record_is_recomputed_alone(image_run, image_config, tmp_path, monkeypatch):
    out = tmp_path / "c"
    shutil.copytree(image_run, out)
    (out / "steps/compare/softmax/seed0.json").unlink()
    shutil.rmtree(out / "runs/compare/softmax/seed0")
    trained = _fail_once(monkeypatch, "none", RuntimeError())
    assert _compare(image_config, *IMAGE_ARGS, "--out", out) == 0
    assert trained == ["compare/softmax/seed0"]
    assert _stored(out, "softmax") == _stored(image_run, "softmax")


def test_a_second_writer_is_refused_while_the_lock_is_held(image_run, image_config, capsys):
    with DirLock(image_run, what="compare directory"):
        assert _compare(image_config, *IMAGE_ARGS, "--out", image_run) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnzoo compare: error:") and "pid" in err and len(err.splitlines()) == 1


def test_a_text_file_task_compares_losses_lower_is_better(tmp_path):
    texts = tmp_path / "texts"
    texts.mkdir()
    rng = np.random.default_rng(0)
    for name in ("a.txt", "b.txt", "z_val.txt"):
        (texts / name).write_text("".join(rng.choice(list("abcab "), 600)))
    cfg = tmp_path / "text.yaml"
    cfg.write_text(
        f"task: char_lm\ntask_options:\n  root: {texts}\n  block_size: 16\nmodel: gpt2_base\n"
        "model_options:\n  dim: 16\n  depth: 1\n  heads: 2\nbatch_size: 4\neval_batches: 2\nlog_every: 1\n"
    )
    out = tmp_path / "out"
    args = ["--mechanisms", "fastmax,softmax", "--seeds", "2", "--lr-grid", "3e-3", "--steps", "3", "--no-progress"]
    assert _compare(cfg, *args, "--out", out) == 0
    doc = _doc(out)
    assert doc["spec"]["metric"] == "loss" and doc["spec"]["higher_is_better"] is False
    soft, fast = _stored(out, "softmax", metric="loss"), _stored(out, "fastmax", metric="loss")
    f = doc["effects"]["fastmax"]
    assert f["effect"] == pytest.approx(np.mean(soft) - np.mean(fast))  # positive: fastmax's loss is lower
    assert not doc["rows"]["softmax"]["lr_at_edge"]  # a one-rate grid has no edge to sit at
    assert "| fastmax |" in (out / "compare.md").read_text()


def _foreign(tmp_path: Path, marker: str) -> Path:
    d = tmp_path / "foreign"
    d.mkdir()
    (d / marker).write_text("{}")
    return d


BAD = [
    (["--mechanisms", "softmax,nope"], "unknown mechanism(s) ['nope']", "valid mechanisms: ["),
    (["--mechanisms", "tssa,fastmax"], "--baseline 'softmax' is not in --mechanisms", "tssa"),
    (["--mechanisms", "softmax,tssa", "--seeds", "1", "--margin", "0.01"], "--margin needs --seeds >= 2", "1"),
    (["--mechanisms", "softmax,tssa", "--lr-grid", ","], "--lr-grid is empty", "1e-3"),
    (["--mechanisms", "softmax,tssa", "--lr-grid", "1e-3,-1"], "finite and > 0", "-1.0"),
    (["--mechanisms", "softmax,tssa", "--margin", "0"], "--margin must be > 0", "0.0"),
    (["--mechanisms", "softmax,tssa", "--metric", "perplexity"], "--metric 'perplexity'", "accuracy"),
    (["--mechanisms", "softmax,tssa", "--lr=0.1"], "--lr is set per run by --lr-grid", "--lr-grid"),
    (["--mechanisms", "softmax,tssa", "--model_options.dpeth=2"], "unknown", "depth"),
    (["--mechanisms", "softmax", "--seeds", "0"], "--seeds must be >= 1", "0"),
]


@pytest.mark.parametrize(("args", "what", "valid"), BAD)
def test_bad_arguments_get_one_clear_line(image_config, tmp_path, capsys, args, what, valid):
    assert _compare(image_config, *args, "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnzoo compare: error:") and len(err.splitlines()) == 1
    assert what in err and valid in err
    assert not (tmp_path / "o").exists()  # nothing written


@pytest.mark.parametrize(
    ("config", "what"),
    [("missing.yaml", "does not exist"), ("bad.yaml", "not valid YAML"), ("no_such_preset", "unknown preset")],
)
def test_an_unreadable_config_is_named(tmp_path, capsys, config, what):
    (tmp_path / "bad.yaml").write_text("task: [digits\n")
    path = tmp_path / config if config.endswith(".yaml") else config
    assert _compare(path, "--mechanisms", "softmax", "--out", tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnzoo compare: error: config") and what in err and len(err.splitlines()) == 1


@pytest.mark.parametrize(
    ("marker", "what"), [("run.json", "reproduce run"), (".attnzoo-run", "train run"), ("notes.txt", "non-empty")]
)
def test_an_out_dir_of_another_kind_is_refused(image_config, tmp_path, capsys, marker, what):
    out = _foreign(tmp_path, marker)
    assert _compare(image_config, *IMAGE_ARGS, "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnzoo compare: error: --out") and what in err
    assert sorted(p.name for p in out.iterdir()) == [marker]  # untouched


def test_jobs_run_the_same_numbers_in_worker_processes(image_run, image_config, tmp_path):
    out = tmp_path / "jobs"
    assert _compare(image_config, *IMAGE_ARGS, "--jobs", "2", "--out", out) == 0
    a, b = _doc(image_run), _doc(out)
    for mech in ("softmax", "tssa"):
        assert b["rows"][mech]["values"] == a["rows"][mech]["values"]
        assert b["rows"][mech]["tuned_lr"] == a["rows"][mech]["tuned_lr"]


def test_replicate_baseline_adds_the_plateau_runs_and_its_gate(image_run, image_config, tmp_path, monkeypatch):
    out = tmp_path / "plateau"
    shutil.copytree(image_run, out)
    trained = _fail_once(monkeypatch, "none", RuntimeError())
    assert _compare(image_config, *IMAGE_ARGS, "--replicate-baseline", "--out", out) == 0
    assert sorted(trained) == ["compare/softmax/2x/seed0", "compare/softmax/2x/seed1"]
    doc = _doc(out)
    base = doc["rows"]["softmax"]
    longer = [json.loads((out / f"steps/compare/softmax/2x/seed{s}.json").read_text()) for s in (0, 1)]
    assert base["values_2x"] == [r["result"]["accuracy"] for r in longer]
    assert all(r["config"]["train"]["steps"] == 8 for r in longer)
    p = doc["plateau"]
    assert p["change"] == pytest.approx(np.mean(base["values_2x"]) - np.mean(base["values"]))
    f = doc["effects"]["tssa"]
    verdict = claims.numbers_verdict(claims.Finding.from_dict(f))
    clearance = f["ci95"][0] if verdict == "agrees" else -f["ci95"][1]  # beyond the boundary 0 (no margin)
    gated = verdict in ("agrees", "disagrees") and clearance <= abs(p["change"])
    assert ("plateau" in f.get("gate_reasons", [])) == gated
    assert ("compare/softmax/2x/seed0" in (out / "compare.md").read_text()) is False  # ids stay out of the prose
    assert "at twice the steps" in p["text"]


def test_a_run_stopped_by_sigterm_mid_training_resumes_from_its_checkpoint(
    image_run, image_config, tmp_path, monkeypatch, capsys
):
    """SIGTERM at step 2 of one run: the trainer checkpoints and stops, the command exits 130; the rerun continues that
    run from its checkpoint (steps 3 and 4 only) and ends with the numbers of an uninterrupted comparison."""
    import os
    import signal

    from attnzoo.train import trainer

    out, real, trained, killed = tmp_path / "killed", trainer.train, {}, []

    def train(cfg, run_dir, resume=False, overwrite=False, progress=True, **kw):
        name = Path(run_dir).relative_to(out / "runs").as_posix()
        steps = trained.setdefault(name, [])

        def callback(step, loss):
            steps.append(step)
            if name == "compare/tssa/seed0" and step == 2 and not killed:
                killed.append(step)
                os.kill(os.getpid(), signal.SIGTERM)

        return real(cfg, run_dir, resume=resume, overwrite=overwrite, progress=progress, callback=callback, **kw)

    monkeypatch.setattr(trainer, "train", train)
    assert _compare(image_config, *IMAGE_ARGS, "--out", out) == 130
    assert "To continue: attnzoo compare" in capsys.readouterr().err
    assert trained["compare/tssa/seed0"] == [1, 2] and not (out / "steps/compare/tssa/seed0.json").exists()
    trained.clear()
    assert _compare(image_config, *IMAGE_ARGS, "--out", out) == 0
    assert trained == {"compare/tssa/seed0": [3, 4], "compare/tssa/seed1": [1, 2, 3, 4]}  # resumed, not restarted
    a, b = _doc(image_run), _doc(out)
    for mech in ("softmax", "tssa"):
        assert b["rows"][mech]["values"] == a["rows"][mech]["values"]


def test_a_damaged_marker_is_named(image_config, tmp_path, capsys):
    out = tmp_path / "o"
    out.mkdir()
    (out / "compare_run.json").write_text("{not json")
    assert _compare(image_config, *IMAGE_ARGS, "--out", out) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("attnzoo compare: error:") and "compare_run.json" in err and len(err.splitlines()) == 1
