"""The pinned download onto the head: the real huggingface_hub client against a stand-in Hub on 127.0.0.1
(tests/recipe/hub_server.py; tests may not reach huggingface.co), and the offline paths with no Hub at all."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest
from hub_server import FakeHub

from recipe.checkpoint import download
from recipe.checkpoint.checkpoint import CheckpointError
from recipe.settings import load_settings

REV = "078455ffe6472f9a52fbc1139f58b9db2881b25c"
MB = 1_000_000


def repo_files() -> dict[str, bytes]:
    index = {"weight_map": {"a": "model-00001.safetensors", "b": "model-00002.safetensors"}}
    return {
        "config.json": b'{"model_type": "glm5_next"}',
        "model.safetensors.index.json": json.dumps(index).encode(),
        "model-00001.safetensors": os.urandom(3 * MB),
        "model-00002.safetensors": os.urandom(2 * MB),
    }


def settings_for(tmp: Path, revision: str = REV):
    return load_settings(
        tmp,
        {
            "MODEL_ID": "org/model",
            "MODEL_REVISION": revision,
            "HF_CACHE": str(tmp / "hf"),
            "TP": "2",
            "WORKER": "me@spark2",
        },
    )


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch):
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # tests/conftest.py sets it for every other test
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    with FakeHub("org/model", REV, repo_files()) as server:
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def gets(hub: FakeHub) -> list[str]:
    return sorted(r.rsplit("/", 1)[1] for r in hub.requests if r.startswith("GET /org/model/resolve/"))


def test_download_fetches_only_missing_files_with_progress(tmp_path: Path, hub: FakeHub) -> None:
    settings = settings_for(tmp_path)
    need = download.needed(settings)
    assert (need.commit, need.files, need.missing_files) == (REV, 4, 4)
    assert need.missing_bytes == sum(len(d) for d in hub.files.values())
    seen: list[tuple[int, int]] = []
    fetched = download.fetch(settings, lambda done, total: seen.append((done, total)))
    folder = Path(fetched.folder)
    assert folder == tmp_path / "hf" / "hub" / "models--org--model" / "snapshots" / REV
    for name, data in hub.files.items():
        assert (folder / name).read_bytes() == data
    assert seen and seen[-1] == (need.missing_bytes, need.missing_bytes)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)

    # A blob lost from the cache: only it counts toward the disk check, and only it is fetched again.
    hub.requests.clear()
    os.unlink((folder / "model-00002.safetensors").resolve())
    need = download.needed(settings)
    assert (need.missing_files, need.missing_bytes) == (1, 2 * MB)
    assert "fetched 1 of 4 files" in download.fetch(settings).note
    assert gets(hub) == ["model-00002.safetensors"]
    assert download.fetch(settings).note.endswith("all 4 files already here")


def test_disk_check_counts_the_missing_files_before_fetching_any(tmp_path: Path, hub: FakeHub) -> None:
    free = shutil.disk_usage(tmp_path).free
    hub.advertised_size["model-00001.safetensors"] = free + 10**12  # more than this disk holds
    with pytest.raises(CheckpointError) as refused:
        download.fetch(settings_for(tmp_path))
    assert "GiB free under" in refused.value.message and "HF_CACHE" in refused.value.fix
    assert gets(hub) == []


def test_an_interrupted_download_resumes_where_it_stopped(tmp_path: Path, hub: FakeHub) -> None:
    hub.cut_after = 1 * MB  # the first transfer of a shard is cut after 1 MB
    fetched = download.fetch(settings_for(tmp_path))
    assert (Path(fetched.folder) / "model-00001.safetensors").read_bytes() == hub.files["model-00001.safetensors"]
    assert hub.bytes_sent < sum(len(d) for d in hub.files.values()) + 1.5 * MB  # the cut shard was not re-sent


def test_unknown_revision_names_the_setting(tmp_path: Path, hub: FakeHub) -> None:
    with pytest.raises(CheckpointError) as refused:
        download.fetch(settings_for(tmp_path, "1" * 40))
    assert "1111111" in refused.value.message and "MODEL_REVISION" in refused.value.fix


def test_offline_a_complete_cached_snapshot_is_used_as_it_is(
    tmp_path: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = settings_for(tmp_path)
    folder = Path(download.fetch(settings).folder)
    hub.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    fetched = download.fetch(settings)
    assert fetched.folder == str(folder) and "HF_HUB_OFFLINE" in fetched.note and hub.requests == []

    # The Hub does not answer (nothing listens where HF_ENDPOINT points): the cache is used, and it says why.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed.getsockname()[1]}")
    fetched = download.fetch(settings)
    assert fetched.folder == str(folder) and "did not answer" in fetched.note and "complete" in fetched.note

    # An incomplete snapshot is refused offline, naming the shard it lacks.
    os.unlink(folder / "model-00002.safetensors")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError, match="incomplete .missing model-00002.safetensors"):
        download.fetch(settings)


def test_offline_without_a_cached_snapshot_says_what_to_do(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(CheckpointError) as refused:
        download.fetch(settings_for(tmp_path))
    assert "is not in" in refused.value.message and "network access" in refused.value.fix


def test_sparks_download_prints_progress_then_what_it_did(tmp_path: Path, hub: FakeHub) -> None:
    from recipe.settings.schema import load_specs

    sparks = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "sparks"
    env = {k: v for k, v in os.environ.items() if k not in load_specs() and not k.startswith("SPARKS_")}
    env.update(
        {
            "SPARKS_CONFIG_ROOT": str(tmp_path),
            "MODEL_ID": "org/model",
            "MODEL_REVISION": REV,
            "HF_CACHE": str(tmp_path / "hf"),
            "TP": "2",
            "WORKER": "me@spark2",
            "COLUMNS": "200",
        }
    )
    done = subprocess.run([str(sparks), "download"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    total = sum(len(d) for d in hub.files.values()) / 2**30
    assert f"downloaded {total:.2f} of {total:.2f} GiB (100%)" in done.stdout
    assert "org/model @ 078455ff: fetched 4 of 4 files" in done.stdout
    again = subprocess.run([str(sparks), "download"], env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "all 4 files already here" in again.stdout and "downloaded" not in again.stdout


@pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root and setpriv to download as another user"
)
def test_a_cache_owned_by_root_is_named_with_the_chown_fix(tmp_path: Path, hub: FakeHub) -> None:
    base = Path(tempfile.mkdtemp(prefix="sparks-hf-"))  # readable by nobody, writable only by root
    try:
        base.chmod(0o755)
        (base / "hf" / "hub").mkdir(parents=True)
        env = {
            **os.environ,
            "MODEL_ID": "org/model",
            "MODEL_REVISION": REV,
            "HF_CACHE": str(base / "hf"),
            "TP": "2",
            "WORKER": "me@spark2",
            "SPARKS_CONFIG_ROOT": str(base),
            "COLUMNS": "200",
            "HOME": str(base),
        }
        sparks = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "sparks"
        done = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", str(sparks), "download"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 1
        text = " ".join((done.stdout + done.stderr).split())
        assert "cannot write" in text and f"sudo chown -R $USER {base / 'hf'}" in text, text
    finally:
        shutil.rmtree(base)
