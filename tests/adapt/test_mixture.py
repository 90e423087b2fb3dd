"""The adaptation mixture (``attnzoo adapt --data plays:1,imdb:1,./my.txt:0.5``): spec errors, held-out splits,
the weighted sampler."""

import pytest
import torch

from attnzoo.adapt.mixture import (
    CORPORA,
    Corpus,
    MixtureSampler,
    load_corpus_split,
    mixture_batches,
    parse_mixture,
    split_text,
)


def _char_tokenize(text: str, n: int) -> torch.Tensor:
    return torch.tensor([ord(c) for c in text[:n]], dtype=torch.long)


@pytest.fixture
def user_file(tmp_path):
    """900 characters of ``a``, then the held-out 10%: a space and 99 ``z``."""
    path = tmp_path / "my notes.txt"
    path.write_text("a" * 900 + " " + "z" * 99)
    return path


def test_spec_names_corpora_files_and_weights(user_file):
    got = parse_mixture(f"plays:1,imdb:2.5,{user_file}:0.5,pydocs")
    assert got == [
        Corpus("plays", 1.0),
        Corpus("imdb", 2.5),
        Corpus("my_notes", 0.5, user_file),
        Corpus("pydocs", 1.0),
    ]
    assert parse_mixture("shakespeare") == [Corpus("plays", 1.0)]  # the earlier name of the plays


@pytest.mark.parametrize(
    "spec, message",
    [
        ("plays:1,wiki:1", "'wiki' is neither a corpus nor an existing file"),
        ("plays,./no/such.txt:1", "'./no/such.txt' is neither a corpus nor an existing file"),
        ("plays:-1", "weight -1.0 must be a finite number > 0"),
        ("plays:0", "weight 0.0 must be a finite number > 0"),
        ("imdb:nan", "weight nan must be a finite number > 0"),
        ("imdb:heavy", "weight 'heavy' is not a number"),
        ("plays,,imdb", "has an empty item"),
        ("plays:1,shakespeare:2", "names the corpus 'plays' twice"),
        ("", "--data is empty"),
    ],
)
def test_bad_specs_name_the_value_and_what_is_valid(spec, message):
    with pytest.raises(ValueError) as e:
        parse_mixture(spec)
    assert message in str(e.value)
    assert "plays" in str(e.value) or "twice" in str(e.value)  # what is valid, or which name repeats


def test_a_user_file_named_like_a_corpus_gets_its_own_name_and_errors_name_the_flag(tmp_path):
    (tmp_path / "imdb.txt").write_text("x " * 100)
    assert parse_mixture(f"imdb,{tmp_path / 'imdb.txt'}:2") == [
        Corpus("imdb", 1.0),
        Corpus("imdb_file", 2.0, tmp_path / "imdb.txt"),
    ]
    with pytest.raises(ValueError, match="--also-eval item 'wiki': 'wiki' is neither a corpus"):
        parse_mixture("plays,wiki", "--also-eval")


def test_an_empty_user_file_is_an_error(tmp_path):
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match=r"empty.txt:2'?: the file .*empty.txt is empty"):
        parse_mixture(f"{tmp_path / 'empty.txt'}:2")


def test_user_file_holds_out_its_last_tenth_at_a_word_boundary(user_file):
    train, held = load_corpus_split(parse_mixture(str(user_file))[0])
    assert train == "a" * 900 and held == " " + "z" * 99
    text = "".join(f"word{i} " for i in range(20))  # 130 characters
    train, held = split_text(text)
    assert train + held == text and held == " word19 "  # the mark (117) falls inside word18: cut after it
    with pytest.raises(ValueError, match="a text of 99 characters is too short to hold out its last 10%: give at"):
        split_text("x" * 99)


@pytest.mark.parametrize("name", sorted(CORPORA))
def test_named_corpora_hold_out_text_the_training_part_lacks(name):
    train, held = load_corpus_split(Corpus(name, 1.0))
    assert len(train) > 2 * len(held) > 0
    # a piece from the middle of the held-out part (whole documents are held out) never occurs in the training text
    piece = held[len(held) // 2 : len(held) // 2 + 200]
    assert piece.strip() and piece not in train


def test_sampler_honours_the_weights_and_draws_rows_from_their_corpus():
    streams = [torch.arange(0, 100), torch.arange(1000, 1100), torch.arange(2000, 2100)]
    sampler = MixtureSampler(streams, [1.0, 1.0, 0.5], block=8, batch=4, seed=3)
    counts = torch.zeros(3)
    for step in range(1, 1501):
        batch = sampler(step)
        which = sampler.choices(step)
        assert torch.equal(batch["input_ids"] // 1000, which[:, None].expand(-1, 8))  # each row from its corpus
        assert torch.equal(batch["input_ids"], batch["labels"])
        counts += torch.bincount(which, minlength=3)
    share = counts / counts.sum()
    assert share.tolist() == pytest.approx([0.4, 0.4, 0.2], abs=0.03)  # 6,000 rows: sd of a share <= 0.0064
    # a pure function of (seed, step): drawn again, or by a fresh sampler, the same batch
    assert torch.equal(sampler(7)["input_ids"], MixtureSampler(streams, [1, 1, 0.5], 8, 4, 3)(7)["input_ids"])
    assert not torch.equal(sampler(7)["input_ids"], MixtureSampler(streams, [1, 1, 0.5], 8, 4, 4)(7)["input_ids"])


def test_held_out_text_is_never_sampled(user_file):
    sampler, held = mixture_batches(_char_tokenize, parse_mixture(f"{user_file}:1"), 2000, 16, 8, seed=0)
    assert held == {"my_notes": " " + "z" * 99}
    seen = torch.cat([sampler(step)["input_ids"].flatten() for step in range(1, 400)])
    assert set(seen.unique().tolist()) == {ord("a")}  # every window of the training part, none of the held-out z


def test_a_corpus_shorter_than_a_block_is_an_error():
    with pytest.raises(ValueError, match="corpus 1's training text has 5 tokens, fewer than one block of 8"):
        MixtureSampler([torch.arange(100), torch.arange(5)], [1, 1], block=8, batch=2, seed=0)
