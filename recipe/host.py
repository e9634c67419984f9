"""Facts about the machines that a plan needs but settings do not hold: this machine, and the link between Sparks.

Detection is kept apart from planning so a plan can be built from fixed facts (tests, DRY_RUN on a laptop).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class LinkFacts:
    """The RoCE link between the head and its workers. Until link detection exists (a later issue) the values are
    placeholders that DRY_RUN prints as they are, so a reader sees which value goes where."""

    master_addr: str = "<head address on the link>"
    ifname: str = "<link netdev>"
    hcas: str = "<RoCE devices>"
    gid_index: str = "<RoCE v2 GID index>"


@dataclass(frozen=True)
class HostFacts:
    python: str                # the interpreter local ranks run under
    gpu: bool                  # an NVIDIA GPU answers here (the engine then picks CUDA itself)
    cpu_count: int
    link: LinkFacts = field(default_factory=LinkFacts)

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


def detect_host() -> HostFacts:
    return HostFacts(python=sys.executable, gpu=has_nvidia_gpu(), cpu_count=os.cpu_count() or 1)
