"""Where the training steps of `attnzoo reproduce`'s models spend their time: top ops by self CPU time.

Usage: ``python scripts/profile_training.py [STEP_ID ...]`` (ids of the ``default`` plan, e.g.
``vision/tost/seed0``; the defaults are the models of docs/performance.md's profile table). Each config trains
40 steps under ``torch.profiler`` on one thread in a temporary directory.
"""

import sys
import tempfile

import torch
from torch.profiler import ProfilerActivity, profile

from attnzoo.reproduce import runner
from attnzoo.train.config import from_dict
from attnzoo.train.trainer import train

DEFAULT_IDS = [
    "vision/tost/seed0",
    "vision/cbt/seed0",
    "vision/vit/seed0",
    "long-range/listops/tssa/seed0",
    "long-range/listops/fastmax/seed0",
    "long-range/listops/csp/seed0",
    "long-range/listops/cbsa/seed0",
    "long-range/image/softmax/seed0",
]


def main(ids: list[str]) -> None:
    torch.set_num_threads(1)
    _, steps = runner.plan("default", 0)
    by_id = {s.id: s for s in steps}
    for sid in ids:
        cfg = dict(by_id[sid].config["train"], steps=40, eval_every=10**6, ckpt_every=10**6, log_every=10)
        with tempfile.TemporaryDirectory() as tmp, profile(activities=[ProfilerActivity.CPU]) as prof:
            train(from_dict(cfg), tmp, progress=False)
        events = prof.key_averages()
        total = sum(e.self_cpu_time_total for e in events)
        print(f"\n== {sid}: {total / 1e6:.2f} s of self CPU time (40 steps, setup and the final evaluation)")
        for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:12]:
            share = 100 * e.self_cpu_time_total / total
            print(f"  {share:5.1f}%  {e.self_cpu_time_total / 1e3:9.1f} ms  {e.count:6d} calls  {e.key[:70]}")


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT_IDS)
