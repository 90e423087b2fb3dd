"""Table-driven test of bad inputs across ops, modules, models, data files, configs, checkpoints and the CLI.

Each case builds a bad input, runs it, and asserts the error type and that the message names the culprit (the
argument or file, and where it matters the value). CLI cases run ``attnzoo.cli.main`` in-process: a non-zero
exit, an ``error:`` line naming the culprit on stderr, and no traceback.

``classify(case)`` is also used by hand to tally a checkout: "clear" (the right error naming the culprit),
"obscure" (an error that does not) or "silent" (no error at all).
"""

from __future__ import annotations

import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch

B, H, N, P = 2, 2, 16, 8
NAN, INF = float("nan"), float("inf")


@dataclass
class Case:
    id: str
    run: Callable[[Path], object]  # gets a fresh tmp dir
    exc: type[BaseException] | tuple[type[BaseException], ...]
    needles: tuple[str, ...]  # all must appear in the message (case-sensitive)
    cli: bool = False


def _t(*shape, fill=None, dtype=torch.float32, scale=1.0, device="cpu"):
    g = torch.Generator().manual_seed(0)
    if device == "meta":
        return torch.empty(*shape, dtype=dtype, device="meta")
    x = torch.randn(*shape, generator=g, dtype=dtype) * scale
    if fill is not None:
        x.view(-1)[3] = fill
    return x


def _qkv(bad=None, fill=NAN, mag=1.0):
    return {n: _t(B, H, N, P, fill=fill if n == bad else None, scale=mag) for n in ("q", "k", "v")}


# ---- ops -----------------------------------------------------------------------------------------------------------
def _tssa(**kw):
    from attnzoo.ops.tssa import tssa

    w = kw.pop("w", _t(B, H, N, P))
    temp = kw.pop("temp", torch.ones(H))
    return tssa(w, temp, **kw)


def _fastmax(bad=None, fill=NAN, mag=1.0, **kw):
    from attnzoo.ops.fastmax import fastmax

    return fastmax(**_qkv(bad, fill, mag), **kw)


def _softmax(bad=None, fill=NAN, mag=1.0, **kw):
    from attnzoo.ops.softmax import softmax_attention

    return softmax_attention(**_qkv(bad, fill, mag), **kw)


def _linear(bad=None, fill=NAN, mag=1.0, **kw):
    from attnzoo.ops.linear import linear_attention

    return linear_attention(**_qkv(bad, fill, mag), **kw)


def _xca(bad=None, fill=NAN, mag=1.0, temp=1.0, **kw):
    from attnzoo.ops.xca import xca

    d = _qkv(bad, fill, mag)
    return xca(d["q"], d["k"], d["v"], temp, **kw)


def _mssa(w, **kw):
    from attnzoo.ops.mssa import mssa

    return mssa(w, **kw)


def _csp(v, shifts=None, groups=4, **kw):
    from attnzoo.ops.csp import csp

    return csp(v, list(range(v.shape[-1])) if shifts is None else shifts, groups, **kw)


def _cbsa(w, reps="pool", **kw):
    from attnzoo.ops.cbsa import cbsa, pool_reps

    if isinstance(reps, str):
        reps = pool_reps(_t(B, H, N, P), num_reps=4)
    return cbsa(w, reps, **kw)


NF = ValueError  # NonFiniteError is a ValueError: callers catching ValueError keep working

