"""DeiT-style image augmentation, deterministic per sample: random resized crop, horizontal flip, RandAugment,
mixup/cutmix (label smoothing is the trainer's ``label_smoothing``, applied to the mixed targets).

Every random choice draws from a ``numpy`` generator the caller seeds from ``(seed, step, index)``, so a
sample's augmentation is a pure function of those three numbers: a resumed run, a DDP shard or a
DataLoader worker produces exactly the same pixels as an uninterrupted single-process run.

References: Inception-style random resized crop (Szegedy et al. 2015); RandAugment (Cubuk et al. 2020,
``N`` ops per image at magnitude ``M`` out of 10); mixup (Zhang et al. 2018); CutMix (Yun et al. 2019), mixed as
in DeiT (Touvron et al. 2021): each batch is mixed with itself reversed, one of the two chosen per batch.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image, ImageEnhance, ImageOps

__all__ = ["random_resized_crop", "center_crop_resize", "rand_augment", "RAND_AUGMENT_OPS", "mix_batch"]

_BICUBIC = Image.Resampling.BICUBIC
_FILL = (128, 128, 128)  # grey for the pixels geometric ops uncover (timm's choice)


def random_resized_crop(
    img: Image.Image,
    size: int,
    rng: np.random.Generator,
    scale: tuple[float, float] = (0.08, 1.0),
    ratio: tuple[float, float] = (3 / 4, 4 / 3),
) -> Image.Image:
    """A crop of random area fraction in ``scale`` and aspect ratio (log-uniform) in ``ratio``, resized to
    ``size x size``; after 10 failed draws the largest centred crop within ``ratio`` (Inception's fallback)."""
    w, h = img.size
    area = w * h
    log_r = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(*log_r))
        cw = int(round(math.sqrt(target * aspect)))
        ch = int(round(math.sqrt(target / aspect)))
        if 0 < cw <= w and 0 < ch <= h:
            left = int(rng.integers(0, w - cw + 1))
            top = int(rng.integers(0, h - ch + 1))
            return img.resize((size, size), _BICUBIC, box=(left, top, left + cw, top + ch))
    in_ratio = w / h
    if in_ratio < ratio[0]:
        cw, ch = w, int(round(w / ratio[0]))
    elif in_ratio > ratio[1]:
        cw, ch = int(round(h * ratio[1])), h
    else:
        cw, ch = w, h
    left, top = (w - cw) // 2, (h - ch) // 2
    return img.resize((size, size), _BICUBIC, box=(left, top, left + cw, top + ch))


def center_crop_resize(img: Image.Image, size: int, crop_fraction: float = 0.875) -> Image.Image:
    """Evaluation view: the centred square of side ``min(w, h) * crop_fraction`` resized to ``size x size``
    (DeiT's "resize to size/0.875, centre-crop size", done as one resampling)."""
    w, h = img.size
    side = min(w, h) * crop_fraction
    left, top = (w - side) / 2, (h - side) / 2
    return img.resize((size, size), _BICUBIC, box=(left, top, left + side, top + side))


# ---- RandAugment --------------------------------------------------------------------------------
# Each op maps (image, magnitude in [0, 1], random sign) to an image; ranges at magnitude 1 follow
# RandAugment's table (rotate 30 degrees, shear 0.3, translate 45% ... of 10).
def _affine(img: Image.Image, coeffs: tuple) -> Image.Image:
    return img.transform(img.size, Image.Transform.AFFINE, coeffs, Image.Resampling.BILINEAR, fillcolor=_FILL)


def _enhance(cls):
    return lambda img, m, s: cls(img).enhance(1.0 + s * 0.9 * m)


