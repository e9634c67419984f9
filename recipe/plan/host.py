"""Facts about the machines that a plan needs but settings do not hold: this machine, and the link between Sparks.

Detection is kept apart from planning so a plan can be built from fixed facts (tests, DRY_RUN on a laptop).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from recipe.net.link import Link


@dataclass(frozen=True)
class LinkEnd:
    """One rank's side of the RoCE link: where its rendezvous goes and which ports NCCL uses. The defaults are
    placeholders that DRY_RUN prints as they are when the link was not detected, so a reader sees what goes where."""

    master_addr: str = "<head address on the link>"
    ifname: str = "<link netdev>"
    hcas: str = "<RoCE devices>"
    gid_index: str = "<RoCE v2 GID index>"


@dataclass(frozen=True)
class LinkFacts:
    """The links from the head to its workers, as each rank needs them (placeholders until detected)."""

    ends: Mapping[int, LinkEnd] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    summaries: tuple[str, ...] = ()

    def for_rank(self, rank: int) -> LinkEnd:
        return self.ends.get(rank, LinkEnd())

    @property
    def master_addr(self) -> str:
        return self.for_rank(0).master_addr

    @classmethod
    def from_link(cls, link: Link) -> LinkFacts:
        return cls.from_links([link])

    @classmethod
    def from_links(cls, links: Sequence[Link], worker_links: Sequence[tuple[int, int, Link]] = ()) -> LinkFacts:
        """Rank i+1 sits at the far end of links[i]; rank 0 uses every link's head-side ports. With three Sparks,
        `worker_links` (rank a, rank b, their link) add each worker's ports to the other worker."""
        ends: dict[int, LinkEnd] = {}
        head_hcas: list[str] = []
        for rank, link in enumerate(links, start=1):
            p = link.primary
            ends[rank] = LinkEnd(
                p.head_ip, p.worker_ifname, ",".join(r.worker_hca for r in link.rails), str(p.gid_index)
            )
            head_hcas += [r.head_hca for r in link.rails if r.head_hca not in head_hcas]
        if links:
            p = links[0].primary
            ends[0] = LinkEnd(p.head_ip, p.head_ifname, ",".join(head_hcas), str(p.gid_index))
        notes = [n for link in links for n in link.all_notes()]
        for a, b, link in worker_links:
            for rank, hcas in ((a, [r.head_hca for r in link.rails]), (b, [r.worker_hca for r in link.rails])):
                end = ends.get(rank)
                if end is None:
                    continue
                have = end.hcas.split(",")
                ends[rank] = replace(end, hcas=",".join(have + [h for h in hcas if h not in have]))
            notes += link.all_notes()
        return cls(
            ends=ends,
            notes=tuple(notes),
            summaries=tuple(link.summary() for link in links)
            + tuple(f"rank {a} <-> rank {b}: {link.summary()}" for a, b, link in worker_links),
        )


@dataclass(frozen=True)
class HostFacts:
    python: str  # the interpreter local ranks run under
    gpu: bool  # an NVIDIA GPU answers here (the engine then picks CUDA itself)
    cpu_count: int
    link: LinkFacts = field(default_factory=LinkFacts)
    rdma: bool = False  # RDMA devices exist here (/dev/infiniband): containers get them

    @property
    def device(self) -> str:
        return "GPU" if self.gpu else "CPU"


def has_nvidia_gpu() -> bool:
    """True when `nvidia-smi -L` lists a GPU; never imports torch."""
    if not shutil.which("nvidia-smi"):
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


def has_rdma_devices() -> bool:
    """True when this machine has RDMA device files (SPARKS_DEV_ROOT moves /dev, for tests)."""
    return os.path.isdir(os.path.join(os.environ.get("SPARKS_DEV_ROOT", "/dev"), "infiniband"))


def detect_host() -> HostFacts:
    return HostFacts(
        python=sys.executable, gpu=has_nvidia_gpu(), cpu_count=os.cpu_count() or 1, rdma=has_rdma_devices()
    )