OP_CASES = [
    Case("tssa-nan-w-causal", lambda d: _tssa(w=_t(B, H, N, P, fill=NAN), causal=True), NF, ("w", "NaN")),
    Case("tssa-nan-w-torch", lambda d: _tssa(w=_t(B, H, N, P, fill=NAN), backend="torch"), NF, ("w", "NaN")),
    Case("tssa-inf-w-naive", lambda d: _tssa(w=_t(B, H, N, P, fill=INF), backend="naive"), NF, ("w", "Inf")),
    Case("tssa-nan-temp", lambda d: _tssa(temp=torch.tensor([1.0, NAN])), NF, ("temp", "NaN")),
    Case("tssa-1e20-noncausal", lambda d: _tssa(w=_t(B, H, N, P, scale=1e20), backend="torch"), NF, ("w", "overflow")),
    Case("tssa-1e20-causal", lambda d: _tssa(w=_t(B, H, N, P, scale=1e20), causal=True), NF, ("w", "overflow")),
    Case("tssa-temp-shape", lambda d: _tssa(temp=torch.ones(H + 1)), ValueError, ("temp", "(H,)")),
    Case("tssa-bad-backend", lambda d: _tssa(backend="gpu"), ValueError, ("backend", "'gpu'")),
    Case("tssa-int-w", lambda d: _tssa(w=torch.ones(B, H, N, P, dtype=torch.int64)), TypeError, ("w", "int64")),
    Case("tssa-3d-w", lambda d: _tssa(w=_t(H, N, P)), ValueError, ("w", "(B, H, N, P)")),
    Case("fastmax-nan-q", lambda d: _fastmax("q"), NF, ("q", "NaN")),
    Case("fastmax-nan-v-causal", lambda d: _fastmax("v", causal=True), NF, ("v", "NaN")),
    Case("fastmax-inf-k-p1", lambda d: _fastmax("k", fill=INF, p=1), NF, ("k", "Inf")),
    Case("fastmax-1e20-p1", lambda d: _fastmax(mag=1e20, p=1), NF, ("overflow", "float32")),
    Case("fastmax-1e20-p2-causal", lambda d: _fastmax(mag=1e20, causal=True), NF, ("overflow",)),
    Case("fastmax-p3", lambda d: _fastmax(p=3), ValueError, ("p=3", "[1, 2]")),
    Case("fastmax-scale-neg", lambda d: _fastmax(scale=-1.0), ValueError, ("scale=-1.0",)),
    Case("fastmax-chunk-0", lambda d: _fastmax(chunk_size=0), ValueError, ("chunk_size", "0")),
    Case("softmax-nan-k", lambda d: _softmax("k"), NF, ("k", "NaN")),
    Case("softmax-1e20", lambda d: _softmax(mag=1e20), NF, ("overflow",)),
    Case("softmax-dropout-1", lambda d: _softmax(dropout_p=1.0), ValueError, ("dropout_p", "1.0")),
    Case("linear-nan-v", lambda d: _linear("v"), NF, ("v", "NaN")),
    Case("linear-1e20", lambda d: _linear(mag=1e20), NF, ("overflow",)),
    Case("linear-feature-map", lambda d: _linear(feature_map="tanh"), ValueError, ("tanh",)),
    Case("xca-nan-float-temp", lambda d: _xca(temp=NAN), ValueError, ("temp", "nan")),
    Case("xca-inf-tensor-temp", lambda d: _xca(temp=torch.tensor([1.0, INF])), NF, ("temp", "Inf")),
    Case("xca-nan-q", lambda d: _xca("q"), NF, ("q", "NaN")),
    Case("xca-1e20", lambda d: _xca(mag=1e20), NF, ("overflow",)),
    Case("mssa-nan", lambda d: _mssa(_t(B, H, N, P, fill=NAN)), NF, ("w", "NaN")),
    Case("mssa-1e20", lambda d: _mssa(_t(B, H, N, P, scale=1e20)), NF, ("w", "overflow")),
    Case("csp-nan", lambda d: _csp(_t(B, N, P, fill=NAN)), NF, ("v", "NaN")),
    Case("csp-inf", lambda d: _csp(_t(B, N, P, fill=INF)), NF, ("v", "Inf")),
    Case("csp-groups", lambda d: _csp(_t(B, N, P), groups=5), ValueError, ("groups=5", "N=16")),
    Case("csp-shifts-len", lambda d: _csp(_t(B, N, P), shifts=[0, 1]), ValueError, ("shifts", "C=8")),
    Case("cbsa-nan-w", lambda d: _cbsa(_t(B, H, N, P, fill=NAN)), NF, ("w", "NaN")),
    Case("cbsa-nan-reps", lambda d: _cbsa(_t(B, H, N, P), reps=_t(B, H, 4, P, fill=NAN)), NF, ("reps", "NaN")),
    Case("cbsa-nan-eta", lambda d: _cbsa(_t(B, H, N, P), eta=torch.full((H, 1, 1), NAN)), NF, ("eta", "NaN")),
    Case("cbsa-1e20", lambda d: _cbsa(_t(B, H, N, P, scale=1e20)), NF, ("w", "overflow")),
    Case("cbsa-eps-0", lambda d: _cbsa(_t(B, H, N, P), eps=0.0), ValueError, ("eps", "0.0")),
    Case("cbsa-reps-missing", lambda d: _cbsa(_t(B, H, N, P), reps=None), ValueError, ("reps", "cbsa")),
]


