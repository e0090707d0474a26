"""Suite-wide test settings.

The machines are shared and noisy (2 vCPUs, other work running): hypothesis
gets no per-example deadline, and nothing here asserts wall-clock limits.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, settings

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
TESTS = Path(__file__).resolve().parent
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from e2e_helpers import Cleanup  # noqa: E402  (after the path set-up above)
from runtime_helpers import FakeDock  # noqa: E402

if TYPE_CHECKING:
    from engines.kokoro.synth import KokoroSynthesizer

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


@pytest.fixture
async def dock() -> AsyncIterator[FakeDock]:
    """A fake dock on a free loopback port (``runtime_helpers.FakeDock``)."""
    d = FakeDock()
    await d.start()
    yield d
    await d.stop()


@pytest.fixture(scope="module")
def kokoro_models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Kokoro model, assembled once per run (``kokoro_helpers.shared_models_dir``)."""
    from kokoro_helpers import shared_models_dir

    return shared_models_dir(tmp_path_factory)


@pytest.fixture(scope="module")
def kokoro_synth(kokoro_models_dir: Path) -> Iterator[KokoroSynthesizer]:
    """A loaded Kokoro synthesiser (``kokoro_helpers.loaded_synth``)."""
    from kokoro_helpers import loaded_synth

    yield from loaded_synth(kokoro_models_dir)
