"""Reading .env and scripts/local.sh as data, and which source wins."""

from __future__ import annotations

from pathlib import Path

import pytest

from recipe.errors import SettingError
from recipe.settings import load_settings
from recipe.settings.sources import parse_file


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_value_forms(tmp_path: Path) -> None:
    path = write(
        tmp_path / "local.sh",
        "\n".join(
            [
                "# a comment",
                "",
                "PORT=9000",
                "export HOST=127.0.0.1",
                'SERVED_NAME="my-model"  # trailing comment',
                "API_KEY='a$b\"c'",
                "WORKER=me@spark2 # the second Spark",
                'HF_CACHE="/data/hf \\"x\\""',
            ]
        ),
    )
    found = {a.key: (a.value, a.origin) for a in parse_file(path, "scripts/local.sh")}
    assert found["PORT"] == ("9000", "scripts/local.sh line 3")
    assert found["HOST"][0] == "127.0.0.1"
    assert found["SERVED_NAME"][0] == "my-model"
    assert found["API_KEY"][0] == 'a$b"c'
    assert found["WORKER"][0] == "me@spark2"
    assert found["HF_CACHE"][0] == '/data/hf "x"'


@pytest.mark.parametrize(
    "line, words",
    [
        ("source ~/other.sh", "not a KEY=value line"),
        ("if true; then PORT=1; fi", "not a KEY=value line"),
        ("PORT=$(echo 9000)", "shell syntax"),
        ("SERVED_NAME=two words", "unquoted space"),
        ('SERVED_NAME="open', "no closing"),
        ("SERVED_NAME='x' y", "after the closing quote"),
        ("9PORT=1", "not a KEY=value line"),
    ],
)
def test_malformed_line_names_file_and_line(tmp_path: Path, line: str, words: str) -> None:
    path = write(tmp_path / "local.sh", f"PORT=9000\n# fine\n{line}\n")
    with pytest.raises(SettingError) as caught:
        parse_file(path, "scripts/local.sh")
    assert "scripts/local.sh line 3" in caught.value.message
    assert words in caught.value.message


def test_precedence_defaults_env_file_local_sh_environment(root: Path) -> None:
    write(root / ".env", "PORT=7001\nPARALLEL=2\nLOG_KEEP=3\n")
    write(root / "scripts" / "local.sh", "PORT=7002\nexport PARALLEL=3\n")
    settings = load_settings(root, {"PORT": "7003"})
    assert settings.port == 7003 and settings.origins["PORT"] == "environment"
    assert settings.parallel == 3 and settings.origins["PARALLEL"] == "scripts/local.sh line 2"
    assert settings.log_keep == 3 and settings.origins["LOG_KEEP"] == ".env line 3"
    assert settings.stop_timeout == 30 and settings.origins["STOP_TIMEOUT"] == "default"


def test_env_file_is_never_executed(root: Path) -> None:
    marker = root / "ran"
    write(root / ".env", f"SERVED_NAME=x\ntouch {marker}\n")
    with pytest.raises(SettingError, match=r"\.env line 2"):
        load_settings(root, {})
    assert not marker.exists()


def test_empty_value_restores_the_default(root: Path) -> None:
    write(root / "scripts" / "local.sh", "WORKER=me@spark2\n")
    assert load_settings(root, {"WORKER": ""}).worker == ""
    assert load_settings(root, {"MODEL_REVISION": ""}).model_revision == ""  # empty means: no pin


def test_unknown_key_close_to_a_setting_warns(root: Path) -> None:
    write(root / "scripts" / "local.sh", "PROT=9000\nHF_HOME=/x\n")
    settings = load_settings(root, {})
    assert settings.port == 8888
    assert settings.warnings == ("scripts/local.sh line 1: PROT is not a setting (did you mean PORT?); ignored",)


def test_derived_defaults_follow_other_settings(root: Path) -> None:
    assert load_settings(root, {}).parallel == 4
    assert load_settings(root, {}).context == 8192  # embedded default: local processes
    sparks = load_settings(root, {"WORKER": "me@spark2", "KV": "fp8"})
    assert (sparks.context, sparks.max_tokens, sparks.effective_runtime) == (1048576, 32768, "docker")


def test_secrets_stay_out_of_repr(root: Path) -> None:
    settings = load_settings(root, {"API_KEY": "sk-abcdef123", "HF_TOKEN": "hf_secret_value"})
    assert "sk-abcdef123" not in repr(settings) and "hf_secret_value" not in repr(settings)
    assert settings.shown("API_KEY") == "(set, hidden)"


def test_variable_references_are_refused_except_in_paths_and_single_quotes(root: Path) -> None:
    """Regression: `API_KEY="$MY_KEY"` used to become the literal key $MY_KEY without a word."""
    write(root / "scripts" / "local.sh", 'export API_KEY="$MY_KEY"\n')
    with pytest.raises(SettingError, match=r"scripts/local.sh line 1: API_KEY refers to a variable") as error:
        load_settings(root, {"MY_KEY": "secret-value"})
    assert "secret-value" not in str(error.value)
    write(root / "scripts" / "local.sh", "API_KEY='pa$$word'\nLOG_DIR=$HOME/sparks-logs\n")
    settings = load_settings(root, {"HOME": "/home/me"})
    assert settings.api_key == "pa$$word"
    assert settings.log_dir.endswith("/sparks-logs") and "$" not in settings.log_dir


def test_path_settings_expand_from_the_environment_they_are_read_with(root: Path) -> None:
    """$HOME, ${VAR} and ~ in a path come from the environment given to load_settings, not this process's."""
    write(root / ".env", "LOG_DIR=$HOME/sparks-logs\nCACHE_DIR=${SPARKS_DATA}/cache\nHF_CACHE=~/hf\n")
    settings = load_settings(root, {"HOME": "/home/someone-else", "SPARKS_DATA": "/data"})
    assert (settings.log_dir, settings.cache_dir, settings.hf_cache) == (
        "/home/someone-else/sparks-logs",
        "/data/cache",
        "/home/someone-else/hf",
    )
