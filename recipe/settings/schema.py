"""config/settings.yaml as typed specs, and the parsing of one raw string against its spec.

A parse failure names the variable, the bad value, where it came from and what to write instead, in one line.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from recipe.errors import SettingError

REPO_ROOT = Path(__file__).resolve().parents[2]  # the checkout: recipe/settings/schema.py is two folders down
SETTINGS_YAML = REPO_ROOT / "config" / "settings.yaml"

_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$"
)
_USER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$", re.IGNORECASE)
_MODEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
_REVISION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
_IMAGE = re.compile(
    r"^[a-z0-9]+([._/-][a-z0-9]+)*(:[0-9]+)?([a-z0-9._/-]*)(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,127}$")

# What to write, per type: the tail of every error message.
_HINTS = {
    "flag": "0 or 1",
    "port": "a TCP port from 1 to 65535",
    "bind": "an IP address to listen on (0.0.0.0 for every interface, 127.0.0.1 for this machine only)",
    "host": "an IPv4 address or a host name, like 192.168.100.2 or spark2",
    "ssh": "an ssh target, like user@192.168.100.2 or user@spark2",
    "path": "an absolute path (~ and $HOME expand)",
    "model": "a Hugging Face repository id, like org/name",
    "revision": "a commit hash or a branch name, without spaces",
    "image": "a Docker image reference in lower case, like glm-sparks-engine:0.1",
    "name": "letters, digits and . _ : / - (no spaces)",
    "secret": "one word without spaces or quotes",
    "text": "any text",
    "args": "arguments split like a shell line, quotes balanced (e.g. -v /data:/data:ro)",
}


@dataclass(frozen=True)
class SettingSpec:
    name: str
    type: str
    default: Any
    meaning: str
    consumer: str
    choices: tuple[str, ...] = ()
    range: tuple[float, float] | None = None
    derived: str = ""
    empty_ok: bool = False
    zero_ok: bool = False  # 0 is accepted besides the range (CONTEXT=0: the largest window that fits)
    example: str = ""  # what an error suggests writing, when the default is derived

    @property
    def is_secret(self) -> bool:
        return self.type == "secret"

    def hint(self) -> str:
        """What a valid value looks like, in words."""
        if self.type == "choice":
            return " or ".join(", ".join(self.choices).rsplit(", ", 1))
        if self.type in ("int", "float") and self.range:
            low, high = (_fmt_number(v, self.type) for v in self.range)
            kind = "a whole number" if self.type == "int" else "a number"
            return f"{'0 or ' if self.zero_ok else ''}{kind} from {low} to {high}"
        return _HINTS.get(self.type, "a value")

    def default_text(self) -> str:
        """The default as the README shows it."""
        if self.default is None:
            return f"derived: {self.derived}"
        return str(self.default) if str(self.default) != "" else "(empty)"


def _fmt_number(value: float, kind: str) -> str:
    return str(int(value)) if kind == "int" else f"{value:g}"


@lru_cache(maxsize=4)
def load_specs(path: Path = SETTINGS_YAML) -> dict[str, SettingSpec]:
    """Every setting, in file order."""
    raw = yaml.safe_load(path.read_text())
    specs = {}
    for name, entry in raw.items():
        rng = entry.get("range")
        specs[name] = SettingSpec(
            name=name,
            type=entry["type"],
            default=entry.get("default"),
            meaning=entry["meaning"],
            consumer=entry["consumer"],
            choices=tuple(str(c) for c in entry.get("choices", ())),
            range=(float(rng[0]), float(rng[1])) if rng else None,
            derived=entry.get("derived", ""),
            empty_ok=bool(entry.get("empty_ok", False)),
            zero_ok=bool(entry.get("zero_ok", False)),
            example=str(entry.get("example", "")),
        )
    return specs


def bad_value(spec: SettingSpec, raw: str, origin: str, why: str = "") -> SettingError:
    where = f" (from {origin})" if origin and origin != "default" else ""
    detail = f" ({why})" if why else ""
    shown = f"a value of {len(raw)} characters" if spec.is_secret else repr(raw)
    return SettingError(
        f"{spec.name} is {spec.hint()}, not {shown}{where}{detail}", f"write {spec.name}={_example(spec)}"
    )


def _example(spec: SettingSpec) -> str:
    if spec.example:
        return spec.example
    if spec.type == "choice":
        return spec.choices[0]
    if spec.default not in (None, ""):
        return str(spec.default)
    return {
        "ssh": "user@spark2",
        "host": "192.168.100.2",
        "secret": "<value>",
        "path": "/absolute/path",
        "float": "4",
        "int": "1",
    }.get(spec.type, "<value>")


def parse_value(spec: SettingSpec, raw: str, origin: str) -> Any:
    """The typed value of `raw` for `spec`; raises SettingError naming the variable and what to write."""
    parser = _PARSERS.get(spec.type, _parse_text)
    try:
        return parser(spec, raw)
    except ValueError as exc:
        raise bad_value(spec, raw, origin, str(exc)) from None


def _parse_int(spec: SettingSpec, raw: str) -> int:
    if not re.fullmatch(r"[0-9]+", raw):
        raise ValueError("")
    return int(_in_range(spec, int(raw)))


def _parse_float(spec: SettingSpec, raw: str) -> float:
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", raw):
        raise ValueError("")
    return float(_in_range(spec, float(raw)))


def _in_range(spec: SettingSpec, value: float) -> float:
    if spec.zero_ok and value == 0:
        return value
    if spec.range and not spec.range[0] <= value <= spec.range[1]:
        raise ValueError("")
    return value


def _parse_flag(spec: SettingSpec, raw: str) -> bool:
    if raw not in ("0", "1"):
        raise ValueError("")
    return raw == "1"


def _parse_choice(spec: SettingSpec, raw: str) -> str:
    if raw not in spec.choices:
        raise ValueError("")
    return raw


def _parse_port(spec: SettingSpec, raw: str) -> int:
    if not re.fullmatch(r"[0-9]{1,5}", raw) or not 1 <= int(raw) <= 65535:
        raise ValueError("")
    return int(raw)


def _parse_bind(spec: SettingSpec, raw: str) -> str:
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        raise ValueError("") from None


def _is_host(raw: str) -> bool:
    if re.fullmatch(r"[0-9.]+", raw):
        try:
            return isinstance(ipaddress.ip_address(raw), ipaddress.IPv4Address)
        except ValueError:
            return False
    return bool(_HOSTNAME.match(raw))


def _parse_host(spec: SettingSpec, raw: str) -> str:
    if not _is_host(raw):
        raise ValueError("")
    return raw


def _parse_ssh(spec: SettingSpec, raw: str) -> str:
    user, _, host = raw.rpartition("@")
    if ("@" in raw and not _USER.match(user)) or not _is_host(host):
        raise ValueError("")
    return raw


_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")


def expand_path(raw: str, environ: Mapping[str, str]) -> str:
    """`$VAR`, `${VAR}` and a leading `~` of a path setting, from the environment the settings are read with
    (what is not in it is left for the process's own environment)."""
    text = _VARIABLE.sub(lambda m: environ.get(m.group(1) or m.group(2), m.group(0)), raw)
    if (text == "~" or text.startswith("~/")) and environ.get("HOME"):
        text = environ["HOME"] + text[1:]
    return text


def _parse_path(spec: SettingSpec, raw: str) -> str:
    expanded = os.path.expanduser(os.path.expandvars(raw))
    if not os.path.isabs(expanded) or "$" in expanded:
        raise ValueError("")
    return os.path.normpath(expanded)


def _matching(pattern: re.Pattern[str]):
    def parse(spec: SettingSpec, raw: str) -> str:
        if not pattern.match(raw):
            raise ValueError("")
        return raw

    return parse


def _parse_secret(spec: SettingSpec, raw: str) -> str:
    if re.search(r"[\s'\"]", raw):
        raise ValueError("")
    return raw


def _parse_text(spec: SettingSpec, raw: str) -> str:
    return raw


def _parse_args(spec: SettingSpec, raw: str) -> str:
    shlex.split(raw)  # ValueError on unbalanced quotes; kept as text, split where it is used
    return raw


_PARSERS = {
    "int": _parse_int,
    "float": _parse_float,
    "flag": _parse_flag,
    "choice": _parse_choice,
    "port": _parse_port,
    "bind": _parse_bind,
    "host": _parse_host,
    "ssh": _parse_ssh,
    "path": _parse_path,
    "model": _matching(_MODEL),
    "revision": _matching(_REVISION),
    "image": _matching(_IMAGE),
    "name": _matching(_NAME),
    "secret": _parse_secret,
    "text": _parse_text,
    "args": _parse_args,
}
