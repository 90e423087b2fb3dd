"""attnzoo's causal LMs and vision classifiers as transformers models: Auto classes, generate, checkpoints, Trainer."""

import dataclasses
import re
from pathlib import Path

import pytest
import torch
from conftest import require

require("transformers")  # fails, not skips, where the hf extra is installed but transformers is broken

from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForImageClassification,
    PretrainedConfig,
    Trainer,
    TrainingArguments,
)

import attnzoo  # noqa: E402
import attnzoo.hf as H  # noqa: E402
from attnzoo.models.config import BackboneConfig, CausalLMConfig, VisionConfig  # noqa: E402

CAUSAL = attnzoo.list_attentions(causal=True)
BIDIRECTIONAL = attnzoo.list_attentions(causal=False)
# the LM families of the zoo (GPT-2, ToST, AoT without / with half MLPs, Fastmax GPT), shrunk
LM_FAMILIES = ["gpt2_base", "tost_gpt_base", "aot_gpt_base", "aot_gpt_hybrid", "fastmax_gpt_p2"]
TINY_LM = dict(dim=32, depth=2, heads=4, vocab_size=61, block_size=40)
TINY_VISION = dict(dim=32, depth=2, heads=4, image_size=16, patch_size=4, in_chans=3, num_classes=5)


def tiny_lm(attention: str = "tssa", **kw) -> "H.AttnZooForCausalLM":
    cfg = H.AttnZooCausalLMConfig(**{**TINY_LM, "attention": attention, **kw})
    return AutoModelForCausalLM.from_config(cfg).eval()


def tokens(b: int = 2, t: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, TINY_LM["vocab_size"], (b, t), generator=torch.Generator().manual_seed(seed))


def test_only_attnzoo_hf_imports_transformers():
    # `import attnzoo` must not need transformers: no module outside attnzoo/hf imports it
    root = Path(attnzoo.__file__).parent
    offenders = [
        str(p.relative_to(root))
        for p in root.rglob("*.py")
        if "hf" not in p.relative_to(root).parts[:1]
        and re.search(r"^\s*(import|from)\s+transformers\b", p.read_text(encoding="utf-8"), re.M)
    ]
    assert offenders == []
    # the top-level export resolves lazily to attnzoo.hf's function
    assert attnzoo.swap_attention is H.swap_attention


# every attnzoo field away from its default (fields attnzoo gains later keep theirs and round-trip too)
NON_DEFAULT = dict(
    attention="fastmax",
    attention_options={"p": 1},
    second_attention="softmax",
    second_attention_options={"scale": 0.5},
    second_attention_from=1,
    mlp_ratio=2.0,
    mlp_dim=48,
    ffn_layers=1,
    act="relu",
    layerscale=0.1,
    final_norm=False,
    dropout=0.1,
    ista_step=0.2,
    ista_lambda=0.3,
)
NON_DEFAULT_LM = dict(pos_embed="sinusoidal", tie_weights=False)
NON_DEFAULT_VISION = dict(
    in_chans=1, patch_embed="linear_ln", pos_embed="fourier", pool="class_attention", class_attention_layers=1
)


@pytest.mark.parametrize(
    "hf_cls, az_cls", [(H.AttnZooCausalLMConfig, CausalLMConfig), (H.AttnZooVisionConfig, VisionConfig)]
)
def test_config_carries_every_attnzoo_field_through_json(tmp_path, hf_cls, az_cls):
    az_names = {f.name for f in dataclasses.fields(az_cls)}
    tiny = dict(TINY_LM, **NON_DEFAULT_LM) if az_cls is CausalLMConfig else dict(TINY_VISION, **NON_DEFAULT_VISION)
    extra = {"norm_eps": 1e-6} if "norm_eps" in az_names else {}
    az = az_cls(**tiny, **NON_DEFAULT, **extra)
    hf = hf_cls.from_attnzoo(az)
    assert hf.attention == "fastmax" and hf.hidden_size == 32 and hf.num_hidden_layers == 2
    for name in az_names:  # every attnzoo field is readable on the transformers config under its own name
        assert getattr(hf, name) == getattr(az, name), name
    assert hf.to_attnzoo() == az
    hf.save_pretrained(tmp_path)
    again = AutoConfig.from_pretrained(tmp_path)
    assert type(again) is hf_cls and again.to_attnzoo() == az
    # the declared fields are attnzoo's (under transformers' names where they differ) plus generation settings
    declared = {f.name for f in dataclasses.fields(hf_cls)} - {f.name for f in dataclasses.fields(PretrainedConfig)}
    assert declared - {hf_cls._renamed.get(n, n) for n in az_names} <= {
        "use_cache",
        "bos_token_id",
        "eos_token_id",
        "pad_token_id",
    }