# ---- modules -------------------------------------------------------------------------------------------------------
_MODULE_KW = {"tssa": {"max_len": 64}}


def _module(name, x, **kw):
    from attnzoo.layers import build_attention

    torch.manual_seed(0)
    m = build_attention(name, 32, 4, **_MODULE_KW.get(name, {}), **kw)
    return m(x)


def _x(fill=None, **kw):
    return _t(2, 16, 32, fill=fill, **kw)


MECHS = ("cbsa", "csp", "fastmax", "linear", "mssa", "softmax", "tssa", "xca")
MODULE_CASES = [Case(f"module-{m}-nan-x", lambda d, m=m: _module(m, _x(NAN)), NF, ("x", "NaN")) for m in MECHS]
MODULE_CASES += [
    Case("module-csp-inf-x", lambda d: _module("csp", _x(INF)), NF, ("x", "Inf")),
    Case("module-cbsa-float64", lambda d: _module("cbsa", _x(dtype=torch.float64)), TypeError, ("x", "float64")),
    Case(
        "module-softmax-float64",
        lambda d: _module("softmax", _x(dtype=torch.float64)),
        TypeError,
        ("x", "float64", "float32"),
    ),
    Case("module-tssa-meta", lambda d: _module("tssa", _x(device="meta")), ValueError, ("x", "meta")),
    Case("module-fastmax-1e20", lambda d: _module("fastmax", _x(scale=1e20)), NF, ("x", "overflow")),
    Case("module-mssa-1e20", lambda d: _module("mssa", _x(scale=1e20)), NF, ("x", "overflow")),
    Case("module-linear-wrong-dim", lambda d: _module("linear", _t(2, 16, 30)), ValueError, ("dim=32", "30")),
    Case("module-dim-heads", lambda d: _module_build("softmax", 30, 4), ValueError, ("dim=30", "heads=4")),
    Case("module-unknown", lambda d: _module_build("nope", 32, 4), ValueError, ("'nope'",)),
]


def _module_build(name, dim, heads):
    from attnzoo.layers import build_attention

    return build_attention(name, dim, heads)


# ---- models --------------------------------------------------------------------------------------------------------
def _vision(images):
    from attnzoo.models import create_model

    torch.manual_seed(0)
    m = create_model("vit_cifar", depth=1)
    s = m.config.image_size
    return m(images(m.config.in_chans, s))


def _lm(idx):
    from attnzoo.models import create_model

    torch.manual_seed(0)
    m = create_model("gpt2_base", depth=1, dim=32, heads=2, vocab_size=50, block_size=16)
    return m(idx)


