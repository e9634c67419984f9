"""Prompt reuse: kept prompt states, and new requests resumed from the longest one their prompt starts with.

This model is a hybrid. Its KDA layers carry one recurrent state per stream (and a short conv window), not rows per
token, so a prefix can be resumed only where that state was kept; its DSA layers keep a row per token in the shared
pool, which a resumed stream can read where they lie. A kept state is therefore a snapshot of every KDA layer's
state and conv window at one position, plus the pool rows of the tokens before it, held as shared, reference-counted
pool slots (`KVPool.share`), never copied.

**Exact by construction.** A prompt is prefilled in chunks of `prefill_chunk` tokens from position 0, so chunk
boundaries sit at fixed positions. States are kept only at a chunk's end, keyed by a hash chain over the chunks
before it (`chunk_keys`; a prompt's last, shorter chunk is keyed too, so that key fits only a prompt that ends
there). Two prompts with the same key went through the same chunks, so the kept state has the bits the new prompt's
own cold prefill would have reached there; the new request then prefills its remaining chunks exactly as a cold
request would (the same boundaries from there on). A resumed reply therefore equals the cold reply token for token.
States reached by decoding (a reply's tokens) are not kept: a decode step and a prompt chunk compute a token's rows
in a different order, so a next turn that resends the reply re-prefills it (from the last whole-chunk boundary of
the earlier prompt, which the reply follows).

**Where states are kept** (`PrefixIndex.wants`): at the end of a prompt, with its last token's logits (the same
prompt sent again needs no prefill at all: its first token is sampled from them); at the last whole-chunk boundary
before that (the next turn of a conversation resumes there); at the boundary before each chat role token (the end
of a system prompt, of each earlier message: a new conversation with the same system prompt resumes there); and
every `EVERY` tokens of a long prompt. A request that reaches a state another request kept meanwhile takes that
state's rows instead of its own (`KeptStates.adopt`), so a prefix prefilled twice at once is still held once.

**Memory.** Pool rows of kept states live inside the pool; KDA snapshots under a cap in bytes (PROMPT_REUSE_GIB).
The index is a tree: each kept state (a node) holds the rows from its parent's position to its own (its page), so a
prefix shared by many states is held once. A running request pins the nodes whose rows it uses (those it resumed
through and those it kept): their rows are inside its own pool budget. Unpinned nodes are what kept states hold
beyond the running requests; admission evicts them (least recently used leaves first) whenever a request would
otherwise wait, so kept states never refuse or delay a request. Snapshots are evicted under the cap (a node without a
snapshot stays while a descendant needs its rows).

Rank 0 decides (`PrefixIndex`, host-side only); every rank applies the decisions carried by the step plan
(`KeptStates`: keep or adopt after a prefill chunk, resume an admitted lane, drop), so all ranks hold the same
states, each its own shard.
"""

from __future__ import annotations

import hashlib
import heapq
import itertools
from array import array
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.cache import Sequence

EVERY = 4096  # a long prompt keeps a state at least this often (tokens)
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|observation|>")


def chunk_keys(prompt: list[int], chunk: int, salt: str = "") -> list[bytes]:
    """keys[k]: the key of the state after the first k + 1 chunks of `prompt` as it is prefilled (whole chunks, the
    last one possibly shorter: its key then matches only a prompt that ends there too). A hash chain: each key
    covers every token before its boundary, and `salt` (a client's cache_salt)."""
    keys, key = [], hashlib.blake2b(salt.encode(), digest_size=16).digest()
    for start in range(0, len(prompt), chunk):
        key = hashlib.blake2b(key + array("q", prompt[start : start + chunk]).tobytes(), digest_size=16).digest()
        keys.append(key)
    return keys


@dataclass(eq=False)
class Node:
    id: int
    key: bytes
    end: int  # tokens before the kept state
    parent: Node | None
    snapshot: bool = True  # False once its KDA snapshot is evicted: only its rows stay, for its descendants
    pins: int = 0  # running requests whose rows include this node's page
    children: int = 0
    used: int = 0  # the index's clock when last kept or resumed from
    logits: Any = None  # the last token's logits there (rank 0, CPU): a prompt ending here samples from them

    @property
    def start(self) -> int:
        return self.parent.end if self.parent is not None else 0

    @property
    def page(self) -> int:
        return self.end - self.start

    def path(self) -> list[Node]:
        """Root first."""
        out: list[Node] = []
        node: Node | None = self
        while node is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


