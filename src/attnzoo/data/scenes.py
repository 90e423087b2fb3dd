"""Scenes with exact masks: 1-3 objects (digits or Fashion-MNIST items) on a textured, noisy background.

The segmentation claims of CBSA (Tables 5/6, Fig. 7: zero-shot segmentation by the [CLS] attention map) and
ToST (Fig. 5) are measured on PASCAL VOC at ImageNet scale; a scene here is their laptop-sized stand-in. Each
scene is a pure function of ``(seed, split, index)`` (its own ``numpy`` generator; no global RNG) and carries:

- ``label``: the class of the object with the most visible pixels (the classification target);
- ``instance`` ``(H, W)``: 0 for background, ``k`` for the ``k``-th object drawn (later objects lie on top);
- ``semantic`` ``(H, W)``: 0 for background, ``class + 1`` on objects (VOC's convention: 0 is background);
- foreground (``instance > 0``), background (its complement) and boundary: the pixels within ``w / 2``
  (chessboard distance) of a pixel of another region, a band of width ``w`` straddling every object edge,
  object-object edges included, like VOC's void band (:func:`boundary_band`).

The masks are exact by construction: an object covers exactly the pixels where its resized source image is at
least :data:`INK_THRESHOLD` of its peak, and those pixels show the object (nothing of it is drawn elsewhere).
"""

from __future__ import annotations

import typing
from dataclasses import dataclass

import numpy as np
import torch

from attnzoo.data.datasets import Batch, BatchDataset

__all__ = [
    "INK_THRESHOLD",
    "MASK_NAMES",
    "Scene",
    "SceneSpec",
    "SceneDataset",
    "boundary_band",
    "load_scene_sources",
    "render_scene",
    "scene_masks",
]

#: a source pixel belongs to its object where its intensity is at least this fraction of the image's peak
INK_THRESHOLD = 0.35
#: the per-pixel maps :meth:`SceneDataset.masks` returns
MASK_NAMES = ("instance", "semantic", "foreground", "background", "boundary")
Source = typing.Literal["digits", "fashion_mnist"]
#: what a scene dataset's batches target: the most visible object's class, or the per-pixel semantic map
Target = typing.Literal["label", "semantic"]
_PLACEMENT_TRIES = 8


@dataclass(frozen=True)
class SceneSpec:
    """How scenes are drawn: canvas side, object count and sizes (fractions of the canvas side), boundary width."""

    canvas: int = 64
    min_objects: int = 1
    max_objects: int = 3
    #: side of the first (largest) object and of the others, as fractions of the canvas side
    main_size: tuple[float, float] = (0.4, 0.6)
    other_size: tuple[float, float] = (0.22, 0.36)
    boundary_width: int = 4
    noise_std: float = 0.04

    def __post_init__(self) -> None:
        if not isinstance(self.canvas, int) or self.canvas < 16:
            raise ValueError(f"canvas={self.canvas!r} must be an int >= 16 (pixels)")
        if not 1 <= self.min_objects <= self.max_objects <= 8:
            raise ValueError(
                f"min_objects={self.min_objects!r}, max_objects={self.max_objects!r}: need "
                "1 <= min_objects <= max_objects <= 8"
            )
        for name in ("main_size", "other_size"):
            lo, hi = getattr(self, name)
            if not 0.05 <= lo <= hi <= 1.0:
                raise ValueError(f"{name}={(lo, hi)!r} must satisfy 0.05 <= low <= high <= 1 (canvas fractions)")
        w = self.boundary_width
        if not isinstance(w, int) or w < 2 or w % 2:
            raise ValueError(f"boundary_width={w!r} must be an even int >= 2 (pixels; w/2 on each side of an edge)")
        if not 0.0 <= self.noise_std <= 0.5:
            raise ValueError(f"noise_std={self.noise_std!r} must lie in [0, 0.5]")


