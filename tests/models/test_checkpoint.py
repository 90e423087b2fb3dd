"""save_pretrained / from_pretrained: bit-exact round trips, atomic writes, clear errors on bad files."""

import json
import os

import pytest
import safetensors.torch
import torch
from models_helpers import example_input, tiny_overrides

import attnzoo
from attnzoo.models import CheckpointError, VisionTransformer, create_model, from_pretrained, list_models
from attnzoo.models import checkpoint as ckpt

ROUND_TRIP = list_models()


def _perturb_all(model):
    """Make every parameter and buffer non-default so that a load that skipped one would be caught."""
    with torch.no_grad():
        for t in list(model.parameters()) + [b for b in model.buffers() if b.is_floating_point()]:
            t.add_(torch.randn_like(t) * 0.01)


@pytest.mark.parametrize("name", ROUND_TRIP)
def test_round_trip_is_bit_exact(name, tmp_path):
    model = create_model(name, **tiny_overrides(name))
    _perturb_all(model)
    model.eval()
    model.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    loaded = from_pretrained(tmp_path)
    assert type(loaded) is type(model)
    assert loaded.config == model.config
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    inputs = example_input(model.config, batch=2)
    assert torch.equal(model(*inputs), loaded(*inputs))
    assert not loaded.training


def test_round_trip_keeps_tied_weights_and_dtype(tmp_path):
    model = create_model("gpt2_base", **tiny_overrides("gpt2_base"), dtype=torch.float64)
    _perturb_all(model)
    model.save_pretrained(tmp_path)
    with safetensors.safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert "lm_head.weight" not in f.keys()  # stored once
        assert json.loads(f.metadata()["aliases"]) == {"lm_head.weight": "wte.weight"}
    loaded = attnzoo.from_pretrained(tmp_path)
    assert loaded.lm_head.weight is loaded.wte.weight
    assert loaded.wte.weight.dtype == torch.float64
    assert torch.equal(loaded.wte.weight, model.wte.weight)


def test_class_from_pretrained_checks_type(tmp_path):
    create_model("gpt2_base", **tiny_overrides("gpt2_base")).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError, match="not a VisionTransformer"):
        VisionTransformer.from_pretrained(tmp_path)


def test_config_json_is_plain_json(tmp_path):
    model = create_model("cbt_t", **tiny_overrides("cbt_t"))
    model.save_pretrained(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    assert data["arch"] == "vision" and data["attention"] == "cbsa"
    with safetensors.safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        digest = f.metadata()["sha256"]
    assert data == {**model.config.to_dict(), "weights_sha256": digest}


def test_failed_save_leaves_existing_checkpoint_untouched(tmp_path, monkeypatch):
    old = create_model("tost_t", **tiny_overrides("tost_t"))
    old.save_pretrained(tmp_path)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    new = create_model("tost_t", **tiny_overrides("tost_t", num_classes=9))

    def boom(tensors, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(safetensors.torch, "save_file", boom)
    with pytest.raises(OSError, match="disk full"):
        new.save_pretrained(tmp_path)
    after = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    assert after == before  # nothing overwritten, no temp files left behind


@pytest.mark.parametrize("failing", ["model.safetensors", "config.json"])
def test_failed_rename_keeps_old_checkpoint_whole(tmp_path, monkeypatch, failing):
    """If either rename fails, the directory still holds the complete old checkpoint (never a mix)."""
    old = create_model("tost_t", **tiny_overrides("tost_t"))
    old.save_pretrained(tmp_path)
    before = {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)}
    real_replace = os.replace

    def flaky_replace(src, dst):
        if str(dst).endswith(failing) and str(src).endswith(".tmp"):
            raise OSError("rename failed")
        return real_replace(src, dst)

    monkeypatch.setattr(ckpt.os, "replace", flaky_replace)
    with pytest.raises(OSError, match="rename failed"):
        create_model("tost_t", **tiny_overrides("tost_t", num_classes=9)).save_pretrained(tmp_path)
    monkeypatch.setattr(ckpt.os, "replace", real_replace)
    assert {n: (tmp_path / n).read_bytes() for n in os.listdir(tmp_path)} == before
    loaded = from_pretrained(tmp_path)
    assert loaded.config.num_classes == 5


def test_resave_over_existing_checkpoint(tmp_path):
    create_model("tost_t", **tiny_overrides("tost_t")).save_pretrained(tmp_path)
    new = create_model("tost_t", **tiny_overrides("tost_t", num_classes=9))
    new.save_pretrained(tmp_path)
    assert sorted(os.listdir(tmp_path)) == ["config.json", "model.safetensors"]
    assert from_pretrained(tmp_path).config.num_classes == 9


def test_meta_model_cannot_be_saved(tmp_path):
    model = create_model("gpt2_base", device="meta")
    with pytest.raises(CheckpointError, match="meta device"):
        model.save_pretrained(tmp_path)
    assert not any(tmp_path.iterdir())


@pytest.fixture
def saved(tmp_path):
    model = create_model("crate_t", **tiny_overrides("crate_t"))
    model.save_pretrained(tmp_path)
    return tmp_path


def test_truncated_weights(saved):
    path = saved / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="model.safetensors: corrupt or not a safetensors file"):
        from_pretrained(saved)


def test_garbage_weights(saved):
    (saved / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        from_pretrained(saved)


def test_flipped_byte_detected_by_checksum(saved):
    path = saved / "model.safetensors"
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the tensor data, header still valid
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="checksum mismatch"):
        from_pretrained(saved)


