"""``attnzoo adapt``: adapt a pretrained language model into a mechanism (attention transfer, then fine-tuning).

Example (SmolLM2, installed by ``bash scripts/install_models.sh``)::

    attnzoo adapt --model smollm2 --mechanism tssa --data shakespeare --out runs/smollm2-tssa \\
        --transfer-steps 200 --finetune-steps 100 --block-size 128 --batch-size 2

The run directory gets ``metrics.csv`` (per step: stage, loss, each layer's transfer loss), ``transfer_loss.png``,
``results.json`` (held-out perplexity of the teacher, the swapped model, after transfer and after fine-tuning) and
checkpoints; ``--resume`` continues an interrupted run exactly.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

MODEL_HELP = (
    "smollm2 (the GGUF installed by scripts/install_models.sh), gguf:PATH (a Llama-family GGUF file), a local "
    "transformers model directory (GPT-2 or Llama-family, with its tokenizer), or run:DIR (an `attnzoo train` run: "
    "its latest checkpoint, adapted on its own task's data)"
)


def _option(text: str) -> tuple[str, Any]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--option takes key=value (e.g. p=2), got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="attnzoo adapt", description=__doc__.split("\n")[0].partition(": ")[2])
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--mechanism", required=True, help="the attnzoo mechanism to adapt into (causal form)")
    p.add_argument("--option", action="append", type=_option, default=[], help="mechanism option key=value")
    p.add_argument(
        "--data",
        default=None,
        help="the training mixture: a comma list of CORPUS[:WEIGHT], CORPUS one of plays (alias shakespeare), imdb, "
        "pydocs or a path to a UTF-8 text file, WEIGHT > 0 (default 1); e.g. plays:1,imdb:1,./my.txt:0.5 "
        "(default plays). Each corpus's held-out part is never trained on (docs/adapt.md)",
    )
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="delete the run in --out and start again")
    p.add_argument("--transfer-steps", type=int, default=100)
    p.add_argument("--finetune-steps", type=int, default=0)
    p.add_argument("--transfer-lr", type=float, default=1e-3)
    p.add_argument("--finetune-lr", type=float, default=1e-4)
    p.add_argument("--warmup-steps", type=int, default=0)
    p.add_argument(
        "--train-projections",
        choices=("auto", "yes", "no"),
        default="auto",
        help="transfer also trains the inherited q/k/v/o (auto: only when the mechanism adds no parameters)",
    )
    p.add_argument("--lora-rank", type=int, default=0, help="fine-tune LoRA adapters of this rank (0: all weights)")
    p.add_argument(
        "--lora-alpha",
        type=float,
        default=16.0,
        help="LoRA alpha: updates are scaled by alpha / rank (a higher rank at the same alpha learns slower)",
    )
    p.add_argument("--block-size", type=int, default=128, help="tokens per training window")
    p.add_argument("--batch-size", type=int, default=2)
    _add_evaluation_args(p)
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--stop-after", type=int, default=None, help="stop (with a checkpoint) after this step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (CUDA when available)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    _check_args(p, a)
    return a


def _add_evaluation_args(p: argparse.ArgumentParser) -> None:
    """The options of held-out evaluation, the control and the generation timing."""
    p.add_argument("--eval-tokens", type=int, default=4096, help="held-out tokens for perplexity (0: no evaluation)")
    p.add_argument("--eval-batches", type=int, default=8, help="run:DIR models: validation batches per evaluation")
    p.add_argument(
        "--eval-every", type=int, default=0, help="also evaluate every this many steps (0: only around the stages)"
    )
    p.add_argument(
        "--also-eval",
        default=None,
        help="held-out corpora evaluated but not trained on (a comma list of corpora or files, as in --data, "
        "without weights), reported as <name>_perplexity beside --data's (e.g. imdb)",
    )
    p.add_argument(
        "--control",
        action="store_true",
        help="also fine-tune the teacher itself (softmax kept) with the same fine-tuning steps, rate and batches, "
        "in OUT/control: the control every per-corpus perplexity is compared with",
    )
    p.add_argument(
        "--prompt-lengths",
        "--gen-contexts",
        dest="prompt_lengths",
        default="",
        help="after the run, time prefill and per-token greedy decoding of the teacher, the control and the student "
        "after prompts of these lengths (comma list of integers or max, the model's longest context, e.g. "
        "1024,2048,4096,max; held-out tokens), into results.json's 'generation'",
    )
    p.add_argument("--decode-tokens", type=int, default=16, help="tokens generated per timed prompt (>= 2)")


def _check_args(p: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Values argparse cannot check alone: ranges, combinations, the ``--data`` / ``--also-eval`` specs."""
    for name in ("block_size", "batch_size"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(a, name)}")
    for name in ("eval_tokens", "eval_batches", "threads", "eval_every"):
        if getattr(a, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(a, name)}")
    a.prompt_lengths = parse_prompt_lengths(p, a.prompt_lengths)
    if a.decode_tokens < 2:
        p.error(f"--decode-tokens must be >= 2 (the first token, then at least one decoded), got {a.decode_tokens}")
    if a.model.startswith("run:") and (a.also_eval or a.prompt_lengths or a.control):
        p.error("--also-eval, --control and --prompt-lengths apply to language models (not run:DIR)")
    if a.control and a.finetune_steps == 0:
        p.error("--control fine-tunes the teacher for --finetune-steps steps; give --finetune-steps > 0")
    if not a.model.startswith("run:"):
        try:
            a.corpora, a.extra_corpora = _corpora(a)
        except ValueError as e:
            p.error(str(e))