MODEL_CASES = [
    Case("vision-nan-images", lambda d: _vision(lambda c, s: _t(1, c, s, s, fill=NAN)), NF, ("images", "NaN")),
    Case(
        "vision-float64",
        lambda d: _vision(lambda c, s: _t(1, c, s, s, dtype=torch.float64)),
        TypeError,
        ("images", "float64"),
    ),
    Case(
        "vision-uint8",
        lambda d: _vision(lambda c, s: torch.zeros(1, c, s, s, dtype=torch.uint8)),
        TypeError,
        ("images", "uint8"),
    ),
    Case("vision-shape", lambda d: _vision(lambda c, s: _t(1, c, s + 1, s + 1)), ValueError, ("images", "shape")),
    Case("lm-token-range", lambda d: _lm(torch.tensor([[1, 2, 50]])), ValueError, ("idx", "50", "vocab_size=50")),
    Case("lm-negative-token", lambda d: _lm(torch.tensor([[-1, 2]])), ValueError, ("idx", "-1")),
    Case("lm-too-long", lambda d: _lm(torch.zeros(1, 17, dtype=torch.long)), ValueError, ("idx", "17", "16")),
    Case("lm-float-ids", lambda d: _lm(torch.zeros(1, 4)), TypeError, ("idx", "float32")),
]


# ---- data files, task options, configs -----------------------------------------------------------------------------
def _csv(d: Path, body: bytes) -> str:
    p = d / "reviews.csv"
    p.write_bytes(body)
    return str(p)


def _load_imdb(path):
    from attnzoo.data.text import load_imdb

    return load_imdb(path)


def _task(name, **opts):
    from attnzoo.data.tasks import build_task

    return build_task(name, **opts)


def _yaml(d: Path, body: bytes, name="cfg.yaml") -> str:
    p = d / name
    p.write_bytes(body)
    return str(p)


def _config(src, overrides=None):
    from attnzoo.train.config import load_config

    return load_config(src, overrides)


DATA_CASES = [
    Case(
        "csv-label-notanint",
        lambda d: _load_imdb(_csv(d, b"text,label\ngood,1\nbad,notanint\n")),
        ValueError,
        ("reviews.csv", "notanint", "line 3"),
    ),
    Case(
        "csv-not-utf8",
        lambda d: _load_imdb(_csv(d, b"text,label\n\xff\xfe bad,1\n")),
        ValueError,
        ("reviews.csv", "UTF-8"),
    ),
    Case(
        "csv-missing-label-col", lambda d: _load_imdb(_csv(d, b"text,y\na,1\n")), ValueError, ("reviews.csv", "label")
    ),
    Case("csv-negative-label", lambda d: _load_imdb(_csv(d, b"text,label\na,-2\n")), ValueError, ("reviews.csv", "-2")),
    Case("task-n_train-neg", lambda d: _task("icl_linear", n_train=-5), ValueError, ("n_train=-5", ">= 1")),
    Case("task-block_size-0", lambda d: _task("char_lm", root=str(d), block_size=0), ValueError, ("block_size=0",)),
    Case(
        "task-min-gt-max",
        lambda d: _task("lra_listops", min_len=50, max_len=10),
        ValueError,
        ("min_len=50", "max_len=10"),
    ),
    Case("task-test-fraction", lambda d: _task("digits", test_fraction=1.5), ValueError, ("test_fraction", "1.5")),
    Case(
        "task-sparsity-gt-dim",
        lambda d: _task("icl_sparse_linear", dim=4, sparsity=9),
        ValueError,
        ("sparsity=9", "dim=4"),
    ),
    Case("task-unknown-option", lambda d: _task("digits", n_trian=5), ValueError, ("n_trian",)),
    Case("task-bad-type", lambda d: _task("icl_linear", dim="20"), TypeError, ("dim", "'20'")),
    Case(
        "yaml-duplicate-key",
        lambda d: _config(_yaml(d, b"model: vit_cifar\nsteps: 5\nsteps: 7\n")),
        ValueError,
        ("cfg.yaml", "steps", "duplicated"),
    ),
    Case("yaml-not-utf8", lambda d: _config(_yaml(d, b"model: vit\xff\n")), ValueError, ("cfg.yaml", "UTF-8")),
    Case("yaml-invalid", lambda d: _config(_yaml(d, b"model: [\n")), ValueError, ("cfg.yaml", "line")),
    Case("yaml-not-mapping", lambda d: _config(_yaml(d, b"- a\n- b\n")), ValueError, ("cfg.yaml", "mapping")),
    Case(
        "yaml-nested-duplicate",
        lambda d: _config(_yaml(d, b"model: m\nmodel_options:\n  depth: 1\n  depth: 2\n")),
        ValueError,
        ("depth", "duplicated"),
    ),
    Case("config-unknown-key", lambda d: _config({"model": "m", "lerning_rate": 1}), ValueError, ("lerning_rate",)),
    Case("config-bad-type", lambda d: _config({"model": "m", "steps": "many"}), TypeError, ("steps", "'many'")),
]


