"""Images and videos end to end through live servers on the trained demo (its vision tower is random: it cannot really see;
these tests show the path, not the model's eyes), with real HTTP clients: the `openai` SDK (chat image_url data
URLs, Responses input_image), the `anthropic` SDK (base64 image blocks) and plain HTTP for the refusals.

- TP=2 (gloo) ≡ TP=1: the same greedy token ids for image requests; a burst of image requests ≡ each alone.
- An image's tokens count in usage: the prompt grows by the processor's token count plus the markup's two.
- Kept prompt states: a resent image resumes past it with the same reply; another image under the same text does
  not resume past the text before it.
- A video (chat video_url, an MP4 data URL): TP=2 with drafts ≡ TP=1 without, batched ≡ alone; its tokens count in
  usage (each frame pair's rows, its markup and its time); each video refusal is a 400 and the server serves on.
- Each limit is a 400 naming its setting (images per request, bytes, pixels), as are URLs while VISION_URLS=0, a
  private address while it is 1, bad base64, bytes that are no image, and text that writes the placeholder itself;
  the server serves on after every one.
"""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Iterator

import anthropic
import httpx
import openai
import pytest
from media import encode, frames
from PIL import Image
from test_api_live import KEY, LiveServer, serve_checkpoint

from engine.checkpoint.demo import TRAINED
from engine.vision.preprocess import ProcessorSpec, image_tokens
from engine.vision.video import decode_video

pytestmark = pytest.mark.slow
FLAGS = [
    *("--vision", "1", "--vision-max-images", "2", "--vision-max-mb", "0.1", "--vision-max-pixels", "250000"),
    *("--vision-max-videos", "1", "--vision-max-frames", "4", "--vision-video-tokens", "48"),
    *("--context", "1024", "--parallel", "3", "--prefill-chunk", "16", "--drafter", "mtp+copy"),
]
SPEC = ProcessorSpec.from_config(json.loads((TRAINED / "config.json").read_text())["vision_config"])


@pytest.fixture(scope="module")
def tp2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from serve_checkpoint(TRAINED, tmp_path_factory, FLAGS, tp=2)


@pytest.fixture(scope="module")
def tp1(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from serve_checkpoint(TRAINED, tmp_path_factory, [*FLAGS, "--vision-urls", "1"], tp=1)


def png(width: int, height: int, seed: int, noise: bool = False) -> bytes:
    """A PNG: a colour gradient by seed (small file), or noise (a file as big as its pixels)."""
    if noise:
        import random

        rng = random.Random(seed)
        image = Image.frombytes("RGB", (width, height), bytes(rng.randrange(256) for _ in range(width * height * 3)))
    else:
        image = Image.linear_gradient("L").resize((width, height)).convert("RGB")
        image = Image.merge(
            "RGB", [b.point(lambda v, k=k: (v * (k + seed)) % 256) for k, b in enumerate(image.split())]
        )
    out = io.BytesIO()
    image.save(out, "PNG")
    return out.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def chat(client: openai.OpenAI, images: list[bytes], text: str = "Describe the picture.", **extra):
    content = [{"type": "image_url", "image_url": {"url": data_url(i)}} for i in images]
    return client.chat.completions.create(
        model="GLM-5.3-Flash",
        messages=[{"role": "user", "content": [*content, {"type": "text", "text": text}]}],
        max_tokens=24,
        temperature=0.0,
        extra_body={"return_token_ids": True, "chat_template_kwargs": {"enable_thinking": False}, **extra},
    )


def client_for(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0)


def ids(reply) -> list[int]:
    return reply.choices[0].model_extra["token_ids"]


def test_image_replies_agree_across_tp_and_batching(tp1: LiveServer, tp2: LiveServer) -> None:
    images = [png(64, 48, 1), png(120, 90, 2), png(30, 200, 3)]
    one, two = client_for(tp1), client_for(tp2)
    serial = [ids(chat(one, [im], draft=False)) for im in images]
    assert [ids(chat(two, [im])) for im in images] == serial  # TP=2 (drafting) ≡ TP=1 without drafts
    burst: dict[int, list[int]] = {}

    def run(k: int) -> None:
        burst[k] = ids(chat(two, [images[k]]))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(images))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [burst.get(k) for k in range(len(images))] == serial
    # two images in one request
    assert ids(chat(one, images[:2])) == ids(chat(two, images[:2]))


def test_image_tokens_count_and_the_image_changes_the_prompt(tp2: LiveServer) -> None:
    client = client_for(tp2)
    text_only = chat(client, [])
    small, large = chat(client, [png(64, 48, 1)]), chat(client, [png(120, 90, 1)])
    for reply, (w, h) in ((small, (64, 48)), (large, (120, 90))):
        assert reply.usage.prompt_tokens == text_only.usage.prompt_tokens + image_tokens(w, h, SPEC) + 2
    # the tower's rows reach the model: another image under the same text changes the first token's distribution
    first = [
        chat(client, [png(64, 48, seed)], logprobs=True, top_logprobs=3).choices[0].logprobs.content[0]
        for seed in (1, 5)
    ]
    assert [(t.token, t.logprob) for t in first[0].top_logprobs] != [
        (t.token, t.logprob) for t in first[1].top_logprobs
    ]


