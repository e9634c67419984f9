"""The cluster test bed, once per session: it skips (with the reason) where it cannot run."""

from __future__ import annotations

import time

import pytest
from testbed import TestBed, missing_prerequisites


@pytest.fixture(scope="session")
def bed():
    reason = missing_prerequisites(docker=True)
    if reason:
        pytest.skip(f"cluster test bed: {reason}")
    started = time.monotonic()
    testbed = TestBed(workers=2, docker=True).up()
    print(f"\n[testbed] up in {time.monotonic() - started:.1f}s ({testbed.timings})")
    try:
        yield testbed
    finally:
        started = time.monotonic()
        testbed.down()
        print(f"\n[testbed] down in {time.monotonic() - started:.1f}s")