# ---- checkpoints (pretrained directories; training checkpoints' integrity is tested with the trainer) --------------
def _pretrained(d: Path, corrupt: Callable[[Path], None]):
    from attnzoo.models import create_model, from_pretrained, save_pretrained

    torch.manual_seed(0)
    m = create_model("gpt2_base", depth=1, dim=32, heads=2, vocab_size=50, block_size=16)
    out = save_pretrained(m, d / "ckpt")
    corrupt(Path(out))
    return from_pretrained(out)


CHECKPOINT_CASES = [
    Case(
        "pretrained-config-not-json",
        lambda d: _pretrained(d, lambda p: (p / "config.json").write_text("{oops")),
        ValueError,
        ("config.json", "JSON"),
    ),
    Case(
        "pretrained-weights-missing",
        lambda d: _pretrained(d, lambda p: (p / "model.safetensors").unlink()),
        ValueError,
        ("model.safetensors", "missing"),
    ),
    Case(
        "pretrained-dir-missing",
        lambda d: _from_pretrained(d / "nothing"),
        (ValueError, FileNotFoundError),
        ("nothing",),
    ),
]


def _from_pretrained(path):
    from attnzoo.models import from_pretrained

    return from_pretrained(path)


# ---- CLI -----------------------------------------------------------------------------------------------------------
def _cli(argv):
    def run(d: Path):
        from attnzoo.cli import main

        return main([a.replace("{d}", str(d)) for a in argv])

    return run


def _cli_file(setup, argv):
    def run(d: Path):
        setup(d)
        return _cli(argv)(d)

    return run


def _run_json(d: Path):
    (d / "rep").mkdir()
    (d / "rep" / "run.json").write_text("{not json")


def _fake_run(d: Path):
    (d / "run").mkdir()
    (d / "run" / "config.yaml").write_text("task: digits\nmodel: vit_cifar\nsteps: 1\nsteps: 2\n")


