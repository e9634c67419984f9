"""Images and videos in chat requests: which parts hold them, reading and preparing them, and placing their rows in
the prompt.

A request's image parts (chat `image_url`, Anthropic `image` blocks and Responses `input_image`, translated to chat
parts) are rendered by the chat template as the checkpoint's image markup, `<|begin_of_image|><|image|><|end_of_image|>`
in the turn's text where the part stood. After tokenising, each image's one `<|image|>` id becomes as many ids as
the image has rows (its size after the processor's resize), and the request carries the image (engine/vision/
prompt.py `PromptImage`) for the vision tower, which rank 0 runs when the prompt chunk holding it is prefilled.

A video part (chat `video_url`) is rendered as `<|begin_of_video|><|video|><|end_of_video|>`; its `<|video|>` id
becomes its frame pairs' markup, each pair an image (`<|begin_of_image|>`, a row per `<|image|>`,
`<|end_of_image|>`) followed by the time of its first frame ("1.5 seconds"), as the reference processor writes it
(engine/vision/video.py); each pair is a PromptImage of the video's media item, keyed by the whole video (a kept
state past a pair is only resumed by the same video: the tower encodes a video's pairs in one call, so a pair's
rows are those of its whole video).

Sources: `data:` URLs always; https URLs only with VISION_URLS=1 (engine/vision/fetch.py: public addresses only,
no redirects, a byte cap, timeouts). Limits (each breach a 400 naming the limit and its setting): images per request
(VISION_MAX_IMAGES), videos per request (VISION_MAX_VIDEOS), bytes per image or video (VISION_MAX_MB), pixels per
image or video frame as sent (VISION_MAX_PIXELS); a video's frames are capped by sampling (VISION_MAX_FRAMES) and
its rows by shrinking its frames (VISION_VIDEO_TOKENS).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.models.glm5_next.vision import ImageTokens
from engine.server.errors import bad_request
from engine.server.protocol import ImagePart, VideoPart
from engine.vision.fetch import ARTICLES, FetchPolicy, SourceError, fetch_image, read_data_url
from engine.vision.preprocess import ImageError, PreparedImage, ProcessorSpec, decode_image, prepare_image
from engine.vision.prompt import PromptImage
from engine.vision.video import PreparedVideo, decode_video

IMAGE_MARKUP = "<|begin_of_image|><|image|><|end_of_image|>"
VIDEO_MARKUP = "<|begin_of_video|><|video|><|end_of_video|>"


@dataclass(frozen=True)
class VisionService:
    """What the routes need to take images and videos: the processor's settings, the markup's ids, the limits."""

    spec: ProcessorSpec
    tokens: ImageTokens
    video_spec: ProcessorSpec = field(default_factory=lambda: ProcessorSpec(max_tokens=16384))  # a video's budget
    max_images: int = 8
    max_videos: int = 4
    max_frames: int = 128
    max_bytes: int = 20 * 2**20
    max_pixels: int = 40_000_000
    urls: bool = False  # VISION_URLS: fetch https URLs
    fetch: FetchPolicy = field(default_factory=lambda: FetchPolicy(max_bytes=20 * 2**20))

    def read(self, url: str, kind: str = "image") -> bytes:
        """The bytes behind an image (video) part's URL (400 for a source this server refuses)."""
        try:
            if url.startswith("data:"):
                return read_data_url(url, self.max_bytes, kind)[1]
            if url.startswith(("https://", "http://")):
                if not self.urls:
                    raise SourceError(
                        f"this server does not fetch {kind} URLs (VISION_URLS=0): send the {kind} as a base64 data URL"
                    )
                return fetch_image(url, self.fetch, kind)[1]
            raise SourceError(f"{ARTICLES[kind]} URL must be a data: URL or an https URL (got {url[:40]!r})")
        except SourceError as exc:
            named = " (VISION_MAX_MB)" if "byte limit" in str(exc) else ""  # the setting behind the cap
            raise bad_request(f"{exc}{named}", "messages", code=f"invalid_{kind}") from exc

    def prepare(self, url: str, kind: str = "image") -> PreparedImage | PreparedVideo:
        """An image (video) part read, decoded under the limits and prepared for the tower (400 when refused)."""
        data = self.read(url, kind)
        try:
            if kind == "image":
                return prepare_image(decode_image(data, self.max_pixels), self.spec)
            return decode_video(data, self.max_pixels, self.max_frames, self.video_spec)
        except ImageError as exc:  # VideoError is one too
            named = " (VISION_MAX_PIXELS)" if "over the limit" in str(exc) else ""  # the setting behind the cap
            raise bad_request(f"{exc}{named}", "messages", code=f"invalid_{kind}") from exc


