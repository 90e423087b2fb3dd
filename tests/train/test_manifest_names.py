"""A checkpoint's manifest may name only files of the checkpoint directory itself: a name that leads elsewhere
(``../x``, an absolute path, a subfolder, ``.``/``..``/empty) is a corrupt manifest, even when the file it leads
to exists and matches the listed size and SHA-256 (verification would otherwise vouch for a file outside)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest

from attnzoo.train.checkpoint import MANIFEST_NAME, CheckpointError, verify_checkpoint


def _entry(file: Path) -> dict:
    data = file.read_bytes()
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _checkpoint(tmp_path: Path) -> Path:
    ck = tmp_path / "checkpoints" / "step_00000001"
    ck.mkdir(parents=True)
    (ck / "model.safetensors").write_bytes(b"weights")
    return ck


def _write_manifest(ck: Path, files: dict) -> None:
    (ck / MANIFEST_NAME).write_text(json.dumps({"format": 1, "algorithm": "sha256", "files": files}))


def test_a_manifest_of_plain_names_verifies(tmp_path):
    ck = _checkpoint(tmp_path)
    _write_manifest(ck, {"model.safetensors": _entry(ck / "model.safetensors")})
    assert verify_checkpoint(ck) is True


@pytest.mark.parametrize("where", ["parent", "absolute", "subfolder", "backslash", "dot", "dotdot", "empty"])
def test_a_manifest_naming_a_file_outside_the_checkpoint_is_corrupt(tmp_path, where):
    ck = _checkpoint(tmp_path)
    outside = tmp_path / "checkpoints" / "elsewhere.bin"
    outside.write_bytes(b"not part of the checkpoint")
    (ck / "sub").mkdir()
    (ck / "sub" / "inner.bin").write_bytes(b"inner")
    (ck / "a\\b").write_bytes(b"a backslash is an ordinary character on POSIX")
    name, target = {
        "parent": ("../elsewhere.bin", outside),
        "absolute": (str(outside), outside),
        "subfolder": ("sub/inner.bin", ck / "sub" / "inner.bin"),
        "backslash": ("a\\b", ck / "a\\b"),
        "dot": (".", ck / "model.safetensors"),
        "dotdot": ("..", ck / "model.safetensors"),
        "empty": ("", ck / "model.safetensors"),
    }[where]
    assert target.is_file()  # the name resolves to a real file with the listed size and digest
    _write_manifest(ck, {"model.safetensors": _entry(ck / "model.safetensors"), name: _entry(target)})
    with pytest.raises(CheckpointError, match=re.escape(f"corrupt manifest (file name {name!r})")):
        verify_checkpoint(ck)
