"""``attnzoo adapt-speed``: prefill and per-token decoding time of a teacher and the models adapted from it, in one
process, after prompts of given lengths.

    attnzoo adapt-speed --model smollm2 runs/tssa runs/fastmax2 runs/tssa/control \\
        --prompt-lengths 1024,2048,4096,max --threads 1 --out speed.json

Every model decodes the same held-out prompts (``--data``'s held-out text) greedily; each adapted model is the
latest checkpoint of its ``attnzoo adapt`` run (an ``OUT/control`` directory is the run's control), with LoRA
adapters merged into their weights. Timing the models one after another in one process keeps them on the same
machine state, which separate runs' ``--prompt-lengths`` tables do not.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["main", "time_models"]


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    from attnzoo.adapt.cli import MODEL_HELP

    p = argparse.ArgumentParser(prog="attnzoo adapt-speed", description=__doc__.split("\n")[0].partition(": ")[2])
    p.add_argument("runs", nargs="*", help="`attnzoo adapt` run directories adapted from --model")
    p.add_argument("--model", required=True, help="the teacher the runs adapted: " + MODEL_HELP)
    p.add_argument(
        "--prompt-lengths",
        required=True,
        help="comma list of prompt lengths in tokens, or max (the longest prompt the model's context holds with "
        "--decode-tokens after it), e.g. 1024,2048,4096,max",
    )
    p.add_argument("--decode-tokens", type=int, default=16, help="tokens generated per prompt (>= 2)")
    p.add_argument("--data", default="plays", help="corpora whose held-out text gives the prompts (as adapt --data)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", default=None, help="also write the timings to this JSON file")
    a = p.parse_args(argv)
    from attnzoo.adapt.cli import parse_prompt_lengths
    from attnzoo.adapt.mixture import parse_mixture

    a.prompt_lengths = parse_prompt_lengths(p, a.prompt_lengths)
    if not a.prompt_lengths:
        p.error("--prompt-lengths names no length; give e.g. 1024,2048,max")
    if a.decode_tokens < 2:
        p.error(f"--decode-tokens must be >= 2 (the first token, then at least one decoded), got {a.decode_tokens}")
    try:
        a.corpora = parse_mixture(a.data)
    except ValueError as e:
        p.error(str(e))
    return a


def time_models(models: dict, tokens, lengths: list[int], decode_tokens: int) -> dict[str, list[dict]]:
    """``{name: generation_speed rows}`` of each of ``models`` (LoRA adapters merged) after prompts of ``lengths``
    tokens of ``tokens (T,)``."""
    from attnzoo.adapt.cli import merge_lora
    from attnzoo.adapt.text import generation_speed

    return {name: generation_speed(merge_lora(m), tokens, lengths, decode_tokens) for name, m in models.items()}


def main(argv: list[str] | None = None) -> int:
    a = _parse_args(argv)
    import torch

    from attnzoo._io import write_json
    from attnzoo.adapt.cli import load_pretrained, resolve_prompt_lengths
    from attnzoo.adapt.loop import load_student
    from attnzoo.adapt.mixture import load_corpus_split
    from attnzoo.adapt.summary import generation_table
    from attnzoo.adapt.text import token_stream

    if a.threads:
        torch.set_num_threads(a.threads)
    teacher, tokenizer = load_pretrained(a.model)
    lengths = resolve_prompt_lengths(a.prompt_lengths, teacher, a.decode_tokens)
    models = {"teacher": teacher}
    for run in a.runs:
        name = str(Path(run))
        if name in models:
            raise ValueError(f"run {run} is named twice; give each run once")
        models[name] = load_student(teacher, run)
    text = "\n\n".join(load_corpus_split(c)[1] for c in a.corpora)
    tokens = token_stream(tokenizer, text, max(lengths), teacher.get_input_embeddings().weight.shape[0])
    if tokens.numel() < max(lengths):
        raise ValueError(
            f"--prompt-lengths up to {max(lengths)} needs that many held-out tokens; --data {a.data} gives "
            f"{tokens.numel()}: add corpora or give shorter lengths"
        )
    gen = time_models(models, tokens, lengths, a.decode_tokens)
    print(generation_table([{"name": "speed", "generation": gen}]))
    if a.out:
        write_json(Path(a.out), {"model": a.model, "decode_tokens": a.decode_tokens, "generation": gen})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
