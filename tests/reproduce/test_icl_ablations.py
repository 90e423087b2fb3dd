"""The in-context section's one-factor ablation (AoT without query normalisation): its plan and its words."""

from __future__ import annotations

from attnzoo.reproduce import claims
from attnzoo.reproduce.sections import icl

PLAN = {
    "tasks": {"linear": {"dim": 4, "n_points": 5, "n_val": 8}},
    "models": ["aot"],
    "ablations": ["aot-qnorm"],
    "seeds": 1,
    "arch": {"dim": 16, "depth": 1, "heads": 2},
    "train": {"steps": 2, "batch_size": 4, "lr": 1e-3},
    "lasso_alpha": 0.01,
}


def test_the_ablation_changes_only_the_query_normalisation():
    runs = {s.id.split("/")[2]: s.config["train"] for s in icl.plan_steps(PLAN, 0) if "train" in s.config}
    base, abl = runs["aot"], runs["aot-qnorm"]
    assert base["model"] == abl["model"] == "icl_aot"
    assert abl["model_options"].pop("attention_options") == {"normalize_query": False}
    assert "attention_options" not in base["model_options"]
    assert abl["model_options"] == base["model_options"]
    assert {k: v for k, v in abl.items() if k != "model_options"} == {
        k: v for k, v in base.items() if k != "model_options"
    }


def test_the_words_follow_the_numbers():
    zero = 1.0
    plateau, learned = claims.stat([0.95, 0.97]), claims.stat([0.2, 0.3])
    assert "keeps AoT on the plateau" in icl._qnorm_text(plateau, learned, zero)
    assert "does not explain it" in icl._qnorm_text(plateau, plateau, zero)
    assert "with and without it" in icl._qnorm_text(learned, learned, zero)
    assert "learns with it but not without it" in icl._qnorm_text(learned, plateau, zero)
    text = icl._ablation_text({"aot": [0.95, 0.97], "aot-qnorm": [0.2, 0.3], "aot+softmax": [0.2, 0.25]}, zero)
    assert "aot-qnorm (one factor" in text and "aot-qnorm separates the normalisation" in text
