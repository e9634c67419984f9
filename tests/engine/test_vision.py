"""The vision tower and image prompts against transformers' glm5_next (fp32, CPU, tiny random configs).

- The tower's rows for images and a video equal the reference's `get_image_features` / `get_video_features`
  (≤ 1e-4).
- A prompt with images, through our text model with the tower's rows in place of the `<|image|>` embeddings, gives
  the reference's logits at every position (≤ 1e-3) whole and in chunks that cut an image, and the same greedy
  continuation.
- Through the serving path (Scheduler + StepExecutor, prompt chunks cutting the images, kept prompt states on):
  the reply equals the model's own greedy reply; batched with other image requests ≡ alone; two images under the
  same text never share a kept state, a resent image does.
"""

from __future__ import annotations

import threading

import pytest
import torch
from reference import IMAGE_IDS, make_reference

from engine.models.glm5_next.model import Glm5NextForCausalLM
from engine.models.glm5_next.vision import VisionTower, has_tower
from engine.parallel import ParallelGroup
from engine.runner.executor import StepExecutor
from engine.sampling import SamplingParams
from engine.scheduler import Finished, Request, Scheduler, Token
from engine.vision.prompt import PromptImage, encode_items, key_ids

TOWER = dict(depth=2, hidden_size=32, num_heads=2, intermediate_size=48, projection_intermediate_size=40)
IMAGE, BEGIN, END = IMAGE_IDS["image_token_id"], IMAGE_IDS["image_start_token_id"], IMAGE_IDS["image_end_token_id"]
GRIDS = [(1, 4, 6), (1, 2, 2), (1, 6, 4)]


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    path = tmp_path_factory.mktemp("vision")
    ref = make_reference(path, "kda3_dsa1", seed=3, vision=TOWER)
    return path, ref, VisionTower.load(path, torch.device("cpu")), Glm5NextForCausalLM.load(path)


def pixels(grids: list[tuple[int, int, int]], seed: int) -> torch.Tensor:
    width = 3 * 2 * 14 * 14
    count = sum(t * h * w for t, h, w in grids)
    return torch.randn(count, width, generator=torch.Generator().manual_seed(seed))


def test_the_checkpoint_says_it_has_a_tower(pair):
    path, _, tower, _ = pair
    assert has_tower(path)
    assert tower.nbytes == sum(p.numel() * 4 for n, p in pair[1].named_parameters() if n.startswith("model.visual."))


