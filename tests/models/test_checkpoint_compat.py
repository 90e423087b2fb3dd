"""Checkpoints written before the model registry's refactor load unchanged (fixtures/make_checkpoint_fixture.py)."""

import base64
import hashlib
import json
from pathlib import Path

import pytest
import torch

from attnzoo.models import CausalLM, from_pretrained, save_pretrained
from attnzoo.models.checkpoint import CHECKSUM_KEY, CONFIG_NAME

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_v1_causal_lm_tssa.json"


@pytest.fixture
def old_checkpoint(tmp_path: Path) -> tuple[Path, dict]:
    """The fixture's files rebuilt byte for byte in ``tmp_path``, and the fixture itself."""
    fixture = json.loads(FIXTURE.read_text())
    for name, entry in fixture["files"].items():
        data = base64.b64decode(entry["base64"])
        assert hashlib.sha256(data).hexdigest() == entry["sha256"], f"fixture file {name} is damaged"
        (tmp_path / name).write_bytes(data)
    return tmp_path, fixture


def test_old_checkpoint_loads_with_same_weights_and_outputs(old_checkpoint):
    directory, fixture = old_checkpoint
    model = from_pretrained(directory)
    assert type(model) is CausalLM and not model.training
    state = model.state_dict()
    assert sorted(state) == sorted(fixture["tensors"])
    for name, want in fixture["tensors"].items():
        t = state[name]
        assert list(t.shape) == want["shape"] and str(t.dtype) == f"torch.{want['dtype']}", name
        assert hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest() == want["sha256"], name
    assert model.lm_head.weight is model.wte.weight  # the tie survives the load
    with torch.no_grad():
        logits = model(torch.tensor(fixture["input_tokens"]))
    torch.testing.assert_close(logits, torch.tensor(fixture["logits"]), rtol=1e-5, atol=1e-6)


def test_old_checkpoint_resaves_with_same_weight_digest(old_checkpoint, tmp_path_factory):
    directory, _ = old_checkpoint
    out = save_pretrained(from_pretrained(directory), tmp_path_factory.mktemp("resaved"))
    old = json.loads((directory / CONFIG_NAME).read_text())
    new = json.loads((out / CONFIG_NAME).read_text())
    assert new[CHECKSUM_KEY] == old[CHECKSUM_KEY]
    assert CausalLM.from_pretrained(out).config == CausalLM.from_pretrained(directory).config
