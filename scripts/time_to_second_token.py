"""Time to the second token after a long prompt: a ``transformers`` GPT-2 against its swapped versions.

Builds a random GPT-2 (GPT-2 small's sizes by default: 12 layers, width 768, 12 heads, vocabulary 50257), then for
each mechanism a copy with every attention swapped (:func:`attnzoo.hf.swap_attention`), and times greedy
``generate(max_new_tokens=2)`` from one prompt of ``--prompt`` tokens: the prompt's parallel pass (the prefill,
which hands each mechanism its decoding state) plus one decoding step. Prints the median over ``--repeats`` runs
after one warm-up, and its ratio to the original model's (the target: within 2x).

    PYTHONPATH=src python scripts/time_to_second_token.py                  # GPT-2 small sizes, 768 tokens
    PYTHONPATH=src python scripts/time_to_second_token.py --layers 4 --dim 256 --heads 4 --prompt 256

Timings are wall-clock on one torch thread by default (``--threads``); on a shared machine they carry its noise.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import torch

# (label, mechanism, options): every causal mechanism a transformers attention module can be swapped for
MECHANISMS = [
    ("softmax", "softmax", {}),
    ("mssa", "mssa", {}),
    ("tssa", "tssa", {}),
    ("linear", "linear", {}),
    ("fastmax-p1", "fastmax", {"p": 1}),
    ("fastmax-p2", "fastmax", {"p": 2}),
]


def _time(model, ids: torch.Tensor, repeats: int) -> float:
    """Median seconds of ``generate`` up to the second new token (one warm-up run first)."""
    kw = dict(max_new_tokens=2, min_new_tokens=2, do_sample=False, pad_token_id=0, use_cache=True)
    mask = torch.ones_like(ids)
    times = []
    with torch.inference_mode():
        for i in range(repeats + 1):
            t0 = time.perf_counter()
            out = model.generate(ids, attention_mask=mask, **kw)
            if i:
                times.append(time.perf_counter() - t0)
    assert out.shape[1] == ids.shape[1] + 2
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompt", type=int, default=768, help="prompt length in tokens")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per model (after one warm-up)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--only", nargs="*", default=None, help="labels of the mechanisms to time (default: all)")
    args = ap.parse_args(argv)

    from transformers import GPT2Config, GPT2LMHeadModel

    from attnzoo.hf import swap_attention

    if args.prompt + 2 > 1024:
        raise SystemExit(f"--prompt {args.prompt} + 2 new tokens exceeds GPT-2's 1024 positions")
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cfg = GPT2Config(n_embd=args.dim, n_layer=args.layers, n_head=args.heads, vocab_size=args.vocab, n_positions=1024)
    original = GPT2LMHeadModel(cfg).eval()
    ids = torch.randint(0, args.vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    print(
        f"GPT-2 {args.layers} layers x width {args.dim} ({args.heads} heads), vocab {args.vocab}; prompt "
        f"{args.prompt} tokens; time to the 2nd new token, median of {args.repeats}; torch threads "
        f"{torch.get_num_threads()}; torch {torch.__version__}"
    )
    base = _time(original, ids, args.repeats)
    print(f"{'model':<14}{'seconds':>10}{'x original':>12}")
    print(f"{'original':<14}{base:>10.3f}{1.0:>12.2f}")
    for label, mechanism, options in MECHANISMS:
        if args.only is not None and label not in args.only:
            continue
        model = copy.deepcopy(original)
        swap_attention(model, mechanism, **options)
        secs = _time(model.eval(), ids, args.repeats)
        print(f"{label:<14}{secs:>10.3f}{secs / base:>12.2f}", flush=True)


if __name__ == "__main__":
    main()
