"""The shared JSON helpers (``attnzoo._io``) and the metric accumulator's public state API."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from attnzoo._io import to_jsonable, write_json
from attnzoo.train.objectives import MetricAccumulator, compute_loss

ODD = {
    "t": (1, 2.5),
    3: np.float32(0.5),
    "arr": np.arange(3),
    "ten": torch.tensor([1.5, 2.0]),
    "scalar": torch.tensor(7),
    "p": Path("a/b"),
    "nan": float("nan"),
    "inf": -math.inf,
    "nested": [{"x": (True,)}],
}


def test_to_jsonable_deep_converts():
    assert to_jsonable(ODD) == {
        "t": [1, 2.5],
        "3": 0.5,
        "arr": [0, 1, 2],
        "ten": [1.5, 2.0],
        "scalar": 7,
        "p": "a/b",
        "nan": None,
        "inf": None,
        "nested": [{"x": [True]}],
    }
    assert to_jsonable(ODD, nonfinite="string")["nan"] == "nan"
    assert to_jsonable(ODD, nonfinite="string")["inf"] == "-inf"
    assert math.isnan(to_jsonable(ODD, nonfinite="keep")["nan"])


def test_to_jsonable_matches_the_copies_it_replaces():
    # reproduce's step hashes are computed from store.jsonable: the shared helper must give the same values
    # (skipped once those modules use the shared helper themselves)
    from attnzoo.analysis import io as analysis_io
    from attnzoo.compare import store

    if hasattr(store, "jsonable"):
        assert to_jsonable(ODD) == store.jsonable(ODD)
    if hasattr(analysis_io, "to_jsonable"):
        assert to_jsonable(ODD, nonfinite="string") == analysis_io.to_jsonable(ODD)


def test_write_json_formats(tmp_path):
    p = write_json(tmp_path / "sub" / "a.json", {"b": (1, 2)})
    assert p.read_text() == '{\n "b": [\n  1,\n  2\n ]\n}\n'
    assert write_json(tmp_path / "c.json", {"b": [1.0]}, indent=None).read_text() == '{"b":[1.0]}\n'
    keep = write_json(tmp_path / "d.json", {"x": float("inf")}, nonfinite="keep", newline=False).read_text()
    assert keep == json.dumps({"x": float("inf")}, indent=1)
    assert json.loads(write_json(tmp_path / "e.json", {"x": float("nan")}).read_text()) == {"x": None}
    assert sorted(q.name for q in tmp_path.iterdir()) == ["c.json", "d.json", "e.json", "sub"]  # no temporaries


def _icl_batch(seed, b=4, n=5):
    g = torch.Generator().manual_seed(seed)
    pred, target = torch.randn(b, n, generator=g), torch.randn(b, n, generator=g)
    loss, pred = compute_loss("icl_regression", pred, target)
    return loss, pred, target


@pytest.mark.parametrize("kind", ["icl_regression", "image_classification", "causal_lm"])
def test_accumulator_states_add_up_across_processes(kind):
    # a process that saw no batch has a state of the same length: one all-reduce combines them
    info = {"n_points": 5, "dim": 2}
    empty = MetricAccumulator(kind, info)
    assert empty.state().shape == MetricAccumulator(kind, info).state().shape
    if kind != "icl_regression":
        return
    whole, a, b = (MetricAccumulator(kind, info) for _ in range(3))
    for seed, part in ((0, a), (1, b), (2, a)):
        whole.update(*_icl_batch(seed))
        part.update(*_icl_batch(seed))
    assert a.state().shape == empty.state().shape
    combined = MetricAccumulator(kind, info)
    combined.load_state(a.state() + b.state() + empty.state())
    got, want = combined.compute(), whole.compute()
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-12)
    assert got["normalized_error_per_position"] == pytest.approx(want["normalized_error_per_position"], rel=1e-12)


def test_old_module_name_still_imports():
    # train/tasks.py was renamed objectives.py (data/tasks.py builds tasks); the old path re-exports it
    from attnzoo.train import objectives, tasks

    assert tasks.compute_loss is objectives.compute_loss and tasks.MetricAccumulator is objectives.MetricAccumulator
