"""Images in chat requests: which parts hold them, reading and preparing them, and placing their rows in the prompt.

A request's image parts (chat `image_url`, Anthropic `image` blocks and Responses `input_image`, translated to chat
parts) are rendered by the chat template as the checkpoint's image markup, `<|begin_of_image|><|image|><|end_of_image|>`
in the turn's text where the part stood. After tokenising, each image's one `<|image|>` id becomes as many ids as
the image has rows (its size after the processor's resize), and the request carries the image (engine/vision/
prompt.py `PromptImage`) for the vision tower, which rank 0 runs when the prompt chunk holding it is prefilled.

Sources: `data:` URLs always; https URLs only with VISION_URLS=1 (engine/vision/fetch.py: public addresses only,
no redirects, a byte cap, timeouts). Limits (each breach a 400 naming the limit and its setting): images per request
(VISION_MAX_IMAGES), bytes per image (VISION_MAX_MB), pixels per image as sent (VISION_MAX_PIXELS).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.models.glm5_next.vision import ImageTokens
from engine.server.errors import bad_request
from engine.server.protocol import ImagePart
from engine.vision.fetch import FetchPolicy, SourceError, fetch_image, read_data_url
from engine.vision.preprocess import ImageError, PreparedImage, ProcessorSpec, decode_image, prepare_image
from engine.vision.prompt import PromptImage

IMAGE_MARKUP = "<|begin_of_image|><|image|><|end_of_image|>"


@dataclass(frozen=True)
class VisionService:
    """What the routes need to take images: the processor's settings, the markup's ids, the limits."""

    spec: ProcessorSpec
    tokens: ImageTokens
    max_images: int = 8
    max_bytes: int = 20 * 2**20
    max_pixels: int = 40_000_000
    urls: bool = False  # VISION_URLS: fetch https URLs
    fetch: FetchPolicy = field(default_factory=lambda: FetchPolicy(max_bytes=20 * 2**20))

    def read(self, url: str) -> bytes:
        """The bytes behind an image part's URL (400 for a source this server refuses)."""
        try:
            if url.startswith("data:"):
                return read_data_url(url, self.max_bytes)[1]
            if url.startswith(("https://", "http://")):
                if not self.urls:
                    raise SourceError(
                        "this server does not fetch image URLs (VISION_URLS=0): send the image as a base64 data URL"
                    )
                return fetch_image(url, self.fetch)[1]
            raise SourceError(f"an image URL must be a data: URL or an https URL (got {url[:40]!r})")
        except SourceError as exc:
            named = " (VISION_MAX_MB)" if "byte limit" in str(exc) else ""  # the setting behind the cap
            raise bad_request(f"{exc}{named}", "messages", code="invalid_image") from exc

    def prepare(self, url: str) -> PreparedImage:
        data = self.read(url)
        try:
            return prepare_image(decode_image(data, self.max_pixels), self.spec)
        except ImageError as exc:
            named = " (VISION_MAX_PIXELS)" if "over the limit" in str(exc) else ""  # the setting behind the cap
            raise bad_request(f"{exc}{named}", "messages", code="invalid_image") from exc


def image_urls(messages: list[Any]) -> list[str]:
    """The URLs of a chat request's image parts, in prompt order. Images are taken in user turns only: the template
    renders those in order, where it may reorder others (tool results follow their calls' order), which would put
    an image's rows at another image's place."""
    urls = []
    for message in messages:
        for part in message.content if isinstance(message.content, list) else ():
            if isinstance(part, ImagePart):
                if message.role != "user":
                    raise bad_request(
                        f"an image in a {message.role} turn: images are taken in user turns only",
                        "messages",
                        code="invalid_image",
                    )
                urls.append(part.image_url.url)
    return urls


def prepare_images(vision: VisionService | None, urls: list[str]) -> list[PreparedImage]:
    """Each image read and prepared for the tower (runs in a worker thread: decoding and fetching take time)."""
    if not urls:
        return []
    if vision is None:
        raise bad_request(
            "this server does not take images (VISION=0); send text only, or start it with VISION=1",
            "messages",
            code="vision_disabled",
        )
    if len(urls) > vision.max_images:
        raise bad_request(
            f"{len(urls)} images in one request; this server takes at most {vision.max_images} (VISION_MAX_IMAGES)",
            "messages",
            code="too_many_images",
        )
    return [vision.prepare(url) for url in urls]


def place_images(
    ids: list[int], prepared: list[PreparedImage], tokens: ImageTokens | None
) -> tuple[list[int], list[PromptImage]]:
    """The prompt's ids with each image's `<|image|>` id repeated for its rows, and where each image sits. The
    rendered markup gives exactly one `<|image|>` per image; text that writes the markup itself is refused."""
    if not prepared:
        return ids, []
    assert tokens is not None
    spots = [i for i, t in enumerate(ids) if t == tokens.image]
    if len(spots) != len(prepared):
        raise bad_request(
            f"the messages' text holds the image placeholder token itself ({len(spots)} placeholders for "
            f"{len(prepared)} images); send images as image parts and leave <|image|> out of the text",
            "messages",
            code="invalid_image",
        )
    out: list[int] = []
    images: list[PromptImage] = []
    last = 0
    for spot, image in zip(spots, prepared):
        out += ids[last:spot]
        images.append(PromptImage(len(out), image.tokens, image, image.grid, image.digest))
        out += [tokens.image] * image.tokens
        last = spot + 1
    out += ids[last:]
    return out, images