@torch.no_grad()
def test_image_rows_match_the_reference(pair):
    _, ref, tower, _ = pair
    patches = pixels(GRIDS, 1)
    theirs = torch.cat(ref.model.get_image_features(patches, torch.tensor(GRIDS)).pooler_output)
    ours = tower.forward(patches, GRIDS)
    assert ours.shape == (sum(h * w // 4 for _, h, w in GRIDS), 48)
    assert (ours - theirs).abs().max() < 1e-4
    # served, each image goes through alone (encode_items): its rows' bits do not depend on the others
    images = [
        PromptImage(0, h * w // 4, part, (t, h, w), bytes(16))
        for part, (t, h, w) in zip(patches.split([t * h * w for t, h, w in GRIDS]), GRIDS)
    ]
    served = encode_items(tower.forward, images)
    assert torch.equal(served[0], encode_items(tower.forward, images[:1])[0])
    assert torch.equal(served[1], tower.forward(patches[24:28], GRIDS[1:2]))


@torch.no_grad()
def test_video_rows_match_the_reference(pair):
    _, ref, tower, _ = pair
    grids = [(3, 4, 4), (2, 2, 6)]  # temporal patches (frame pairs) × patches
    patches = pixels(grids, 2)
    theirs = torch.cat(ref.model.get_video_features(patches, torch.tensor(grids)).pooler_output)
    assert (tower.forward(patches, grids) - theirs).abs().max() < 1e-4


def image_prompt(seed: int = 5) -> tuple[list[int], list[PromptImage], torch.Tensor]:
    """Text, an image (4×6 patches: 6 rows), text, an image (2×2: 1 row), text: ids, images, their patches."""
    text = torch.randint(1, 89, (20,), generator=torch.Generator().manual_seed(seed)).tolist()
    grids = [GRIDS[0], GRIDS[1]]
    patches = pixels(grids, seed)
    ids = text[:7] + [BEGIN] + [IMAGE] * 6 + [END] + text[7:15] + [BEGIN, IMAGE, END] + text[15:]
    images = [
        PromptImage(8, 6, patches[:24], grids[0], seed.to_bytes(2, "little") + b"a" * 14),
        PromptImage(24, 1, patches[24:], grids[1], seed.to_bytes(2, "little") + b"b" * 14),
    ]
    return ids, images, patches


def embeds_for(tower: VisionTower, images: list[PromptImage], start: int, count: int):
    from engine.vision.prompt import chunk_rows

    rows = [tower.forward(im.patches(), [im.grid]) for im in images]
    return chunk_rows(images, rows, start, count)


@torch.no_grad()
def test_image_prompt_logits_match_the_reference(pair):
    _, ref, tower, model = pair
    ids, images, patches = image_prompt()
    theirs = ref(
        input_ids=torch.tensor([ids]), pixel_values=patches, image_grid_thw=torch.tensor([im.grid for im in images])
    ).logits[0]
    for chunk in (len(ids), 10, 3):  # whole; chunks that cut the first image; tiny chunks
        seq = model.new_sequence(model.make_pool(len(ids)))
        ours = torch.cat(
            [
                model.prefill(seq, ids[s : s + chunk], all_logits=True, embeds=embeds_for(tower, images, s, chunk))
                for s in range(0, len(ids), chunk)
            ]
        )
        assert (ours - theirs).abs().max() < 1e-3, chunk
    # the image rows matter: the same ids without them give other logits after the first image
    seq = model.new_sequence(model.make_pool(len(ids)))
    plain = model.prefill(seq, ids, all_logits=True)
    assert (plain[8:] - theirs[8:]).abs().max() > 1e-2


@torch.no_grad()
def test_image_prompt_greedy_matches_the_reference(pair):
    from transformers import DynamicCache

    _, ref, tower, model = pair
    ids, images, patches = image_prompt(9)
    cache = DynamicCache(config=ref.config.text_config)
    out = ref(
        input_ids=torch.tensor([ids]),
        pixel_values=patches,
        image_grid_thw=torch.tensor([im.grid for im in images]),
        cache=cache,
        use_cache=True,
    )
    theirs = []
    for _ in range(12):
        theirs.append(int(out.logits[0, -1].argmax()))
        out = ref(input_ids=torch.tensor([[theirs[-1]]]), cache=out.cache, use_cache=True)
    seq = model.new_sequence(model.make_pool(len(ids) + 16))
    step = model.prefill(seq, ids, embeds=embeds_for(tower, images, 0, len(ids)))
    ours = []
    for _ in range(12):
        ours.append(int(step.argmax()))
        step = model.decode([seq], [ours[-1]])[0]
    assert ours == theirs


# -- the serving path ----------------------------------------------------------------------------------------------


def run_requests(
    model,
    tower,
    requests: list[tuple[list[int], list[PromptImage]]],
    parallel: int,
    chunk: int = 8,
    graphs: bool = False,
    drafter: str = "none",
    draft: bool = True,
    encoded: list | None = None,
):
    """Each (ids, images) through a real Scheduler and StepExecutor (kept prompt states on; copy drafts of up to 3
    tokens with `drafter` "copy", used when `draft`); greedy replies of 10 tokens and their cached-token counts, in
    order."""
    pool = model.make_pool(512)
    window = 4 if drafter != "none" else 1
    executor = StepExecutor(model, pool, lanes=parallel, graphs=graphs, window=window)

    def encode(images: list[PromptImage]) -> list[torch.Tensor]:
        if encoded is not None:  # what the tower was asked to encode, call by call
            encoded.append([im.digest for im in images])
        return encode_items(tower.forward, images)

    scheduler = Scheduler(
        executor,
        ParallelGroup.single(),
        parallel=parallel,
        max_queued=16,
        prefill_chunk=chunk,
        reuse_bytes=2**30,
        encode_images=encode,
        drafter=drafter,
        draft_tokens=window - 1,
    )
    scheduler.start()
    results: list[tuple[list[int], int] | None] = [None] * len(requests)
    done = [threading.Event() for _ in requests]

    def submit(k: int) -> None:
        tokens: list[int] = []

        def sink(event) -> None:
            if isinstance(event, Token):
                tokens.append(event.id)
            elif isinstance(event, Finished):
                results[k] = (tokens, event.cached_tokens)
                done[k].set()
            else:
                done[k].set()

        ids, images = requests[k]
        params = SamplingParams(temperature=0.0, max_tokens=10)
        scheduler.submit(Request(f"r{k}", ids, params, sink, images=images, draft=draft))

    try:
        for k in range(len(requests)):
            submit(k)
            if parallel == 1:  # one after another: a later request may resume from an earlier one's states
                assert done[k].wait(120)
        for event in done:
            assert event.wait(120)
    finally:
        scheduler.stop()
    return results


@torch.no_grad()
def model_greedy(model, tower, ids, images) -> list[int]:
    seq = model.new_sequence(model.make_pool(len(ids) + 12))
    step = model.prefill(seq, ids, embeds=embeds_for(tower, images, 0, len(ids)))
    out = []
    for _ in range(10):
        out.append(int(step.argmax()))
        step = model.decode([seq], [out[-1]])[0]
    return out


def test_served_image_requests_equal_the_model_alone_and_batched(pair):
    _, _, tower, model = pair
    prompts = [image_prompt(seed) for seed in (11, 12, 13)]
    expected = [model_greedy(model, tower, ids, images) for ids, images, _ in prompts]
    requests = [(ids, images) for ids, images, _ in prompts]
    alone = run_requests(model, tower, requests, parallel=1)
    batched = run_requests(model, tower, requests, parallel=3)
    assert [r[0] for r in alone] == expected
    assert [r[0] for r in batched] == expected


def test_kept_states_tell_images_apart(pair):
    _, _, tower, model = pair
    ids, images, _ = image_prompt(21)
    other = [PromptImage(im.start, im.tokens, -im.patches(), im.grid, b"other" + im.digest[5:]) for im in images]
    assert key_ids(ids, images) != key_ids(ids, other)
    first, second, again = run_requests(model, tower, [(ids, images), (ids, other), (ids, images)], parallel=1)
    assert first[0] == model_greedy(model, tower, ids, images)
    assert second[0] == model_greedy(model, tower, ids, other) != first[0]
    assert second[1] <= images[0].start  # other pixels: nothing kept past the text before the first image
    assert again[1] > images[1].end and again[0] == first[0]  # the same image resent: resumed past it, same reply


@torch.no_grad()
def test_attention_in_query_blocks_equals_one_block(pair, monkeypatch):
    from engine.models.glm5_next import vision

    _, _, tower, _ = pair
    patches = pixels(GRIDS, 4)
    whole = tower.forward(patches, GRIDS)
    monkeypatch.setattr(vision, "ATTEND_ELEMENTS", 2 * 2 * 24)  # 2 heads: blocks of 2 queries
    # the same sums, in an order the CPU's attention kernel picks by the query count: a few fp32 ulps apart (rows up
    # to ~15 in size); the served blocks depend on the image's size alone, so one image always gets the same bits
    assert (tower.forward(patches, GRIDS) - whole).abs().max() < 2e-5


def test_a_later_turn_does_not_encode_the_images_a_kept_state_holds(pair):
    _, _, tower, model = pair
    ids, images, _ = image_prompt(41)
    later = ids + [7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23]  # the conversation goes on
    encoded: list = []
    first, second = run_requests(model, tower, [(ids, images), (later, images)], parallel=1, encoded=encoded)
    # resumed at the last whole chunk (24): past the first image, before the second (24..25)
    assert images[0].end <= second[1] == 24 < images[1].end
    assert encoded == [[im.digest for im in images], [images[1].digest]]  # the first image is not encoded again
    assert second[0] == model_greedy(model, tower, later, images)
