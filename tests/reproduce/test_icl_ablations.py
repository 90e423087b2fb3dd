"""The in-context section's one-factor ablations of AoT's attention (query normalisation; tied projection): their
plans and the layers they build; the gates of its "learns" and "close to" findings."""

from __future__ import annotations

import pytest

from attnzoo.compare import claims
from attnzoo.compare.pipeline import Evidence, judged
from attnzoo.models.registry import create_model
from attnzoo.reproduce.sections import icl

PLAN = {
    "tasks": {"linear": {"dim": 4, "n_points": 5, "n_val": 8}},
    "models": ["aot"],
    "ablations": ["aot-qnorm", "aot-untied", "aot+softmax"],
    "seeds": 1,
    "arch": {"dim": 16, "depth": 1, "heads": 2},
    "train": {"steps": 2, "batch_size": 4, "lr": 1e-3},
    "lasso_alpha": 0.01,
}


def _runs():
    return {s.id.split("/")[2]: s.config["train"] for s in icl.plan_steps(PLAN, 0) if "train" in s.config}


def _attention(run: dict):
    model = create_model(run["model"], **run["model_options"])
    return next(m for m in model.modules() if type(m).__name__.endswith("Attention"))


@pytest.mark.parametrize(
    "name, options",
    [("aot-qnorm", {"normalize_query": False}), ("aot-untied", {"normalize_query": True, "tied": False})],
)
def test_each_ablation_changes_one_option_of_the_run(name, options):
    runs = _runs()
    base, abl = dict(runs["aot"]), dict(runs[name])
    base["model_options"], abl["model_options"] = dict(base["model_options"]), dict(abl["model_options"])
    assert base["model"] == abl["model"] == "icl_aot"
    assert abl["model_options"].pop("attention_options") == options
    assert "attention_options" not in base["model_options"]
    assert abl == base


def test_the_layers_built_differ_in_one_factor():
    runs = _runs()
    aot, qnorm, untied, soft = (_attention(runs[n]) for n in ("aot", "aot-qnorm", "aot-untied", "aot+softmax"))
    assert (aot.normalize_query, aot.tied) == (True, True)
    assert (qnorm.normalize_query, qnorm.tied) == (False, True)
    assert (untied.normalize_query, untied.tied) == (True, False)
    assert type(soft).__name__ == "SoftmaxAttention"  # both factors changed: the 2x2's fourth corner
    assert untied.qkv.weight.shape[0] == 3 * aot.qkv.weight.shape[0]


def _judge_learns(f, m, fin, zero):
    judged([f], Evidence(gates=icl._learns_plateau(f, m, fin, zero)))


def test_learns_verdicts_stand_only_where_twice_the_steps_agrees():
    # the same rule for "agrees" and "disagrees": a run at twice the steps must give the same verdict
    def finding(verdict):
        return claims.finding(
            "AoT Fig. 6", "aot learns linear functions in context", "", "", verdict, "rule", kind="paper"
        )

    zero = 1.0
    f = finding("disagrees")
    _judge_learns(f, "aot", {"aot": [0.9, 0.8], "aot@2x-steps": [0.9, 0.3]}, zero)
    assert f["verdict"] == "inconclusive" and f["ungated_verdict"] == "disagrees"
    assert "'inconclusive'" in f["gate"] and f["gate_reasons"] == ["plateau"]
    f = finding("disagrees")
    _judge_learns(f, "aot", {"aot": [0.9, 0.8], "aot@2x-steps": [0.7, 0.6]}, zero)
    assert f["verdict"] == "disagrees" and "disagrees by the same rule" in f["longer_run"]
    f = finding("agrees")
    _judge_learns(f, "gpt", {"gpt": [0.1, 0.2], "gpt@2x-steps": [0.05]}, zero)
    assert f["verdict"] == "agrees"
    f = finding("agrees")
    _judge_learns(f, "gpt", {"gpt": [0.1, 0.2]}, zero)
    assert f["verdict"] == "inconclusive" and "no run at twice the steps" in f["gate"]
    f = finding("inconclusive")
    _judge_learns(f, "aot", {"aot": [0.1, 0.9]}, zero)
    assert f["verdict"] == "inconclusive" and "gate" not in f


def test_aot_that_did_not_learn_gates_its_comparison_as_listops_gates_its_rows():
    # the baseline's rule (every seed below 0.8x the zero predictor) applied to AoT: a decided gap from a row that
    # did not leave the zero predictor is gated, whichever side it lies on
    def records(aot_errors):
        recs = {}
        for i, (a, g) in enumerate(zip(aot_errors, [0.05, 0.06, 0.04], strict=True)):
            recs[f"icl/linear/aot/seed{i}"] = {"result": {"error_per_position": [1.0, 0.95, a]}}
            recs[f"icl/linear/gpt/seed{i}"] = {"result": {"error_per_position": [0.2, 0.1, g]}}
        return recs

    zero = 1.0
    stuck = [0.85, 0.3, 0.35]
    fin = {"aot": stuck, "gpt": [0.05, 0.06, 0.04]}
    f = icl._closeness("linear", zero, records(stuck))
    judged([f], Evidence(gates=icl._aot_unlearned(f, fin, zero)))
    assert f["ungated_verdict"] == "disagrees" and f["verdict"] == "inconclusive"
    assert f["gate_reasons"] == ["did not learn"] and "1 of 3 seeds of aot did not learn" in f["gate"]
    learned = [0.3, 0.3, 0.35]
    fin = {"aot": learned, "gpt": [0.05, 0.06, 0.04]}
    f = icl._closeness("linear", zero, records(learned))
    judged([f], Evidence(gates=icl._aot_unlearned(f, fin, zero)))
    assert f["verdict"] == "disagrees" and "gate" not in f
