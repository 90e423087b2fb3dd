"""``attnzoo reproduce``: the smoke budget end to end (report structure, results.json, resume, determinism),
plan validation for every budget, the claim verdict rules and bad-argument errors."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from attnzoo.reproduce import BUDGETS, SECTIONS, ReproduceError, main, plan, run
from attnzoo.reproduce.claims import VERDICTS, compare
from attnzoo.reproduce.report import FINDING_COLUMNS
from attnzoo.reproduce.store import Step, StepStore

HEADINGS = {
    "vision": "## Vision: image classification",
    "long-range": "## Long-range: LRA-style suite",
    "language": "## Language: character-level Shakespeare",
    "icl": "## In-context learning: linear and sparse-linear regression",
    "efficiency": "## Efficiency: time and memory vs sequence length",
    "probes": "## White-box probes",
}

#: header row prefixes every smoke report must contain (the tables' expected columns)
TABLE_HEADERS = [
    "| model | mechanism | paper | params | val acc % | train img/s | peak train-step MiB |",
    "| mechanism | listops | image | avg |",
    "| mechanism | listops (N=64) | image (N=64) |",
    "| model | mechanism | description | params | val loss (nats) | val bits/char | train tokens/s |",
    "| model | ms/token @ 8 | ms/token @ 32 | state KiB @ 8 | state KiB @ 32 |",
    "| predictor | k=1 |",
    "| mechanism | N=64 | N=256 |",
    "| layer | SNR, φ=threshold | SNR, φ=softmax |",
    "| " + " | ".join(FINDING_COLUMNS) + " |",
    "| step | config hash | wall s | finished |",
]


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """One smoke run (single torch thread, restored afterwards) shared by the tests of this module."""
    out = tmp_path_factory.mktemp("reproduce") / "smoke"
    threads = torch.get_num_threads()
    try:
        rc = main(["--budget", "smoke", "--out", str(out), "--seed", "0", "--no-progress", "--threads", "1"])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0
    return out


def _results(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())


@pytest.mark.slow
def test_report_has_every_section_table_and_plot(smoke):
    text = (smoke / "report.md").read_text()
    for h in [*HEADINGS.values(), "## Setup", "## Agreement with the papers", "## Run configurations"]:
        assert re.search(rf"^{re.escape(h)}$", text, re.M), f"missing heading {h!r}"
    for header in TABLE_HEADERS:
        assert header in text, f"missing table with columns {header!r}"
    assert "SMOKE RUN" in text
    refs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert len(refs) >= 6
    for ref in refs:
        png = smoke / ref
        assert png.is_file(), ref
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", ref
    on_disk = {p.relative_to(smoke).as_posix() for p in (smoke / "plots").glob("*.png")}
    assert on_disk == set(refs), "every plot is referenced exactly by the report"
    # every step's exact config appears in the report
    _, steps = plan("smoke", 0)
    for s in steps:
        assert f"<code>{s.id}</code>" in text


@pytest.mark.slow
def test_results_json_holds_every_number(smoke):
    res = _results(smoke)
    assert set(res) == {"meta", "sections", "steps", "failed"}
    assert res["failed"] == {}
    assert res["meta"]["budget"] == "smoke" and res["meta"]["seed"] == 0
    assert {"cpu", "threads", "torch"} <= set(res["meta"]["machine"])
    assert list(res["sections"]) == list(SECTIONS)
    for key, sec in res["sections"].items():
        assert sec["tables"], key
        for f in sec["findings"]:
            assert f["verdict"] in VERDICTS
    _, steps = plan("smoke", 0)
    assert set(res["steps"]) == {s.id for s in steps}
    vis = res["sections"]["vision"]["data"]["models"]
    assert set(vis) == set(BUDGETS["smoke"]["vision"]["models"])
    for m in vis.values():
        assert 0.0 <= m["accuracy"] <= 1.0 and m["params"] > 0 and m["samples_per_s"] > 0
    lra = res["sections"]["long-range"]["data"]
    assert set(lra["majority"]) == set(BUDGETS["smoke"]["long-range"]["tasks"])
    assert all(10.0 <= v <= 100.0 for v in lra["majority"].values())  # 10 classes at most: majority >= 10%
    lm = res["sections"]["language"]["data"]["models"]
    for m in lm.values():
        assert m["val_bpc"] == pytest.approx(m["val_loss"] / torch.log(torch.tensor(2.0)).item())
    # the baseline references of the ICL section: least squares is exact once k >= d (noiseless data)
    curves = res["sections"]["icl"]["data"]["curves"]["linear"]
    d = BUDGETS["smoke"]["icl"]["tasks"]["linear"]["dim"]
    assert max(curves["least_squares"][d + 1:]) < 1e-8
    assert curves["lasso"][-1] < curves["zero"][-1]


@pytest.mark.slow
def test_rerun_skips_completed_steps_and_keeps_numbers(smoke):
    before = _results(smoke)["steps"]
    mtimes = {p: p.stat().st_mtime_ns for p in (smoke / "steps").rglob("*.json")}
    outcome = run(smoke, "smoke", seed=0, progress=False)
    assert outcome.computed == [] and outcome.failed == {}
    assert len(outcome.skipped) == len(before)
    assert outcome.wall_s < 30  # only the report is rebuilt
    assert {p: p.stat().st_mtime_ns for p in (smoke / "steps").rglob("*.json")} == mtimes
    after = _results(smoke)["steps"]
    assert {k: v["result"] for k, v in after.items()} == {k: v["result"] for k, v in before.items()}


@pytest.mark.slow
def test_interrupted_run_continues_and_same_seed_gives_same_numbers(smoke, tmp_path):
    out = tmp_path / "copy"
    shutil.copytree(smoke, out)
    before = _results(out)["steps"]
    # a step whose training finished but whose record was never written, and a step lost entirely
    (out / "steps" / "vision" / "vit.json").unlink()
    (out / "steps" / "icl" / "linear" / "aot.json").unlink()
    shutil.rmtree(out / "runs" / "icl" / "linear" / "aot")
    outcome = run(out, "smoke", seed=0, progress=False, only="vision,icl", threads=1)
    assert sorted(outcome.computed) == ["icl/linear/aot", "vision/vit"]
    after = _results(out)["steps"]
    # retrained from scratch with the same seed: identical numbers
    assert after["icl/linear/aot"]["result"]["error_per_position"] == before["icl/linear/aot"]["result"]["error_per_position"]
    assert after["vision/vit"]["result"]["accuracy"] == before["vision/vit"]["result"]["accuracy"]
    # sections not selected this time are still reported, since their steps are complete
    assert list(_results(out)["sections"]) == list(SECTIONS)


def test_store_recomputes_when_the_config_changes(tmp_path):
    store = StepStore(tmp_path)
    s1 = Step("sec/a", "sec", {"x": 1}, lambda ctx, step: {"y": 2})
    store.save(s1, {"y": 2}, 0.1, 0.0)
    assert store.load(s1)["result"] == {"y": 2}
    s2 = Step("sec/a", "sec", {"x": 2}, lambda ctx, step: {"y": 3})
    assert store.load(s2) is None
    assert not list(tmp_path.rglob("*.tmp")), "writes are atomic (no temporary files left)"


@pytest.mark.parametrize("budget", sorted(BUDGETS))
def test_every_budget_plans_valid_runs(budget):
    """Every training step's config passes the trainer's validation and builds a valid model config."""
    from attnzoo.models import get_config
    from attnzoo.train.config import from_dict

    b, steps = plan(budget, 3)
    assert {s.section for s in steps} == set(SECTIONS)
    trains = [s for s in steps if "train" in s.config]
    assert trains
    for s in trains:
        cfg = from_dict(s.config["train"]).validate()
        assert cfg.seed == 3
        get_config(cfg.model, **cfg.resolved_model_options())  # raises on an invalid architecture
    ids = [s.id for s in steps]
    assert all(d in ids and ids.index(d) < ids.index(s.id) for s in steps for d in s.deps)


def test_claim_rules():
    kw = dict(tol=2.0, unit="pts", paper="P", claim="c", paper_value="v", a_name="a", b_name="b")
    assert compare(80.0, 81.5, kind="comparable", **kw)["verdict"] == "agrees"
    assert compare(78.0, 81.5, kind="comparable", **kw)["verdict"] == "disagrees"
    assert compare(81.0, 80.0, kind="at_least", **kw)["verdict"] == "agrees"
    assert compare(79.0, 80.0, kind="at_least", **kw)["verdict"] == "inconclusive"
    assert compare(77.0, 80.0, kind="at_least", **kw)["verdict"] == "disagrees"
    assert compare(1.0, 1.5, kind="at_least", lower_is_better=True, **kw)["verdict"] == "agrees"
    assert compare(None, 1.0, kind="at_least", **kw)["verdict"] == "not tested"
    with pytest.raises(ValueError, match="kind must be"):
        compare(1.0, 1.0, kind="better", **kw)


def test_bad_arguments_fail_early(tmp_path, capsys):
    with pytest.raises(ReproduceError, match="unknown section 'visoin'.*valid sections"):
        run(tmp_path / "a", "smoke", only="visoin")
    with pytest.raises(ReproduceError, match="unknown budget 'huge'; valid budgets"):
        plan("huge", 0)
    with pytest.raises(ReproduceError, match="seed must be a non-negative integer"):
        plan("smoke", -1)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    assert main(["--budget", "smoke", "--out", str(foreign), "--no-progress"]) == 2
    assert "not a reproduce run" in capsys.readouterr().err
    assert (foreign / "notes.txt").read_text() == "mine"
    # a directory of another budget/seed is refused before anything runs
    other = tmp_path / "other"
    other.mkdir()
    (other / "run.json").write_text(json.dumps({"budget": "default", "seed": 0}))
    with pytest.raises(ReproduceError, match="budget 'default' and seed 0"):
        run(other, "smoke", seed=0, only="probes")
    assert not (other / "steps").exists()


def test_list_prints_the_plan(capsys):
    assert main(["--budget", "smoke", "--list", "--only", "probes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith("probes/") for line in lines)
    assert any("needs vision/vit" in line for line in lines)
