"""The real Kokoro engine (and a tiny Qwen3) as processes, reached over HTTP (the
``openai`` package), Wyoming (the ``wyoming`` package's client) and Prometheus
(``prometheus_client.parser``), while docked into a real dock that serves /metrics too."""

from __future__ import annotations

import asyncio
import io
import json
import wave
from pathlib import Path

import numpy as np
import pytest
from dock_helpers import DockProcess
from e2e_helpers import Cleanup, EngineProcess, RecordingOap, poll, wait_active
from protocol_servers_helpers import parse_metrics, read_until, request, sample, wyoming_session
from runtime_helpers import free_port

pytestmark = pytest.mark.slow

pytest.importorskip("onnxruntime")
openai = pytest.importorskip("openai")

from wyoming.tts import (  # noqa: E402
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

NO_NICE = {"TTSDOCK_SYNTH_NICE": "0"}


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    kh = pytest.importorskip("kokoro_helpers")
    return Path(kh.shared_models_dir(tmp_path_factory))


async def dock_with_http(tmp: Path, cleanup: Cleanup) -> DockProcess:
    oap = RecordingOap()
    await oap.start()
    cleanup.later(oap.stop)
    dock = cleanup.dock(DockProcess(tmp, oap.ports, "--http-port", "0"))
    await dock.start()
    assert dock.ports["http"] > 0
    return dock


async def http_up(port: int, proc: EngineProcess) -> None:
    async def up() -> bool:
        proc.check_alive()
        status, _h, _b = await request(port, "GET", "/health")
        return status == 200

    await poll(up, 180.0, "engine /health")


def pcm16(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype="<i2").astype(np.float32) / 32768.0


async def test_kokoro_over_http_and_wyoming(
    models_dir: Path, tmp_path: Path, cleanup: Cleanup
) -> None:
    dock = await dock_with_http(tmp_path, cleanup)
    http_port, wy_port = free_port(), free_port()
    kokoro = cleanup.engine(
        await EngineProcess(
            tmp_path, "kokoro", dock.ports["dock"], free_port(),
            "--models-dir", str(models_dir), "--threads", "1",
            "--http-port", str(http_port), "--wyoming-uri", f"tcp://127.0.0.1:{wy_port}",
            # on a shared 2-core box the load meter may find no headroom at all: this test
            # is about the protocols (admission: test_engine_protocols.py)
            "--protocol-min-headroom", "0", env=NO_NICE,
        ).start()
    )  # fmt: skip
    await wait_active(dock, "kokoro", kokoro)
    await http_up(http_port, kokoro)
    client = openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{http_port}/v1", api_key="unused", max_retries=0
    )

    # the README's curl: a WAV that plays
    status, headers, body = await request(
        http_port,
        "POST",
        "/v1/audio/speech",
        {"model": "kokoro", "input": "Hello", "voice": "jf_alpha", "response_format": "wav"},
    )
    assert status == 200 and headers["Content-Type"] == "audio/wav"
    with wave.open(io.BytesIO(body)) as w:
        assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (24000, 2, 1)
        audio = pcm16(w.readframes(w.getnframes()))
    assert 0.3 < audio.size / 24000 < 3 and float(np.sqrt(np.mean(audio**2))) > 0.02

    # streamed with the official client
    got = bytearray()
    async with client.audio.speech.with_streaming_response.create(
        model="kokoro",
        input="Good morning. How can I help you today?",
        voice="jm_kumo",
        response_format="pcm",
        extra_body={"stream": True},
    ) as resp:
        async for chunk in resp.iter_bytes():
            got += chunk
    assert len(got) / 2 / 24000 > 1.0

    # Wyoming, one shot and streamed
    wy = await wyoming_session(wy_port)
    await wy.write_event(Synthesize(text="Hello there.", voice=SynthesizeVoice("jf_alpha")).event())
    events = await read_until(wy, "audio-stop", within=60)
    assert events[0].type == "audio-start" and events[-1].type == "audio-stop"
    assert sum(len(e.payload or b"") for e in events) > 24000
    await wy.write_event(SynthesizeStart(voice=SynthesizeVoice("jf_alpha")).event())
    for piece in ("Thank you", " for call", "ing. Good", "bye."):
        await wy.write_event(SynthesizeChunk(text=piece).event())
    await wy.write_event(SynthesizeStop().event())
    events = await read_until(wy, "synthesize-stopped", within=60)
    assert [e.type for e in events][-2:] == ["audio-stop", "synthesize-stopped"]
    await wy.disconnect()

    # a disconnect mid-stream is a barge-in: the engine's STATS shows the cancel
    before = await kokoro.stats()
    long_text = " ".join(["This sentence is here to keep the engine busy for a while."] * 12)
    async with client.audio.speech.with_streaming_response.create(
        model="kokoro", input=long_text, voice="jf_alpha", response_format="pcm",
        extra_body={"stream": True},
    ) as resp:  # fmt: skip
        async for _chunk in resp.iter_bytes():
            break

    async def cancelled() -> bool:
        st = await kokoro.stats()
        return int(st["bargeins"]) > int(before["bargeins"]) and st["sched_open"] == "0"

    await poll(cancelled, 30.0, "the cancel in STATS")

    # Prometheus parses both /metrics
    _s, _h, raw = await request(http_port, "GET", "/metrics")
    eng = parse_metrics(raw.decode())
    assert sample(eng, "ttsdock_engine_protocol_requests_total", protocol="http") == 3
    assert sample(eng, "ttsdock_engine_protocol_requests_total", protocol="wyoming") == 2
    assert sample(eng, "ttsdock_engine_protocol_requests_cancelled_total", protocol="http") == 1

    async def dock_metrics() -> dict[str, object] | None:
        # (on a loaded box the dock may have dropped and re-docked the engine meanwhile)
        _s, _h, raw = await request(dock.ports["http"], "GET", "/metrics")
        fams = parse_metrics(raw.decode())
        return fams if sample(fams, "ttsdock_engine_active") == 1 else None

    dk = await poll(dock_metrics, 30.0, "dock /metrics with the engine active")
    assert dk["ttsdock_hop_latency_seconds"].type == "summary"
    _s, _h, raw = await request(dock.ports["http"], "GET", "/health")
    assert json.loads(raw)["engine"] == "kokoro"
    assert "Traceback" not in kokoro.logs()


