"""CSP Table 4's second group in the report: the MEGA rows of the LRA section and MEGA-CSP's scaling finding."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from attnzoo.compare import claims
from attnzoo.compare.pipeline import judge, judged
from attnzoo.models import create_model
from attnzoo.reproduce.sections import efficiency, lra

ARCH = {"dim": 32, "depth": 2, "heads": 4, "mlp_dim": 64}


@pytest.mark.parametrize("task", ["listops", "image"])
def test_mega_rows_share_everything_but_the_attention(task):
    built = {row: lra.mega_model(task, row, ARCH) for row in lra.MEGA_ROWS}
    for row, (name, opts) in built.items():
        assert name == lra.MEGA_ROWS[row].format(task=task)
        assert (opts["dim"], opts["depth"], opts["mlp_dim"]) == (32, 2, 64)
        assert opts["attention_options"]["hdim"] == 64
        model = create_model(name, **opts)
        assert model.config.dim == 32 and len(model.blocks) == 2
    dense, chunk, csp = (built[r][1]["attention_options"] for r in ("mega", "mega_chunk", "mega_csp"))
    assert dense["chunk_size"] is None and chunk["chunk_size"] is not None
    assert {k: v for k, v in dense.items() if k != "chunk_size"} == {
        k: v for k, v in chunk.items() if k != "chunk_size"
    }
    assert csp["attention"] == "csp" and dense["attention"] in ("softmax", "laplace")


def test_mega_rows_are_planned_with_their_own_models():
    plan = {
        "tasks": {"listops": {"n_train": 32, "n_val": 16, "min_len": 8, "max_len": 16, "max_depth": 2}},
        "mechanisms": ["softmax", "mega_chunk", "mega_csp"],
        "arch": ARCH,
        "train": {"steps": 2, "batch_size": 4, "lr": 1e-3},
    }
    models = {s.config["mechanism"]: s.config["train"]["model"] for s in lra.plan_steps(plan, 0) if "train" in s.config}
    assert models == {
        "softmax": "tost_lra_listops",
        "mega_chunk": "mega_chunk_lra_listops",
        "mega_csp": "mega_csp_lra_listops",
    }


def _res(values: dict[str, list[float]]) -> dict:
    return {
        m: {"listops": {"accuracy": claims.stat(v), "per_seed": list(v), "seeds": len(v), "steps_per_s": 1.0}}
        for m, v in values.items()
    }


def test_mega_csp_vs_chunk_finding_is_oriented_and_decided_by_the_ci():
    res = _res({"softmax": [40, 41, 42], "mega_chunk": [30.0, 31.0, 32.0], "mega_csp": [35.0, 36.0, 37.0]})
    out = judged(*lra._findings(res, ["softmax", "mega_chunk", "mega_csp"], ["listops"], {"listops": 256}, ["listops"]))
    (f,) = [f for f in out if f["claim"].startswith("MEGA using CSP")]  # one task: no separate average
    assert f["claim"].endswith(" on listops")
    assert f["a_name"] == "mega_csp" and f["b_name"] == "mega_chunk"
    assert f["effect"] == pytest.approx(5.0) and f["verdict"] == "agrees"
    res = _res({"softmax": [40, 41, 42], "mega_chunk": [35.0, 36.0, 37.0], "mega_csp": [30.0, 31.0, 32.0]})
    out = judged(*lra._findings(res, ["softmax", "mega_chunk", "mega_csp"], ["listops"], {"listops": 256}, ["listops"]))
    assert [f["verdict"] for f in out if f["claim"].startswith("MEGA using CSP")] == ["disagrees"]


def test_two_tasks_give_the_average_then_each_task():
    res = _res({"softmax": [40, 41, 42], "mega_chunk": [30.0, 31.0, 32.0], "mega_csp": [35.0, 36.0, 37.0]})
    for m in res:
        res[m]["text"] = dict(res[m]["listops"])
    mechs, tasks = ["softmax", "mega_chunk", "mega_csp"], ["listops", "text"]
    out = judged(*lra._findings(res, mechs, tasks, {"listops": 256, "text": 256}, tasks))
    mega = [f["claim"].split(" beats chunked MEGA ")[1] for f in out if f["claim"].startswith("MEGA using CSP")]
    assert mega == ["on the LRA average", "on listops", "on text"]


@pytest.mark.parametrize(("chunk", "gated"), [(128, True), (256, True), (16, False), (None, False)])
def test_mega_chunk_covering_the_sequence_is_dense_mega_and_gated(chunk, gated):
    res = _res({"softmax": [40, 41, 42], "mega_chunk": [30.0, 31.0, 32.0], "mega_csp": [35.0, 36.0, 37.0]})
    out, ev = lra._findings(res, ["softmax", "mega_chunk", "mega_csp"], ["listops"], {"listops": 128}, ["listops"])
    sid = "long-range/listops/mega_chunk/seed0"
    records = {sid: {"config": {"train": {"model_options": {"attention_options": {"chunk_size": chunk}}}}}}
    ev.gates += lra._dense_chunks(out, records, ["listops"], {"listops": 128})
    judge(out, ev)
    (f,) = [f for f in out if f["b_name"] == "mega_chunk"]
    assert (f["verdict"] == "inconclusive") == gated and f.get("ungated_verdict", "agrees") == "agrees"
    if gated:
        assert f["gate_reasons"] == ["conditions"]
        assert f"chunk r = {chunk} covers the whole sequence (N = 128 on listops)" in f["gate"]
    # the encoder rows are not touched
    assert all("gate" not in g for g in out if g.get("b_name") == "softmax")


def _rows(mech: str, exponent: float, lengths=(512, 2048, 8192)) -> list:
    return [
        SimpleNamespace(mechanism=mech, length=n, fwd_ms=0.01 * n**exponent, status="ok", causal=False) for n in lengths
    ]


@pytest.mark.parametrize(("exponent", "verdict"), [(1.02, "agrees"), (1.5, "inconclusive"), (1.98, "disagrees")])
def test_mega_csp_scaling_verdict_follows_the_measured_exponent(exponent, verdict):
    (f,) = efficiency._mega_csp_linear_findings(_rows("mega_csp", exponent) + _rows("mega", 2.0))
    assert f["verdict"] == verdict and f["kind"] == "paper" and f.get("measurement")
    assert f"N^{exponent:.2f}" in f["measured"] and "mega N^2.00" in f["measured"]


def test_mega_csp_scaling_is_not_judged_at_short_lengths():
    (f,) = efficiency._mega_csp_linear_findings(_rows("mega_csp", 2.0, lengths=(64, 256)))
    assert f["verdict"] == "not tested" and "256" in f["measured"]
    assert efficiency._mega_csp_linear_findings(_rows("mega", 2.0)) == []


def test_mega_csp_vs_chunk_is_gated_when_chunked_mega_did_not_learn():
    """A comparison against MEGA-chunk needs MEGA-chunk to have learned: one of its seeds at the majority class gates
    the verdict (kept as ungated_verdict), on the task and on the average; a learned MEGA-chunk leaves it decided."""
    mechs, lengths = ["softmax", "mega_chunk", "mega_csp"], {"listops": 256}
    res = _res({"softmax": [40, 41, 42], "mega_chunk": [18.0, 19.0, 20.0], "mega_csp": [28.0, 29.0, 30.0]})
    out = judged(*lra._findings(res, mechs, ["listops"], lengths, ["listops"], majority={"listops": 17.0}))
    (f,) = [f for f in out if f["claim"].startswith("MEGA using CSP")]
    assert f["verdict"] == "inconclusive" and f["ungated_verdict"] == "agrees"
    assert "mega_chunk did not learn (listops: lowest seed 18.0%" in f["gate"]
    out = judged(*lra._findings(res, mechs, ["listops"], lengths, ["listops"], majority={"listops": 10.0}))
    assert [f["verdict"] for f in out if f["claim"].startswith("MEGA using CSP")] == ["agrees"]


def test_memory_checks_skip_the_quadratic_mechanisms():
    """Dense MEGA and MSSA are quadratic by design: no O(N)-memory check for them; MEGA-CSP and MEGA-chunk are checked
    and a linear growth agrees, a quadratic one would disagree."""

    def rows(mech, power):
        return [
            SimpleNamespace(mechanism=mech, length=n, fwd_peak_mb=2.0 * (n / 512) ** power, status="ok")
            for n in (512, 2048)
        ]

    ok = rows("mega", 2) + rows("mssa", 2) + rows("mega_csp", 1) + rows("mega_chunk", 2) + rows("softmax", 2)
    out = {f["claim_id"].split("#")[1]: f["verdict"] for f in efficiency._memory_growth_findings(ok)}
    assert out == {"mega_chunk": "disagrees", "mega_csp": "agrees"}


def test_mega_chunk_size_of_the_plan_replaces_the_registered_chunk():
    _, opts = lra.mega_model("listops", "mega_chunk", ARCH, chunk=8)
    assert opts["attention_options"]["chunk_size"] == 8
    # the dense row stays dense, whatever the plan's chunk
    assert lra.mega_model("listops", "mega", ARCH, chunk=8)[1]["attention_options"]["chunk_size"] is None
    with pytest.raises(ValueError, match="mega_chunk_size must be a positive int, got 0"):
        lra.mega_model("listops", "mega_chunk", ARCH, chunk=0)
    plan = {
        "tasks": {"listops": {"n_train": 32, "n_val": 16, "min_len": 8, "max_len": 16, "max_depth": 2}},
        "mechanisms": ["softmax", "mega_chunk"],
        "arch": ARCH,
        "train": {"steps": 2, "batch_size": 4, "lr": 1e-3},
        "mega_chunk_size": 4,
    }
    (step,) = [s for s in lra.plan_steps(plan, 0) if s.config.get("mechanism") == "mega_chunk"]
    assert step.config["train"]["model_options"]["attention_options"]["chunk_size"] == 4