@dataclass(frozen=True)
class Scene:
    """One drawn scene: ``image`` uint8 ``(H, W)``, ``instance`` int8 ``(H, W)``, the objects' ``classes`` (object
    ``k`` has class ``classes[k - 1]``) and ``label``, the class of the object with the most visible pixels."""

    image: np.ndarray
    instance: np.ndarray
    classes: tuple[int, ...]
    label: int


def load_scene_sources(source: Source, split: str, root: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The object images ``(M, h, w)`` uint8 and classes ``(M,)`` scenes of ``split`` ("train"/"test") draw from."""
    from attnzoo.data import images

    if source == "digits":
        return images.load_digits(split)
    if source == "fashion_mnist":
        return images.load_fashion_mnist(split, root=root)
    raise ValueError(f"source={source!r} is not supported; valid sources: {list(typing.get_args(Source))}")


def _resize(img: np.ndarray, size: int) -> np.ndarray:
    """Bilinear resize of a square-ish ``(h, w)`` float image to ``(size, size)`` (pixel centres aligned)."""
    h, w = img.shape
    ys = np.clip((np.arange(size) + 0.5) * h / size - 0.5, 0, h - 1)
    xs = np.clip((np.arange(size) + 0.5) * w / size - 0.5, 0, w - 1)
    y0, x0 = np.floor(ys).astype(int), np.floor(xs).astype(int)
    y1, x1 = np.minimum(y0 + 1, h - 1), np.minimum(x0 + 1, w - 1)
    fy, fx = (ys - y0)[:, None], (xs - x0)[None, :]
    top = img[y0][:, x0] * (1 - fx) + img[y0][:, x1] * fx
    bottom = img[y1][:, x0] * (1 - fx) + img[y1][:, x1] * fx
    return top * (1 - fy) + bottom * fy


def _background(rng: np.random.Generator, n: int) -> np.ndarray:
    """Two random oriented gratings plus a coarse random blob field, in about [0.05, 0.45]."""
    yy, xx = np.mgrid[0:n, 0:n].astype(np.float64) / n
    tex = np.zeros((n, n))
    for _ in range(2):
        theta, freq, phase = rng.uniform(0, np.pi), rng.uniform(2.0, 7.0), rng.uniform(0, 2 * np.pi)
        tex += np.sin(2 * np.pi * freq * (xx * np.cos(theta) + yy * np.sin(theta)) + phase)
    coarse = _resize(rng.uniform(-1.0, 1.0, (4, 4)), n)
    return 0.25 + 0.06 * tex + 0.08 * coarse


def _place(rng: np.random.Generator, instance: np.ndarray, ink: np.ndarray, span: int) -> tuple[int, int]:
    """A top-left corner where ``ink`` hides at most 10% of itself under earlier objects (the least-hiding of
    :data:`_PLACEMENT_TRIES` random tries otherwise), so that later objects rarely bury earlier ones."""
    best, best_hidden = (0, 0), None
    side = ink.shape[0]
    for _ in range(_PLACEMENT_TRIES):
        top, left = int(rng.integers(0, span)), int(rng.integers(0, span))
        hidden = int(np.count_nonzero(ink & (instance[top : top + side, left : left + side] > 0)))
        if best_hidden is None or hidden < best_hidden:
            best, best_hidden = (top, left), hidden
        if hidden <= 0.1 * np.count_nonzero(ink):
            break
    return best


def render_scene(rng: np.random.Generator, sources: tuple[np.ndarray, np.ndarray], spec: SceneSpec) -> Scene:
    """Draw one scene from ``rng`` (its only randomness): objects largest first, smaller ones on top."""
    imgs, classes = sources
    n = spec.canvas
    image = _background(rng, n)
    instance = np.zeros((n, n), np.int8)
    count = int(rng.integers(spec.min_objects, spec.max_objects + 1))
    drawn = []
    for k in range(count):
        lo, hi = spec.main_size if k == 0 else spec.other_size
        side = max(4, int(round(rng.uniform(lo, hi) * n)))
        j = int(rng.integers(len(imgs)))
        obj = _resize(imgs[j].astype(np.float64), side)
        peak = obj.max()
        ink = obj >= INK_THRESHOLD * peak if peak > 0 else np.zeros_like(obj, bool)
        top, left = _place(rng, instance, ink, n - side + 1)
        brightness = rng.uniform(0.7, 1.0)
        # object pixels span [0.45, 1] x brightness: they overlap the background's range only at their dimmest
        appearance = brightness * (0.45 + 0.55 * obj / max(peak, 1e-9))
        region = (slice(top, top + side), slice(left, left + side))
        image[region] = np.where(ink, appearance, image[region])
        instance[region] = np.where(ink, k + 1, instance[region])
        drawn.append(int(classes[j]))
    image = image + rng.normal(0.0, spec.noise_std, image.shape)
    pixels = np.clip(np.rint(image * 255.0), 0, 255).astype(np.uint8)
    visible = np.bincount(instance.ravel().astype(np.int64), minlength=count + 1)[1:]
    return Scene(pixels, instance, tuple(drawn), drawn[int(np.argmax(visible))])


def boundary_band(regions: np.ndarray, width: int) -> np.ndarray:
    """Pixels within ``width // 2`` (chessboard distance) of a pixel of another region: a band of ``width`` pixels
    straddling every edge of the label map ``regions`` ``(..., H, W)``; the canvas border is no edge."""
    r = width // 2
    if r < 1:
        raise ValueError(f"width={width!r} must be >= 2 (a band of width/2 pixels on each side of an edge)")
    pad = [(0, 0)] * (regions.ndim - 2) + [(r, r), (r, r)]
    padded = np.pad(regions, pad, mode="edge")
    h, w = regions.shape[-2:]
    band = np.zeros(regions.shape, bool)
    for dy in range(2 * r + 1):
        for dx in range(2 * r + 1):
            band |= padded[..., dy : dy + h, dx : dx + w] != regions
    return band


def scene_masks(instance: np.ndarray, classes: list[tuple[int, ...]], boundary_width: int) -> dict[str, np.ndarray]:
    """The maps of :data:`MASK_NAMES` for instance maps ``(B, H, W)`` and each scene's object classes."""
    semantic = np.zeros(instance.shape, np.int64)
    for b, cls in enumerate(classes):
        lut = np.array([-1, *cls], np.int64) + 1  # 0 stays background, object k -> class + 1
        semantic[b] = lut[instance[b].astype(np.int64)]
    fg = instance > 0
    return {
        "instance": instance.astype(np.int64),
        "semantic": semantic,
        "foreground": fg,
        "background": ~fg,
        "boundary": boundary_band(instance, boundary_width),
    }


class SceneDataset(BatchDataset):
    """``n`` scenes; scene ``i`` is :func:`render_scene` with ``np.random.default_rng([seed, split_id, i])``.

    ``get_batch(idx) -> ((images (B, 1, H, W) float, normalised by mean/std),), target)``: the target is
    ``labels (B,)`` int64 (``target="label"``) or the semantic maps ``(B, H, W)`` int64 (``target="semantic"``,
    0 = background, class + 1 on objects: a segmentation task's). ``masks(idx) -> {name: (B, H, W)}`` for the
    names of :data:`MASK_NAMES`. Scenes are memoised (uint8).
    """

    def __init__(
        self,
        n: int,
        seed: int,
        split_id: int,
        sources: tuple[np.ndarray, np.ndarray],
        spec: SceneSpec,
        mean: float = 0.0,
        std: float = 1.0,
        target: Target = "label",
    ) -> None:
        if n < 1:
            raise ValueError(f"a scene dataset needs n >= 1 scenes, got {n}")
        if target not in typing.get_args(Target):
            raise ValueError(f"target={target!r} is not supported; valid targets: {list(typing.get_args(Target))}")
        self.target = target
        if not std > 0:
            raise ValueError(f"std={std!r} must be > 0")
        self.n, self.seed, self.split_id = int(n), int(seed), int(split_id)
        self.sources, self.spec = sources, spec
        self.mean, self.std = float(mean), float(std)
        self._memo: dict[int, Scene] = {}

    def __len__(self) -> int:
        return self.n

    @property
    def shape(self) -> tuple[int, int, int]:
        return (1, self.spec.canvas, self.spec.canvas)

    def scene(self, i: int) -> Scene:
        """Scene ``i`` (drawn on first use, then memoised)."""
        i = int(i)
        if not 0 <= i < self.n:
            raise IndexError(f"scene index {i} out of range [0, {self.n})")
        if i not in self._memo:
            self._memo[i] = render_scene(np.random.default_rng([self.seed, self.split_id, i]), self.sources, self.spec)
        return self._memo[i]

    def pixels(self, idx) -> np.ndarray:
        """Raw scenes ``(B, H, W)`` as floats in [0, 1] (not normalised)."""
        idx = self._check_idx(idx)
        return np.stack([self.scene(i).image for i in idx]).astype(np.float32) / 255.0

    def get_batch(self, idx) -> Batch:
        idx = self._check_idx(idx)
        x = torch.from_numpy(self.pixels(idx)).sub_(self.mean).div_(self.std).unsqueeze(1)
        if self.target == "semantic":
            return (x,), self.masks(idx)["semantic"]
        y = torch.tensor([self.scene(i).label for i in idx], dtype=torch.int64)
        return (x,), y

    def masks(self, idx) -> dict[str, torch.Tensor]:
        """Exact per-pixel maps of scenes ``idx``: ``{name: (B, H, W)}`` (int64 ids, bool masks)."""
        idx = self._check_idx(idx)
        scenes = [self.scene(i) for i in idx]
        instance = np.stack([s.instance for s in scenes])
        maps = scene_masks(instance, [s.classes for s in scenes], self.spec.boundary_width)
        return {k: torch.from_numpy(v) for k, v in maps.items()}


def build_scene_splits(
    *,
    source: Source,
    img_size: int,
    n_train: int,
    n_val: int,
    min_objects: int,
    max_objects: int,
    boundary_width: int,
    noise_std: float,
    seed: int,
    root: str | None,
    target: Target = "label",
) -> tuple[SceneDataset, SceneDataset, dict]:
    """Train and validation scenes (objects from the sources' train and test splits) and the task's ``info``:
    ``num_classes`` counts the object classes (``target="label"``) or the per-pixel classes, background included
    (``target="semantic"``)."""
    if not isinstance(img_size, int) or img_size < 16:
        raise ValueError(f"img_size={img_size!r} must be an int >= 16 (the scenes' side in pixels)")
    spec = SceneSpec(
        canvas=img_size,
        min_objects=min_objects,
        max_objects=max_objects,
        boundary_width=boundary_width,
        noise_std=noise_std,
    )
    train_src, val_src = load_scene_sources(source, "train", root), load_scene_sources(source, "test", root)
    probe = SceneDataset(min(n_train, 64), seed, 0, train_src, spec).pixels(np.arange(min(n_train, 64)))
    mean, std = float(probe.mean()), float(probe.std()) or 1.0
    train = SceneDataset(n_train, seed, 0, train_src, spec, mean, std, target)
    val = SceneDataset(n_val, seed, 1, val_src, spec, mean, std, target)
    ncls = int(max(train_src[1].max(), val_src[1].max()) + 1)
    semantic = target == "semantic"
    info = dict(
        num_classes=ncls + 1 if semantic else ncls,
        object_classes=ncls,
        in_chans=1,
        img_size=img_size,
        mean=mean,
        std=std,
        masks=list(MASK_NAMES),
        boundary_width=boundary_width,
        label="per pixel: 0 background, class + 1 on objects"
        if semantic
        else "class of the object with the most visible pixels",
    )
    return train, val, info
