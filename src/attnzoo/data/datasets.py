"""Map-style datasets that return whole batches: ``get_batch(idx) -> (inputs, target)``.

``inputs`` is a tuple of tensors passed to the model as ``model(*inputs)``. Generated datasets make
sample ``i`` from its own RNG seeded by ``(seed, i)``, so any subset (a DDP shard, a resumed run)
sees exactly the same samples, in any order, on any number of processes.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch

__all__ = [
    "BatchDataset",
    "ArrayDataset",
    "ImageDataset",
    "GeneratedDataset",
    "WindowDataset",
    "PackedWindowDataset",
    "Batch",
    "IGNORE_INDEX",
]

#: a target no loss reads (``torch.nn.functional.cross_entropy``'s default ``ignore_index``)
IGNORE_INDEX = -100

Batch = tuple[tuple[torch.Tensor, ...], torch.Tensor]


class BatchDataset:
    """``len(ds)`` samples; ``ds.get_batch(idx: (B,) int array) -> (inputs, target)``."""

    def __len__(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def get_batch(self, idx: np.ndarray) -> Batch:  # pragma: no cover - interface
        raise NotImplementedError

    def _check_idx(self, idx) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if idx.ndim != 1:
            raise ValueError(f"idx must be a 1-D array of sample indices, got shape {idx.shape}")
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"sample index out of range [0, {len(self)}): min {idx.min()}, max {idx.max()}")
        return idx


class ArrayDataset(BatchDataset):
    """In-memory arrays: ``inputs`` (each ``(N, ...)``) and ``target (N, ...)``."""

    def __init__(self, inputs: Sequence[np.ndarray], target: np.ndarray) -> None:
        self.inputs = [np.asarray(a) for a in inputs]
        self.target = np.asarray(target)
        n = len(self.target)
        for a in self.inputs:
            if len(a) != n:
                raise ValueError(f"inputs and target disagree on the sample count: {len(a)} vs {n}")

    def __len__(self) -> int:
        return len(self.target)

    def get_batch(self, idx) -> Batch:
        idx = self._check_idx(idx)
        return tuple(torch.from_numpy(np.ascontiguousarray(a[idx])) for a in self.inputs), torch.from_numpy(
            np.ascontiguousarray(self.target[idx])
        )


#: where :class:`ImageDataset` puts an image smaller than its canvas: centred, or at a random offset fixed per image
#: (an object placed anywhere: a task a bag of patch features with learned positions cannot read off fixed pixels)
PLACEMENTS = ("center", "random")


class ImageDataset(BatchDataset):
    """uint8 images ``(N, H, W[, C])`` -> float ``(B, C, H', W')`` normalised by ``mean``/``std``, zero-padded to
    ``size``."""

    def __init__(
        self,
        images: np.ndarray,
        labels: np.ndarray,
        mean: float,
        std: float,
        size: int | None = None,
        placement: str = "center",
        seed: int = 0,
    ):
        if images.ndim == 3:
            images = images[..., None]
        if images.ndim != 4:
            raise ValueError(f"images must have shape (N, H, W) or (N, H, W, C), got {images.shape}")
        self.images = np.ascontiguousarray(images.transpose(0, 3, 1, 2))  # (N, C, H, W)
        self.labels = np.asarray(labels, dtype=np.int64)
        self.mean, self.std = float(mean), float(std)
        h, w = self.images.shape[-2:]
        self.size = size or max(h, w)
        if self.size < max(h, w):
            raise ValueError(f"img_size={self.size} is smaller than the images ({h}x{w}); valid: >= {max(h, w)}")
        if placement not in PLACEMENTS:
            raise ValueError(f"placement={placement!r} is not known; valid: {', '.join(PLACEMENTS)}")
        self.placement = placement
        self.offsets = self._offsets(placement, seed, h, w)

    def __len__(self) -> int:
        return len(self.labels)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.images.shape[1], self.size, self.size)

    def get_batch(self, idx) -> Batch:
        idx = self._check_idx(idx)
        x = torch.from_numpy(self.images[idx]).float().div_(255.0).sub_(self.mean).div_(self.std)
        h, w = x.shape[-2:]
        if (h, w) != (self.size, self.size):
            # pad with the normalised value of a black pixel, each image at its own offset
            out = torch.full((x.shape[0], x.shape[1], self.size, self.size), -self.mean / self.std)
            for k, (top, left) in enumerate(self.offsets[idx]):
                out[k, :, top : top + h, left : left + w] = x[k]
            x = out
        return (x,), torch.from_numpy(self.labels[idx])

    def _offsets(self, placement: str, seed: int, h: int, w: int) -> np.ndarray:
        """``(N, 2)`` top-left corner of each image on the canvas: centred, or drawn uniformly once per image
        (``seed``), so an image sits at the same place in every epoch and on every resume."""
        n = len(self.labels)
        if placement == "center":
            return np.tile(np.array([(self.size - h) // 2, (self.size - w) // 2], dtype=np.int64), (n, 1))
        rng = np.random.default_rng(seed)
        return np.stack([rng.integers(0, self.size - h + 1, n), rng.integers(0, self.size - w + 1, n)], axis=1)


class GeneratedDataset(BatchDataset):
    """``n`` samples; sample ``i`` is ``make(np.random.default_rng([*seed, i]))`` -> ``(inputs tuple, target)``.

    Samples are memoised (``cache=True``) so later epochs don't regenerate them.
    """

    def __init__(
        self, n: int, seed: int | Sequence[int], make: Callable[[np.random.Generator], tuple], cache: bool = True
    ) -> None:
        if n < 1:
            raise ValueError(f"a generated dataset needs n >= 1 samples, got {n}")
        self.n, self.make, self.cache = int(n), make, cache
        # an uncached stream of i.i.d. prompts needs no shuffling: the trainer reads it in order
        self.shuffle = cache
        self.seed = [int(seed)] if isinstance(seed, (int, np.integer)) else [int(s) for s in seed]
        self._memo: dict[int, tuple] = {}

    def __len__(self) -> int:
        return self.n

    def sample(self, i: int) -> tuple:
        i = int(i)
        if i in self._memo:
            return self._memo[i]
        s = self.make(np.random.default_rng([*self.seed, i]))
        if self.cache:
            self._memo[i] = s
        return s

    def get_batch(self, idx) -> Batch:
        idx = self._check_idx(idx)
        samples = [self.sample(i) for i in idx]
        n_in = len(samples[0][0])
        inputs = tuple(torch.from_numpy(_widen(np.stack([s[0][k] for s in samples]))) for k in range(n_in))
        target = torch.from_numpy(_widen(np.stack([np.asarray(s[1]) for s in samples])))
        return inputs, target


def _widen(a: np.ndarray) -> np.ndarray:
    # samples are memoised in compact integer types (uint8 pixels, ...); models take int64 ids
    return a.astype(np.int64) if a.dtype.kind in "iub" else a


class WindowDataset(BatchDataset):
    """Next-token windows of a stream: sample ``i`` is ``(tokens[j:j+L],), tokens[j+1:j+L+1]`` with ``j = i * stride``.

    Training uses ``stride=1`` (every offset); validation uses ``stride=L`` (disjoint windows covering the text).
    ``doc_starts``: the offsets in ``tokens`` where documents (plays, files) begin, for :meth:`packed`.
    """

    def __init__(
        self, tokens: np.ndarray, block_size: int, stride: int = 1, doc_starts: Sequence[int] | None = None
    ) -> None:
        if len(tokens) <= block_size:
            raise ValueError(f"the token stream ({len(tokens)} tokens) must be longer than block_size={block_size}")
        if stride < 1:
            raise ValueError(f"stride must be >= 1, got {stride}")
        self.tokens = torch.from_numpy(np.asarray(tokens, dtype=np.int64))
        self.block_size = int(block_size)
        self.stride = int(stride)
        self.doc_starts = None if doc_starts is None else np.asarray(doc_starts, dtype=np.int64)
        if self.doc_starts is not None and self.doc_starts.size:
            lo, hi = int(self.doc_starts.min()), int(self.doc_starts.max())
            if lo < 0 or hi >= len(tokens):
                raise ValueError(f"doc_starts must lie in [0, {len(tokens)}), got values in [{lo}, {hi}]")

    def __len__(self) -> int:
        return (len(self.tokens) - self.block_size - 1) // self.stride + 1

    def packed(self) -> "PackedWindowDataset":
        """The same windows, each cut at the document starts inside it and packed into one row (see there)."""
        if self.doc_starts is None:
            raise ValueError("this token stream has no document starts (doc_starts): it cannot be packed by document")
        return PackedWindowDataset(self.tokens.numpy(), self.block_size, self.stride, self.doc_starts)

    def get_batch(self, idx) -> Batch:
        idx = torch.from_numpy(self._check_idx(idx)) * self.stride
        offsets = idx[:, None] + torch.arange(self.block_size + 1)
        w = self.tokens[offsets]
        return (w[:, :-1].contiguous(),), w[:, 1:].contiguous()


class PackedWindowDataset(WindowDataset):
    """:class:`WindowDataset`'s windows packed by document: a batch of ``B`` windows is one row ``(1, B * L)``.

    ``get_batch(idx) -> ((ids (1, T), cu_seqlens (S + 1,) int32), target (1, T))`` with ``T = B * L``: each
    window starts a sequence and so does every document start inside it, so no token attends across a document
    (or window) boundary and the model restarts its positions and causal states there. A target that is the
    first token of a document (predicted from the end of the previous one) is ``IGNORE_INDEX``; every other next
    token is a target. The windows, hence the batches of a step, are those of the unpacked dataset: the same
    indices give the same tokens, so a run's data order (and resume) does not change with packing.
    """

    def __init__(self, tokens: np.ndarray, block_size: int, stride: int, doc_starts: Sequence[int]) -> None:
        super().__init__(tokens, block_size, stride, doc_starts)
        starts = torch.zeros(len(self.tokens) + 1, dtype=torch.bool)
        starts[torch.from_numpy(self.doc_starts)] = True
        self._starts = starts  # (len + 1,): True where a document begins

    def get_batch(self, idx) -> Batch:
        idx = torch.from_numpy(self._check_idx(idx)) * self.stride
        offsets = idx[:, None] + torch.arange(self.block_size + 1)  # (B, L + 1)
        w = self.tokens[offsets]
        first = self._starts[offsets]  # (B, L + 1): token begins a document
        begins = first[:, :-1].clone()
        begins[:, 0] = True  # every window begins a sequence of its own
        target = w[:, 1:].masked_fill(first[:, 1:], IGNORE_INDEX)
        t = begins.numel()
        bounds = torch.nonzero(begins.reshape(-1)).reshape(-1)
        cu = torch.cat([bounds, torch.tensor([t])]).to(torch.int32)
        return (w[:, :-1].reshape(1, t), cu), target.reshape(1, t)