def test_kept_states_resume_the_same_image_only(tp2: LiveServer) -> None:
    client = client_for(tp2)
    text = "Tell me about the shapes in it, please, in three short sentences."
    first = chat(client, [png(96, 96, 7)], text)
    again = chat(client, [png(96, 96, 7)], text)
    other = chat(client, [png(96, 96, 8)], text)
    assert ids(again) == ids(first)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 16  # resumed past the image (to the last whole chunk)
    assert other.usage.prompt_tokens_details.cached_tokens < 16  # the image is near the start: no state past it


def test_anthropic_base64_image_blocks(tp2: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=tp2.url, api_key=KEY, max_retries=0)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    image["source"]["data"] = base64.b64encode(png(64, 48, 1)).decode()
    messages = [{"role": "user", "content": [image, {"type": "text", "text": "Describe the picture."}]}]
    reply = client.messages.create(model="GLM-5.3-Flash", max_tokens=16, messages=messages)
    assert reply.content and reply.usage.input_tokens > image_tokens(64, 48, SPEC)
    counted = client.messages.count_tokens(model="GLM-5.3-Flash", messages=messages)
    plain = client.messages.count_tokens(
        model="GLM-5.3-Flash",
        messages=[{"role": "user", "content": [{"type": "text", "text": "Describe the picture."}]}],
    )
    assert counted.input_tokens == plain.input_tokens + image_tokens(64, 48, SPEC) + 2 == reply.usage.input_tokens


def test_responses_input_image(tp2: LiveServer) -> None:
    client = client_for(tp2)
    content = [
        {"type": "input_image", "image_url": data_url(png(64, 48, 1))},
        {"type": "input_text", "text": "Describe the picture."},
    ]
    reply = client.responses.create(
        model="GLM-5.3-Flash", input=[{"role": "user", "content": content}], max_output_tokens=16
    )
    assert reply.status in ("completed", "incomplete") and reply.usage.input_tokens > image_tokens(64, 48, SPEC)


def _post(server: LiveServer, content: list[dict]) -> httpx.Response:
    body = {"model": "GLM-5.3-Flash", "max_tokens": 4, "messages": [{"role": "user", "content": content}]}
    return httpx.post(
        server.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
    )


