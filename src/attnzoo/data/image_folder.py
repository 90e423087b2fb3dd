"""Your own images in ImageNet's layout: one sub-folder per class, PNG/JPEG files read through Pillow.

``root/train/<class>/*.png`` + ``root/val/<class>/*.png``, or ``root/<class>/*`` split into train/val by a
fraction with a seed (per class, so both splits keep every class). Classes are the sorted folder names.

Training images are augmented DeiT-style (:mod:`attnzoo.data.augment`); sample ``i`` of step ``s`` draws from
``np.random.default_rng([seed, 1, s, i])`` and the batch's mixup/cutmix from ``[seed, 2, s, first index]``,
so a step's batch is a pure function of ``(seed, step, indices)``: resume, DDP shards and DataLoader workers
(``num_workers``) give identical pixels.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from PIL import Image, UnidentifiedImageError

from attnzoo.data import augment as _aug
from attnzoo.data.datasets import Batch, BatchDataset

__all__ = [
    "ImageFolderDataset",
    "Augment",
    "scan_image_folder",
    "split_image_folder",
    "IMAGE_EXTENSIONS",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
]

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass(frozen=True)
class Augment:
    """Training augmentation options (all off: the evaluation view, centre crop only)."""

    random_resized_crop: bool = True
    crop_scale: tuple[float, float] = (0.08, 1.0)
    hflip: float = 0.5
    randaugment_n: int = 0
    randaugment_m: float = 9.0
    mixup: float = 0.0
    cutmix: float = 0.0
    mix_prob: float = 1.0
    mix_switch_prob: float = 0.5

    @property
    def mixes(self) -> bool:
        return (self.mixup > 0 or self.cutmix > 0) and self.mix_prob > 0


def _class_files(folder: Path) -> list[Path]:
    files = []
    for p in sorted(folder.iterdir()):
        if p.name.startswith("."):  # .DS_Store, editors' swap files: not data
            continue
        if p.is_dir():
            raise ValueError(
                f"{p} is a folder inside class folder {folder}; expected only PNG/JPEG files "
                f"(one level of class folders: root/<class>/<image>)"
            )
        if p.suffix.lower() not in IMAGE_EXTENSIONS:
            raise ValueError(
                f"{p} is not a PNG/JPEG image (extension {p.suffix or 'none'!r}); valid extensions: "
                f"{list(IMAGE_EXTENSIONS)}. Move it out of the class folder"
            )
        files.append(p)
    if not files:
        raise ValueError(f"class folder {folder} holds no PNG/JPEG images; remove it or add images")
    return files


def scan_image_folder(
    root: str | Path, classes: Sequence[str] | None = None
) -> tuple[list[Path], np.ndarray, list[str]]:
    """``(files, labels (N,) int64, class names)`` of ``root/<class>/<image>``; ``classes`` fixes the label
    order (a validation folder must use the training folder's classes)."""
    root = Path(root)
    if not root.is_dir():
        raise ValueError(f"image folder {root} does not exist" + (" (it is a file)" if root.exists() else ""))
    found = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not found:
        raise ValueError(f"image folder {root} has no class sub-folders; expected root/<class>/<image>.png|jpg")
    if classes is None:
        classes = found
    else:
        extra = sorted(set(found) - set(classes))
        if extra:
            raise ValueError(
                f"{root} has class folders the training set lacks: {extra[:10]}; "
                f"training classes: {list(classes)[:10]}{' ...' if len(classes) > 10 else ''}"
            )
    files: list[Path] = []
    labels: list[int] = []
    for k, name in enumerate(classes):
        if name not in found:
            continue  # a validation folder may lack a class
        f = _class_files(root / name)
        files += f
        labels += [k] * len(f)
    return files, np.asarray(labels, np.int64), list(classes)


def split_image_folder(labels: np.ndarray, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-class split: ``round(n_c * val_fraction)`` images of each class (at least 1 when ``n_c >= 2``, never
    all) go to validation, chosen by a permutation seeded by ``(seed, class)``. Returns sorted index arrays."""
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction={val_fraction!r} must lie in (0, 1)")
    tr, va = [], []
    for c in np.unique(labels):
        idx = np.flatnonzero(labels == c)
        n_val = min(max(int(round(len(idx) * val_fraction)), 1 if len(idx) >= 2 else 0), len(idx) - 1)
        perm = np.random.default_rng([seed, int(c)]).permutation(idx)
        va.append(perm[:n_val])
        tr.append(perm[n_val:])
    return np.sort(np.concatenate(tr)), np.sort(np.concatenate(va))


def check_image_headers(files: Sequence[Path]) -> None:
    """Open every file's header (no decoding): an unreadable or non-PNG/JPEG file raises naming it."""
    for f in files:
        _open(f, decode=False)


def _open(path: Path, decode: bool = True) -> Image.Image:
    try:
        img = Image.open(path)
        if img.format not in ("PNG", "JPEG", "MPO"):  # MPO: multi-picture JPEG from cameras
            raise ValueError(f"image file {path} is a {img.format} image; only PNG and JPEG are read")
        if decode:
            img = img.convert("RGB")  # grey, palette, alpha -> 3 channels; also forces the full decode
        return img
    except (UnidentifiedImageError, OSError, SyntaxError) as e:
        raise ValueError(f"unreadable image file {path}: {e}") from e


class ImageFolderDataset(BatchDataset):
    """Image files -> ``images (B, 3, size, size)`` float normalised by ``mean``/``std`` (per channel) and
    ``target``: ``(B,)`` int64, or ``(B, num_classes)`` float32 soft targets when mixup/cutmix is on.

    ``augment=None`` gives the evaluation view (centre crop of ``crop_fraction``, no randomness).
    """

    #: the trainer passes the step to :meth:`get_batch` (augmentation depends on it)
    step_dependent = True

    def __init__(
        self,
        files: Sequence[Path],
        labels: np.ndarray,
        num_classes: int,
        size: int,
        *,
        mean: Sequence[float] = IMAGENET_MEAN,
        std: Sequence[float] = IMAGENET_STD,
        augment: Augment | None = None,
        seed: int = 0,
        crop_fraction: float = 0.875,
        num_workers: int = 0,
    ) -> None:
        self.files = [str(f) for f in files]  # plain strings: cheap to pickle into spawned workers
        self.labels = np.asarray(labels, np.int64)
        if len(self.files) != len(self.labels) or not self.files:
            raise ValueError(
                f"need as many labels as files (>= 1), got {len(self.files)} files, {len(self.labels)} labels"
            )
        self.num_classes, self.size = int(num_classes), int(size)
        self.mean = torch.tensor(mean, dtype=torch.float32).view(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(3, 1, 1)
        self.augment, self.seed, self.crop_fraction = augment, int(seed), float(crop_fraction)
        self.num_workers = int(num_workers)

    def __len__(self) -> int:
        return len(self.files)

    def _threads(self):
        if getattr(self, "_pool", None) is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(self.num_workers, thread_name_prefix="attnzoo-image-folder")
        return self._pool

    def __getstate__(self) -> dict:
        # a thread pool can't travel to a spawned DataLoader worker; it is re-created there if needed
        return {k: v for k, v in self.__dict__.items() if k != "_pool"}

    @property
    def shape(self) -> tuple[int, int, int]:
        return (3, self.size, self.size)

    def load(self, i: int, step: int = 0) -> torch.Tensor:
        """Sample ``i`` as seen at ``step``: ``(3, size, size)`` float32, normalised."""
        img = _open(Path(self.files[i]))
        a = self.augment
        if a is None:
            img = _aug.center_crop_resize(img, self.size, self.crop_fraction)
        else:
            rng = np.random.default_rng([self.seed, 1, int(step), int(i)])
            if a.random_resized_crop:
                img = _aug.random_resized_crop(img, self.size, rng, a.crop_scale)
            else:
                img = _aug.center_crop_resize(img, self.size, self.crop_fraction)
            if rng.random() < a.hflip:
                img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            if a.randaugment_n > 0:
                img = _aug.rand_augment(img, a.randaugment_n, a.randaugment_m, rng)
        x = torch.from_numpy(np.asarray(img, dtype=np.uint8).copy()).permute(2, 0, 1).float().div_(255.0)
        return (x - self.mean) / self.std

    def get_batch(self, idx, step: int = 0) -> Batch:
        """``((images (B, 3, size, size),), target)`` for sample indices ``idx`` at training step ``step``."""
        idx = self._check_idx(idx)
        if self.augment is None and self.num_workers > 0 and len(idx) > 1:
            # evaluation batches don't go through the trainer's DataLoader: decode them on threads (Pillow
            # releases the GIL while decoding and resampling); each image is a pure function of its index
            imgs = list(self._threads().map(self.load, idx.tolist()))
        else:
            imgs = [self.load(int(i), step) for i in idx]
        x = torch.stack(imgs) if imgs else torch.empty(0, *self.shape)
        y = torch.from_numpy(self.labels[idx])
        a = self.augment
        if a is not None and a.mixes:
            # seeded by the batch's first index too, so DDP shards of one step mix differently
            rng = np.random.default_rng([self.seed, 2, int(step), int(idx[0]) if len(idx) else 0])
            xm, ym = _aug.mix_batch(
                x,
                y,
                self.num_classes,
                rng,
                mixup_alpha=a.mixup,
                cutmix_alpha=a.cutmix,
                prob=a.mix_prob,
                switch_prob=a.mix_switch_prob,
            )
            return (xm,), ym
        return (x,), y


def _check_range(name: str, value: float, lo: float, hi: float, lo_open: bool = False, hi_open: bool = False) -> None:
    bad = value < lo or value > hi or (lo_open and value == lo) or (hi_open and value == hi)
    if bad:
        interval = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise ValueError(f"task 'image_folder': option {name}={value!r} must lie in {interval}")


def _check_stats(
    name: str, value: Sequence[float] | None, default: tuple[float, ...], positive: bool
) -> tuple[float, ...]:
    if value is None:
        return default
    ok = len(value) == 3 and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value)
    if not ok or (positive and min(value) <= 0):
        raise ValueError(
            f"task 'image_folder': option {name}={value!r} must be a list of 3 numbers (R, G, B)"
            + (", all > 0" if positive else "")
        )
    return tuple(float(v) for v in value)


def _scan_splits(
    root: str, val_fraction: float | None, seed: int
) -> tuple[list[Path], np.ndarray, list[Path], np.ndarray, list[str]]:
    """Train and validation ``(files, labels)`` and the class names: from ``root/train`` and ``root/val`` when both
    exist, else a seeded per-class split of the class folders under ``root``."""
    base = Path(root).expanduser()
    if not base.is_dir():
        raise ValueError(
            f"task 'image_folder': root={root!r} is not a folder"
            + (" (it is a file)" if base.exists() else " (it does not exist)")
        )
    has_split = (base / "train").is_dir() and (base / "val").is_dir()
    if has_split:
        if val_fraction is not None:
            raise ValueError(
                f"task 'image_folder': {base} has train/ and val/ folders, so "
                f"val_fraction={val_fraction!r} has no use; leave it unset (null), or point root at a "
                "folder of class folders"
            )
        files, labels, classes = scan_image_folder(base / "train")
        vfiles, vlabels, _ = scan_image_folder(base / "val", classes)
        if not vfiles:
            raise ValueError(f"validation folder {base / 'val'} holds no images")
    else:
        if (base / "train").is_dir() or (base / "val").is_dir():
            missing = "val" if (base / "train").is_dir() else "train"
            raise ValueError(
                f"task 'image_folder': {base} has a {'train' if missing == 'val' else 'val'}/ folder but "
                f"no {missing}/ folder; give both, or class folders directly under root with val_fraction"
            )
        all_files, all_labels, classes = scan_image_folder(base)
        tr, va = split_image_folder(all_labels, 0.1 if val_fraction is None else val_fraction, seed)
        if len(va) == 0:
            raise ValueError(
                f"task 'image_folder': {base} has too few images per class for a validation split "
                f"(need >= 2 in some class)"
            )
        files, labels = [all_files[i] for i in tr], all_labels[tr]
        vfiles, vlabels = [all_files[i] for i in va], all_labels[va]
    return files, labels, vfiles, vlabels, classes


def build_image_folder(
    *,
    root: str,
    img_size: int,
    val_fraction: float | None,
    seed: int,
    random_resized_crop: bool,
    crop_scale_min: float,
    hflip: float,
    randaugment_n: int,
    randaugment_m: float,
    mixup: float,
    cutmix: float,
    mix_prob: float,
    mix_switch_prob: float,
    mean: Sequence[float] | None,
    std: Sequence[float] | None,
    crop_fraction: float,
    num_workers: int,
    verify: bool,
) -> tuple[ImageFolderDataset, ImageFolderDataset, dict]:
    """The ``image_folder`` task's ``(train, val, info)``; every option is checked before any file is read."""
    _check_range("crop_scale_min", crop_scale_min, 0.0, 1.0, lo_open=True)
    _check_range("crop_fraction", crop_fraction, 0.0, 1.0, lo_open=True)
    for k, v in (("hflip", hflip), ("mix_prob", mix_prob), ("mix_switch_prob", mix_switch_prob)):
        _check_range(k, v, 0.0, 1.0)
    _check_range("randaugment_m", randaugment_m, 0.0, 10.0)
    for k, v in (("mixup", mixup), ("cutmix", cutmix), ("randaugment_n", randaugment_n), ("num_workers", num_workers)):
        if v < 0:
            raise ValueError(f"task 'image_folder': option {k}={v!r} must be >= 0 (0 disables it)")
    mean_t = _check_stats("mean", mean, IMAGENET_MEAN, positive=False)
    std_t = _check_stats("std", std, IMAGENET_STD, positive=True)
    files, labels, vfiles, vlabels, classes = _scan_splits(root, val_fraction, seed)
    if verify:
        check_image_headers([*files, *vfiles])
    aug = Augment(
        random_resized_crop=random_resized_crop,
        crop_scale=(crop_scale_min, 1.0),
        hflip=hflip,
        randaugment_n=randaugment_n,
        randaugment_m=randaugment_m,
        mixup=mixup,
        cutmix=cutmix,
        mix_prob=mix_prob,
        mix_switch_prob=mix_switch_prob,
    )
    common = dict(mean=mean_t, std=std_t, seed=seed, crop_fraction=crop_fraction, num_workers=num_workers)
    train = ImageFolderDataset(files, labels, len(classes), img_size, augment=aug, **common)
    val = ImageFolderDataset(vfiles, vlabels, len(classes), img_size, augment=None, **common)
    info = dict(
        num_classes=len(classes),
        in_chans=3,
        img_size=img_size,
        mean=list(mean_t),
        std=list(std_t),
        classes=classes,
        n_train=len(files),
        n_val=len(vfiles),
    )
    return train, val, info