def test_mismatched_weights(saved, tmp_path_factory):
    other = tmp_path_factory.mktemp("other")
    create_model("crate_t", **tiny_overrides("crate_t", dim=48)).save_pretrained(other)
    os.replace(other / "model.safetensors", saved / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"model.safetensors: tensor '.*' has shape"):
        from_pretrained(saved)


def test_missing_and_unexpected_tensors(saved, tmp_path_factory):
    other = tmp_path_factory.mktemp("other")
    create_model("crate_t", **tiny_overrides("crate_t", depth=3)).save_pretrained(other)
    os.replace(other / "model.safetensors", saved / "model.safetensors")
    with pytest.raises(CheckpointError, match=r"unexpected tensors \['blocks\.2\."):
        from_pretrained(saved)


def test_bad_config_json(saved):
    (saved / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json: not valid JSON"):
        from_pretrained(saved)


def test_unknown_config_key_in_file(saved):
    data = json.loads((saved / "config.json").read_text())
    data["dimm"] = 3
    (saved / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match=r"config.json: invalid config: unknown VisionConfig key\(s\) \['dimm'\]"):
        from_pretrained(saved)


def test_unknown_arch_and_missing_files(saved, tmp_path_factory):
    data = json.loads((saved / "config.json").read_text())
    data["arch"] = "diffusion"
    (saved / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="unknown model arch 'diffusion'"):
        from_pretrained(saved)
    empty = tmp_path_factory.mktemp("empty")
    with pytest.raises(CheckpointError, match="config.json: missing"):
        from_pretrained(empty)
    create_model("crate_t", **tiny_overrides("crate_t")).save_pretrained(empty)
    os.remove(empty / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors: missing"):
        from_pretrained(empty)
    with pytest.raises(CheckpointError, match="not a directory"):
        from_pretrained(empty / "nope")


def test_every_registered_model_is_loadable_class():
    from attnzoo.models.registry import get_config, model_class_for

    for name in list_models():
        assert model_class_for(get_config(name).arch).config_class.arch == get_config(name).arch


def _rewrite_weights(directory, edit=None, keep_metadata=()):
    """Re-save ``model.safetensors`` with ``edit(tensors)`` applied and only ``keep_metadata`` kept."""
    path = directory / "model.safetensors"
    with safetensors.safe_open(str(path), "pt") as f:
        meta = f.metadata()
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if edit is not None:
        edit(tensors)
    safetensors.torch.save_file(tensors, str(path), metadata={k: meta[k] for k in keep_metadata} or None)
    return tensors


def _bump_first(tensors):
    name = sorted(tensors)[0]
    tensors[name] = tensors[name] + 1.0


@pytest.mark.parametrize("keep", [(), ("format", "aliases")])
def test_edited_weights_with_stripped_metadata_are_detected(saved, keep):
    # the checksum in config.json survives whatever is done to the safetensors metadata
    _rewrite_weights(saved, _bump_first, keep)
    match = r"model.safetensors: checksum mismatch with weights_sha256 in .*config.json"
    with pytest.raises(CheckpointError, match=match):
        from_pretrained(saved)


def test_stripped_metadata_alone_still_loads_verified(saved, recwarn):
    _rewrite_weights(saved)
    from_pretrained(saved)
    assert not [w for w in recwarn if "unverified" in str(w.message)]


def test_metadata_checksum_disagreeing_with_config_is_an_error(saved):
    # tensors edited and the metadata checksum recomputed to match, config.json untouched: still caught
    tensors = _rewrite_weights(saved, _bump_first)
    safetensors.torch.save_file(tensors, str(saved / "model.safetensors"), metadata={"sha256": ckpt._digest(tensors)})
    with pytest.raises(CheckpointError, match="checksum mismatch with weights_sha256"):
        from_pretrained(saved)


def test_checkpoint_with_only_the_metadata_checksum_loads(saved, recwarn):
    # checkpoints written before config.json carried the checksum: the metadata one is used, no warning
    data = json.loads((saved / "config.json").read_text())
    del data["weights_sha256"]
    (saved / "config.json").write_text(json.dumps(data))
    from_pretrained(saved)
    assert not [w for w in recwarn if "unverified" in str(w.message)]
    _rewrite_weights(saved, _bump_first, ("sha256",))
    with pytest.raises(CheckpointError, match="checksum mismatch with its sha256 metadata"):
        from_pretrained(saved)


def test_checkpoint_without_any_checksum_loads_with_one_warning(saved):
    data = json.loads((saved / "config.json").read_text())
    del data["weights_sha256"]
    (saved / "config.json").write_text(json.dumps(data))
    tensors = _rewrite_weights(saved)
    with pytest.warns(RuntimeWarning, match=r"model.safetensors: unverified weights"):
        first = from_pretrained(saved)
    import warnings

    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        second = from_pretrained(saved)
    assert not [w for w in again if "unverified" in str(w.message)]  # once per file, not per load
    for model in (first, second):
        own = model.state_dict()
        assert all(torch.equal(own[k], t) for k, t in tensors.items())


@pytest.mark.parametrize("bad", ["abc", 12, "G" * 64])
def test_malformed_config_checksum(saved, bad):
    data = json.loads((saved / "config.json").read_text())
    data["weights_sha256"] = bad
    (saved / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="config.json: weights_sha256 must be a SHA-256 hex digest"):
        from_pretrained(saved)