def _image(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


REFUSALS = [
    ("three images", [_image(data_url(png(32, 32, k))) for k in range(3)], "VISION_MAX_IMAGES"),
    ("bytes", [_image(data_url(png(200, 200, 1, noise=True)))], "VISION_MAX_MB"),
    ("pixels", [_image(data_url(png(600, 500, 1)))], "VISION_MAX_PIXELS"),
    ("base64", [_image("data:image/png;base64,not*base64")], "base64"),
    ("not an image", [_image("data:image/png;base64," + base64.b64encode(b"hello, world").decode())], "image"),
    ("placeholder", [_image(data_url(png(32, 32, 1))), {"type": "text", "text": "see <|image|>"}], "placeholder"),
    ("ftp", [_image("ftp://example.com/a.png")], "https"),
]


def _video(url: str) -> dict:
    return {"type": "video_url", "video_url": {"url": url}}


def video_url(data: bytes) -> str:
    return "data:video/mp4;base64," + base64.b64encode(data).decode()


def clip(seed: int, count: int = 16, width: int = 64, height: int = 48) -> bytes:
    return encode(frames(count, width, height, seed=seed, noise=width * height < 10_000), fps=8)


def video_chat(client: openai.OpenAI, data: bytes, **extra):
    return client.chat.completions.create(
        model="GLM-5.3-Flash",
        messages=[{"role": "user", "content": [_video(video_url(data)), {"type": "text", "text": "What happens?"}]}],
        max_tokens=16,
        temperature=0.0,
        extra_body={"return_token_ids": True, "chat_template_kwargs": {"enable_thinking": False}, **extra},
    )


def test_video_replies_agree_across_tp_drafts_and_batching_and_count_in_usage(tp1: LiveServer, tp2: LiveServer) -> None:
    from tokenizers import Tokenizer

    clips = [clip(1), clip(2, count=24)]
    one, two = client_for(tp1), client_for(tp2)
    serial = [ids(video_chat(one, c, draft=False)) for c in clips]
    assert [ids(video_chat(two, c)) for c in clips] == serial
    burst: dict[int, list[int]] = {}

    def run(k: int) -> None:
        burst[k] = ids(video_chat(two, clips[k]))

    threads = [threading.Thread(target=run, args=(k,)) for k in range(len(clips))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert [burst.get(k) for k in range(len(clips))] == serial
    # usage: the text-only prompt + the video's markup: per pair begin, rows, end and its time; begin/end of video
    tokenizer = Tokenizer.from_file(str(TRAINED / "tokenizer.json"))
    video = decode_video(clips[0], 250_000, 4, ProcessorSpec(max_tokens=48))
    times = sum(len(tokenizer.encode(f"{s:.1f} seconds", add_special_tokens=False).ids) for s in video.seconds)
    text_only = one.chat.completions.create(
        model="GLM-5.3-Flash",
        messages=[{"role": "user", "content": [{"type": "text", "text": "What happens?"}]}],
        max_tokens=1,
        extra_body={"chat_template_kwargs": {"enable_thinking": False}},
    )
    expected = text_only.usage.prompt_tokens + 2 + video.tokens + 2 * len(video.pairs) + times
    assert video_chat(one, clips[0]).usage.prompt_tokens == expected
    assert len(video.pairs) == 2  # VISION_MAX_FRAMES=4: two pairs


VIDEO_REFUSALS = [
    ("two videos", [_video(video_url(clip(1))), _video(video_url(clip(2)))], "VISION_MAX_VIDEOS"),
    ("too short", [_video(video_url(clip(1, count=2)))], "samples no frame"),
    ("an image as a video", [_video(data_url(png(32, 32, 1)))], "not a video type"),
    ("a video as an image", [_image(video_url(clip(1)))], "not an image type"),
    ("no video stream", [_video(video_url(b"RIFF" + bytes(60)))], "video"),
    ("pixels", [_video(video_url(clip(1, count=8, width=640, height=480)))], "VISION_MAX_PIXELS"),
    ("placeholder", [_video(video_url(clip(1))), {"type": "text", "text": "and <|video|>"}], "placeholder"),
]


@pytest.mark.parametrize("case, content, words", VIDEO_REFUSALS, ids=[r[0] for r in VIDEO_REFUSALS])
def test_bad_videos_get_a_400_and_the_server_serves_on(tp2: LiveServer, case: str, content: list, words: str) -> None:
    answer = _post(tp2, content)
    assert answer.status_code == 400, answer.text
    assert words.lower() in answer.json()["error"]["message"].lower(), answer.text
    assert _post(tp2, [_video(video_url(clip(3)))]).status_code == 200


def test_images_are_taken_in_user_turns_only(tp2: LiveServer) -> None:
    image = _image(data_url(png(32, 32, 1)))
    for role in ("system", "assistant"):
        body = {
            "model": "GLM-5.3-Flash",
            "max_tokens": 4,
            "messages": [{"role": role, "content": [image]}, {"role": "user", "content": "hi"}],
        }
        answer = httpx.post(
            tp2.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=60
        )
        assert answer.status_code == 400 and "user turns" in answer.json()["error"]["message"], answer.text


@pytest.mark.parametrize("case, content, words", REFUSALS, ids=[r[0] for r in REFUSALS])
def test_bad_images_get_a_400_and_the_server_serves_on(tp2: LiveServer, case: str, content: list, words: str) -> None:
    answer = _post(tp2, content)
    assert answer.status_code == 400, answer.text
    assert words.lower() in answer.json()["error"]["message"].lower(), answer.text
    assert _post(tp2, [_image(data_url(png(32, 32, 1)))]).status_code == 200


def test_urls_are_refused_without_vision_urls_and_private_addresses_with_it(tp1: LiveServer, tp2: LiveServer) -> None:
    answer = _post(tp2, [_image("https://example.com/cat.png")])  # VISION_URLS=0: nothing is fetched
    assert answer.status_code == 400 and "VISION_URLS=0" in answer.json()["error"]["message"]
    for url in ("https://127.0.0.1:9/cat.png", "https://10.1.2.3/cat.png", "https://169.254.169.254/latest"):
        answer = _post(tp1, [_image(url)])  # VISION_URLS=1: checked before any connection
        assert answer.status_code == 400 and "address" in answer.json()["error"]["message"], answer.text
    # an Anthropic url source goes the same way
    client = anthropic.Anthropic(base_url=tp1.url, api_key=KEY, max_retries=0)
    block = {"type": "image", "source": {"type": "url", "url": "https://10.1.2.3/cat.png"}}
    with pytest.raises(anthropic.BadRequestError, match="address"):
        client.messages.create(model="GLM-5.3-Flash", max_tokens=4, messages=[{"role": "user", "content": [block]}])
    health = httpx.get(tp1.url + "/health").json()
    assert health["ok"] and health["vision"]["enabled"] and health["vision"]["urls"]
    assert health["memory"]["weights_bytes"]["vision"] == health["vision"]["tower_bytes"] > 0


def test_the_start_smoke_tests_image_request_is_answered(tp2: LiveServer) -> None:
    from recipe.launch.smoke import sample_png, smoke_image

    assert Image.open(io.BytesIO(sample_png())).size == (48, 32)  # the recipe's own PNG writer makes a real PNG
    assert smoke_image(tp2.url + "/v1", "GLM-5.3-Flash", KEY) > 0


def test_the_document_offers_image_parts(tp2: LiveServer) -> None:
    from engine.server.openapi import IMAGE_SCHEMAS

    document = httpx.get(tp2.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    components = document["components"]["schemas"]
    assert set(IMAGE_SCHEMAS) <= set(components)
