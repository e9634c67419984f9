"""What a start or restart checks on this machine before it stops anything, so that a well-formed but wrong value
fails while the running server still serves: the folders it writes, HOST, the ports, the checkpoint, the window.

Each check raises one `RecipeError` naming the setting, its value and what to write. The window is the engine's
own arithmetic (`python -m engine fit`, no weight loaded), asked through the local ranks' interpreter; it is asked
only when every rank runs here as a process (RUNTIME=docker and workers: the engine refuses at load, and the start
refits to the window it names).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
from pathlib import Path

from recipe.errors import RecipeError, SettingError
from recipe.launch.control import Status
from recipe.launch.launch import scrubbed_environ
from recipe.net.ports import port_is_free
from recipe.plan.plan import Plan
from recipe.reporter import Reporter
from recipe.settings import Settings
from recipe.settings.schema import load_specs

GIB = 2**30
FIT_TIMEOUT_S = 120


def check_settings_here(settings: Settings, plan: Plan, current: Status) -> None:
    """The folders, HOST and the ports: before the checkpoint step (LOG_DIR first: with a LOG_DIR that cannot be
    read, the running server's record is not found and its port would look like another program's)."""
    check_folder("LOG_DIR", settings.log_dir)
    if plan.runtime == "docker" or not settings.checkpoint:  # the demo checkpoint, the kernel caches
        check_folder("CACHE_DIR", settings.cache_dir)
    check_host(settings.host)
    check_ports(plan, current)


def check_folder(name: str, path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as error:
        raise SettingError(
            f"{name}={path} cannot be written ({error.strerror})",
            f"write {name}=<a folder this user can write>, or remove {name} for its default; nothing was stopped",
        ) from None


def check_host(host: str) -> None:
    """HOST must be an address of this machine (rank 0 listens there; with Docker too: host network)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, 0))
        except OSError as error:
            raise SettingError(
                f"HOST={host} is not an address of this machine ({error.strerror})",
                "write HOST=0.0.0.0 (every interface), HOST=127.0.0.1 (this machine only) or one of "
                "this machine's addresses (ip -brief addr); nothing was stopped",
            ) from None


def ports_of_run(plan: Plan, current: Status) -> set[int]:
    """Ports the recorded run, about to be stopped, may hold: those it recorded, while its rank 0 has not exited.
    (A record written before ports were recorded holds none: its ports are taken to be this plan's.)"""
    if current.state is None or current.alive.get(0) is False:
        return set()
    return set(current.state.ports or (p for rank in plan.ranks for p in rank.ports))


def check_ports(plan: Plan, current: Status) -> None:
    ours = ports_of_run(plan, current)
    for rank in plan.ranks:
        for port, name in zip(rank.ports, ("PORT", "MASTER_PORT")):
            if port not in ours and not port_is_free(port):
                raise RecipeError(
                    f"port {port} ({name}) is already in use on this machine by another program",
                    "stop that program (ss -ltnp names it; a server of ours started with another "
                    f"LOG_DIR stops with LOG_DIR=<that folder> ./stop.sh), or write {name}=<a free "
                    "port>; nothing was stopped",
                )


def check_checkpoint(settings: Settings, plan: Plan) -> None:
    """The folder the ranks load holds what loading reads: config.json that parses, tokenizer.json, every shard."""
    folder = plan.host_checkpoint
    if not folder:
        return
    missing = missing_parts(Path(folder))
    if missing:
        raise RecipeError(f"{_named(settings, folder)} is not a complete checkpoint: {missing}", _fix(settings, folder))


def missing_parts(folder: Path) -> str:
    """What a checkpoint folder lacks, in words ("" when nothing)."""
    if not folder.is_dir():
        return "no such folder"
    try:
        json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        return "config.json is missing"
    except (OSError, ValueError) as error:
        return f"config.json does not parse ({error})"
    if not (folder / "tokenizer.json").is_file():
        return "tokenizer.json is missing"
    shards = _shards(folder)
    if isinstance(shards, str):
        return shards
    lost = [name for name in shards if not (folder / name).is_file()]
    return f"{len(lost)} weight file(s) missing, {lost[0]} first" if lost else ""


def _shards(folder: Path) -> list[str] | str:
    """The weight files model.safetensors.index.json lists (or the single model.safetensors), or why not."""
    index = folder / "model.safetensors.index.json"
    if not index.is_file():
        return (
            ["model.safetensors"]
            if (folder / "model.safetensors").is_file()
            else "no weights (neither model.safetensors.index.json nor model.safetensors)"
        )
    try:
        return sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return f"model.safetensors.index.json does not parse ({error})"