CLI_CASES = [
    Case("cli-unknown-command", _cli(["trian"]), SystemExit, ("trian",), cli=True),
    Case(
        "cli-train-dup-yaml",
        _cli_file(lambda d: _yaml(d, b"model: vit_cifar\nlr: 1\nlr: 2\n"), ["train", "{d}/cfg.yaml", "--out", "{d}/o"]),
        SystemExit,
        ("cfg.yaml", "lr"),
        cli=True,
    ),
    Case(
        "cli-train-not-utf8",
        _cli_file(lambda d: _yaml(d, b"model: \xff\n"), ["train", "{d}/cfg.yaml", "--out", "{d}/o"]),
        SystemExit,
        ("cfg.yaml", "UTF-8"),
        cli=True,
    ),
    Case(
        "cli-train-unknown-preset",
        _cli(["train", "no_such_preset", "--out", "{d}/o"]),
        SystemExit,
        ("no_such_preset",),
        cli=True,
    ),
    Case(
        "cli-train-n_train",
        _cli(["train", "icl_linear_aot", "--out", "{d}/o", "--task_options.n_train=-5"]),
        SystemExit,
        ("n_train=-5",),
        cli=True,
    ),
    Case(
        "cli-train-bad-override",
        _cli(["train", "digits_vit_tiny", "--out", "{d}/o", "--steps=abc"]),
        SystemExit,
        ("steps", "abc"),
        cli=True,
    ),
    Case(
        "cli-train-resume-corrupt-config",
        _cli_file(_fake_run, ["train", "--resume", "--out", "{d}/run"]),
        SystemExit,
        ("config.yaml", "steps"),
        cli=True,
    ),
    Case(
        "cli-bench-lengths-0",
        _cli(["bench", "--preset", "quick", "--lengths", "0", "--out", "{d}/b"]),
        SystemExit,
        ("--lengths", "0"),
        cli=True,
    ),
    Case(
        "cli-bench-heads-neg",
        _cli(["bench", "--preset", "quick", "--heads", "-4", "--out", "{d}/b"]),
        SystemExit,
        ("--heads", "-4"),
        cli=True,
    ),
    Case(
        "cli-bench-dim-heads",
        _cli(["bench", "--preset", "quick", "--dim", "30", "--heads", "4", "--out", "{d}/b"]),
        SystemExit,
        ("--dim 30", "--heads 4"),
        cli=True,
    ),
    Case(
        "cli-bench-dims-heads",
        _cli(["bench", "--preset", "quick", "--sweeps", "d", "--dims", "30", "--heads", "4", "--out", "{d}/b"]),
        SystemExit,
        ("--dims", "30"),
        cli=True,
    ),
    Case(
        "cli-bench-out-file",
        _cli_file(lambda d: (d / "f.txt").write_text("x"), ["bench", "--preset", "quick", "--out", "{d}/f.txt"]),
        SystemExit,
        ("f.txt", "not a directory"),
        cli=True,
    ),
    Case(
        "cli-bench-repeats-0",
        _cli(["bench", "--preset", "quick", "--repeats", "0", "--out", "{d}/b"]),
        SystemExit,
        ("--repeats", "0"),
        cli=True,
    ),
    Case(
        "cli-bench-unknown-mech",
        _cli(["bench", "--mechanisms", "nope", "--out", "{d}/b"]),
        SystemExit,
        ("nope",),
        cli=True,
    ),
    Case(
        "cli-eval-batch-size-0",
        _cli(["eval", "{d}/run", "--batch-size", "0"]),
        SystemExit,
        ("--batch-size", "0"),
        cli=True,
    ),
    Case("cli-eval-not-a-run", _cli(["eval", "{d}/nothing"]), SystemExit, ("nothing",), cli=True),
    Case(
        "cli-generate-tokens-0",
        _cli(["generate", "{d}/run", "--max-new-tokens", "0"]),
        SystemExit,
        ("--max-new-tokens", "0"),
        cli=True,
    ),
    Case("cli-generate-not-a-run", _cli(["generate", "{d}/nothing"]), SystemExit, ("nothing",), cli=True),
    Case(
        "cli-reproduce-corrupt-run-json-run",
        _cli_file(_run_json, ["reproduce", "--out", "{d}/rep", "--budget", "smoke", "--only", "efficiency"]),
        SystemExit,
        ("run.json", "corrupt"),
        cli=True,
    ),
]

CASES = OP_CASES + MODULE_CASES + MODEL_CASES + DATA_CASES + CHECKPOINT_CASES + CLI_CASES


def _check_message(case: Case, msg: str) -> list[str]:
    return [n for n in case.needles if n not in msg]


