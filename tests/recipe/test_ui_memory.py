"""The LIVE banner says what /health reports the server runs (engine/server/health.py, engine/footprint.py): the
Memory line, the lanes, cache rows, dense weights and drafts; a setting stands in only where /health is silent."""

from __future__ import annotations

from pathlib import Path

from recipe.cli import ui
from recipe.cli.ui import drafts_words, memory_line, reuse_words, serving_words, vision_words
from recipe.launch.smoke import SmokeResult
from recipe.plan.host import HostFacts
from recipe.plan.plan import build_plan
from recipe.settings import Settings, load_settings

GIB = 2**30


def test_memory_line_reads_health():
    health = {
        "memory": {
            "weights_bytes": {"routed_experts": 3 * GIB, "dense": GIB, "embeddings_and_head": GIB // 2, "mtp": 0,
                              "total": 4 * GIB + GIB // 2},
            "pool_bytes": 2 * GIB,
            "pool_rows": "fp8",
            "lane_state_bytes": 68 * 2**20,
        }
    }  # fmt: skip
    line = memory_line(health)
    assert line == (
        "rank 0: weights 4.50 GiB (routed experts 3.00 GiB) · pool 2.00 GiB (fp8 rows) · lane states 68.0 MiB"
    )
    assert memory_line({}) is None and memory_line({"memory": {}}) is None


def test_the_window_row_names_prompt_reuse_only_when_health_says_it_runs():
    assert (
        reuse_words({"prompt_reuse": {"enabled": True, "cap_bytes": 4 * GIB}})
        == " · prompt reuse (states up to 4.00 GiB)"
    )
    assert reuse_words({"prompt_reuse": {"enabled": False}}) == "" and reuse_words({}) == ""


def test_vision_words_say_what_health_reports() -> None:
    tower = {"enabled": True, "tower_bytes": 1_127_254_016}
    assert vision_words({"vision": {**tower, "urls": False}}) == " · images (data: URLs; tower 1.05 GiB on rank 0)"
    assert vision_words({"vision": {**tower, "urls": True}}) == (
        " · images (data: and https URLs; tower 1.05 GiB on rank 0)"
    )
    assert vision_words({"vision": {**tower, "urls": False, "max_videos": 2}}) == (
        " · images and video (data: URLs; tower 1.05 GiB on rank 0)"
    )
    assert vision_words({"vision": {"enabled": False}}) == "" and vision_words({}) == ""


# Settings that differ from every value RUNNING reports, so a banner that prints a setting is caught.
ASKED = {"PARALLEL": "2", "KV": "fp8", "DENSE": "q4", "DRAFTER": "copy", "DRAFT_TOKENS": "5"}
RUNNING = {
    "streams": {"decoding": 0, "prefilling": 0, "max": 3},
    "memory": {"pool_rows": "bf16"},
    "weights": "fp8",
    "drafts": {"drafter": "mtp+copy", "draft_tokens": 3, "tokens_per_step": 2.375},
}


def _asked(root: Path, **overrides: str) -> Settings:
    return load_settings(root, {**ASKED, **overrides})


def test_the_window_row_states_what_health_says_runs(root: Path) -> None:
    assert serving_words(_asked(root), RUNNING) == (
        "3 at once · bf16 KV · fp8 dense weights · mtp+copy drafts (up to 3, smoke test 2.38 tokens/step)"
    )
    off = {**RUNNING, "drafts": {"drafter": "none", "draft_tokens": 0, "tokens_per_step": 1.0}}
    assert drafts_words(_asked(root), off) == "no drafts"


def test_the_window_row_falls_back_to_settings_only_where_health_is_silent(root: Path) -> None:
    assert serving_words(_asked(root), {}) == "2 at once · fp8 KV · q4 dense weights · copy drafts (up to 5)"
    assert serving_words(_asked(root), {"memory": {}, "streams": {}}).startswith("2 at once · fp8 KV · ")
    assert drafts_words(_asked(root, DRAFT_TOKENS="0"), {}) == "no drafts"
    assert drafts_words(_asked(root, DRAFTER="none"), {}) == "no drafts"


def test_live_banner_prints_what_health_reports(root: Path) -> None:
    settings = _asked(root)
    plan = build_plan(settings, HostFacts(python="python3", gpu=False, cpu_count=2, rdma=False))
    with ui.console.capture() as captured:
        ui.live_banner(plan, settings, {**RUNNING, "context_length": 4096}, SmokeResult("OK", 2, 0.5))
    window = next(line for line in captured.get().splitlines() if line.lstrip().startswith("Window"))
    assert "4096 tokens · 3 at once · bf16 KV · fp8 dense weights · mtp+copy drafts (up to 3, smoke test 2.38" in window