@pytest.mark.parametrize(
    "hf_cls, az_cls", [(H.AttnZooCausalLMConfig, CausalLMConfig), (H.AttnZooVisionConfig, VisionConfig)]
)
def test_config_declares_and_round_trips_every_backbone_field(tmp_path, hf_cls, az_cls):
    # the transformers config's fields are read from the attnzoo dataclass: none goes missing (norm_eps once did)
    declared = {f.name for f in dataclasses.fields(hf_cls)}
    backbone = [f.name for f in dataclasses.fields(BackboneConfig)]
    assert [n for n in backbone if hf_cls._renamed.get(n, n) not in declared] == []
    own = {f.name for f in dataclasses.fields(az_cls)} - set(backbone) - {"num_classes"}
    assert {hf_cls._renamed.get(n, n) for n in own} <= declared
    # every BackboneConfig field away from its default comes back through config.json
    tiny = TINY_LM if az_cls is CausalLMConfig else TINY_VISION
    values = dict(NON_DEFAULT, ffn="none", norm="post", residual=False, norm_eps=1e-6, norm_layer="scalenorm")
    default = BackboneConfig()
    assert [n for n in backbone if n not in tiny and values.get(n, getattr(default, n)) == getattr(default, n)] == []
    az = az_cls(**tiny, **values)
    hf_cls.from_attnzoo(az).save_pretrained(tmp_path)
    again = AutoConfig.from_pretrained(tmp_path).to_attnzoo()
    assert {n: getattr(again, n) for n in backbone} == {n: getattr(az, n) for n in backbone}


def test_config_rejects_bad_values_early():
    with pytest.raises(ValueError, match="dim=30 must be divisible by heads=4"):
        H.AttnZooCausalLMConfig(dim=30, heads=4)
    with pytest.raises(ValueError, match="pool"):
        H.AttnZooVisionConfig(**TINY_VISION, pool="max")
    with pytest.raises(ValueError, match="VisionConfig"):
        H.AttnZooCausalLMConfig.from_preset("tost_t")


def test_vision_num_classes_is_num_labels():
    cfg = H.AttnZooVisionConfig(**TINY_VISION)
    assert cfg.num_labels == 5 and cfg.num_classes == 5 and cfg.to_attnzoo().num_classes == 5
    assert H.AttnZooVisionConfig(dim=32, heads=4).num_labels == 1000  # attnzoo's ImageNet default


@pytest.mark.parametrize("family", LM_FAMILIES)
@pytest.mark.parametrize("mechanism", CAUSAL)
def test_from_config_builds_each_lm_family_for_each_causal_mechanism(family, mechanism):
    tiny = dict(TINY_LM, ffn_layers=1) if family == "aot_gpt_hybrid" else TINY_LM  # MLP in the first half
    cfg = H.AttnZooCausalLMConfig.from_preset(family, attention=mechanism, **tiny)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    assert isinstance(model, H.AttnZooForCausalLM)
    assert cfg.attention == mechanism and all(type(b.attn).registry_name == mechanism for b in model.model.blocks)
    ref = attnzoo.get_config(family, attention=mechanism, **tiny)
    assert model.model.config == ref  # the family's layout (ffn, ffn_layers, ...) survives the conversion
    ids = tokens()
    out = model(ids, labels=ids)
    assert out.logits.shape == (2, 5, TINY_LM["vocab_size"])
    # the transformers forward is attnzoo's forward
    torch.testing.assert_close(out.logits, model.model(ids), rtol=0, atol=0)
    expected = torch.nn.functional.cross_entropy(out.logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    torch.testing.assert_close(out.loss, expected)


@pytest.mark.parametrize("mechanism", BIDIRECTIONAL)
def test_from_config_builds_vision_classifier_for_each_mechanism(mechanism):
    cfg = H.AttnZooVisionConfig(**TINY_VISION, attention=mechanism)
    model = AutoModelForImageClassification.from_config(cfg).eval()
    assert isinstance(model, H.AttnZooForImageClassification)
    x = torch.randn(2, 3, 16, 16)
    labels = torch.tensor([0, 4])
    out = model(pixel_values=x, labels=labels)
    assert out.logits.shape == (2, 5)
    torch.testing.assert_close(out.logits, model.model(x), rtol=0, atol=0)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))


