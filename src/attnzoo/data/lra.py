"""Long-Range-Arena-style generators (Tay et al., 2021), made offline and deterministic by seed.

- ListOps (Nangia & Bowman, 2018): nested ``[MAX``/``[MIN``/``[MED``/``[SM`` lists of digits; the
  label is the value (10 classes). Tokens: 0 pad, 1..10 digits 0..9, 11..14 operators, 15 ``]``.
- Pathfinder (Linsley et al., 2018): two dots, dashed curved paths, distractor paths; label 1 iff
  the dots lie on the same path (negatives: the outer ends of a broken path, so that the dots'
  distance, position and the ink do not give the label away). Pixel intensities are the tokens (vocab 256).
- Byte-level encodings for Text (IMDB) and Retrieval (two passages: same Shakespeare work or not).

Token 0 is padding in every padded task here (ListOps, Text, Retrieval) and never a real token: bytes are stored as
``byte + 1`` (a NUL byte is token 1) and ListOps tokens start at 1, so ``tokens != 0`` is the attention mask.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "LISTOPS_TOKENS",
    "LISTOPS_VOCAB",
    "listops_sample",
    "listops_evaluate",
    "listops_to_string",
    "pathfinder_sample",
    "PATH_VALUE",
    "DOT_VALUE",
    "encode_bytes",
    "retrieval_sample",
    "fit_band_rule",
    "pathfinder_shortcut_features",
    "pathfinder_shortcut_accuracy",
    "byte_histogram_similarity",
    "retrieval_shortcut_accuracy",
]

# ---- ListOps -----------------------------------------------------------------------------------
PAD = 0
_DIGIT0 = 1
OPS = ("[MIN", "[MAX", "[MED", "[SM")
_OP0 = 11
CLOSE = 15
#: token id -> string (0 is padding)
LISTOPS_TOKENS = ["<pad>"] + [str(d) for d in range(10)] + list(OPS) + ["]"]
LISTOPS_VOCAB = len(LISTOPS_TOKENS)


def _apply(op: str, vals: list[int]) -> int:
    if op == "[MIN":
        return min(vals)
    if op == "[MAX":
        return max(vals)
    if op == "[MED":
        # LRA's definition: int(np.median(v)), i.e. the mean of the two middle values truncated
        s = sorted(vals)
        m = len(s) // 2
        return s[m] if len(s) % 2 else (s[m - 1] + s[m]) // 2
    return sum(vals) % 10  # [SM: sum modulo 10


def listops_sample(
    rng: np.random.Generator, min_len: int = 500, max_len: int = 2000, max_depth: int = 10, max_args: int = 10
) -> tuple[list[int], int]:
    """One ListOps expression as token ids and its value, with ``min_len <= len <= max_len``.

    A token budget drawn uniformly in ``[min_len, max_len]`` is split at random among an operator's
    2..``max_args`` arguments, recursively, up to ``max_depth`` nesting levels.
    """
    if not (5 <= min_len <= max_len):
        raise ValueError(f"need 5 <= min_len <= max_len, got min_len={min_len}, max_len={max_len}")

    def node(budget: int, depth: int, out: list[int]) -> int:
        if budget < 4 or depth >= max_depth:
            d = int(rng.integers(10))
            out.append(_DIGIT0 + d)
            return d
        op = int(rng.integers(len(OPS)))
        out.append(_OP0 + op)
        inner = budget - 2
        k = int(rng.integers(2, max_args + 1))
        k = max(1, min(k, inner))
        # random composition of `inner` into k positive parts
        cuts = np.sort(rng.choice(inner - 1, size=k - 1, replace=False) + 1) if k > 1 else np.array([], int)
        parts = np.diff(np.concatenate([[0], cuts, [inner]]))
        vals = [node(int(p), depth + 1, out) for p in parts]
        out.append(CLOSE)
        return _apply(OPS[op], vals)

    for _ in range(1000):
        tokens: list[int] = []
        value = node(int(rng.integers(min_len, max_len + 1)), 0, tokens)
        if min_len <= len(tokens) <= max_len:
            return tokens, value
    raise RuntimeError(f"could not generate a ListOps expression of length in [{min_len}, {max_len}]")


def listops_to_string(tokens) -> str:
    return " ".join(LISTOPS_TOKENS[int(t)] for t in tokens if int(t) != PAD)


def listops_evaluate(expression: str) -> int:
    """Evaluate a ListOps expression written as space-separated tokens with an explicit stack (no recursion)."""
    stack: list[tuple[str, list[int]]] = []
    result: int | None = None
    for tok in expression.split():
        if tok in OPS:
            stack.append((tok, []))
        elif tok == "]":
            if not stack:
                raise ValueError("unbalanced ']' in ListOps expression")
            op, vals = stack.pop()
            if not vals:
                raise ValueError(f"operator {op} has no arguments")
            v = _independent_op(op, vals)
            if stack:
                stack[-1][1].append(v)
            else:
                result = v
        elif tok.isdigit() and len(tok) == 1:
            if stack:
                stack[-1][1].append(int(tok))
            else:
                result = int(tok)
        else:
            raise ValueError(f"unknown ListOps token {tok!r}; valid: digits 0-9, {list(OPS)}, ']'")
    if stack or result is None:
        raise ValueError("incomplete ListOps expression")
    return result


def _independent_op(op: str, vals: list[int]) -> int:
    # Written separately from _apply on purpose: the evaluator checks the generator.
    a = np.asarray(vals)
    return {"[MIN": int(a.min()), "[MAX": int(a.max()), "[MED": int(np.median(a)), "[SM": int(a.sum() % 10)}[op]


# ---- Pathfinder -------------------------------------------------------------------------------
PATH_VALUE = 160
DOT_VALUE = 255


def _dilate(mask: np.ndarray, r: int) -> np.ndarray:
    """Chebyshev dilation of a boolean mask by ``r`` pixels (separable: rows, then columns)."""
    if r <= 0:
        return mask.copy()
    h, w = mask.shape
    p = np.pad(mask, r)
    rows = np.zeros((h + 2 * r, w), bool)
    for d in range(2 * r + 1):
        rows |= p[:, d : d + w]
    out = np.zeros((h, w), bool)
    for d in range(2 * r + 1):
        out |= rows[d : d + h]
    return out


def pathfinder_sample(
    rng: np.random.Generator,
    size: int = 32,
    n_paths: int | None = None,
    path_steps: int | None = None,
    dash: int = 3,
    gap: int = 1,
    curvature: float = 0.3,
) -> tuple[np.ndarray, int]:
    """One Pathfinder image ``(size, size)`` uint8 and its label (1 iff the two dots share a path).

    Each path is a unit-step walk with a random turn of at most ``curvature`` rad per step, drawn as
    ``dash`` pixels on, ``gap`` off, from both ends towards the middle (so a path's two ends look
    alike). Different paths (with their end dots) stay at least ``gap + 3`` pixels apart, so dilating
    the image by ``ceil(gap / 2)`` joins the dashes of one path and never two paths: that is the
    connectivity check the tests run on the rendered image.

    Negatives are made by breaking a path, so that nothing but connectivity tells the classes apart.
    Every image holds two candidate paths drawn alike (same length, placed in random order), one of
    them broken into two pieces by a hole that leaves them at least ``gap + 3`` pixels apart (like
    two different paths, unlike two dashes), plus ``n_paths - 2`` distractors. The image is drawn before the label;
    the label then puts the dots on the ends of the whole path (1) or on the outer ends of the broken
    one (0). The dotted pair is therefore distributed alike in both classes: same distance between
    the dots, same positions in the frame, same amount of ink in the image. (With a negative's dots on
    the ends of two unrelated paths, a band on the dots' distance alone scored ~90%.)
    """
    if size < 16:
        raise ValueError(f"pathfinder size must be >= 16, got {size}")
    scale = size / 32
    # Two paths only on small canvases: three separated 10-step paths rarely fit in 16x16.
    n_paths = n_paths if n_paths is not None else (2 if size < 24 else max(3, int(round(3 * scale**0.5))))
    path_steps = path_steps if path_steps is not None else int(round(20 * scale))
    if n_paths < 2:
        raise ValueError(f"pathfinder needs n_paths >= 2 (two main paths), got {n_paths}")
    sep = gap + 3
    if path_steps < sep + 5:
        raise ValueError(
            f"path_steps={path_steps} is too short to break a path (pieces of 3 pixels around a hole of "
            f"gap + 3 = {sep} steps): need path_steps >= {sep + 5}"
        )
    for _attempt in range(200):
        layout = _layout(rng, size, n_paths, path_steps, dash, gap, curvature, sep)
        if layout is None:
            continue
        img, whole, broken = layout
        label = int(rng.integers(2))
        a, b = whole if label else broken
        for y, x in (a, b) if rng.integers(2) else (b, a):
            img[y - 1 : y + 2, x - 1 : x + 2] = DOT_VALUE
        return img, label
    raise RuntimeError(f"could not place {n_paths} separated paths of {path_steps} steps in a {size}x{size} image")


def _layout(rng, size, n_paths, path_steps, dash, gap, curvature, sep):
    """``(image without dots, ends of the whole path, outer ends of the broken path)``, or None.

    Each path takes the first of up to 100 candidate walks (drawn 25 at a time) whose pixels and end
    dots keep ``sep`` pixels from the paths already placed and whose ends are ``2 * sep`` apart (all
    pixels stay 1 from the border, so a 3x3 dot always fits). Separation is checked on whole paths,
    before the break, and one hole position serves both candidates (both must admit it), so that
    being broken says nothing about where or how a path was drawn.
    """
    footprint = np.zeros((size, size), bool)  # pixels (with end dots) of paths placed so far
    # The dash pattern runs from both ends to the middle, so the two ends of a path look alike (a
    # pattern from one end only leaves a lone pixel at the other for some lengths). The middle
    # pixels are drawn so that no gap is longer than `gap`.
    t = np.arange(path_steps + 1)
    from_end = np.minimum(t, path_steps - t)
    drawn = (from_end % (dash + gap) < dash) | (t == path_steps // 2) | (t == (path_steps + 1) // 2)
    paths: list[tuple[np.ndarray, np.ndarray]] = []
    for _k in range(n_paths):
        forbidden = _dilate(footprint, sep - 1)
        near = _dilate(footprint, sep)  # an end dot (3x3) touches `forbidden` iff its centre is here
        for _batch in range(4):
            ys, xs = _walks(rng, 25, size, path_steps, curvature)
            ok = (ys.min(1) >= 1) & (xs.min(1) >= 1) & (ys.max(1) <= size - 2) & (xs.max(1) <= size - 2)
            ys, xs = np.clip(ys, 1, size - 2), np.clip(xs, 1, size - 2)  # only to index safely
            ok &= ~forbidden[ys[:, drawn], xs[:, drawn]].any(axis=1)
            ok &= ~near[ys[:, 0], xs[:, 0]] & ~near[ys[:, -1], xs[:, -1]]
            ok &= np.maximum(abs(ys[:, 0] - ys[:, -1]), abs(xs[:, 0] - xs[:, -1])) >= 2 * sep
            hits = np.flatnonzero(ok)
            if hits.size:
                y, x = ys[hits[0]], xs[hits[0]]
                footprint[y[drawn], x[drawn]] = True
                for yy, xx in ((y[0], x[0]), (y[-1], x[-1])):
                    footprint[yy - 1 : yy + 2, xx - 1 : xx + 2] = True
                paths.append((y, x))
                break
        else:
            return None
    # the hole: steps [start, start + length), leaving pieces of >= 3 pixels (a dot never hides a piece)
    start = int(rng.integers(3, path_steps - 2 - sep + 1))
    lengths = [_hole(y, x, drawn, start, sep, path_steps - 2 - start) for y, x in paths[:2]]
    if None in lengths:
        return None
    broken = int(rng.integers(2))
    hole = (t >= start) & (t < start + lengths[broken])
    img = np.zeros((size, size), np.uint8)
    for i, (y, x) in enumerate(paths):
        keep = drawn & ~hole if i == broken else drawn
        img[y[keep], x[keep]] = PATH_VALUE
    ends = [((int(y[0]), int(x[0])), (int(y[-1]), int(x[-1]))) for y, x in paths[:2]]
    return img, ends[1 - broken], ends[broken]


def _hole(ys, xs, drawn, start, sep, max_len):
    """Fewest steps from ``start`` to leave out so the two pieces are ``sep`` apart (Chebyshev), or None."""
    t = np.arange(len(ys))
    before = drawn & (t < start)
    for length in range(sep, max_len + 1):
        after = drawn & (t >= start + length)
        if not after.any():
            return None
        d = np.maximum(abs(ys[before][:, None] - ys[after][None]), abs(xs[before][:, None] - xs[after][None]))
        if d.min() >= sep:
            return length
    return None


def _shapes(rng, n, steps, curvature):
    """Offsets (dy, dx) ``(n, steps + 1)`` from the start of ``n`` unit-step walks turning <= ``curvature`` a step."""
    turns = rng.uniform(-curvature, curvature, (n, steps))
    theta = rng.uniform(0, 2 * np.pi, (n, 1)) + np.concatenate([np.zeros((n, 1)), np.cumsum(turns, axis=1)], axis=1)
    zero = np.zeros((n, 1))
    dy = np.concatenate([zero, np.cumsum(np.sin(theta[:, :-1]), axis=1)], axis=1)
    dx = np.concatenate([zero, np.cumsum(np.cos(theta[:, :-1]), axis=1)], axis=1)
    return dy, dx


def _walks(rng, n, size, steps, curvature):
    """Pixel rows and columns ``(n, steps + 1)`` of ``n`` walks placed uniformly inside the 1-pixel margin.

    The shape is drawn first, then the start uniformly among the positions that keep it inside the
    margin: the distribution of a uniform start conditioned on fitting, without rejected draws. A
    walk too wide for the frame comes out partly outside it (the caller rejects it).
    """
    dy, dx = _shapes(rng, n, steps, curvature)
    lo_y, hi_y = 1 - dy.min(1), size - 2 - dy.max(1)
    lo_x, hi_x = 1 - dx.min(1), size - 2 - dx.max(1)
    y0 = lo_y + rng.random(n) * (hi_y - lo_y)
    x0 = lo_x + rng.random(n) * (hi_x - lo_x)
    return np.rint(y0[:, None] + dy).astype(np.int64), np.rint(x0[:, None] + dx).astype(np.int64)


# ---- byte-level text --------------------------------------------------------------------------
def encode_bytes(text: str | bytes, length: int) -> np.ndarray:
    """UTF-8 bytes + 1 (0 is padding), truncated / zero-padded to ``length``: ``(length,)`` int64."""
    b = text.encode("utf-8") if isinstance(text, str) else text
    arr = np.zeros(length, np.int64)
    raw = np.frombuffer(b[:length], np.uint8)
    arr[: len(raw)] = raw.astype(np.int64) + 1
    return arr


def retrieval_sample(rng: np.random.Generator, docs: list[np.ndarray], length: int):
    """Two byte passages ``(length,)`` each and label 1 iff both come from the same document.

    ``docs`` are uint8 byte arrays at least ``2 * length`` long; same-document passages don't overlap.
    """
    label = int(rng.integers(2))
    i = int(rng.integers(len(docs)))
    d = docs[i]
    if label:
        # two non-overlapping windows: pick a split point, then one window on each side
        a0 = int(rng.integers(0, len(d) - 2 * length + 1))
        b0 = int(rng.integers(a0 + length, len(d) - length + 1))
        if rng.integers(2):
            a0, b0 = b0, a0
        pa, pb = d[a0 : a0 + length], d[b0 : b0 + length]
    else:
        j = int(rng.integers(len(docs) - 1))
        j += j >= i
        e = docs[j]
        a0 = int(rng.integers(0, len(d) - length + 1))
        b0 = int(rng.integers(0, len(e) - length + 1))
        pa, pb = d[a0 : a0 + length], e[b0 : b0 + length]
    return (pa.astype(np.int64) + 1, pb.astype(np.int64) + 1), label


# ---- shortcut measures ----------------------------------------------------------------------------
# A trivial rule on one scalar per example (the dots' distance, the amount of ink, the byte-histogram
# similarity of two passages), fitted on train and scored on val: how far the label can be read off
# without solving the task. Models should be compared against max(majority, this), not majority alone.

_MAX_CUTS = 1024  # candidate cut points per rule: exhaustive below this many distinct values, else quantiles


def fit_band_rule(
    x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, *, band: bool = True
) -> dict:
    """Best rule "label ``inside_label`` iff ``lo <= x < hi``" on train, scored on val (binary labels 0/1).

    ``x_*``: ``(M,)`` scalar features, ``y_*``: ``(M,)`` labels in {0, 1}. With ``band=False`` one end is
    infinite (a threshold rule). Cut points lie midway between consecutive distinct train values (at most
    1024 of them, else train quantiles); the search over all intervals and both labels is exhaustive.

    Returns ``lo``, ``hi``, ``inside_label``, ``train_accuracy``, ``val_accuracy`` and ``majority`` (the
    frequency of the most common val label: the best constant guess, with hindsight).
    """
    x_train, x_val = np.asarray(x_train, np.float64), np.asarray(x_val, np.float64)
    y_train, y_val = np.asarray(y_train).astype(np.int64), np.asarray(y_val).astype(np.int64)
    for name, x, y in (("train", x_train, y_train), ("val", x_val, y_val)):
        if x.ndim != 1 or x.shape != y.shape or x.size == 0:
            raise ValueError(
                f"{name} features and labels must be non-empty 1-D arrays of one length, got {x.shape} and {y.shape}"
            )
        if not np.isin(y, (0, 1)).all():
            raise ValueError(f"{name} labels must be 0 or 1, got values {np.unique(y).tolist()}")
    u = np.unique(x_train)
    mids = (u[1:] + u[:-1]) / 2
    if mids.size > _MAX_CUTS:
        mids = np.unique(np.quantile(x_train, np.linspace(0, 1, _MAX_CUTS + 2)[1:-1]))
    cuts = np.concatenate([[-np.inf], mids, [np.inf]])
    # positives / negatives strictly below each cut, so an interval [cuts[i], cuts[j]) holds pos[j] - pos[i]
    order = np.sort(x_train)
    below = np.searchsorted(order, cuts, side="left")
    pos_sorted = np.concatenate([[0], np.cumsum(y_train[np.argsort(x_train, kind="stable")])])
    pos = pos_sorted[below]
    neg = below - pos
    n, n_pos = y_train.size, int(y_train.sum())
    if band:
        i, j = np.triu_indices(cuts.size, k=1)
    else:
        i = np.concatenate([np.zeros(cuts.size - 1, np.int64), np.arange(1, cuts.size)])
        j = np.concatenate([np.arange(1, cuts.size), np.full(cuts.size - 1, cuts.size - 1)])
    in_pos, in_neg = pos[j] - pos[i], neg[j] - neg[i]
    correct = np.stack([in_neg + (n_pos - in_pos), in_pos + (n - n_pos - in_neg)])  # inside_label 0 / 1
    label, k = np.unravel_index(int(np.argmax(correct)), correct.shape)
    lo, hi = float(cuts[i[k]]), float(cuts[j[k]])
    inside = (x_val >= lo) & (x_val < hi)
    pred = np.where(inside, label, 1 - label)
    return dict(
        lo=lo,
        hi=hi,
        inside_label=int(label),
        train_accuracy=float(correct[label, k] / n),
        val_accuracy=float((pred == y_val).mean()),
        majority=float(max(y_val.mean(), 1 - y_val.mean())),
    )


def pathfinder_shortcut_features(images: np.ndarray) -> dict[str, np.ndarray]:
    """Per image of ``(M, S, S)`` (or ``(M, S*S)``) Pathfinder pixels: scalars that must not give the label away.

    ``endpoint_distance``: Euclidean distance (px) between the centres of the two dots; ``dot_radius``:
    mean distance of the two dots' centres from the image centre; ``path_pixels``: pixels drawn as path
    (not covered by a dot); ``ink``: all non-zero pixels. Each ``(M,)``.
    """
    images = np.asarray(images)
    if images.ndim == 2:
        side = int(round(images.shape[1] ** 0.5))
        if side * side != images.shape[1]:
            raise ValueError(f"flat images must have a square number of pixels, got {images.shape[1]}")
        images = images.reshape(len(images), side, side)
    if images.ndim != 3:
        raise ValueError(f"images must have shape (M, S, S) or (M, S*S), got {images.shape}")
    dist, radius = np.empty(len(images)), np.empty(len(images))
    centre = (images.shape[1] - 1) / 2, (images.shape[2] - 1) / 2
    for m, img in enumerate(images):
        ys, xs = np.nonzero(img == DOT_VALUE)
        if ys.size == 0:
            raise ValueError(f"image {m} shows no dot (no pixel of value {DOT_VALUE})")
        # dots are 3x3 and far apart: the pixels within 2 of the first dot pixel form the first dot
        first = np.maximum(abs(ys - ys[0]), abs(xs - xs[0])) <= 2
        if first.all():
            raise ValueError(f"image {m} shows one dot, Pathfinder images show two")
        c0 = ys[first].mean(), xs[first].mean()
        c1 = ys[~first].mean(), xs[~first].mean()
        dist[m] = np.hypot(c0[0] - c1[0], c0[1] - c1[1])
        radius[m] = (np.hypot(*np.subtract(c0, centre)) + np.hypot(*np.subtract(c1, centre))) / 2
    return dict(
        endpoint_distance=dist,
        dot_radius=radius,
        path_pixels=(images == PATH_VALUE).sum((1, 2)).astype(np.float64),
        ink=(images > 0).sum((1, 2)).astype(np.float64),
    )


def byte_histogram_similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity ``(M,)`` of the byte histograms of paired passages ``a``, ``b`` ``(M, N)``.

    Tokens are bytes + 1 with 0 for padding (as :func:`encode_bytes` and :func:`retrieval_sample` make
    them); padding is not counted. A passage of padding only has similarity 0.
    """
    a, b = np.asarray(a, np.int64), np.asarray(b, np.int64)
    if a.ndim != 2 or b.ndim != 2 or len(a) != len(b):
        raise ValueError(f"a and b must be (M, N) token arrays with the same M, got {a.shape} and {b.shape}")

    def hist(t):
        rows = np.repeat(np.arange(len(t)), t.shape[1])
        h = np.zeros((len(t), 257))
        np.add.at(h, (rows, t.reshape(-1)), 1.0)
        return h[:, 1:]  # padding is no byte

    ha, hb = hist(a), hist(b)
    norm = np.linalg.norm(ha, axis=1) * np.linalg.norm(hb, axis=1)
    return np.where(norm > 0, (ha * hb).sum(1) / np.where(norm > 0, norm, 1.0), 0.0)


def _features(data, featurize, max_examples: int | None, chunk: int = 256) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``featurize(*inputs)`` (a dict of ``(m,)`` arrays) over ``data`` in chunks, and the labels.

    ``data``: a batch dataset (``get_batch``) or an ``(*inputs, labels)`` tuple of arrays. Chunks keep
    memory small: a full Path-X split is 20,000 x 16,384 pixels.
    """
    if hasattr(data, "get_batch"):
        n = len(data) if max_examples is None else min(len(data), max_examples)

        def batch(s, e):
            inputs, target = data.get_batch(np.arange(s, e))
            return [x.numpy() for x in inputs], target.numpy()
    else:
        *arrays, labels = data
        n = len(labels) if max_examples is None else min(len(labels), max_examples)

        def batch(s, e):
            return [np.asarray(x[s:e]) for x in arrays], np.asarray(labels[s:e])

    if n < 1:
        raise ValueError("no examples to measure a shortcut on")
    feats, ys = [], []
    for s in range(0, n, chunk):
        inputs, y = batch(s, min(s + chunk, n))
        feats.append(featurize(*inputs))
        ys.append(y)
    return {k: np.concatenate([f[k] for f in feats]) for k in feats[0]}, np.concatenate(ys)


def _split(task_or_train, val):
    if val is None:
        if not (hasattr(task_or_train, "train") and hasattr(task_or_train, "val")):
            raise TypeError("pass a built task (with .train and .val) or both train= and val= examples")
        return task_or_train.train, task_or_train.val
    return task_or_train, val


def pathfinder_shortcut_accuracy(task_or_train, val=None, *, max_examples: int | None = None) -> dict[str, dict]:
    """How well the best band on the dots' distance, their position or the ink predicts Pathfinder labels.

    ``task_or_train``: a built ``lra_pathfinder``/``lra_pathx`` task (``build_task(...)``), or train
    examples ``(images (M, S*S) or (M, S, S), labels (M,))`` with ``val`` the same for validation.
    ``max_examples`` caps the examples read from each split. Returns, for each feature of
    :func:`pathfinder_shortcut_features`, :func:`fit_band_rule`'s dict.
    """
    train, val = _split(task_or_train, val)
    f_tr, y_tr = _features(train, pathfinder_shortcut_features, max_examples)
    f_va, y_va = _features(val, pathfinder_shortcut_features, max_examples)
    return {k: fit_band_rule(f_tr[k], y_tr, f_va[k], y_va) for k in f_tr}


def retrieval_shortcut_accuracy(task_or_train, val=None, *, max_examples: int | None = None) -> dict:
    """How well "same work iff the two passages' byte histograms are similar" predicts Retrieval labels.

    The feature is the cosine similarity of the two passages' byte histograms
    (:func:`byte_histogram_similarity`); the rule is the best threshold on train (either direction),
    scored on val. ``task_or_train``: a built ``lra_retrieval`` task, or train examples
    ``(a (M, N), b (M, N), labels (M,))`` with ``val`` the same for validation; ``max_examples`` caps
    the examples read from each split (a full split of 4,000-byte pairs is large).

    Returns ``threshold`` (the fitted cut), ``similar_label`` (the label predicted at or above it),
    ``train_accuracy``, ``val_accuracy``, ``majority`` (most common val label's frequency) and
    ``n_train``/``n_val``.
    """
    train, val = _split(task_or_train, val)

    def similarity(a, b):
        return {"similarity": byte_histogram_similarity(a, b)}

    f_tr, y_tr = _features(train, similarity, max_examples)
    f_va, y_va = _features(val, similarity, max_examples)
    rule = fit_band_rule(f_tr["similarity"], y_tr, f_va["similarity"], y_va, band=False)
    # a threshold rule has one infinite end: above the finite cut the label is inside_label iff hi is infinite
    above_inside = np.isinf(rule["hi"])
    threshold = rule["lo"] if above_inside else rule["hi"]
    similar = rule["inside_label"] if above_inside else 1 - rule["inside_label"]
    return dict(
        threshold=float(threshold),
        similar_label=int(similar),
        train_accuracy=rule["train_accuracy"],
        val_accuracy=rule["val_accuracy"],
        majority=rule["majority"],
        n_train=int(len(y_tr)),
        n_val=int(len(y_va)),
    )
