"""Text corpora: Shakespeare split by play, IMDB CSV, user directories, the character vocabulary."""

import numpy as np
import pytest

from attnzoo.data.text import SHAKESPEARE_VAL_WORKS, CharVocab, load_imdb, load_shakespeare, load_text_dir


def test_shakespeare_split_by_play():
    train, val = load_shakespeare()
    assert sorted(val) == sorted(SHAKESPEARE_VAL_WORKS)
    assert not set(train) & set(val)
    assert len(train) >= 30 and "macbeth" in train
    assert "To be, or not to be" in val["hamlet"]


def test_user_text_directory(tmp_path):
    (tmp_path / "a.txt").write_text("hello\r\nworld")
    (tmp_path / "b.txt").write_bytes("caf\xe9".encode("latin-1"))
    docs = load_text_dir(tmp_path)
    assert docs == {"a": "hello\nworld", "b": "caf\xe9"}
    train, val = load_shakespeare(tmp_path)
    assert list(train) == ["a"] and list(val) == ["b"]
    (tmp_path / "b.txt").unlink()
    with pytest.raises(ValueError, match="at least two documents"):
        load_shakespeare(tmp_path)


def test_char_vocab_round_trip():
    v = CharVocab("hello world")
    ids = v.encode("low")
    assert ids.dtype == np.int64 and v.decode(ids) == "low"
    assert CharVocab.from_json(v.to_json()).chars == v.chars
    with pytest.raises(ValueError, match="not in the vocabulary"):
        v.encode("z")


def test_imdb_csv_installed():
    texts, labels = load_imdb()
    assert len(texts) == 25000 and labels.shape == (25000,)
    assert np.bincount(labels).tolist() == [12500, 12500]


def test_user_csv(tmp_path):
    (tmp_path / "r.csv").write_text('text,label\n"good, film",1\nbad,0\n')
    texts, labels = load_imdb(tmp_path / "r.csv", source=None)
    assert texts == ["good, film", "bad"] and labels.tolist() == [1, 0]
    (tmp_path / "s.csv").write_text("review,y\nx,1\n")
    with pytest.raises(ValueError, match="'text' and 'label' columns"):
        load_imdb(tmp_path / "s.csv")