@pytest.mark.parametrize("mechanism", CAUSAL)
def test_greedy_generate_equals_attnzoo_decoding(mechanism):
    model = tiny_lm(mechanism)
    ids = tokens(2, 6)
    out = model.generate(ids, max_new_tokens=12, do_sample=False, return_dict_in_generate=True)
    ref = model.model.generate(ids, 12, temperature=0)
    assert torch.equal(out.sequences, ref)
    # generate decoded with attnzoo's recurrent state / KV cache, not by re-running the prefix
    assert isinstance(out.past_key_values, H.RecurrentCache) and out.past_key_values.pos == 6 + 12 - 1
    # and the cached decoding computes the model: it picks the parallel forward's argmax at every step
    logits = model(out.sequences[:, :-1]).logits
    assert torch.equal(logits[:, 5:].argmax(-1), out.sequences[:, 6:])


@pytest.mark.parametrize("mechanism", CAUSAL)
def test_sampling_generate_equals_attnzoo_sampling(mechanism):
    model = tiny_lm(mechanism)
    ids = tokens(3, 4)
    torch.manual_seed(7)
    hf = model.generate(ids, max_new_tokens=10, do_sample=True, temperature=0.8, top_k=7, top_p=1.0)
    torch.manual_seed(7)
    ref = model.model.generate(ids, 10, temperature=0.8, top_k=7)
    assert torch.equal(hf, ref)
    torch.manual_seed(8)
    other = model.generate(ids, max_new_tokens=10, do_sample=True, temperature=0.8, top_k=7, top_p=1.0)
    assert not torch.equal(other, hf)  # it does sample


@pytest.mark.parametrize("mechanism", ["tssa", "softmax"])
def test_beam_search_reorders_the_cache(mechanism):
    model = tiny_lm(mechanism)
    ids = tokens(2, 5)
    cached = model.generate(ids, max_new_tokens=6, num_beams=3, do_sample=False)
    plain = model.generate(ids, max_new_tokens=6, num_beams=3, do_sample=False, use_cache=False)
    assert torch.equal(cached, plain)


@pytest.mark.parametrize("mechanism", CAUSAL)
def test_cached_forward_matches_parallel_forward(mechanism):
    model = tiny_lm(mechanism)
    ids = tokens(2, 9)
    full = model(ids).logits
    first = model(ids[:, :4], use_cache=True)
    rest = model(ids[:, 4:], past_key_values=first.past_key_values, use_cache=True)
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], dim=1), full, rtol=1e-4, atol=1e-5)
    assert rest.past_key_values.get_seq_length() == 9


def test_cache_is_taken_under_its_new_and_its_old_name():
    # transformers 5.24 passes the decoding cache as cache=, earlier versions as past_key_values=
    model = tiny_lm("tssa")
    ids = tokens(2, 7)
    first_new, first_old = model(ids[:, :3], use_cache=True), model(ids[:, :3], use_cache=True)
    new = model(ids[:, 3:], cache=first_new.past_key_values, use_cache=True)
    old = model(ids[:, 3:], past_key_values=first_old.past_key_values, use_cache=True)
    torch.testing.assert_close(new.logits, old.logits, rtol=0, atol=0)
    assert new.past_key_values.get_seq_length() == old.past_key_values.get_seq_length() == 7
    with pytest.raises(ValueError, match="cache= or past_key_values=, not both"):
        model(ids[:, 3:], cache=new.past_key_values, past_key_values=old.past_key_values, use_cache=True)


@pytest.mark.parametrize("mechanism", CAUSAL)
def test_decoding_memory_is_flat_for_recurrent_mechanisms(mechanism):
    model = tiny_lm(mechanism)
    short = model.generate(tokens(1, 3), max_new_tokens=2, do_sample=False, return_dict_in_generate=True)
    long = model.generate(tokens(1, 3), max_new_tokens=30, do_sample=False, return_dict_in_generate=True)
    small, big = short.past_key_values.nbytes(), long.past_key_values.nbytes()
    if mechanism in ("tssa", "fastmax", "linear"):
        assert small == big > 0  # running sums: the state does not grow with the context
    else:
        assert big > small  # softmax / MSSA keep every key and value


