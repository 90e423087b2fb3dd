"""The probes section's verdict rules (layer-wise compression, AoT Fig. 4) on tables of known numbers, and its
plan: deep probe models trained for the probe, the shallow vision models as an ablation, both denoise step sizes."""

import pytest

from attnzoo.compare import claims
from attnzoo.reproduce.budgets import budget
from attnzoo.reproduce.sections import probes as P


@pytest.mark.parametrize(
    "vals,start,expected",
    [
        ([5, 4, 3, 2], 0, "agrees"),  # falls at every step
        ([5, 6, 4, 3], 0, "agrees"),  # falls overall, 2 of 3 steps fall
        ([1, 2, 3, 4], 0, "disagrees"),  # rises at every step
        ([3, 2, 4, 5], 0, "disagrees"),  # rises overall, 1 of 3 steps falls
        ([5, 1, 6, 5.5], 0, "inconclusive"),  # rises overall though 2 of 3 steps fall
        ([5, 6, 7, 4.9], 0, "inconclusive"),  # falls overall though only 1 of 3 steps falls
        ([1, 2, 3, 9, 8, 7, 6, 5], 4, "agrees"),  # CRATE's shape: decompresses early, compresses over the latter half
        ([1, 2, 3, 9, 8, 7, 6, 5], 0, "inconclusive"),  # ... which the whole-range rule would not call
        ([1, 2, 3, 4, 4, 5, 6, 7], 4, "disagrees"),
        ([1, 1], 0, "inconclusive"),  # no change
        ([3.0], 0, "inconclusive"),  # nothing to compare
    ],
)
def test_fall_verdict_table(vals, start, expected):
    assert P._fall_verdict([float(v) for v in vals], start) == expected


@pytest.mark.parametrize("n,start", [(2, 0), (3, 1), (4, 2), (8, 4), (12, 6), (1, 0)])
def test_latter_half_starts_mid_way_with_two_layers_at_least(n, start):
    assert P._layerwise_claim("crate", "compression", n)[0] == start


def _layerwise(mech, key, vals, extra=None):
    rows = [
        {"name": f"blocks.{i}.attn", "mechanism": mech, key: v, **{k: s[i] for k, s in (extra or {}).items()}}
        for i, v in enumerate(vals)
    ]
    series = {key: list(vals), **(extra or {})}
    return {"experiment": "layerwise", "params": {"eps": 0.5, "crate_eps": 0.1}, "layers": rows, "series": series}


def _denoise(eta, soft, thresh, tau=0.75):
    return {
        "experiment": "denoise",
        "params": {"eta": eta, "layers": len(soft) - 1, "tau": tau},
        "snr": {"threshold": thresh, "softmax": soft},
        "growth_factor_fit": {"threshold": thresh[1] / thresh[0], "softmax": soft[-1] / soft[0]},
        "growth_factor_theory": 1 + eta * tau,
    }


def test_layerwise_findings_judge_the_latter_half_and_gate_on_the_figures_measure():
    deep = {
        "crate": _layerwise(
            "mssa",
            "crate_compression",
            [30, 40, 45, 44, 50, 49, 48, 47],
            {"compression": [10, 11, 12, 13, 14, 15, 16, 17]},
        ),
        "cbt": _layerwise(
            "cbsa",
            "crate_compression",
            [30, 31, 32, 33, 34, 35, 36, 37],
            {"compression": [20, 19, 18, 17, 16, 15, 14, 13]},
        ),
        "tost": _layerwise(
            "tssa",
            "variational_compression",
            [9, 8, 8.5, 7, 6, 5, 4, 3],
            {"crate_compression": [1, 2, 3, 4, 5, 6, 7, 8]},
        ),
        "vit": _layerwise("softmax", "coding_rate", [5, 4, 3, 2, 1, 1, 1, 1]),
        "aot": _layerwise(
            "mssa", "crate_compression", [8, 7, 6, 5, 4, 5, 6, 7], {"compression": [1, 1, 1, 1, 1, 2, 3, 4]}
        ),
    }
    out = {f["claim"].split("'s")[0].replace("the trained ", ""): f for f in P._findings({}, deep)}
    assert set(out) == {"crate", "cbt", "tost", "aot"}  # no claim for the black-box ViT
    for f in out.values():
        # a finding's fields, plus the probe model it was measured on (its random-initialisation control's key)
        base = set(claims.finding("p", "c", "v", "m", "agrees", "r", kind="paper", measurement=True))
        # where the paper's own measure was probed too: its verdict, and the gate when it differs
        assert (
            base | {"probe_model"}
            <= set(f)
            <= base | {"probe_model", "literal_measure", "gate", "gate_reasons", "ungated_verdict"}
        )
        assert f["kind"] == "paper" and f["measurement"] is True
        assert f["seeds"] == 1
    # CRATE rises over its first half and falls over its latter half: agrees (layers 5 -> 8: 50 -> 47, 3 of 3 fall),
    # but CBSA Fig. 5's own measure (raw eq 2) rises over those layers: the verdict is gated on the definition
    assert out["crate"]["ungated_verdict"] == "agrees" and out["crate"]["verdict"] == "inconclusive"
    assert out["crate"]["gate_reasons"] == ["conditions"] and out["crate"]["literal_measure"]["verdict"] == "disagrees"
    # ... while the raw eq 2 rises over the same layers: the agreement says the definition decides it
    assert "R^c raw (eq 2)" in out["crate"]["gate"] and "layer 5 → 8: 14 → 17" in out["crate"]["gate"]
    assert "gives disagrees" in out["crate"]["gate"]
    assert "layer 5 → 8: 50 → 47" in out["crate"]["measured"] and "3 of 3 steps fall" in out["crate"]["measured"]
    # CBT rises: disagrees, but raw eq 2 falls over the same layers: gated on the definition
    f = out["cbt"]
    assert f["ungated_verdict"] == "disagrees" and f["verdict"] == "inconclusive"
    assert f["literal_measure"]["verdict"] == "agrees" and "layer 5 → 8: 16 → 13" in f["gate"]
    # AoT rises over its latter half under raw eq 2 too: the verdict stands
    assert out["aot"]["verdict"] == "disagrees" and "gate" not in out["aot"]
    # ToST is judged on its own R^var_c over all layers (mostly decreases): agrees; CRATE's measure is not the claim
    assert out["tost"]["verdict"] == "agrees" and out["tost"]["paper"] == "ToST Fig. 4a"
    assert out["tost"]["explanation"] == ""  # no raw R^c series given: nothing to contrast
    assert out["tost"]["measured"].startswith("R^var_c (ToST eq 4): layer 1 → 8: 9 → 3 (-6; 6 of 7 steps fall)")


