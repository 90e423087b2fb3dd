"""Everything read back is verified: damaged metrics.csv rows, stored step records and run files, JSON, and what
faults leave behind (temporaries, partial checkpoint directories) are found, named, and never used."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from attnzoo._io import ReadError, read_json
from attnzoo.train.metrics_log import MetricsLog
from attnzoo.train.run_dir import clean_leftovers

HEADER = "step,split,lr,loss,accuracy,samples_per_s,tokens_per_s,elapsed_s\n"
ROW = "{s},train,0.001,2.{s},,100.0,,0.{s}\n"


def _log(tmp_path: Path, content: bytes, resume_step: int = 100) -> list[dict]:
    (tmp_path / "metrics.csv").write_bytes(content)
    MetricsLog(tmp_path, "classification", enabled=True, resume_step=resume_step).close()
    with open(tmp_path / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _good(*steps: int) -> str:
    return "".join(ROW.format(s=s) for s in steps)


@pytest.mark.parametrize(
    "damage, why",
    [
        (_good(3)[:-9] + "\n", "line 4: 6 fields, the header has 8"),  # torn row (cut short, then the next write)
        (_good(3).replace("2.3", "2.\0\0"), "line 4: NUL bytes"),
        ("3,train,0.001,abc,,1,,1\n", "line 4: loss 'abc' is not a number"),
        ("x,train,0.001,1,,1,,1\n", "line 4: step 'x' is not a positive integer"),
        ("3,test,0.001,1,,1,,1\n", "line 4: split 'test' is neither train nor val"),
        (_good(2), "line 4: repeats step 2 train"),  # two writers' rows
    ],
)
def test_a_damaged_metrics_row_is_dropped_with_a_notice_naming_file_and_line(tmp_path, capsys, damage, why):
    rows = _log(tmp_path, (HEADER + _good(1, 2) + damage + _good(4)).encode())
    assert [r["step"] for r in rows] == ["1", "2", "4"]
    assert all(None not in r.values() and len(r) == 8 for r in rows)  # nothing padded
    err = capsys.readouterr().err
    assert f"{tmp_path / 'metrics.csv'}: dropped 1 damaged row(s): {why}" in err


def test_undecodable_bytes_and_a_torn_last_line(tmp_path, capsys):
    rows = _log(tmp_path, HEADER.encode() + _good(1).encode() + b"\xff\xfe\x80garbage\n" + b"2,train,0.0")
    assert [r["step"] for r in rows] == ["1"]
    err = capsys.readouterr().err
    assert "line 3: not UTF-8" in err and "line 4: torn (no line end)" in err


def test_rows_after_the_checkpoint_are_dropped_silently(tmp_path, capsys):
    assert [r["step"] for r in _log(tmp_path, (HEADER + _good(1, 2, 3)).encode(), resume_step=2)] == ["1", "2"]
    assert capsys.readouterr().err == ""


def test_an_empty_metrics_file_is_noticed(tmp_path, capsys):
    assert _log(tmp_path, b"", resume_step=7) == []
    assert "metrics.csv is empty; the metrics logged before step 7 are lost" in capsys.readouterr().err
    assert (tmp_path / "metrics.csv").read_text() == HEADER


@pytest.mark.parametrize("content", [b"\x00\x01\x02 random bytes\xff\n1,2\n", b"stp,splt\n1,train\n"])
def test_a_damaged_header_is_an_error_naming_the_file(tmp_path, content):
    with pytest.raises(ReadError, match=r"metrics.csv, line 1: not a metrics.csv header for this task") as e:
        _log(tmp_path, content)
    assert (tmp_path / "metrics.csv").read_bytes() == content  # kept for the user to look at
    assert "(b'" not in str(e.value)  # the header is quoted as text


def test_a_damaged_header_with_crlf_is_quoted_as_the_user_sees_it(tmp_path):
    with pytest.raises(ReadError, match=r"header for this task \('stp,split'; expected"):
        _log(tmp_path, b"stp,split\r\n1,train\r\n")


def test_read_json_names_the_file(tmp_path):
    f = tmp_path / "final.json"
    f.write_text('{"val": {"acc')
    with pytest.raises(ReadError, match=rf"{f} \(results\) is corrupt: Unterminated string"):
        read_json(f, "results")
    f.write_bytes(b"\xff\xfe")
    with pytest.raises(ReadError, match=rf"{f} is corrupt"):
        read_json(f)


# ---- the reproduce store ------------------------------------------------------------------------------------
def _store(tmp_path):
    from attnzoo.compare.store import Step, StepStore

    store = StepStore(tmp_path)
    step = Step("vision/vit/seed1", "vision", {"x": 1}, lambda ctx, s: {})
    run = store.run_dir(step.id)
    run.mkdir(parents=True)
    (run / "final.json").write_text('{"step": 5, "val": {"accuracy": 0.11}}')
    store.save(step, {"accuracy": 0.11, "curve": [[5, 2.3], [10, 2.1]]}, 1.0, 0.0)
    return store, step


def test_a_changed_digit_in_a_stored_step_is_recomputed_not_reported(tmp_path, capsys):
    store, step = _store(tmp_path)
    assert store.load(step)["result"]["accuracy"] == 0.11
    p = store.path(step.id)
    p.write_text(p.read_text().replace("0.11", "0.41"))
    assert store.load(step) is None
    assert f"{p} does not match its SHA-256" in capsys.readouterr().err
    with pytest.raises(ValueError, match=f"stored step result {p} is damaged"):
        store.load_by_id(step.id)


def test_a_changed_run_final_json_is_recomputed(tmp_path, capsys):
    store, step = _store(tmp_path)
    final = store.run_dir(step.id) / "final.json"
    final.write_text('{"step": 5, "val": {"accuracy": 0.41}}')
    assert store.load(step) is None
    assert f"{final} does not match the SHA-256 recorded in" in capsys.readouterr().err
    assert not final.exists()  # resuming the run from its last checkpoint writes it again


def test_a_record_without_checksum_still_loads_and_a_torn_one_is_noticed(tmp_path, capsys):
    store, step = _store(tmp_path)
    p = store.path(step.id)
    rec = json.loads(p.read_text())
    del rec["sha256"]
    p.write_text(json.dumps(rec))  # written by an older attnzoo
    assert store.load(step)["result"]["accuracy"] == 0.11
    p.write_text(p.read_text()[:40])
    assert store.load(step) is None and f"{p} is unreadable" in capsys.readouterr().err


def test_a_truncated_run_final_json_is_named_and_recomputed(tmp_path, capsys):
    from attnzoo.compare.common import _final_metrics

    f = tmp_path / "final.json"
    f.write_text('{"step": 5, "val": {"accur')
    assert _final_metrics(f) is None
    assert f"{f} (a training run's final metrics) is corrupt: Unterminated string" in capsys.readouterr().err
    assert not f.exists()


def test_store_temporaries_are_cleaned(tmp_path):
    store, step = _store(tmp_path)
    tmp = store.path(step.id).with_name(".seed1.json.abc123.tmp")
    tmp.write_text("{")
    keep = store.path(step.id).with_name("notes.txt")
    keep.write_text("mine")
    assert store.clean_leftovers() == [tmp] and keep.is_file() and store.load(step) is not None


# ---- leftovers of faults in a run directory ------------------------------------------------------------------
def test_resume_cleans_what_faults_left_and_keeps_the_rest(tmp_path, capsys, one_thread):
    sys.path.insert(0, str(Path(__file__).parents[1] / "train"))
    from tiny_models import tiny_factory

    from attnzoo.train.config import load_config
    from attnzoo.train.trainer import train

    run = tmp_path / "run"
    cfg = load_config(None, dict(task="digits", steps=4, batch_size=32, eval_every=4, ckpt_every=2, seed=1))
    train(cfg, run, model_factory=tiny_factory, progress=False)
    ck = run / "checkpoints"
    junk = [
        ck / ".tmp_step_00000006",  # a checkpoint being written
        ck / ".del_step_00000001",  # an old one being deleted
        ck / "step_00000003",  # a partial step directory (no state.json)
        ck / ".latest.x1y2.tmp",
        run / ".config.yaml.a1b2.tmp",
        ck / "step_00000004" / ".model.safetensors.q9.tmp",
    ]
    for p in junk:
        if p.suffix == ".tmp":
            p.write_text("x")
        else:
            p.mkdir()
            (p / "model.safetensors").write_text("x")
    # a half-deleted checkpoint: state.json left, a file its manifest lists gone
    half = ck / "step_00000002"
    (half / "model.safetensors").unlink()
    train(None, run, resume=True, model_factory=tiny_factory, progress=False)
    assert not any(p.exists() for p in [*junk, half])
    assert sorted(p.name for p in ck.iterdir()) == ["latest", "step_00000004"]
    assert "removed what an earlier fault left in" in capsys.readouterr().err
    assert clean_leftovers(run) == []


def test_a_run_metrics_file_damaged_after_the_run_is_named(tmp_path):
    from attnzoo.compare.common import Context, train_run
    from attnzoo.compare.store import StepStore

    ctx = Context(tmp_path, StepStore(tmp_path), seed=0, progress=False)
    vit = {"dim": 16, "depth": 1, "heads": 2, "patch_size": 4}
    cfg = dict(task="digits", task_options={}, model="vit_s", model_options=vit, seed=0, steps=2, batch_size=16)
    train_run(ctx, "t/seed0", cfg)
    metrics = ctx.store.run_dir("t/seed0") / "metrics.csv"
    metrics.write_text(HEADER + _good(1, 2))  # the finished run is read back, not trained again
    rec = train_run(ctx, "t/seed0", cfg)
    assert rec["curve"] == [[1, 2.1], [2, 2.2]] and rec["samples_per_s"] == 100.0
    metrics.write_bytes(HEADER.encode() + b"1,train,0.1,\xff\xfe,,1,,1\n")
    with pytest.raises(ReadError, match=r"metrics.csv is damaged \(UnicodeDecodeError"):
        train_run(ctx, "t/seed0", cfg)
    metrics.write_text(HEADER + "1,train,0.1,2.\0,,1,,1\n")
    with pytest.raises(ReadError, match=r"metrics.csv is damaged \(ValueError"):
        train_run(ctx, "t/seed0", cfg)
