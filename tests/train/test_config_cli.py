"""Config loading, overrides and early failures (before any training or directory write)."""

import pytest

from attnzoo.train import cli as train_cli
from attnzoo.train.config import ConfigError, apply_overrides, list_presets, load_config, parse_overrides
from attnzoo.train.objectives import check_model_choice


def test_parse_overrides_forms():
    got = parse_overrides(
        [
            "--lr=1e-3",
            "--steps",
            "10",
            "--compile",
            "--model_options.depth=2",
            "--eval-batch-size=null",
            "--attention",
            "tssa",
        ]
    )
    assert got == {
        "lr": 1e-3,
        "steps": 10,
        "compile": True,
        "model_options.depth": 2,
        "eval_batch_size": None,
        "attention": "tssa",
    }
    with pytest.raises(ConfigError, match="--key=value"):
        parse_overrides(["steps=3"])


def test_words_yaml_reads_as_booleans_stay_words_for_text_fields():
    # amp is Literal["auto", "off", ...]: YAML 1.1 would read "off" as False
    got = parse_overrides(["--amp=off", "--compile=off"])
    assert got == {"amp": "off", "compile": False}
    cfg = apply_overrides(load_config("fmnist_vit_small"), parse_overrides(["--amp", "off"]))
    assert cfg.amp == "off"


def test_yaml_file_and_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("task: digits\nmodel: vit_cifar\nlr: 1e-3\nmodel_options: {depth: 2}\n")
    cfg = load_config(str(f), {"model_options.heads": 4, "attention": "cbsa"})
    assert cfg.lr == 1e-3 and cfg.model_options == {"depth": 2, "heads": 4}
    assert cfg.resolved_model_options()["attention"] == "cbsa"
    assert apply_overrides(cfg, {"steps": 7}).steps == 7


@pytest.mark.parametrize(
    "overrides, exc, match",
    [
        ({"lrr": 1.0}, ConfigError, r"unknown config key 'lrr' \(did you mean 'lr'\?\); valid keys: \[.*'lr'"),
        ({"steps": "ten"}, TypeError, r"steps='ten' has type str; expected int"),
        ({"steps": 2.5}, TypeError, "expected int"),
        ({"compile": "yes"}, TypeError, "expected bool"),
        ({"optimizer": "sgd"}, ConfigError, r"valid choices: \['adamw', 'lion'\]"),
        ({"schedule": "step"}, ConfigError, r"valid choices: \['cosine', 'linear', 'inverse_sqrt', 'constant'\]"),
        ({"lr.x": 1}, ConfigError, "not an options mapping"),
    ],
)
def test_bad_overrides(overrides, exc, match):
    with pytest.raises(exc, match=match):
        load_config("digits_vit_tiny", overrides)


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"task": "cifar10"}, r"unknown task 'cifar10'; valid tasks: \[.*'fashion_mnist'"),
        ({"model": "vit_xxl"}, r"unknown model 'vit_xxl'; valid models: \[.*'vit_cifar'"),
        ({"attention": "flash9"}, r"unknown attention 'flash9'; valid attentions: \[.*'softmax'"),
        ({"model": "gpt2_base"}, r"needs a 'vision' model; valid models for it: \[.*'vit_cifar'"),
        ({"model_options.depht": 2}, r"unknown VisionConfig key\(s\) \['depht'\]"),
        ({"steps": 0}, "steps must be >= 1"),
        ({"model": ""}, "no model given"),
    ],
)
def test_semantic_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        check_model_choice(load_config("digits_vit_tiny", overrides).validate())


def test_unknown_preset_lists_presets():
    with pytest.raises(ConfigError, match=r"unknown preset 'nope'.*valid presets: \[.*'digits_vit_tiny'"):
        load_config("nope")


def test_every_preset_is_valid():
    presets = list_presets()
    assert len(presets) >= 25 and all(presets.values())
    tasks = set()
    for name in presets:
        cfg = load_config(name).validate()
        check_model_choice(cfg)
        tasks.add(cfg.task)
    assert {
        "digits",
        "fashion_mnist",
        "lra_listops",
        "lra_text",
        "lra_retrieval",
        "lra_image",
        "lra_pathfinder",
        "lra_pathx",
        "shakespeare_char",
        "icl_linear",
        "icl_sparse_linear",
    } <= tasks


@pytest.mark.parametrize(
    "args, match",
    [
        (["digits_vit_tiny", "--lrr=1"], "unknown config key"),
        (["digits_vit_tiny", "--model=vit_xxl"], "unknown model"),
        (["digits_vit_tiny", "--steps=abc"], "expected int"),
        ([], "no config given"),
    ],
)
def test_cli_fails_before_touching_the_out_dir(tmp_path, capsys, args, match):
    out = tmp_path / "run"
    assert train_cli.main(args + ["--out", str(out)]) == 2
    assert match in capsys.readouterr().err
    assert not out.exists()
