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
from pathlib import Path
from typing import Any

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
    from attnzoo.adapt.text import TEXT_SOURCES

    p = argparse.ArgumentParser(prog="attnzoo adapt", description=__doc__.split("\n")[0].partition(": ")[2])
    p.add_argument("--model", required=True, help=MODEL_HELP)
    p.add_argument("--mechanism", required=True, help="the attnzoo mechanism to adapt into (causal form)")
    p.add_argument("--option", action="append", type=_option, default=[], help="mechanism option key=value")
    p.add_argument(
        "--data", default=None, choices=TEXT_SOURCES, help="offline training/held-out text (default shakespeare)"
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
    p.add_argument("--block-size", type=int, default=128, help="tokens per training window")
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--eval-tokens", type=int, default=4096, help="held-out tokens for perplexity (0: no evaluation)")
    p.add_argument("--eval-batches", type=int, default=8, help="run:DIR models: validation batches per evaluation")
    p.add_argument(
        "--eval-every", type=int, default=0, help="also evaluate every this many steps (0: only around the stages)"
    )
    p.add_argument(
        "--also-eval",
        default=None,
        choices=TEXT_SOURCES,
        help="a second held-out corpus, reported as <name>_perplexity beside --data's (e.g. imdb)",
    )
    p.add_argument(
        "--gen-contexts",
        default="",
        help="after the run, time greedy generation of teacher and student after prompts of these lengths "
        "(comma list, e.g. 128,512,1024; held-out tokens), into results.json's 'generation'",
    )
    p.add_argument("--checkpoint-every", type=int, default=50)
    p.add_argument("--stop-after", type=int, default=None, help="stop (with a checkpoint) after this step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or auto (CUDA when available)")
    p.add_argument("--no-progress", action="store_true")
    a = p.parse_args(argv)
    for name in ("block_size", "batch_size"):
        if getattr(a, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be a positive integer, got {getattr(a, name)}")
    for name in ("eval_tokens", "eval_batches", "threads", "eval_every"):
        if getattr(a, name) < 0:
            p.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(a, name)}")
    try:
        a.gen_contexts = [int(c) for c in a.gen_contexts.split(",") if c.strip()]
    except ValueError:
        p.error(f"--gen-contexts takes a comma list of positive integers, got {a.gen_contexts!r}")
    if any(c < 1 for c in a.gen_contexts):
        p.error(f"--gen-contexts takes positive integers, got {a.gen_contexts}")
    if a.model.startswith("run:") and (a.also_eval or a.gen_contexts):
        p.error("--also-eval and --gen-contexts apply to language models (not run:DIR)")
    if a.also_eval is not None and a.also_eval == (a.data or "shakespeare"):
        p.error(f"--also-eval {a.also_eval} is the --data corpus itself; name the other one")
    return a


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


def _text_model(a: argparse.Namespace, total_steps: int, device):
    """A pretrained language model (on ``device``), its training batches and held-out perplexity on ``--data``."""
    from attnzoo.adapt.text import load_text_split, perplexity, token_stream, window_batches

    teacher, tokenizer = load_pretrained(a.model)
    teacher.to(device)
    vocab = teacher.get_input_embeddings().weight.shape[0]
    train_text, held_out = load_text_split(a.data or "shakespeare")
    need = total_steps * a.batch_size * a.block_size
    train_tokens = token_stream(tokenizer, train_text, max(need, 64 * a.block_size), vocab)
    held = {}
    if a.eval_tokens:
        held[""] = token_stream(tokenizer, held_out, a.eval_tokens, vocab)
        if a.also_eval and a.also_eval != (a.data or "shakespeare"):
            held[f"{a.also_eval}_"] = token_stream(tokenizer, load_text_split(a.also_eval)[1], a.eval_tokens, vocab)
    batches = window_batches(train_tokens, a.block_size, a.batch_size, a.seed)

    def eval_fn(m):
        return {f"{pre}{k}": v for pre, toks in held.items() for k, v in perplexity(m, toks, a.block_size).items()}

    eval_fn.held_out = held.get("")  # the tokens --gen-contexts prompts with
    return teacher, batches, (eval_fn if held else None)


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


def _generation(teacher, student, a: argparse.Namespace, eval_fn) -> None:
    """Greedy generation speed of teacher and student (its LoRA adapters merged) after prompts of ``--gen-contexts``
    held-out tokens, printed and added to the run's results.json (``"generation"``)."""
    from attnzoo._io import write_json
    from attnzoo.adapt.text import generation_speed

    tokens = getattr(eval_fn, "held_out", None)
    if tokens is None or tokens.numel() < max(a.gen_contexts):
        raise ValueError(
            f"--gen-contexts up to {max(a.gen_contexts)} needs at least that many --eval-tokens of held-out text"
        )
    models = (("teacher", teacher), ("student", merge_lora(student)))
    gen = {name: generation_speed(m, tokens, a.gen_contexts) for name, m in models}
    for name, rows in gen.items():
        for r in rows:
            print(
                f"generation {name:7s} context {r['context']:5d}: prefill {r['prefill_s']:.3f} s, "
                f"{r['decode_tokens_per_s']:.1f} tokens/s after it"
            )
    path = Path(a.out) / "results.json"
    results = json.loads(path.read_text())
    results["generation"] = gen
    write_json(path, results)


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    import torch

    from attnzoo.adapt.loop import AdaptConfig, adapt

    if a.threads:
        torch.set_num_threads(a.threads)
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
        checkpoint_every=a.checkpoint_every,
        seed=a.seed,
        eval_every=a.eval_every,
    )
    cfg.validate()
    from attnzoo.train.device import resolve_device

    device = resolve_device(a.device)
    if a.model.startswith("run:"):
        if a.data is not None:
            raise ValueError("--data does not apply to run:DIR models: they adapt on their own task's data")
        teacher, batches, loss_fn, eval_fn = _attnzoo_run(a.model[len("run:") :], a, device)
    else:
        teacher, batches, eval_fn = _text_model(a, cfg.total_steps, device)
        loss_fn = None
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
    )
    for stage, values in res.evaluations.items():
        shown = ", ".join(f"{k} {v:.4g}" for k, v in values.items())
        print(f"{stage:9s} {shown}")
    if a.gen_contexts and res.step == cfg.total_steps:
        _generation(teacher, res.student.model, a, eval_fn)
    print(f"attnzoo adapt: step {res.step} of {cfg.total_steps}; run directory {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