def parse_prompt_lengths(p: argparse.ArgumentParser, text: str) -> list[int | str]:
    """``--prompt-lengths`` as a list of positive integers and ``"max"``."""
    out: list[int | str] = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        if item == "max":
            out.append(item)
            continue
        try:
            value = int(item)
        except ValueError:
            value = 0
        if value < 1:
            p.error(f"--prompt-lengths takes a comma list of positive integers or max, got {item!r} in {text!r}")
        out.append(value)
    return out


def load_pretrained(spec: str):
    """``(model, tokenizer)`` for ``--model`` (see :data:`MODEL_HELP`)."""
    from attnzoo.adapt.gguf import load_gguf_llama, load_smollm2

    if spec == "smollm2":
        return load_smollm2()
    if spec.startswith("gguf:"):
        return load_gguf_llama(spec[len("gguf:") :])
    path = Path(spec)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--model {spec!r}: not a model directory (no config.json); valid: {MODEL_HELP}")
    from attnzoo.hf.pretrained import load_local_causal_lm

    return load_local_causal_lm(path)


def _corpora(a: argparse.Namespace):
    """``(training corpora, evaluated-only corpora)`` of ``--data`` and ``--also-eval`` (the first named once)."""
    from attnzoo.adapt.mixture import parse_mixture

    train = parse_mixture(a.data or "plays")
    extra = parse_mixture(a.also_eval, "--also-eval") if a.also_eval else []
    for c in extra:
        if any(t.name == c.name for t in train):
            raise ValueError(f"--also-eval {c.name} is already in --data (evaluated there); name another corpus")
    return train, extra


@dataclass
class TextRun:
    """What ``attnzoo adapt`` needs of a language model: the ``teacher``, ``batches(step)`` of the mixture,
    ``eval_fn`` (held-out perplexity per corpus, or ``None``), ``corpora`` ``{name: metric prefix}`` (the first
    training corpus unprefixed, ``perplexity``; the others ``<name>_perplexity``), the names of the prefixed metrics
    and ``prompt(n)``, ``n`` held-out tokens ``(n,)`` to time generation after."""

    teacher: Any
    batches: Callable[[int], dict]
    eval_fn: Callable[[Any], dict[str, float]] | None
    corpora: dict[str, str]
    metrics: list[str]
    prompt: Callable[[int], Any]


def _text_model(a: argparse.Namespace, total_steps: int, device) -> TextRun:
    """The pretrained language model (on ``device``), the mixture's training batches and held-out evaluation."""
    from attnzoo.adapt.mixture import load_corpus_split, mixture_batches
    from attnzoo.adapt.text import perplexity, token_stream

    teacher, tokenizer = load_pretrained(a.model)
    teacher.to(device)
    # before training: a bad length fails at once
    a.prompt_lengths = resolve_prompt_lengths(a.prompt_lengths, teacher, a.decode_tokens)
    vocab = teacher.get_input_embeddings().weight.shape[0]
    train, extra = a.corpora, a.extra_corpora

    def tokenize(text: str, n: int):
        return token_stream(tokenizer, text, n, vocab)

    need = max(total_steps * a.batch_size * a.block_size, 64 * a.block_size)
    batches, held_text = mixture_batches(tokenize, train, need, a.block_size, a.batch_size, a.seed)
    held_text.update({c.name: load_corpus_split(c)[1] for c in extra})
    corpora = {name: ("" if i == 0 else f"{name}_") for i, name in enumerate(held_text)}
    held = {corpora[n]: tokenize(t, a.eval_tokens) for n, t in held_text.items()} if a.eval_tokens else {}

    def eval_fn(m):
        return {f"{pre}{k}": v for pre, toks in held.items() for k, v in perplexity(m, toks, a.block_size).items()}

    def prompt(n: int):
        # held-out text only: every corpus's, the first corpus's first
        return tokenize("\n\n".join(held_text.values()), n)

    metrics = [f"{pre}{k}" for pre in corpora.values() if pre for k in ("loss", "perplexity")]
    return TextRun(teacher, batches, eval_fn if held else None, corpora, metrics, prompt)


