"""Read `.env` and `scripts/local.sh` as data: KEY=value lines, never executed.

Accepted lines: blank, `# comment`, `KEY=value` and `export KEY=value`. A value is bare (text after ` #` is a
comment), "double-quoted" (\\" and \\\\ escape) or 'single-quoted' (literal); a comment may follow a closing quote.
Any other line is an error naming the file and the line number, because a shell would have run it and we do not.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from recipe.errors import SettingError

_ASSIGNMENT = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


@dataclass(frozen=True)
class Assignment:
    key: str
    value: str
    origin: str  # "scripts/local.sh line 4"
    literal: bool = False  # single-quoted: a $ in it is meant as a $


def parse_file(path: Path, shown_as: str) -> list[Assignment]:
    """Every assignment in `path` in file order; an absent file has none."""
    if not path.is_file():
        return []
    found = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        origin = f"{shown_as} line {number}"
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        match = _ASSIGNMENT.match(stripped)
        if not match:
            raise SettingError(
                f"{origin} is not a KEY=value line: {_clip(stripped)!r}",
                f"write KEY=value or export KEY=value there ({shown_as} is read as data, not run)",
            )
        text = match.group(2)
        found.append(Assignment(match.group(1), _parse_value(text, origin), origin, literal=text.startswith("'")))
    return found


def _clip(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _parse_value(text: str, origin: str) -> str:
    if text.startswith('"'):
        return _quoted(text, '"', origin)
    if text.startswith("'"):
        return _quoted(text, "'", origin)
    value = re.split(r"\s+#", text, maxsplit=1)[0].rstrip()
    if re.search(r"[`;|&<>()]|\$\(", value):
        raise SettingError(f"{origin} has shell syntax in {_clip(value)!r}", "write a plain value (nothing is run)")
    if re.search(r"\s", value):
        raise SettingError(f"{origin} has an unquoted space in {_clip(value)!r}", 'put the value in quotes: KEY="a b"')
    return value


def _quoted(text: str, quote: str, origin: str) -> str:
    chars: list[str] = []
    index = 1
    while index < len(text):
        char = text[index]
        if quote == '"' and char == "\\" and index + 1 < len(text) and text[index + 1] in '"\\$`':
            chars.append(text[index + 1])
            index += 2
            continue
        if char == quote:
            rest = text[index + 1 :].strip()
            if rest and not rest.startswith("#"):
                raise SettingError(
                    f"{origin} has text after the closing quote: {_clip(rest)!r}",
                    "end the line after the quote, or start a # comment",
                )
            return "".join(chars)
        chars.append(char)
        index += 1
    raise SettingError(f"{origin} has no closing {quote}", f"close the value with {quote} on the same line")