def media_parts(messages: list[Any]) -> list[tuple[str, str]]:
    """(kind, URL) of a chat request's image and video parts, in prompt order. They are taken in user turns only:
    the template renders those in order, where it may reorder others (tool results follow their calls' order),
    which would put an image's rows at another image's place."""
    parts = []
    for message in messages:
        for part in message.content if isinstance(message.content, list) else ():
            if isinstance(part, ImagePart | VideoPart):
                kind = "image" if isinstance(part, ImagePart) else "video"
                if message.role != "user":
                    raise bad_request(
                        f"{ARTICLES[kind]} in a {message.role} turn: images and videos are taken in user turns only",
                        "messages",
                        code=f"invalid_{kind}",
                    )
                parts.append((kind, part.image_url.url if isinstance(part, ImagePart) else part.video_url.url))
    return parts


def prepare_media(vision: VisionService | None, parts: list[tuple[str, str]]) -> list[PreparedImage | PreparedVideo]:
    """Each image and video read and prepared for the tower (runs in a worker thread: decoding and fetching take
    time)."""
    if not parts:
        return []
    if vision is None:
        raise bad_request(
            "this server does not take images or videos (VISION=0); send text only, or start it with VISION=1",
            "messages",
            code="vision_disabled",
        )
    for kind, limit, setting in (("image", vision.max_images, "IMAGES"), ("video", vision.max_videos, "VIDEOS")):
        count = sum(1 for k, _ in parts if k == kind)
        if count > limit:
            raise bad_request(
                f"{count} {kind}s in one request; this server takes at most {limit} (VISION_MAX_{setting})",
                "messages",
                code=f"too_many_{kind}s",
            )
    return [vision.prepare(url, kind) for kind, url in parts]


def place_media(
    ids: list[int],
    prepared: list[PreparedImage | PreparedVideo],
    tokens: ImageTokens | None,
    encode: Callable[[str], list[int]],
) -> tuple[list[int], list[PromptImage]]:
    """The prompt's ids with each image's `<|image|>` id repeated for its rows and each video's `<|video|>` id
    replaced by its frame pairs' markup (`encode` tokenises the times), and where each image or frame pair sits.
    The rendered markup gives exactly one placeholder per part; text that writes one itself is refused."""
    if not prepared:
        return ids, []
    assert tokens is not None
    spots = [i for i, t in enumerate(ids) if t in (tokens.image, tokens.video)]
    expected = [tokens.image if isinstance(item, PreparedImage) else tokens.video for item in prepared]
    if [ids[i] for i in spots] != expected:
        raise bad_request(
            f"the messages' text holds an image or video placeholder token itself ({len(spots)} placeholders for "
            f"{len(prepared)} images and videos); send them as parts and leave <|image|> and <|video|> out of the "
            "text",
            "messages",
            code="invalid_image",
        )
    out: list[int] = []
    images: list[PromptImage] = []

    def place(image: PreparedImage, number: int, digest: bytes) -> None:
        images.append(PromptImage(len(out), image.tokens, image, image.grid, digest, number))
        out.extend([tokens.image] * image.tokens)

    last = 0
    for number, (spot, item) in enumerate(zip(spots, prepared)):
        out += ids[last:spot]
        if isinstance(item, PreparedImage):
            place(item, number, item.digest)
        else:
            for index, (pair, seconds) in enumerate(zip(item.pairs, item.seconds)):
                out.append(tokens.begin)
                place(pair, number, item.pair_digest(index))
                out.append(tokens.end)
                out += encode(f"{seconds:.1f} seconds")
        last = spot + 1
    out += ids[last:]
    return out, images