def classify(case: Case, tmp: Path) -> tuple[str, str]:
    """("clear" | "obscure" | "silent", detail) for one case (used by the test and to tally a checkout)."""
    if case.cli:
        err, out = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
                rc = case.run(tmp)
        except SystemExit as e:  # an old CLI may let argparse's exit through
            rc = e.code
        except Exception as e:  # noqa: BLE001
            return "obscure", f"traceback: {type(e).__name__}: {e}"
        text = err.getvalue()
        if rc in (0, None):
            return "silent", f"rc={rc}"
        if "Traceback" in text:
            return "obscure", "traceback on stderr"
        if "error" not in text:
            return "obscure", f"no error line: {text[-300:]!r}"
        missing = _check_message(case, text)
        return ("obscure", f"stderr lacks {missing}: {text[-300:]!r}") if missing else ("clear", text.strip()[-200:])
    try:
        case.run(tmp)
    except Exception as e:  # noqa: BLE001
        if not isinstance(e, case.exc):
            return "obscure", f"{type(e).__name__}: {e}"
        missing = _check_message(case, str(e))
        return ("obscure", f"message lacks {missing}: {e}") if missing else ("clear", str(e)[:200])
    return "silent", "no error"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_gets_a_clear_error(case: Case, tmp_path: Path) -> None:
    kind, detail = classify(case, tmp_path)
    assert kind == "clear", f"{case.id}: {kind}: {detail}"


def test_case_count() -> None:
    assert len(CASES) >= 80
    assert len({c.id for c in CASES}) == len(CASES)


def test_cli_debug_flag_shows_the_traceback(tmp_path: Path) -> None:
    from attnzoo.cli import main

    with pytest.raises(ValueError, match="n_train=-5"):
        main(["--debug", "train", "icl_linear_aot", "--out", str(tmp_path / "o"), "--task_options.n_train=-5"])


def test_cli_debug_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from attnzoo.cli import main

    monkeypatch.setenv("ATTNZOO_DEBUG", "1")
    _run_json(tmp_path)
    with pytest.raises(ValueError, match="run.json"):
        main(["reproduce", "--out", str(tmp_path / "rep"), "--budget", "smoke", "--only", "efficiency"])


def test_one_host_sync_per_op_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The finiteness check reads q, k and v back in one transfer (``.tolist()`` once per call)."""
    calls = []
    orig = torch.Tensor.tolist

    def counting(self):
        calls.append(self.shape)
        return orig(self)

    monkeypatch.setattr(torch.Tensor, "tolist", counting)
    _softmax()
    _linear()
    assert len(calls) == 2


def test_meta_tensors_infer_shapes_without_reading_values() -> None:
    from attnzoo.ops.fastmax import fastmax
    from attnzoo.ops.tssa import tssa

    w = torch.empty(B, H, N, P, device="meta")
    assert tssa(w, torch.ones(H, device="meta")).shape == w.shape
    assert fastmax(w, w, w).shape == w.shape


def test_finite_inputs_of_ordinary_size_pass() -> None:
    # the overflow bounds are loose: inputs scaled by 1e6 are still computed (and finite)
    for f in (
        lambda: _fastmax(mag=1e6, p=1),
        lambda: _linear(mag=1e6),
        lambda: _softmax(mag=1e6),
        lambda: _mssa(_t(B, H, N, P, scale=1e6)),
        lambda: _tssa(w=_t(B, H, N, P, scale=1e6)),
    ):
        assert torch.isfinite(f()).all()


def test_bench_overwrite_removes_only_its_own_stale_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import attnzoo.bench as bench

    out = tmp_path / "b"
    out.mkdir()
    for f in ("results.csv", "results.json", "sweep_d.png", "decode.png"):
        (out / f).write_text("old")
    (out / "notes.txt").write_text("mine")
    monkeypatch.setattr(bench, "run", lambda args: ([], {"machine": "test"}))
    monkeypatch.setattr(bench, "timing_allocator", lambda: None)
    rc = bench.main(["--preset", "quick", "--out", str(out), "--overwrite", "--device", "cpu"])
    assert rc == 0
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "results.csv", "results.json"]
    assert json.loads((out / "results.json").read_text())["rows"] == []
