"""What `sparks bench` is asked to measure: `BenchOptions` (checked before anything is sent), and the parsing of the
command's size lists and URL."""

from __future__ import annotations

from dataclasses import dataclass, field

from recipe.bench.client import MAX_CONNECTIONS
from recipe.errors import RecipeError

MAX_CONCURRENCY = MAX_CONNECTIONS - 2  # spares for /health


@dataclass(frozen=True)
class BenchOptions:
    url: str  # API base, ending in /v1
    model: str
    api_key: str = field(default="", repr=False)
    concurrency: tuple[int, ...] = (1, 2, 3, 4)
    tokens: int = 256  # reply length of every decode request
    prompt_sizes: tuple[int, ...] = (512, 2048, 8192, 32768)
    reuse_sizes: tuple[int, ...] = (8192, 32768)  # prompt reuse: cold vs resent, and a shared system prompt
    repeats: int = 3
    request_timeout_s: float = 600.0  # one request, first byte to last
    budget_s: float = 3600.0  # the whole bench; what is left then is skipped, not run
    seed: int = 1234

    def check(self) -> None:
        if self.tokens < 2:
            raise RecipeError(f"--tokens is {self.tokens}", "a decode rate needs at least 2 tokens a reply")
        if self.repeats < 1 or self.repeats > 50:
            raise RecipeError(f"--repeats is {self.repeats}", "write a number from 1 to 50")
        if not self.concurrency or any(n < 1 or n > MAX_CONCURRENCY for n in self.concurrency):
            raise RecipeError(f"--concurrency is {self.concurrency}", f"write numbers from 1 to {MAX_CONCURRENCY}")
        if any(n < 16 for n in self.prompt_sizes):
            raise RecipeError(f"--prompt-sizes is {self.prompt_sizes}", "write sizes of at least 16 tokens")
        if any(n < 64 for n in self.reuse_sizes):
            raise RecipeError(f"--reuse-sizes is {self.reuse_sizes}", "write sizes of at least 64 tokens")
        if self.request_timeout_s <= 0 or self.budget_s <= 0:
            raise RecipeError("--timeout and --budget must be positive", "write a number of seconds above 0")


def parse_sizes(text: str, option: str) -> tuple[int, ...]:
    """'1,2,4' or '512,2k,32k' -> (1, 2, 4) / (512, 2048, 32768); a bad item names the option and the item."""
    out = []
    for item in (part.strip().lower() for part in text.split(",")):
        if not item:
            continue
        scale = 1024 if item.endswith("k") else 1
        try:
            out.append(int(item[:-1] if scale > 1 else item) * scale)
        except ValueError:
            raise RecipeError(
                f"{option} has {item!r}, not a whole number", f"write a comma-separated list such as {option} 1,2,4"
            ) from None
    return tuple(out)


def api_url(url: str, host: str, port: int) -> str:
    """The API base: `url` as given (with /v1 added when missing), else this machine's server from HOST/PORT."""
    if not url:
        reach = "127.0.0.1" if host in ("", "0.0.0.0", "::") else host
        url = f"http://{reach}:{port}"
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"