@dataclass
class PrefixIndex:
    """Rank 0's view of the kept states: which exist, which a prompt can resume from, what to evict. Host-side; the
    step plan carries its decisions (keeps, resumes, drops) to every rank's `KeptStates`."""

    chunk: int  # the scheduler's prefill chunk: states sit at its multiples
    snapshot_bytes: int  # one KDA snapshot on rank 0 (the largest shard)
    cap_bytes: int  # PROMPT_REUSE_GIB
    marks: frozenset[int] = frozenset()  # role token ids: a state is kept at the boundary before each
    nodes: dict[bytes, Node] = field(default_factory=dict)
    queries: int = 0  # prompt tokens of requests that could resume (vLLM's prefix_cache_queries)
    hits: int = 0  # of those, tokens resumed from kept states (prefix_cache_hits)
    _clock: Any = field(default_factory=itertools.count)
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _unpinned: int = field(default=0, init=False)  # pool rows of unpinned nodes (kept up to date: read every step)
    snapshots: int = field(default=0, init=False)  # nodes holding a snapshot

    def match(self, keys: list[bytes]) -> Node | None:
        """The deepest kept state (with its snapshot) that a prompt with these chunk keys starts with."""
        for key in reversed(keys):
            node = self.nodes.get(key)
            if node is not None and node.snapshot:
                return node
        return None

    def touch(self, node: Node) -> None:
        for n in node.path():
            n.used = next(self._clock)

    def pin(self, node: Node, by: int = 1) -> None:
        for n in node.path():
            was = n.pins
            n.pins += by
            if (was == 0) != (n.pins == 0):
                self._unpinned += n.page if n.pins == 0 else -n.page

    def wants(self, prompt: list[int], end: int, last_kept: int) -> bool:
        """Whether a state is kept at boundary `end` of `prompt` (see the module's note)."""
        last = (len(prompt) - 1) // self.chunk * self.chunk
        if end in (len(prompt), last) or end - last_kept >= EVERY:
            return True
        return any(t in self.marks for t in prompt[end : end + self.chunk])

    def add(self, key: bytes, end: int, parent: Node | None) -> tuple[Node | None, list[tuple[int, bool]]]:
        """A new kept state at `end` (its snapshot taken now), under `parent`; with the drops that make room for its
        snapshot under the cap. (None, []) when the cap cannot hold even one."""
        if self.snapshot_bytes > self.cap_bytes:
            return None, []
        drops = []
        while (self.snapshots + 1) * self.snapshot_bytes > self.cap_bytes:
            oldest = min((n for n in self.nodes.values() if n.snapshot), key=lambda n: n.used)
            drops += self._drop_snapshot(oldest, keep=parent)
        node = Node(next(self._ids), key, end, parent, used=next(self._clock))
        if parent is not None:
            parent.children += 1
        self.nodes[key] = node
        self.snapshots += 1
        self._unpinned += node.page
        return node, drops

    def forget(self, node: Node) -> list[tuple[int, bool]]:
        """Take out a state `add` made for a prompt chunk whose step failed: no rank kept it, so nothing of it is
        dropped; then the drops of what that leaves unreachable (`prune`). A state someone holds stays."""
        if self.nodes.get(node.key) is node and node.pins == 0 and node.children == 0:
            self._remove(node)
        return self.prune()

    def unpinned_tokens(self, besides: Node | None = None) -> int:
        """Pool rows held by kept states and by no running request (`besides`: a path about to be pinned)."""
        spared = besides.path() if besides is not None else []
        return self._unpinned - sum(n.page for n in spared if n.pins == 0)

    def evict(self, tokens: int, besides: Node | None = None) -> list[tuple[int, bool]]:
        """Drop unpinned states, least recently used leaves first, until `tokens` rows are freed or none is left."""
        spared = set(besides.path()) if besides is not None else set()

        def evictable(n: Node) -> bool:
            return n.pins == 0 and n.children == 0 and n not in spared

        leaves = [(n.used, n.id, n) for n in self.nodes.values() if evictable(n)]
        heapq.heapify(leaves)
        drops: list[tuple[int, bool]] = []
        freed = 0
        while freed < tokens and leaves:
            leaf = heapq.heappop(leaves)[2]
            freed += leaf.page
            drops += self._remove(leaf)
            if leaf.parent is not None and evictable(leaf.parent):  # a leaf now
                heapq.heappush(leaves, (leaf.parent.used, leaf.parent.id, leaf.parent))
        return drops

    def prune(self) -> list[tuple[int, bool]]:
        """Remove unpinned leaves without a snapshot (nothing can resume from them), up their chains."""
        drops: list[tuple[int, bool]] = []
        while dead := [n for n in self.nodes.values() if n.pins == 0 and n.children == 0 and not n.snapshot]:
            for node in dead:
                drops += self._remove(node)
        return drops

    def _drop_snapshot(self, node: Node, keep: Node | None) -> list[tuple[int, bool]]:
        self.snapshots -= node.snapshot
        node.snapshot, node.logits = False, None
        if node.pins == 0 and node.children == 0 and node is not keep:
            return self._remove(node)
        return [(node.id, False)]

    def _remove(self, node: Node) -> list[tuple[int, bool]]:
        del self.nodes[node.key]
        self.snapshots -= node.snapshot
        self._unpinned -= node.page if node.pins == 0 else 0
        if node.parent is not None:
            node.parent.children -= 1
        return [(node.id, True)]

    def stats(self, bytes_per_token: int) -> dict[str, Any]:
        tokens = sum(n.page for n in self.nodes.values())
        return {
            "enabled": True,
            "states": self.snapshots,
            "nodes": len(self.nodes),
            "tokens": tokens,
            "snapshot_bytes": self.snapshots * self.snapshot_bytes,
            "row_bytes": tokens * bytes_per_token,
            "cap_bytes": self.cap_bytes,
            "queries_tokens": self.queries,
            "hits_tokens": self.hits,
        }


