import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "engine"))

# No test may reach the Hugging Face Hub (or anything off this machine): the recipe's download then uses the cache
# only. The download tests lift this for a stand-in Hub on 127.0.0.1 (tests/recipe/hub_server.py).
import os  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")


import pytest  # noqa: E402
from ports import free_port  # noqa: E402

from recipe.settings.schema import load_specs  # noqa: E402


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The CLI run in-process against a private config root, log and cache folders, and free ports (the recipe
    and reliability tests)."""
    config = tmp_path / "config-root"
    (config / "scripts").mkdir(parents=True)
    for name in load_specs():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARKS_CONFIG_ROOT", str(config))
    monkeypatch.setenv("LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setenv("CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_CACHE", str(tmp_path / "hf"))
    monkeypatch.setenv("PORT", str(free_port()))
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    monkeypatch.setenv("HOST", "127.0.0.1")
    return tmp_path
