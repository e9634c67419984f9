"""The LIVE banner's Memory line says what /health's `memory` reports (engine/footprint.py), and nothing when an
engine does not report it."""

from __future__ import annotations

from recipe.cli.ui import memory_line, reuse_words, vision_words

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
