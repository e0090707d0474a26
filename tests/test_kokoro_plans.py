"""Execution plans: calibration, the plan cache (stale, corrupt, forced) and fallbacks."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import structlog

from engines.kokoro import plans as plans_mod
from engines.kokoro.graph_split import SplitGraphs
from engines.kokoro.plans import (
    MAX_LOG_SPECTRAL_DISTANCE,
    SHIPPED,
    PlanCache,
    choose,
    log_spectral_distance,
)

RATE = 24000
SPEED = {"int8": 0.02, "fast": 0.01, "slow": 0.05, "wrong": 0.001, "broken": 0.001}


def tone(scale: float = 1.0, noise: float = 0.0) -> np.ndarray:
    """A voiced-like signal with a broadband floor (as speech has), plus extra noise."""
    t = np.arange(RATE // 2) / RATE
    rng = np.random.default_rng(1)
    x = 0.3 * np.sin(2 * np.pi * 220 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    x = x + 0.01 * rng.standard_normal(len(t))
    return (scale * x + noise * rng.standard_normal(len(t))).astype(np.float32)


class FakeRuntime:
    """Stands in for ONNX Runtime: a 'session' is the variant's name; its decode sleeps
    by the variant's speed and returns audio (``wrong`` sounds different)."""

    def __init__(self) -> None:
        self.built: list[str] = []
        self.loads: list[tuple[str, int]] = []

    def build(self, source: str | bytes, variant: str) -> bytes:
        self.built.append(variant)
        if variant == "broken":
            raise RuntimeError("execution provider did not load")
        return variant.encode() * 10

    def load(self, source: str | bytes, threads: int) -> Any:
        data = source if isinstance(source, bytes) else Path(source).read_bytes()
        name = SHIPPED if data == b"shipped-decoder" else data[: len(data) // 10].decode()
        self.loads.append((name, threads))
        return name

    def decode(self, session: Any, threads: int) -> np.ndarray:
        import time

        time.sleep(SPEED[session] / threads)
        return tone(noise=0.5) if session == "wrong" else tone()


@pytest.fixture
def model(tmp_path: Path) -> tuple[Path, SplitGraphs]:
    m = tmp_path / "model.onnx"
    m.write_bytes(b"model")
    dec = tmp_path / "model.onnx.decoder"
    dec.write_bytes(b"shipped-decoder")
    return m, SplitGraphs(str(tmp_path / "model.onnx.prosody"), str(dec))


def run(model: tuple[Path, SplitGraphs], rt: FakeRuntime, plan: str = "auto", **kw: Any) -> Any:
    m, stages = model
    return choose(
        m,
        kw.pop("sha", "abc"),
        stages,
        plan=plan,
        candidates=kw.pop("candidates", ["int8", "fast", "slow", "wrong", "broken"]),
        build=rt.build,
        load=rt.load,
        decode=rt.decode,
        thread_counts=[1, 2],
    )


def test_calibration_picks_the_fastest_matching_variant_and_caches_it(model) -> None:
    rt = FakeRuntime()
    with structlog.testing.capture_logs() as logs:
        choice = run(model, rt)
    assert choice.variant == "fast" and choice.source == "measured"
    assert set(choice.rtf) == {1, 2}  # the winner is measured at every thread count
    by_name = {m.variant: m for m in choice.candidates}
    assert "log-spectral distance" in by_name["wrong"].error  # too different: never chosen
    assert "execution provider" in by_name["broken"].error
    rejected = {e["plan"] for e in logs if e["event"] == "plan_candidate_rejected"}
    assert rejected == {"wrong", "broken"}
    assert any(e["event"] == "plan_calibrating" for e in logs)
    # a second start reads the cache: no measurement, same graph file
    rt2 = FakeRuntime()
    again = run(model, rt2)
    assert again.variant == "fast" and again.source == "cached" and not rt2.loads
    assert again.decoder == choice.decoder and again.rtf == choice.rtf


@pytest.mark.parametrize(
    "damage",
    ["model_changed", "cpu_changed", "cpus_changed", "json_corrupt", "graph_corrupt",
     "graph_missing"],
)  # fmt: skip
def test_a_stale_or_corrupt_cache_is_measured_again(
    model, damage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run(model, FakeRuntime())
    cache = PlanCache(model[0])
    kw: dict[str, Any] = {}
    if damage == "model_changed":
        kw["sha"] = "def"
    elif damage == "cpu_changed":
        data = json.loads(cache.index.read_text())
        data["fingerprint"]["cpu_sha256"] = "0" * 64
        cache.index.write_text(json.dumps(data))
    elif damage == "cpus_changed":  # e.g. the engine now runs under a container's CPU limit
        monkeypatch.setattr(plans_mod, "available_cpus", lambda: 97)
    elif damage == "json_corrupt":
        cache.index.write_text("{not json")
    elif damage == "graph_corrupt":
        cache.graph_path("fast").write_bytes(b"tampered")
    else:
        cache.graph_path("fast").unlink()
    rt = FakeRuntime()
    choice = run(model, rt, **kw)
    assert choice.source == "measured" and choice.variant == "fast" and rt.loads


def test_a_forced_plan_is_not_measured(model) -> None:
    rt = FakeRuntime()
    choice = run(model, rt, plan="slow")
    assert choice.variant == "slow" and choice.source == "forced" and not rt.loads


def test_when_no_variant_beats_the_shipped_graph_it_is_chosen(model) -> None:
    rt = FakeRuntime()
    choice = run(model, rt, candidates=["int8", "slow", "broken"])
    assert choice.variant == SHIPPED and choice.decoder == model[1].decoder


def test_a_shipped_graph_that_does_not_run_raises(model) -> None:
    rt = FakeRuntime()

    def broken(session: Any, threads: int) -> np.ndarray:
        raise RuntimeError("bad graph")

    m, stages = model
    with pytest.raises(RuntimeError, match="shipped decoder graph does not run"):
        choose(m, "abc", stages, plan="auto", candidates=["int8"], build=rt.build,
               load=rt.load, decode=broken, thread_counts=[1])  # fmt: skip


def test_log_spectral_distance_tolerates_precision_and_catches_real_changes() -> None:
    ref = tone()
    rng = np.random.default_rng(3)
    assert log_spectral_distance(ref, ref) == 0.0
    near = ref + (1e-3 * rng.standard_normal(len(ref))).astype(np.float32)
    assert log_spectral_distance(near, ref) < MAX_LOG_SPECTRAL_DISTANCE
    assert log_spectral_distance(tone(scale=0.5), ref) > MAX_LOG_SPECTRAL_DISTANCE  # half gain
    assert log_spectral_distance(tone(noise=0.5), ref) > MAX_LOG_SPECTRAL_DISTANCE


@pytest.mark.slow
def test_the_engine_calibrates_once_then_starts_from_the_cache(kokoro_models_dir: Path) -> None:
    from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer

    first = KokoroSynthesizer(KokoroConfig(models_dir=kokoro_models_dir))
    first.load()
    plan = first.plan()
    first.close()
    assert plan.source in ("measured", "cached") and plan.rtf[1] > 0 and plan.capacity > 0
    second = KokoroSynthesizer(KokoroConfig(models_dir=kokoro_models_dir))
    with structlog.testing.capture_logs() as logs:
        second.load()
    try:
        assert second.plan().source == "cached" and second.plan().name == plan.name
        assert not any(e["event"] == "plan_calibrating" for e in logs)
        assert f":PLAN:{plan.name}" in second.status_suffix()
    finally:
        second.close()


class SharedCoreRuntime(FakeRuntime):
    """Every decode holds one lock, like cores that share their execution units (SMT):
    two at once take twice as long each. The crowded measurement's decodes (run from
    its own threads) meet before either starts, so that they overlap whatever the OS
    scheduler does on a loaded machine (else one could start after the other ended)."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.core = threading.Lock()
        self.caller = threading.get_ident()  # the calibrating thread: lone decodes
        self.meet = threading.Barrier(2, timeout=5.0)

    def decode(self, session: Any, threads: int) -> np.ndarray:
        import threading

        if threading.get_ident() != self.caller:
            self.meet.wait()
        with self.core:
            return super().decode(session, 1)


def test_the_winner_is_measured_with_every_core_busy_and_that_is_cached(model) -> None:
    rt = SharedCoreRuntime()
    choice = run(model, rt)
    assert choice.variant == "fast" and choice.crowded is not None
    # of two decodes started at once one waits for the other: 1.5x the lone figure
    assert choice.crowded > 1.3 * choice.rtf[1]
    again = run(model, FakeRuntime())
    assert again.source == "cached" and again.crowded == pytest.approx(choice.crowded)
    # independent cores: about the lone figure
    (model[0].with_name("model.onnx.plans") / "plans.json").unlink()
    free = run(model, FakeRuntime())
    assert free.crowded is not None and free.crowded < 0.85 * choice.crowded


def test_a_crowded_figure_of_another_core_count_is_not_reused(model) -> None:
    run(model, SharedCoreRuntime())
    m, stages = model
    rt = FakeRuntime()
    again = choose(m, "abc", stages, plan="auto", candidates=["int8", "fast"], build=rt.build,
                   load=rt.load, decode=rt.decode, thread_counts=[1, 2], cores=4)  # fmt: skip
    assert again.source == "cached" and again.crowded is None  # measured at 2 cores


class CrowdedFailRuntime(FakeRuntime):
    """Decodes fail only while another decode runs."""

    def __init__(self) -> None:
        super().__init__()
        import threading

        self.running = 0
        self.lock = threading.Lock()

    def decode(self, session: Any, threads: int) -> np.ndarray:
        import time

        with self.lock:
            self.running += 1
        try:
            time.sleep(0.01)
            with self.lock:
                if self.running > 1:
                    raise RuntimeError("out of memory")
            return super().decode(session, threads)
        finally:
            with self.lock:
                self.running -= 1


def test_a_failing_crowded_probe_is_reported_and_not_cached(model) -> None:
    with structlog.testing.capture_logs() as logs:
        choice = run(model, CrowdedFailRuntime())
    assert choice.variant == "fast" and choice.crowded is None
    assert any(e["event"] == "plan_crowded_unmeasured" for e in logs)
