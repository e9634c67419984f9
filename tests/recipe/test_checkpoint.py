"""Checkpoint manifests, and what a copy to a worker sends from a Hugging Face cache (the copy itself runs over
real ssh and rsync in tests/cluster/test_cluster.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.checkpoint.checkpoint import (
    differences,
    head_checkpoint_dir,
    layout_of,
    missing_bytes,
    parse_manifest,
    read_manifest,
)
from recipe.net.nodes import LocalNode
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
    assert differences(head, worker) == [
        "b: head 20 bytes, worker 5 bytes",
        "c: head 30 bytes, worker missing",
        "d: head missing, worker 1 bytes",
    ]
    assert missing_bytes(head, worker) == 50


def hf_cache(root: Path) -> tuple[Path, Path]:
    """A cache as huggingface_hub leaves it: snapshot links into blobs/, one blob a xet-style link further out, a
    file written into the snapshot by hand, a link whose blob never arrived, refs/main naming the commit."""
    repo = root / "hub" / "models--org--model"
    snap = repo / "snapshots" / REV
    (snap / "sub").mkdir(parents=True)
    (repo / "blobs").mkdir()
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REV)
    (repo / "refs" / "other").write_text("f" * 40)
    (repo / "blobs" / "aaa").write_bytes(b"config")
    (repo / "blobs" / "bbb").write_bytes(b"weights")
    (root / "xet").mkdir()
    (root / "xet" / "chunk").write_bytes(b"xet-data")
    (repo / "blobs" / "ccc").symlink_to(root / "xet" / "chunk")
    (snap / "config.json").symlink_to("../../blobs/aaa")
    (snap / "sub" / "w.safetensors").symlink_to("../../../blobs/bbb")
    (snap / "x.safetensors").symlink_to("../../blobs/ccc")
    (snap / "gone.safetensors").symlink_to("../../blobs/never-arrived")
    (snap / "README.md").write_text("by hand")
    return repo, snap


def test_hf_snapshot_is_sent_blobs_first_then_its_links(tmp_path: Path) -> None:
    repo, snap = hf_cache(tmp_path)
    layout = layout_of(str(snap))
    assert layout.root == str(repo)
    # First, with links followed: the blobs the snapshot reads (a xet link included) and its plain file.
    assert sorted(layout.blobs) == ["blobs/aaa", "blobs/bbb", "blobs/ccc", f"snapshots/{REV}/README.md"]
    # Then, as links: the snapshot's links into blobs/ and the ref naming this commit (not a broken link).
    assert sorted(layout.links) == [
        "refs/main",
        f"snapshots/{REV}/config.json",
        f"snapshots/{REV}/sub/w.safetensors",
        f"snapshots/{REV}/x.safetensors",
    ]
    assert dict(read_manifest(LocalNode(), str(snap)))["x.safetensors"] == len(b"xet-data")


def test_a_plain_folder_is_sent_whole(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    layout = layout_of(str(tmp_path / "ckpt") + "/")
    assert layout.root == str(tmp_path / "ckpt") and layout.blobs is None


def test_an_unpinned_revision_is_found_through_refs(tmp_path: Path) -> None:
    repo, snap = hf_cache(tmp_path / "hf")
    settings = load_settings(
        tmp_path,
        {"MODEL_ID": "org/model", "MODEL_REVISION": "", "HF_CACHE": str(tmp_path / "hf"), "WORKER": "me@spark2"},
    )
    assert head_checkpoint_dir(settings) == str(snap)


def test_a_copy_that_still_differs_names_the_first_differences(tmp_path: Path) -> None:
    from recipe.checkpoint.checkpoint import CheckpointError, verify_copy

    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "a.safetensors").write_bytes(b"12345")
    want = parse_manifest("a.safetensors\t9\nb.safetensors\t3\n")
    with pytest.raises(CheckpointError) as differs:
        verify_copy(LocalNode(), str(tmp_path / "ckpt"), want)
    assert (
        "a.safetensors: head 9 bytes, worker 5 bytes; b.safetensors: head 3 bytes, worker missing"
        in differs.value.message
    )