def test_attention_mask_right_padding_ok_left_padding_needs_a_masked_layer():
    # more in test_hf_masks.py (generate from padded prompts)
    model = tiny_lm("linear")
    ids = tokens(2, 5)
    right = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    out, full = model(ids, attention_mask=right).logits, model(ids).logits
    torch.testing.assert_close(out[0], full[0], rtol=0, atol=0)
    torch.testing.assert_close(out[1, :3], full[1, :3], rtol=0, atol=0)
    # a left-padded row equals that row alone (linear attention honours masks) ...
    left = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])
    torch.testing.assert_close(model(ids, attention_mask=left).logits[1, 2:], model(ids[1:, 2:]).logits[0])
    # ... and a layer that does not is an error naming it, never silently ignored
    for blk in model.model.blocks:
        blk.attn.supports_masks = False
    with pytest.raises(ValueError, match="attention 'linear' does not honour attention_mask"):
        model(ids, attention_mask=left)


def test_bad_inputs_raise_clear_errors():
    model = tiny_lm("tssa")
    with pytest.raises(ValueError, match="vocab_size"):
        model(torch.full((1, 3), TINY_LM["vocab_size"]))
    with pytest.raises(TypeError, match="RecurrentCache"):
        model(tokens(), past_key_values=object(), use_cache=True)
    with pytest.raises(ValueError, match="block_size=40"):
        model.generate(tokens(1, 30), max_new_tokens=20, do_sample=False)
    with pytest.raises(ValueError, match="inputs_embeds"):
        model(inputs_embeds=torch.zeros(1, 2, 32))
    with pytest.raises(TypeError, match=r"unexpected arguments \['token_type_ids'\]"):
        model(tokens(), token_type_ids=tokens())
    with pytest.raises(ValueError, match="position_ids"):
        model(tokens(), position_ids=torch.arange(5).flip(0).expand(2, -1))


@pytest.mark.parametrize("mechanism", ["tssa", "softmax"])
def test_save_pretrained_from_pretrained_is_bit_exact(tmp_path, mechanism):
    model = tiny_lm(mechanism)
    with torch.no_grad():  # move every parameter off its initial value so a re-initialised load would show
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").is_file()
    assert not list(tmp_path.glob("*.bin")) and not list(tmp_path.glob("*.pt"))  # no pickle
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is H.AttnZooForCausalLM and loaded.config.attention == mechanism
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    assert loaded.model.lm_head.weight is loaded.model.wte.weight  # still tied
    ids = tokens()
    assert torch.equal(loaded(ids).logits, model(ids).logits)


def test_vision_save_pretrained_from_pretrained_is_bit_exact(tmp_path):
    # conv stem: BatchNorm running statistics are buffers and must survive too
    cfg = H.AttnZooVisionConfig(
        **{**TINY_VISION, "dim": 64}, patch_embed="conv", attention="xca", pool="class_attention", layerscale=1.0
    )
    model = AutoModelForImageClassification.from_config(cfg)
    model.train()
    model(pixel_values=torch.randn(4, 3, 16, 16))  # updates the BatchNorm running statistics
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForImageClassification.from_pretrained(tmp_path).eval()
    a, b = model.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    x = torch.randn(2, 3, 16, 16)
    assert torch.equal(loaded(pixel_values=x).logits, model(pixel_values=x).logits)


def _trainer_args(tmp_path) -> TrainingArguments:
    return TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        per_device_train_batch_size=4,
        learning_rate=1e-2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )


def test_trainer_runs_two_steps_on_the_lm(tmp_path):
    model = tiny_lm("tssa").train()
    g = torch.Generator().manual_seed(0)
    data = []
    for _ in range(8):
        ids = torch.randint(0, TINY_LM["vocab_size"], (12,), generator=g)
        data.append({"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids.clone()})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model=model, args=_trainer_args(tmp_path), train_dataset=data)
    result = trainer.train()
    assert result.global_step == 2
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    changed = [k for k, v in model.state_dict().items() if not torch.equal(before[k], v)]
    assert any(".attn." in k for k in changed) and "model.wte.weight" in changed


def test_trainer_runs_two_steps_on_the_vision_classifier(tmp_path):
    model = AutoModelForImageClassification.from_config(H.AttnZooVisionConfig(**TINY_VISION, attention="tssa"))
    g = torch.Generator().manual_seed(0)
    data = [{"pixel_values": torch.randn(3, 16, 16, generator=g), "labels": i % 5} for i in range(8)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = Trainer(model=model, args=_trainer_args(tmp_path), train_dataset=data)
    assert trainer.train().global_step == 2
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items() if ".attn." in k)
