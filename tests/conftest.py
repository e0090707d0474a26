"""Suite-wide test settings.

The machines are shared and noisy (2 vCPUs, other work running): hypothesis
gets no per-example deadline, and nothing here asserts wall-clock limits.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from e2e_helpers import Cleanup  # noqa: E402  (after the path set-up above)

settings.register_profile(
    "default",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    max_examples=int(os.environ.get("HYPOTHESIS_MAX_EXAMPLES", "100")),
)
settings.load_profile("default")


@pytest.fixture
async def cleanup() -> AsyncIterator[Cleanup]:
    """Processes and tasks a test started, stopped after it (``e2e_helpers.Cleanup``)."""
    c = Cleanup()
    try:
        yield c
    finally:
        await c.run()
