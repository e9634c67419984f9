"""Videos: decoding, frame sampling, the frames' canvas and patches, the prompt markup, and a video prompt's logits.

Against transformers' glm5_next (the numerical reference):
- A video prompt through our text model, each frame pair's tower rows in place of its `<|image|>` positions inside
  the `<|begin_of_video|>` … `<|end_of_video|>` span, gives the reference model's logits (fed the same pixels as
  `pixel_values_videos`) at every position: within 1.5e-3 of that model run in float64 (at one ill-conditioned
  position every fp32 run is ~1e-3 off, the reference's own included) — and the same greedy tokens as its fp32
  run. Runs everywhere.
- Where torchvision is installed (the reference's video processor needs it; this machine's CPU torch has no
  matching torchvision on PyPI, the GPU machine has one): the frames sampled (over hundreds of lengths, rates and
  caps), the canvas sizes, the patches of whole clips (bit for bit) and the prompt ids with the frames' times equal
  `Glm5NextVideoProcessor` / `Glm5NextProcessor` given the same decoded frames.

Without the reference: every FFmpeg container the tests write (MP4/H.264, WebM/VP9, MOV/MPEG-4) decodes to the same
frame pairs as preparing all its frames at once; each refusal is a one-line VideoError.
"""

from __future__ import annotations

import copy
import json
import math

import numpy as np
import pytest
import torch
from media import audio_only, decode_all, encode, frames
from reference import IMAGE_IDS, make_reference

from engine.checkpoint.demo import TRAINED
from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.models.glm5_next.vision import ImageTokens, VisionTower
from engine.server.images import VIDEO_MARKUP, place_media
from engine.vision.preprocess import ImageError, ProcessorSpec
from engine.vision.prompt import chunk_rows
from engine.vision.video import VideoError, decode_video, prepare_frames, sample_indices, video_canvas

SPEC = ProcessorSpec(max_tokens=400)


# -- decoding, without the reference --------------------------------------------------------------------------------


@pytest.mark.parametrize(("codec", "container"), [("libx264", "mp4"), ("libvpx-vp9", "webm"), ("mpeg4", "mov")])
def test_each_container_decodes_to_the_frames_prepared_whole(codec: str, container: str) -> None:
    data = encode(frames(37, 96, 64, seed=1), fps=12, codec=codec, container=container)
    video = decode_video(data, 10**6, 16, SPEC)
    everything, fps = decode_all(data)
    assert fps == 12 and video.indices == sample_indices(37, 12.0, 16)
    whole = prepare_frames([everything[i] for i in video.indices], video.indices, fps, SPEC)
    assert [p.digest for p in video.pairs] == [p.digest for p in whole.pairs]
    assert len(video.pairs) == len(video.indices) // 2 and video.seconds == [i / 12 for i in video.indices[::2]]
    patches = torch.cat([p.patches for p in video.pairs])
    assert patches.shape == (sum(p.grid[1] * p.grid[2] for p in video.pairs), 3 * 2 * 14 * 14)
    assert video.tokens == sum(p.tokens for p in video.pairs) <= SPEC.max_tokens
    # a pair's two frames differ (the clip moves), and each pair's patches hold both
    assert not torch.equal(video.pairs[0].canvas[0], video.pairs[0].canvas[1])


def test_sampling_keeps_pairs_within_the_cap() -> None:
    for total, fps, cap in [(10, 10.0, 16), (300, 30.0, 8), (7, 2.0, 128), (3000, 24.0, 128), (61, 29.97, 5)]:
        chosen = sample_indices(total, fps, cap)
        assert len(chosen) % 2 == 0 and len(chosen) <= cap + 1
        assert chosen == sorted(chosen) and 0 <= chosen[0] and chosen[-1] < total
    assert sample_indices(20, 10.0, 128) == [0, 5, 10, 15]  # 2 s at 10 fps: a frame each half second
    # a long clip is sampled evenly, sparser, at the cap
    assert len(sample_indices(30 * 600, 30.0, 128)) == 128


def test_a_video_stays_within_its_token_budget() -> None:
    per_token = 2 * 28 * 28  # pixels of one prompt token: a frame pair's 28 x 28 block
    for budget in (64, 100, 16384):
        spec = ProcessorSpec(max_tokens=budget)
        for count in (2, 20, 128):
            for height, width in ((48, 64), (720, 1280), (2160, 3840)):
                canvas_h, canvas_w, content_h, content_w = video_canvas(count, height, width, spec)
                assert count * canvas_h * canvas_w <= budget * per_token
                assert content_h <= canvas_h and content_w <= canvas_w


