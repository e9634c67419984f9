"""Checkpoint manifests and the pinned download's offline path (no network: a complete snapshot already cached)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.checkpoint import CheckpointError, differences, download, missing_bytes, parse_manifest, read_manifest
from recipe.nodes import LocalNode
from recipe.settings import load_settings

REV = "078455ffe6472f9a52fbc1139f58b9db2881b25c"


def test_manifest_is_byte_ordered_whatever_the_locale_and_follows_links(tmp_path: Path) -> None:
    folder = tmp_path / "ckpt"
    (folder / "sub").mkdir(parents=True)
    for name, data in {"b.bin": b"12", "B.bin": b"1", "a_b": b"", "sub/é.txt": b"xyz"}.items():
        (folder / name).write_bytes(data)
    (tmp_path / "blob").write_bytes(b"12345")
    (folder / "linked").symlink_to(tmp_path / "blob")
    manifest = read_manifest(LocalNode(), str(folder))
    assert [p for p, _ in manifest] == ["B.bin", "a_b", "b.bin", "linked", "sub/é.txt"]
    assert dict(manifest)["linked"] == 5
    assert read_manifest(LocalNode(), str(tmp_path / "absent")) == ()


def test_differences_and_missing_bytes() -> None:
    head = parse_manifest("a\t10\nb\t20\nc\t30\n")
    worker = parse_manifest("a\t10\nb\t5\nd\t1\n")
    assert differences(head, worker) == ["b: head 20 bytes, worker 5 bytes", "c: head 30 bytes, worker missing",
                                         "d: head missing, worker 1 bytes"]
    assert missing_bytes(head, worker) == 50


def _settings(tmp_path: Path, revision: str):
    return load_settings(tmp_path, {"MODEL_ID": "org/model", "MODEL_REVISION": revision,
                                    "HF_CACHE": str(tmp_path / "hf")})


def test_offline_download_uses_a_complete_cached_snapshot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "hf" / "hub" / "models--org--model"
    (repo / "snapshots" / REV).mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    (repo / "snapshots" / REV / "config.json").write_text("{}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert download(_settings(tmp_path, REV), offline=True) == str(repo / "snapshots" / REV)
    with pytest.raises(CheckpointError, match="not complete"):
        download(_settings(tmp_path, "1" * 40), offline=True)