def _attnzoo_run(run: str, a: argparse.Namespace, device):
    """An ``attnzoo train`` run's model (latest checkpoint, on ``device``), batches of its task's training set
    (``--batch-size`` samples drawn from ``(seed, step)``), its task loss and its validation metrics."""
    import torch

    from attnzoo.data.tasks import build_task
    from attnzoo.train.checkpoint import CheckpointError, latest_checkpoint, load_checkpoint
    from attnzoo.train.objectives import build_task_model, compute_loss
    from attnzoo.train.run_dir import load_run
    from attnzoo.train.trainer import evaluate

    cfg = load_run(Path(run))
    ckpt = latest_checkpoint(Path(run) / "checkpoints")
    if ckpt is None:
        raise CheckpointError(f"--model run:{run}: the run has no checkpoint yet")
    task = build_task(cfg.task, **cfg.task_options)
    model = build_task_model(cfg, task)
    load_checkpoint(ckpt, model, restore_rng=False)
    model.to(device).eval()
    n = len(task.train)

    def batches(step: int):
        g = torch.Generator().manual_seed(a.seed * 1_000_003 + step)
        return task.train.get_batch(torch.randint(0, n, (a.batch_size,), generator=g).numpy())

    def loss_fn(m, batch):
        return compute_loss(task.kind, m(*batch[0]), batch[1])[0]

    def eval_fn(m):
        metrics = evaluate(m, task, a.batch_size, device, max_batches=a.eval_batches)
        return {k: v for k, v in metrics.items() if isinstance(v, float)}

    return model, batches, loss_fn, (eval_fn if a.eval_batches else None)


def merge_lora(model):
    """``model`` with its LoRA adapters (peft) folded into their base weights, in place, as a deployed model runs
    them: generation is then timed without the adapters' extra products (the last use of the student here)."""
    for m in model.modules():
        if hasattr(m, "lora_A") and callable(getattr(m, "merge", None)):
            m.merge()
    return model


def resolve_prompt_lengths(lengths: list[int | str], model, decode_tokens: int) -> list[int]:
    """``--prompt-lengths`` as token counts: ``max`` is the longest prompt the model's context
    (``config.max_position_embeddings``) holds with the ``decode_tokens`` generated after it; a longer one is an
    error."""
    longest = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if "max" in lengths and not isinstance(longest, int):
        raise ValueError("--prompt-lengths max needs a model whose config names max_position_embeddings; give numbers")
    room = longest - decode_tokens if isinstance(longest, int) else None
    out = [room if n == "max" else int(n) for n in lengths]
    too_long = [n for n in out if room is not None and n > room]
    if too_long or (room is not None and room < 1):
        raise ValueError(
            f"--prompt-lengths {too_long or lengths}: a prompt and the --decode-tokens {decode_tokens} after it "
            f"must fit the model's context of {longest} tokens (max: {room})"
        )
    return list(dict.fromkeys(out))


def _generation(models: dict[str, Any], a: argparse.Namespace, text: TextRun) -> dict[str, list[dict]]:
    """Prefill seconds and per-token greedy decoding time of each of ``models`` (LoRA adapters merged) after prompts
    of ``--prompt-lengths`` held-out tokens, printed and added to the run's results.json (``"generation"``)."""
    from attnzoo.adapt.text import generation_speed

    lengths = a.prompt_lengths
    tokens = text.prompt(max(lengths))
    if tokens.numel() < max(lengths):
        raise ValueError(
            f"--prompt-lengths up to {max(lengths)} needs that many held-out tokens; the held-out text of the "
            f"corpora gives {tokens.numel()}: add a corpus to --also-eval or give shorter lengths"
        )
    gen = {name: generation_speed(merge_lora(m), tokens, lengths, a.decode_tokens) for name, m in models.items()}
    for name, rows in gen.items():
        for r in rows:
            print(
                f"generation {name:8s} prompt {r['context']:6d}: prefill {r['prefill_s']:.3f} s, "
                f"decode {1e3 * r['decode_s_per_token']:.1f} ms/token ({r['decode_tokens_per_s']:.1f} tokens/s)"
            )
    _add_results(Path(a.out), generation=gen)
    return gen


def _add_results(out: Path, **entries: Any) -> None:
    """Add ``entries`` to ``out/results.json`` (written atomically)."""
    from attnzoo._io import write_json

    path = out / "results.json"
    results = json.loads(path.read_text())
    results.update(entries)
    write_json(path, results)


