"""``attnzoo adapt --data MIXTURE --control``: per-corpus held-out perplexity against a direct computation, exact
resume after a kill in either run, the spec errors on the command line."""

import json

import pytest
from conftest import require

require("transformers")  # fails, not skips, where the hf extra is installed but transformers is broken
from test_gguf import tiny_llama, write_gguf  # noqa: E402

from attnzoo.cli import main  # noqa: E402

BLOCK, EVAL_TOKENS = 16, 48


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, tiny_llama())
    return path


@pytest.fixture(scope="module")
def notes(tmp_path_factory):
    """A user text file: training text, then its held-out last tenth."""
    path = tmp_path_factory.mktemp("text") / "notes.txt"
    path.write_text(" ".join(f"the cat {i % 7} sat on the mat {i % 5}" for i in range(60)))
    return path


def _args(model, out, notes, *extra):
    return [
        "adapt", "--model", f"gguf:{model}", "--mechanism", "linear", "--out", str(out), "--data",
        f"plays:1,{notes}:0.5", "--also-eval", "pydocs", "--transfer-steps", "2", "--finetune-steps", "3",
        "--block-size", str(BLOCK), "--eval-tokens", str(EVAL_TOKENS), "--threads", "1", "--no-progress",
        "--checkpoint-every", "2", *extra,
    ]  # fmt: skip


def _direct(model, tok, corpus):
    """Held-out perplexity of ``model`` on ``corpus``, computed here from the corpus's split."""
    from attnzoo.adapt.mixture import load_corpus_split, parse_mixture
    from attnzoo.adapt.text import perplexity, token_stream

    held = load_corpus_split(parse_mixture(corpus)[0])[1]
    vocab = model.get_input_embeddings().weight.shape[0]
    return perplexity(model, token_stream(tok, held, EVAL_TOKENS, vocab), BLOCK)["perplexity"]


def test_per_corpus_perplexity_equals_a_direct_computation(one_thread, tmp_path, tiny_gguf, notes, capsys):
    from attnzoo.adapt import load_gguf_llama, make_student
    from attnzoo.train.checkpoint import latest_checkpoint, load_checkpoint

    extra = ["--control", "--prompt-lengths", "8,max", "--decode-tokens", "4"]
    assert main(_args(tiny_gguf, tmp_path / "run", notes, *extra)) == 0
    printed = capsys.readouterr().out
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    table = results["per_corpus"]
    assert list(table) == results["corpora"] == ["plays", "notes", "pydocs"]
    cols = ["teacher", "control", "swapped", "transfer", "finetune"]
    assert all(list(row) == cols for row in table.values())
    assert "| corpus | teacher | control (teacher fine-tuned) | swapped | after transfer | after fine-tune |" in printed
    assert f"| notes | {table['notes']['teacher']:,.1f} |" in printed

    teacher, tok = load_gguf_llama(tiny_gguf)
    student = make_student(teacher, "linear").model
    for corpus, spec in (("plays", "plays"), ("notes", str(notes)), ("pydocs", "pydocs")):
        assert table[corpus]["teacher"] == pytest.approx(_direct(teacher, tok, spec), rel=1e-6)
        assert table[corpus]["swapped"] == pytest.approx(_direct(student, tok, spec), rel=1e-6)
    # after fine-tuning: the run's last checkpoint (the whole student), evaluated here
    load_checkpoint(latest_checkpoint(tmp_path / "run" / "checkpoints"), student, restore_rng=False)
    assert table["notes"]["finetune"] == pytest.approx(_direct(student, tok, str(notes)), rel=1e-6)
    assert table["notes"]["finetune"] != table["notes"]["swapped"]
    # the control: the teacher itself (softmax swapped in reproduces it), then fine-tuned
    control = json.loads((tmp_path / "run" / "control" / "results.json").read_text())["evaluations"]
    assert control["swapped"] == pytest.approx(control["teacher"], rel=1e-5)
    assert table["notes"]["control"] == control["finetune"]["notes_perplexity"] != table["notes"]["teacher"]
    # the first corpus's metrics are the run's headline "perplexity", the others carry their name
    assert results["evaluations"]["finetune"]["perplexity"] == table["plays"]["finetune"]
    header = (tmp_path / "run" / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"notes_perplexity", "pydocs_perplexity", "notes_loss"} <= set(header)

    # timing: teacher, control and student after prompts of 8 tokens and of max (the context of 64 less the 4
    # decoded tokens), then the summary's tables read back from the run directory
    gen = results["generation"]
    assert list(gen) == ["teacher", "control", "student"]
    assert all([r["context"] for r in rows] == [8, 60] for rows in gen.values())
    assert all(r["prefill_s"] > 0 and r["decode_s_per_token"] > 0 for rows in gen.values() for r in rows)
    from attnzoo.adapt import summary

    assert summary.main([str(tmp_path / "run")]) == 0
    printed = capsys.readouterr().out
    assert (
        "run, held-out perplexity per corpus:" in printed
        and f"| pydocs | {table['pydocs']['teacher']:,.1f} |" in printed
    )
    ms = 1e3 * gen["control"][1]["decode_s_per_token"]
    assert f"| run | control | 60 | {gen['control'][1]['prefill_s']:.3f} | {ms:.1f} |" in printed