RAND_AUGMENT_OPS = {
    # every op takes (image, magnitude, sign); the ones without a magnitude ignore the last two
    "identity": lambda img, _m, _s: img,
    "autocontrast": lambda img, _m, _s: ImageOps.autocontrast(img),
    "equalize": lambda img, _m, _s: ImageOps.equalize(img),
    "rotate": lambda img, m, s: img.rotate(s * 30.0 * m, Image.Resampling.BILINEAR, fillcolor=_FILL),
    "solarize": lambda img, m, _s: ImageOps.solarize(img, int(round(256 - 256 * m))),
    "posterize": lambda img, m, _s: ImageOps.posterize(img, max(1, 8 - int(round(4 * m)))),
    "color": _enhance(ImageEnhance.Color),
    "contrast": _enhance(ImageEnhance.Contrast),
    "brightness": _enhance(ImageEnhance.Brightness),
    "sharpness": _enhance(ImageEnhance.Sharpness),
    "shear_x": lambda img, m, s: _affine(img, (1, s * 0.3 * m, 0, 0, 1, 0)),
    "shear_y": lambda img, m, s: _affine(img, (1, 0, 0, s * 0.3 * m, 1, 0)),
    "translate_x": lambda img, m, s: _affine(img, (1, 0, s * 0.45 * m * img.size[0], 0, 1, 0)),
    "translate_y": lambda img, m, s: _affine(img, (1, 0, 0, 0, 1, s * 0.45 * m * img.size[1])),
}
_OP_NAMES = tuple(RAND_AUGMENT_OPS)


def rand_augment(img: Image.Image, n: int, m: float, rng: np.random.Generator) -> Image.Image:
    """RandAugment: ``n`` ops drawn uniformly (with replacement) from :data:`RAND_AUGMENT_OPS`, each at
    magnitude ``m`` in [0, 10] with a random sign for the signed ops (``img`` is RGB)."""
    mag = min(max(m, 0.0), 10.0) / 10.0
    for k in rng.integers(0, len(_OP_NAMES), size=n):
        sign = 1.0 if rng.random() < 0.5 else -1.0
        img = RAND_AUGMENT_OPS[_OP_NAMES[int(k)]](img, mag, sign)
    return img


# ---- mixup / cutmix -------------------------------------------------------------------------------
def mix_batch(
    x: torch.Tensor,
    y: torch.Tensor,
    num_classes: int,
    rng: np.random.Generator,
    *,
    mixup_alpha: float = 0.0,
    cutmix_alpha: float = 0.0,
    prob: float = 1.0,
    switch_prob: float = 0.5,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mix a batch with itself reversed: images ``x (B, C, H, W)`` and labels ``y (B,)`` int64 ->
    ``(x', soft targets (B, num_classes) float32)``; each target row sums to 1.

    With probability ``prob`` the batch is mixed: by CutMix (``lam ~ Beta(cutmix_alpha)``, a box of area
    ``1 - lam`` pasted, ``lam`` corrected to the box actually pasted) with probability ``switch_prob`` when
    both alphas are > 0, else by mixup (``x' = lam x + (1 - lam) x_rev``, ``lam ~ Beta(mixup_alpha)``).
    """
    if x.ndim != 4 or y.shape != (x.shape[0],):
        raise ValueError(f"mix_batch needs images (B, C, H, W) and labels (B,), got {tuple(x.shape)}, {tuple(y.shape)}")
    onehot = torch.nn.functional.one_hot(y, num_classes).float()
    use_cut = cutmix_alpha > 0 and (mixup_alpha <= 0 or rng.random() < switch_prob)
    alpha = cutmix_alpha if use_cut else mixup_alpha
    # the draws happen whether or not the batch is mixed, so one batch's choice never shifts another's
    mixed = rng.random() < prob
    lam = float(rng.beta(alpha, alpha)) if alpha > 0 else 1.0
    box = rng.random(2)
    if not mixed or alpha <= 0:
        return x, onehot
    x_rev, t_rev = x.flip(0), onehot.flip(0)
    if use_cut:
        h, w = x.shape[-2:]
        cut = math.sqrt(1.0 - lam)
        ch, cw = int(h * cut), int(w * cut)
        cy, cx = int(box[0] * h), int(box[1] * w)
        y0, y1 = max(cy - ch // 2, 0), min(cy + ch // 2, h)
        x0, x1 = max(cx - cw // 2, 0), min(cx + cw // 2, w)
        x = x.clone()
        x[:, :, y0:y1, x0:x1] = x_rev[:, :, y0:y1, x0:x1]
        lam = 1.0 - (y1 - y0) * (x1 - x0) / (h * w)
    else:
        x = x * lam + x_rev * (1.0 - lam)
    return x, onehot * lam + t_rev * (1.0 - lam)