def _control(text: TextRun, cfg, a: argparse.Namespace):
    """The teacher fine-tuned (softmax kept) with the student's fine-tuning steps, rate, LoRA rank and batches (step
    ``s`` of the control is step ``transfer_steps + s`` of the student), as its own resumable run in ``OUT/control``;
    ``None`` until the student's run is complete."""
    from dataclasses import replace

    from attnzoo.adapt.loop import adapt

    control_cfg = replace(cfg, mechanism="softmax", options={}, transfer_steps=0, train_projections=None)
    shift = cfg.transfer_steps

    def batches(step: int):
        return text.batches(shift + step)

    return adapt(
        text.teacher,
        batches,
        control_cfg,
        Path(a.out) / "control",
        eval_fn=text.eval_fn,
        resume=a.resume,
        progress=not a.no_progress,
        eval_metrics=text.metrics,
    )


def _config(a: argparse.Namespace):
    from attnzoo.adapt.loop import AdaptConfig

    cfg = AdaptConfig(
        mechanism=a.mechanism,
        options=dict(a.option),
        transfer_steps=a.transfer_steps,
        finetune_steps=a.finetune_steps,
        transfer_lr=a.transfer_lr,
        finetune_lr=a.finetune_lr,
        warmup_steps=a.warmup_steps,
        train_projections={"auto": None, "yes": True, "no": False}[a.train_projections],
        lora_rank=a.lora_rank,
        lora_alpha=a.lora_alpha,
        checkpoint_every=a.checkpoint_every,
        seed=a.seed,
        eval_every=a.eval_every,
        data=None if a.model.startswith("run:") else _data_record(a),
    )
    cfg.validate()
    return cfg


def _data_record(a: argparse.Namespace) -> dict:
    """What a language model's batches and evaluations are drawn from, as the run records it (a resume with other
    data is refused): the mixture (files by absolute path), block and batch size, held-out corpora and tokens."""

    def items(corpora):
        return [[c.name, c.weight, str(c.path.resolve()) if c.path else None] for c in corpora]

    return {
        "mixture": items(a.corpora),
        "also_eval": items(a.extra_corpora),
        "block_size": a.block_size,
        "batch_size": a.batch_size,
        "eval_tokens": a.eval_tokens,
    }


def _finish_text(res, cfg, a: argparse.Namespace, text: TextRun) -> None:
    """After a language model's run: the control, the per-corpus table and the generation timing (each once the
    student's run is complete)."""
    if res.step != cfg.total_steps:
        return
    evaluations = dict(res.evaluations)
    control = _control(text, cfg, a) if a.control else None
    if control is not None and "finetune" in control.evaluations:
        evaluations["control"] = control.evaluations["finetune"]
        _add_results(Path(a.out), evaluations=evaluations)
    if text.eval_fn is not None:
        from attnzoo.adapt.summary import per_corpus, per_corpus_table

        table = per_corpus(evaluations, text.corpora)
        _add_results(Path(a.out), per_corpus=table, corpora=list(text.corpora))
        print("held-out perplexity per corpus:\n" + per_corpus_table(table))
    if a.prompt_lengths:
        models = {"teacher": text.teacher, "student": res.student.model}
        if control is not None:
            models = {"teacher": text.teacher, "control": control.student.model, "student": res.student.model}
        _generation(models, a, text)


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    import torch

    from attnzoo.adapt.loop import adapt
    from attnzoo.train.device import resolve_device

    if a.threads:
        torch.set_num_threads(a.threads)
    cfg = _config(a)
    device = resolve_device(a.device)
    text = None
    if a.model.startswith("run:"):
        if a.data is not None:
            raise ValueError("--data does not apply to run:DIR models: they adapt on their own task's data")
        teacher, batches, loss_fn, eval_fn = _attnzoo_run(a.model[len("run:") :], a, device)
    else:
        text = _text_model(a, cfg.total_steps, device)
        teacher, batches, eval_fn, loss_fn = text.teacher, text.batches, text.eval_fn, None
    res = adapt(
        teacher,
        batches,
        cfg,
        a.out,
        loss_fn=loss_fn,
        eval_fn=eval_fn,
        resume=a.resume,
        overwrite=a.overwrite,
        stop_after=a.stop_after,
        progress=not a.no_progress,
        eval_metrics=text.metrics if text is not None else (),
    )
    for stage, values in res.evaluations.items():
        shown = ", ".join(f"{k} {v:.4g}" for k, v in values.items())
        print(f"{stage:9s} {shown}")
    if text is not None:
        _finish_text(res, cfg, a, text)
    print(f"attnzoo adapt: step {res.step} of {cfg.total_steps}; run directory {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
