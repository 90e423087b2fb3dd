"""Kills at random points of a reproduce run (SIGKILL: no handler runs): the next run takes the dead process's
lock, removes its temporaries, reuses every intact step and computes the rest; nothing stored is damaged."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from attnzoo._lock import LOCK_NAME

N_STEPS = 40

# a plan of cheap steps whose results are a function of their id; reports as the real runner writes them
SCRIPT = textwrap.dedent(
    f"""
    import sys, time
    from attnzoo._io import atomic_write_text, write_json
    from attnzoo.reproduce import report, runner
    from attnzoo.compare.store import Step

    def compute(ctx, step):
        time.sleep(0.02)
        write_json(ctx.store.run_dir(step.id) / "final.json", {{"val": {{"k": step.config["k"]}}}})
        return {{"value": step.config["k"] ** 2}}

    steps = [Step(f"probes/s{{k:02d}}", "probes", {{"k": k}}, compute) for k in range({N_STEPS})]
    runner.plan = lambda budget_name, seed, settings=(): ({{}}, steps)
    runner.machine_description = lambda device: {{}}

    def write_report(out, plan, budget_name, seed, sections, records, outcome, *a, **kw):
        atomic_write_text(out / "report.md", f"{{len(records)}} steps\\n")
        write_json(out / "results.json", {{"steps": records}})

    report.write_report = write_report
    print("started", flush=True)
    runner.run(sys.argv[1], "smoke", only="probes", progress=False)
    """
)


@pytest.mark.slow  # several interpreters
def test_random_kills_of_a_reproduce_run_lose_nothing(tmp_path):
    out = tmp_path / "rep"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rng = random.Random(25)
    for _ in range(3):
        p = subprocess.Popen([sys.executable, "-c", SCRIPT, str(out)], env=env, stdout=subprocess.PIPE, text=True)
        assert p.stdout.readline().strip() == "started"
        time.sleep(rng.uniform(0.05, 0.6))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(out)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())["steps"]
    assert sorted(results) == [f"probes/s{k:02d}" for k in range(N_STEPS)]
    assert all(r["result"]["value"] == r["config"]["k"] ** 2 for r in results.values())
    assert (out / "report.md").read_text() == f"{N_STEPS} steps\n"
    leftovers = [p for p in out.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == [] and (out / LOCK_NAME).is_file()
    from attnzoo.compare.store import Step, StepStore

    store = StepStore(out)
    for sid, rec in results.items():  # every stored record verifies against its SHA-256
        assert store.load(Step(sid, "probes", rec["config"], None)) is not None
