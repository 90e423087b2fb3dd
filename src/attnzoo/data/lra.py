"""Long-Range-Arena-style generators (Tay et al., 2021), made offline and deterministic by seed.

- ListOps (Nangia & Bowman, 2018): nested ``[MAX``/``[MIN``/``[MED``/``[SM`` lists of digits; the
  label is the value (10 classes). Tokens: 0 pad, 1..10 digits 0..9, 11..14 operators, 15 ``]``.
- Pathfinder (Linsley et al., 2018): two dots, dashed curved paths, distractor paths; label 1 iff
  the dots lie on the same path. Pixel intensities are the tokens (vocab 256).
- Byte-level encodings for Text (IMDB) and Retrieval (two passages: same Shakespeare work or not).
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
    """Chebyshev dilation of a boolean mask by ``r`` pixels."""
    out = mask.copy()
    p = np.pad(mask, r)
    h, w = mask.shape
    for dy in range(-r, r + 1):
        for dx in range(-r, r + 1):
            out |= p[r + dy : r + dy + h, r + dx : r + dx + w]
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
    ``dash`` pixels on, ``gap`` off. Different paths (with their end dots) stay at least
    ``gap + 3`` pixels apart, so dilating the image by ``ceil(gap / 2)`` joins the dashes of one path
    and never two paths: that is the connectivity check the tests run on the rendered image.
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
    for _attempt in range(200):
        footprint = np.zeros((size, size), bool)  # pixels (with end dots) of paths placed so far
        img = np.zeros((size, size), np.uint8)
        ends: list[tuple[tuple[int, int], tuple[int, int]]] = []
        for _p in range(n_paths):
            placed = False
            forbidden = _dilate(footprint, sep - 1)
            for _try in range(100):
                pix = _walk(rng, size, path_steps, dash, gap, curvature)
                if pix is None:
                    continue
                mask = np.zeros((size, size), bool)
                for y, x in pix:
                    mask[y, x] = True
                (y0, x0), (y1, x1) = pix[0], pix[-1]
                fp = mask.copy()
                fp[max(y0 - 1, 0) : y0 + 2, max(x0 - 1, 0) : x0 + 2] = True
                fp[max(y1 - 1, 0) : y1 + 2, max(x1 - 1, 0) : x1 + 2] = True
                if (fp & forbidden).any() or max(abs(y0 - y1), abs(x0 - x1)) < 2 * sep:
                    continue
                footprint |= fp
                img[mask] = PATH_VALUE
                ends.append((pix[0], pix[-1]))
                placed = True
                break
            if not placed:
                break
        if len(ends) < n_paths:
            continue
        label = int(rng.integers(2))
        a = ends[0][int(rng.integers(2))]
        b = ends[0][1] if (label and a == ends[0][0]) else ends[0][0] if label else ends[1][int(rng.integers(2))]
        for y, x in (a, b):
            img[max(y - 1, 0) : y + 2, max(x - 1, 0) : x + 2] = DOT_VALUE
        return img, label
    raise RuntimeError(f"could not place {n_paths} separated paths of {path_steps} steps in a {size}x{size} image")


def _walk(rng, size, steps, dash, gap, curvature):
    """Pixels drawn by one dashed unit-step walk (first and last always drawn), or None if it leaves the frame."""
    y0, x0 = rng.uniform(2, size - 3, size=2)
    theta = rng.uniform(0, 2 * np.pi) + np.concatenate([[0.0], np.cumsum(rng.uniform(-curvature, curvature, steps))])
    ys = np.rint(y0 + np.concatenate([[0.0], np.cumsum(np.sin(theta[:-1]))])).astype(np.int64)
    xs = np.rint(x0 + np.concatenate([[0.0], np.cumsum(np.cos(theta[:-1]))])).astype(np.int64)
    if ys.min() < 1 or xs.min() < 1 or ys.max() > size - 2 or xs.max() > size - 2:
        return None
    t = np.arange(steps + 1)
    keep = (t % (dash + gap) < dash) | (t == steps)
    pix: list[tuple[int, int]] = []
    for yi, xi in zip(ys[keep].tolist(), xs[keep].tolist()):
        if not pix or pix[-1] != (yi, xi):
            pix.append((yi, xi))
    return pix


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