def test_a_budget_under_one_token_a_pair_is_refused() -> None:
    with pytest.raises(ImageError, match="128 frames need at least 64 prompt tokens, over the budget of 16"):
        video_canvas(128, 720, 1280, ProcessorSpec(max_tokens=16))
    assert video_canvas(128, 720, 1280, ProcessorSpec(max_tokens=64))[:2] == (28, 28)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "empty"),
        (b"\x00\x01 not a video at all" * 20, "format"),
        (audio_only(), "no video stream"),
        (encode(frames(2, 32, 32), fps=10), "samples no frame"),  # 0.2 s
        (encode(frames(6, 640, 480), fps=10), "over the limit"),
    ],
)
def test_refusals_are_one_line(data: bytes, message: str) -> None:
    with pytest.raises(VideoError, match=message) as refused:
        decode_video(data, 100_000, 16, SPEC)
    assert "\n" not in str(refused.value)


def test_the_markup_gives_each_pair_its_rows_and_time() -> None:
    video = decode_video(encode(frames(20, 64, 48), fps=10), 10**6, 16, SPEC)
    tokens = ImageTokens(image=90, begin=91, end=92, video_begin=93, video_end=94, video=95)
    times: list[str] = []

    def encode_text(text: str) -> list[int]:
        times.append(text)
        return [7, 7]

    ids, images = place_media([1, 93, 95, 94, 2], [video], tokens, encode_text)
    assert times == [f"{s:.1f} seconds" for s in video.seconds] == ["0.0 seconds", "1.0 seconds"]
    expected = [1, 93]
    for pair in video.pairs:
        expected += [91] + [90] * pair.tokens + [92, 7, 7]
    assert ids == [*expected, 94, 2]
    assert [ids[im.start - 1] for im in images] == [91, 91] and all(ids[im.end] == 92 for im in images)


def test_two_videos_sharing_their_first_pairs_never_share_a_kept_state() -> None:
    """A pair's rows come from its whole video's tower call, so its key is of the whole video: a prompt resumes past
    a pair only for the same video."""
    from engine.vision.prompt import key_ids

    tokens = ImageTokens(image=90, begin=91, end=92, video_begin=93, video_end=94, video=95)
    base = frames(20, 56, 56, seed=2)
    changed = base[:10] + frames(10, 56, 56, seed=3)  # the first pair (frames 0 and 5) is the same
    keys, videos = [], []
    for clip in (base, changed, base):
        indices = sample_indices(len(clip), 10.0, 16)
        videos.append(prepare_frames([clip[i] for i in indices], indices, 10.0, SPEC))
        ids, images = place_media([1, 93, 95, 94, 2], videos[-1:], tokens, lambda s: [7])
        keys.append(key_ids(ids, images))
    assert videos[0].pairs[0].digest == videos[1].pairs[0].digest != videos[1].pairs[1].digest  # the premise
    first = images[0]
    assert keys[0] == keys[2]  # the same video: the same keys
    assert keys[0][: first.start] == keys[1][: first.start] and keys[0][first.start] != keys[1][first.start]


# -- a video prompt through our model against the reference model (CPU, fp32) --------------------------------------

TOWER = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=48, projection_intermediate_size=40)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("video")
    ref = make_reference(path, "kda3_dsa1", seed=4, vision=TOWER)
    return ref, VisionTower.load(path, torch.device("cpu")), Glm5NextForCausalLM.load(path)


def _float64(ref):
    """A float64 copy of the reference model (its experts through the eager loop: `_grouped_mm` takes no float64)."""
    exact = copy.deepcopy(ref).double()
    for config in (exact.config, getattr(exact.config, "text_config", None)):
        if config is not None:
            config._experts_implementation = "eager"
    return exact