def test_softmax_denoise_verdict_uses_the_small_step_and_explains_the_large_one():
    res = {
        "denoise": _denoise(0.1, [10, 12, 13, 11, 6], [10, 10.75, 11.5, 12.4, 13.3]),
        "denoise/eta0.02": _denoise(0.02, [10, 10.2, 10.4, 10.5, 10.6], [10, 10.15, 10.3, 10.45, 10.6]),
        "denoise/eta0.02-matched": _denoise(0.02, [10, 11, 12, 13, 9, 5, 3], [10] * 7),
    }
    fs = P._findings(res, {})
    soft = next(f for f in fs if "soft-max" in f["claim"])
    assert soft["verdict"] == "agrees" and "η=0.02" in soft["rule"]
    assert "rises at every layer" in soft["measured"]
    assert "η=0.1, 4 layers: SNR 10 → 6" in soft["explanation"] and "peaks at 13 at layer 2" in soft["explanation"]
    assert "peaks at 13 at layer 3" in soft["explanation"] and "gives no η" in soft["explanation"]
    # the small step falling too: disagrees
    res["denoise/eta0.02"] = _denoise(0.02, [10, 10.2, 10.1, 10.0, 9.9], [10, 10.15, 10.3, 10.45, 10.6])
    soft = next(f for f in P._findings(res, {}) if "soft-max" in f["claim"])
    assert soft["verdict"] == "disagrees" and "peaks at 10.2 at layer 1" in soft["measured"]


def test_plan_trains_deep_probe_models_and_keeps_the_shallow_ablation():
    b = budget("default")
    steps = {s.id: s for s in P.plan_steps(b["probes"], 3, b["vision"])}
    depth = b["probes"]["layerwise_depth"]
    assert depth >= 8
    for name in b["probes"]["layerwise"]:
        train = steps[f"probes/train/{name}"].config["train"]
        assert train["model_options"]["depth"] == depth and train["seed"] == 3
        # the vision section's task, width (the row's own, as the vision row trains), heads, patches, batch and
        # optimiser; depth and the `layerwise_train` settings (steps, warm-up, rate) may differ
        assert train["task"] == b["vision"]["task"] and train["task_options"] == b["vision"]["task_options"]
        arch = {**b["vision"]["arch"], **b["vision"].get("row_arch", {}).get(name, {})}
        for k in ("dim", "heads", "patch_size"):
            assert train["model_options"][k] == arch[k]
        own = b["probes"].get("layerwise_train", {})
        assert train["lr"] == own.get("lr", b["vision"]["train"]["lr"]) and own.get("lr") == 2e-3
        assert train["steps"] == own.get("steps", b["vision"]["train"]["steps"])
        assert train["batch_size"] == b["vision"]["train"]["batch_size"]
        assert steps[f"probes/layerwise/{name}"].deps == (f"probes/train/{name}",)
        # the shallow ablation reads the vision section's own run, so only where the vision section trains the row
        if name in b["vision"]["models"]:
            assert steps[f"probes/layerwise-shallow/{name}"].deps == (f"vision/{name}/seed3",)
        else:
            assert f"probes/layerwise-shallow/{name}" not in steps
    assert any(k.startswith("probes/layerwise-shallow/") for k in steps)
    den = {k: s.config["params"] for k, s in steps.items() if k.startswith("probes/denoise")}
    assert den["probes/denoise/eta0.02"]["eta"] == 0.02
    big = den["probes/denoise"]
    assert den["probes/denoise/eta0.02-matched"]["layers"] * 0.02 == pytest.approx(
        big.get("layers", 12) * big.get("eta", 0.1)
    )
    with pytest.raises(ValueError, match="layerwise_depth must be an int >= 2"):
        P.plan_steps(dict(b["probes"], layerwise_depth=1), 0, b["vision"])
    with pytest.raises(ValueError, match="unknown layer-wise probe model 'nope'"):
        P.plan_steps(dict(b["probes"], layerwise=["nope"]), 0, b["vision"])
