"""One CheckpointError for pretrained weights and training checkpoints (it used to be two classes)."""

import pytest

from attnzoo.models import CheckpointError
from attnzoo.train import checkpoint as train_checkpoint


def test_one_checkpoint_error_class_caught_as_before(tmp_path):
    assert train_checkpoint.CheckpointError is CheckpointError
    assert issubclass(CheckpointError, ValueError) and issubclass(CheckpointError, RuntimeError)
    root = tmp_path / "checkpoints"
    root.mkdir()
    (root / "latest").write_text("../elsewhere")  # a name outside the run: refused
    with pytest.raises(CheckpointError, match="latest"):
        train_checkpoint.latest_checkpoint(root)