@torch.no_grad()
def test_video_prompt_logits_and_greedy_match_the_reference(pair) -> None:
    ref, tower, model = pair
    video = decode_video(encode(frames(30, 56, 56, seed=3), fps=10), 10**6, 16, ProcessorSpec(max_tokens=24))
    tokens = ImageTokens.from_config({k: v for k, v in IMAGE_IDS.items()})
    text = torch.randint(1, 89, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    ids, images = place_media(
        [*text[:5], tokens.video_begin, tokens.video, tokens.video_end, *text[5:]],
        [video],
        tokens,
        lambda s: [int(c) % 80 + 1 for c in s if c.isdigit()],  # a stand-in tokeniser for the times
    )
    patches = torch.cat([p.patches for p in video.pairs])
    grid = [[len(video.pairs), video.pairs[0].grid[1], video.pairs[0].grid[2]]]
    exact = _float64(ref)(
        input_ids=torch.tensor([ids]), pixel_values_videos=patches.double(), video_grid_thw=torch.tensor(grid)
    ).logits[0]
    rows = [tower.forward(im.patches(), [im.grid]) for im in images]
    for chunk in (len(ids), 7):  # whole; chunks that cut the frames
        seq = model.new_sequence(model.make_pool(len(ids) + 12))
        ours = torch.cat(
            [
                model.prefill(seq, ids[s : s + chunk], all_logits=True, embeds=chunk_rows(images, rows, s, chunk))
                for s in range(0, len(ids), chunk)
            ]
        )
        # against the reference run in float64: at position 13 (a time token after the first pair) any fp32 run is
        # ~1e-3 off, transformers' own included (8.6e-4), ours 4e-5 to 9.0e-4 with the CPU thread count (1-8 threads
        # measured); against transformers' fp32 run the two errors added up to 1.1e-3-3.5e-3 there. Elsewhere < 1e-4
        assert (ours.double() - exact).abs().max() < 1.5e-3, chunk
    # greedy from the prompt: the same 8 tokens
    seq = model.new_sequence(model.make_pool(len(ids) + 12))
    step = model.prefill(seq, ids, embeds=chunk_rows(images, rows, 0, len(ids)))
    full = list(ids)
    for _ in range(8):
        token = int(step.argmax())
        reference = ref(
            input_ids=torch.tensor([full]), pixel_values_videos=patches, video_grid_thw=torch.tensor(grid)
        ).logits[0, -1]
        assert token == int(reference.argmax())
        full.append(token)
        step = model.decode([seq], [token])[0]


# -- against the reference video processor (where torchvision is installed) ----------------------------------------


def _reference_processor(spec: ProcessorSpec, max_frames: int):
    pytest.importorskip("torchvision", reason="transformers' video processor needs torchvision")
    from transformers.models.glm5_next.video_processing_glm5_next import Glm5NextVideoProcessor

    return Glm5NextVideoProcessor(
        max_frames=max_frames,
        max_image_tokens=spec.max_tokens,
        min_image_tokens=spec.min_tokens,
        patch_size=spec.patch_size,
        merge_size=spec.merge_size,
        temporal_patch_size=spec.temporal_patch_size,
    )


def _metadata(total: int, fps: float):
    from transformers.video_utils import VideoMetadata

    return VideoMetadata(total_num_frames=total, fps=fps, duration=total / fps)


def test_sampling_equals_the_reference() -> None:
    processors = {cap: _reference_processor(SPEC, cap) for cap in (2, 3, 16, 128)}
    rates = (1.0, 2.5, 10.0, 23.976, 24.0, 25.0, 29.97, 30.0, 60.0)
    totals = (1, 2, 3, 5, 9, 10, 24, 30, 59, 61, 100, 241, 301, 1000, 4999)
    checked = 0
    for cap, processor in processors.items():
        for fps in rates:
            for total in totals:
                theirs = processor.sample_frames(_metadata(total, fps)).tolist()
                if not theirs:  # too short to sample: the reference returns nothing, we refuse
                    with pytest.raises(VideoError):
                        sample_indices(total, fps, cap)
                    continue
                assert sample_indices(total, fps, cap) == theirs, (total, fps, cap)
                checked += 1
    assert checked > 300


def test_canvas_sizes_equal_the_reference() -> None:
    pytest.importorskip("torchvision", reason="transformers' video processor needs torchvision")
    from transformers.models.glm5_next.video_processing_glm5_next import smart_resize

    for budget in (16, 64, 400, 16384):
        spec = ProcessorSpec(max_tokens=budget)
        for count in (2, 4, 16, 128):
            for height, width in ((1, 1), (10, 300), (48, 64), (480, 640), (1080, 1920), (2160, 3840), (333, 17)):
                try:
                    theirs = smart_resize(
                        count, height, width, 2, spec.factor, min_pixels=spec.min_tokens, max_pixels=budget
                    )
                except ValueError:  # a budget under one block per frame pair: refused by both
                    with pytest.raises(ImageError, match="prompt tokens, over the budget"):
                        video_canvas(count, height, width, spec)
                    continue
                assert video_canvas(count, height, width, spec)[:2] == tuple(theirs), (budget, count, height, width)


CLIPS = [  # (frames, width, height, fps, max_frames, budget): shrunk, enlarged (tiny frames), as is, long and capped
    (25, 160, 90, 10, 16, 200),
    (12, 20, 12, 6, 16, 64),
    (8, 56, 56, 4, 16, 400),
    (90, 64, 48, 30, 6, 100),
]


@pytest.mark.parametrize("clip", CLIPS)
def test_patches_and_markup_equal_the_reference_processor(clip) -> None:
    count, width, height, fps, cap, budget = clip
    spec = ProcessorSpec(max_tokens=budget)
    processor = _reference_processor(spec, cap)
    data = encode(frames(count, width, height, seed=count), fps=fps)
    everything, rate = decode_all(data)
    out = processor(
        videos=[everything],
        video_metadata=[_metadata(len(everything), rate)],
        return_metadata=True,
        return_tensors="pt",
    )
    ours = decode_video(data, 10**7, cap, spec)
    assert ours.indices == list(out["video_metadata"][0].frames_indices)
    grid = out["video_grid_thw"].tolist()
    assert grid == [[len(ours.pairs), ours.pairs[0].grid[1], ours.pairs[0].grid[2]]]
    assert torch.equal(torch.cat([p.patches for p in ours.pairs]), out["pixel_values_videos"])

    # the prompt ids, the frames' times written by the reference processor with the trained demo's tokenizer
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer
    from transformers.models.glm5_next.image_processing_pil_glm5_next import Glm5NextImageProcessorPil
    from transformers.models.glm5_next.processing_glm5_next import Glm5NextProcessor

    full = Glm5NextProcessor(
        image_processor=Glm5NextImageProcessorPil(),
        tokenizer=AutoTokenizer.from_pretrained(TRAINED),
        video_processor=processor,
    )
    text = "Watch: " + VIDEO_MARKUP + " What happens?"
    theirs = full(
        text=[text], videos=[everything], video_metadata=[_metadata(len(everything), rate)], return_tensors="pt"
    )["input_ids"][0].tolist()
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    tokens = ImageTokens.from_config(json.loads((TRAINED / "config.json").read_text()))
    ids, _ = place_media(
        tokenizer.encode(text, add_special_tokens=False).ids,
        [ours],
        tokens,
        lambda s: list(tokenizer.encode(s, add_special_tokens=False).ids),
    )
    assert ids == theirs
    assert math.isclose(ours.seconds[-1], ours.indices[-2] / rate)
    assert np.all(np.diff(ours.indices) >= 0)


def test_the_engine_refuses_a_video_budget_under_one_token_a_pair() -> None:
    from engine.config import EngineConfig

    def problems(**video) -> list[str]:
        return [p for p in EngineConfig("unused", vision=True, **video).problems() if "vision" in p]

    assert any(
        "cannot give each of the 65 frame pairs" in p for p in problems(vision_max_frames=129, vision_video_tokens=64)
    )
    assert problems(vision_max_frames=129, vision_video_tokens=65) == []
    assert any("--vision-max-frames at least 2" in p for p in problems(vision_max_frames=1))


@torch.no_grad()
def test_a_prompt_resumed_inside_a_video_encodes_the_whole_video_and_equals_a_cold_start(pair) -> None:
    """A first request ends inside a video (its first two frame pairs); the second, the whole prompt, resumes from
    the state kept past the first pair, and the tower still encodes its video whole (one call per media item), so
    its reply is the cold start's."""
    from test_vision import run_requests

    _, tower, model = pair
    tokens = ImageTokens.from_config(dict(IMAGE_IDS))
    clip = frames(30, 56, 56, seed=5)
    indices = sample_indices(len(clip), 10.0, 16)
    video = prepare_frames([clip[i] for i in indices], indices, 10.0, ProcessorSpec(max_tokens=24))
    text = torch.randint(1, 89, (12,), generator=torch.Generator().manual_seed(7)).tolist()
    ids, images = place_media(
        [*text[:5], tokens.video_begin, tokens.video, tokens.video_end, *text[5:]],
        [video],
        tokens,
        lambda s: [int(c) % 80 + 1 for c in s if c.isdigit()],
    )
    assert len(images) == 3 and images[0].end < 16 < images[1].end <= 20 < images[2].start
    encoded: list = []
    _, resumed = run_requests(model, tower, [(ids[:20], images[:2]), (ids, images)], parallel=1, encoded=encoded)
    (cold,) = run_requests(model, tower, [(ids, images)], parallel=1)
    assert resumed[1] == 16  # resumed past the first pair, inside the second
    assert encoded[1] == [im.digest for im in images]  # yet the whole video went through the tower
    assert resumed[0] == cold[0]