class KeptStates:
    """One rank's kept states, applied from the step plans: each node's page (pool slots it shares) and, while it
    has one, its KDA snapshot (every layer's state and conv window, copies)."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self.pages: dict[int, list[int]] = {}
        # node -> (KDA states, conv windows, the MTP layer's carried hidden row or None), copies
        self.snapshots: dict[int, tuple[dict[int, torch.Tensor], dict[int, torch.Tensor], torch.Tensor | None]] = {}

    def keep(self, node: int, seq: Sequence, start: int) -> None:
        """After a prefill chunk: keep `seq`'s state at its length, and its rows from `start` (its parent's end)."""
        snapshot = (  # copied first: a copy that fails (the GPU out of memory) leaves nothing kept or shared
            {layer: t.clone() for layer, t in seq.kda_state.items()},
            {layer: t.clone() for layer, t in seq.conv_state.items()},
            seq.hidden[:1].clone() if seq.hidden is not None else None,
        )
        page = seq.slot_ids[start : seq.length]
        self.pool.share(page)
        self.pages[node] = page
        self.snapshots[node] = snapshot

    def drop(self, node: int, whole: bool) -> None:
        self.snapshots.pop(node, None)
        if whole:
            self.pool.release(self.pages.pop(node))

    def resume(self, seq: Sequence, path: list[int]) -> None:
        """A fresh sequence goes on from the last node of `path` (root first): its rows shared, its state copied."""
        seq.take_over(self._shared(path))
        kda, conv, hidden = self.snapshots[path[-1]]
        for layer in kda:
            seq.store_state(layer, kda[layer].clone(), conv[layer].clone())
        if hidden is not None:
            if seq.hidden is None:
                seq.hidden = hidden.clone()
            else:
                seq.hidden[:1] = hidden

    def adopt(self, seq: Sequence, path: list[int]) -> None:
        """`seq` has just prefilled up to the end of `path`, where another request kept the same chunks: it holds
        the kept rows instead of its own (the same bits), so the pool holds that prefix once."""
        seq.take_over(self._shared(path))

    def _shared(self, path: list[int]) -> list[int]:
        """The rows of `path` (root first), one more holder added for each."""
        slots = [s for node in path for s in self.pages[node]]
        self.pool.share(slots)
        return slots

    def release_all(self) -> None:
        for node in list(self.pages):
            self.drop(node, True)