def test_resume_after_a_kill_in_the_student_or_the_control_repeats_the_run(
    one_thread, tmp_path, tiny_gguf, notes, monkeypatch, capsys
):
    from attnzoo.adapt import loop

    assert main(_args(tiny_gguf, tmp_path / "whole", notes, "--control")) == 0
    real_step, calls = loop._Run.step, []

    def step(self, *args, **kwargs):
        calls.append(1)
        if len(calls) in (4, 10):
            raise RuntimeError("killed")
        return real_step(self, *args, **kwargs)

    monkeypatch.setattr(loop._Run, "step", step)
    # killed at the student's step 4 (after its checkpoint at step 2), resumed (student steps 3-5, then the control),
    # killed again at the control's step 3 (after its checkpoint at step 2), resumed
    args = _args(tiny_gguf, tmp_path / "killed", notes, "--control")
    assert main(args) == 1
    assert main(args + ["--resume"]) == 1 and len(calls) == 10
    assert main(args + ["--resume"]) == 0

    def read(run, *path):
        return json.loads((tmp_path / run / "/".join(path)).read_text())

    def losses(run, *sub):
        rows = (tmp_path / run / "/".join(sub) / "metrics.csv").read_text().splitlines()
        return [r.split(",")[4] for r in rows[1:] if ",train," in r]

    whole, got = read("whole", "results.json"), read("killed", "results.json")
    assert got["evaluations"] == whole["evaluations"] and got["per_corpus"] == whole["per_corpus"]
    control = read("killed", "control", "results.json")["evaluations"]
    assert control == read("whole", "control", "results.json")["evaluations"]
    assert losses("killed") == losses("whole") and losses("killed", "control") == losses("whole", "control")
    assert len(losses("whole", "control")) == 3
    # resuming with another mixture (or block size) would draw other batches: refused, naming the setting
    other = _args(tiny_gguf, tmp_path / "whole", notes, "--control", "--resume")
    other[other.index("--data") + 1] = f"plays:1,{notes}:2"
    assert main(other) == 1
    assert (
        "was started with other settings (data: {'mixture': [['plays', 1.0, None], ['notes', 0.5,"
        in capsys.readouterr().err
    )


def test_mixture_errors_on_the_command_line(tmp_path, tiny_gguf, capsys):
    base = ["adapt", "--model", f"gguf:{tiny_gguf}", "--mechanism", "linear", "--out", str(tmp_path / "r")]
    (tmp_path / "empty.txt").write_text("")
    for data, message in (
        ("plays:1,wiki:2", "--data item 'wiki:2': 'wiki' is neither a corpus nor an existing file"),
        ("plays:-0.5", "--data item 'plays:-0.5': weight -0.5 must be a finite number > 0"),
        (f"{tmp_path / 'missing.txt'}", "missing.txt' is neither a corpus nor an existing file"),
        (f"{tmp_path / 'empty.txt'}:1", "empty.txt is empty; give a file with text in it"),
    ):
        assert main(base + ["--data", data]) == 2
        err = capsys.readouterr().err
        assert message in err
        assert "CORPUS[:WEIGHT]" in err or "give a file with text" in err  # what would be valid
    assert main(base + ["--control"]) == 2
    assert "--control fine-tunes the teacher for --finetune-steps steps" in capsys.readouterr().err
    assert main(base + ["--finetune-steps", "2", "--lora-rank", "2", "--lora-alpha", "0"]) == 1
    assert "lora_alpha must be a finite number > 0, got 0.0" in capsys.readouterr().err


def test_adapt_speed_times_the_teacher_and_each_run_from_its_checkpoint(one_thread, tmp_path, tiny_gguf, notes, capsys):
    from attnzoo.adapt import load_gguf_llama, load_student
    from attnzoo.adapt.mixture import load_corpus_split, parse_mixture
    from attnzoo.adapt.text import perplexity, token_stream

    run = tmp_path / "run"
    # alpha 6 (not the default 16): the rebuilt student below matches only if the scale alpha / rank is kept
    assert main(_args(tiny_gguf, run, notes, "--control", "--lora-rank", "2", "--lora-alpha", "6")) == 0
    for path in (run, run / "control"):
        assert json.loads((path / "adapt.json").read_text())["lora_alpha"] == 6.0
    results = json.loads((run / "results.json").read_text())
    assert results["per_corpus"]["pydocs"]["finetune"] == results["evaluations"]["finetune"]["pydocs_perplexity"]
    # a run's latest checkpoint rebuilt (mechanism, LoRA adapters) is the model the run evaluated last
    teacher, tok = load_gguf_llama(tiny_gguf)
    held = token_stream(tok, load_corpus_split(parse_mixture("pydocs")[0])[1], EVAL_TOKENS, 64)
    for path, stage in ((run, "finetune"), (run / "control", "finetune")):
        ppl = perplexity(load_student(teacher, path), held, BLOCK)["perplexity"]
        want = json.loads((path / "results.json").read_text())["evaluations"][stage]["pydocs_perplexity"]
        assert ppl == pytest.approx(want, rel=1e-6)
        assert ppl != results["per_corpus"]["pydocs"]["teacher"]  # the adapted weights, not the teacher's

    out = tmp_path / "speed.json"
    argv = ["adapt-speed", "--model", f"gguf:{tiny_gguf}", str(run), str(run / "control"), "--prompt-lengths", "8,max"]
    assert main(argv + ["--decode-tokens", "4", "--threads", "1", "--out", str(out)]) == 0
    gen = json.loads(out.read_text())["generation"]
    assert list(gen) == ["teacher", str(run), str(run / "control")]
    assert all(
        [r["context"] for r in rows] == [8, 60] and r["decode_s_per_token"] > 0 for rows in gen.values() for r in rows
    )
    assert f"| speed | {run} | 60 |" in capsys.readouterr().out
    assert main(["adapt-speed", "--model", f"gguf:{tiny_gguf}", str(tmp_path), "--prompt-lengths", "8"]) == 1
    assert "is not an attnzoo adapt run directory" in capsys.readouterr().err