@pytest.fixture(scope="module")
def qwen3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny generated Qwen3-TTS CustomVoice model set (as tests/test_e2e_pipeline.py)."""
    pytest.importorskip("torch")
    pytest.importorskip("gguf")
    qh = pytest.importorskip("qwen3_helpers")
    from qwen3_vocoder_fixture import export_tiny_vocoder

    from engines.qwen3.weights.paths import VOCODER_FILE

    d = tmp_path_factory.mktemp("proto-qwen3")
    hf = qh.write_checkpoint(d / "hf", qh.tiny_config("custom_voice", text_hidden=8))
    out = d / "models"
    qh.convert_checkpoint(hf, out, dtype="f16")
    export_tiny_vocoder(out / VOCODER_FILE)
    return out


async def test_qwen3_metrics_parse(qwen3_dir: Path, tmp_path: Path, cleanup: Cleanup) -> None:
    http_port = free_port()
    qwen3 = cleanup.engine(
        await EngineProcess(
            tmp_path, "qwen3", free_port(), free_port(),
            "--model-dir", str(qwen3_dir), "--max-frames", "12", "--seed", "1",
            "--http-port", str(http_port), "--protocol-min-headroom", "0", env=NO_NICE,
        ).start()
    )  # fmt: skip
    await http_up(http_port, qwen3)
    status, _h, body = await request(
        http_port, "POST", "/v1/audio/speech", {"model": "qwen3", "input": "Hi.", "stream": True}
    )
    assert status == 200 and len(body) > 44
    _s, _h, raw = await request(http_port, "GET", "/metrics")
    fams = parse_metrics(raw.decode())
    assert sample(fams, "ttsdock_engine_protocol_requests_completed_total", protocol="http") == 1
    assert fams["ttsdock_engine_ttfa_seconds"].type == "summary"
    await asyncio.sleep(0)