def _named(settings: Settings, folder: str) -> str:
    return f"CHECKPOINT={folder}" if settings.checkpoint else f"the checkpoint {folder}"


def _fix(settings: Settings, folder: str) -> str:
    if settings.checkpoint:
        return (
            "write CHECKPOINT=<a folder with config.json, tokenizer.json and the safetensors files>, or remove "
            "CHECKPOINT to serve the default; nothing was stopped"
        )
    if settings.effective_runtime == "process":  # the embedded default's demo checkpoint, made by a start
        return f"delete {folder}: the next start makes it again; nothing was stopped"
    return "./start.sh fetches what is missing (or: sparks download); nothing was stopped"


def check_window(settings: Settings, plan: Plan, reporter: Reporter) -> None:
    """Refuse a window this machine can never hold (local process ranks only; see the module docstring)."""
    if plan.runtime != "process" or any(rank.node != "local" for rank in plan.ranks):
        return
    answer = ask_fit(settings, plan, reporter)
    if answer is None:
        return
    if "error" in answer:
        raise RecipeError(
            f"{_named(settings, plan.checkpoint)} cannot be served: {answer['error']}", _fix(settings, plan.checkpoint)
        )
    if not answer["fits"] or (settings.context == 0 and answer["largest_window"] < min_context()):
        raise window_refusal(settings, answer)
    reporter.note(
        f"Window: {settings.context or 'the largest'} tokens can fit this machine "
        f"(up to {answer['largest_window']} once no other program holds memory)"
    )


def ask_fit(settings: Settings, plan: Plan, reporter: Reporter) -> dict | None:
    """`engine fit`'s answer through the interpreter the local ranks run under; None (noted) when it gives none."""
    argv = [
        plan.rank0.argv[0],
        "-m",
        "engine",
        "fit",
        plan.checkpoint,
        "--tp",
        str(plan.tp),
        "--context",
        str(settings.context),
        "--kv",
        settings.kv,
        "--dense",
        settings.dense,
        "--drafter",
        settings.drafter if settings.draft_tokens > 0 else "none",
        "--vision",
        "1" if settings.vision else "0",
    ]
    if settings.memory_reserve_gib is not None:
        argv += ["--memory-reserve-gib", str(settings.memory_reserve_gib)]
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=FIT_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env=scrubbed_environ(plan.rank0.env),
        )
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as error:
        reporter.warn(f"the window was not checked ahead ({type(error).__name__}); the engine checks it at load")
        return None
    return answer if isinstance(answer, dict) and ("fits" in answer or "error" in answer) else None


def min_context() -> int:
    """The smallest window CONTEXT accepts (config/settings.yaml): a chat template's prompt and a short reply."""
    bounds = load_specs()["CONTEXT"].range
    if bounds is None:
        raise RuntimeError("config/settings.yaml must give CONTEXT a range (its low end is the smallest window)")
    return int(bounds[0])


def _size(count: int) -> str:
    return f"{count / GIB:.2f} GiB" if count >= GIB // 4 else f"{count / 2**20:.1f} MiB"


def window_refusal(settings: Settings, fit: dict) -> RecipeError:
    memory, reserve, weights = fit["memory_bytes"], fit["reserve_bytes"], fit["weights_bytes"]
    largest, ranks = fit["largest_window"], fit["ranks_on_memory"]
    machine = f"this machine's {fit['device'].upper()} memory ({_size(memory)} in all)"
    if reserve >= memory:
        return SettingError(
            f"MEMORY_RESERVE_GIB={reserve / GIB:g} leaves nothing of {machine} for the model",
            f"write MEMORY_RESERVE_GIB=<less than {memory / GIB:.0f}>, or remove it for the "
            "engine's estimate; nothing was stopped",
        )
    if largest < min_context():
        return SettingError(
            f"{machine} holds a window of {largest} tokens at most, after a {_size(reserve)} "
            f"reserve and {_size(weights)} of weights; a chat needs {min_context()}",
            "lower MEMORY_RESERVE_GIB, serve a smaller checkpoint, or use a larger machine; nothing was stopped",
        )
    need = settings.context * fit["bytes_per_token"] * ranks
    return SettingError(
        f"CONTEXT={settings.context} needs {_size(need)} of cache ({ranks} rank(s)), more than "
        f"{machine} can ever hold after a {_size(reserve)} reserve and {_size(weights)} of weights: "
        f"{largest} tokens at most",
        f"write CONTEXT={largest} or less (CONTEXT=0: the largest that fits); nothing was stopped",
    )
