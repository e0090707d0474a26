"""Engine protocol listeners with real clients we did not write: the ``openai`` package
against POST /v1/audio/speech, the ``wyoming`` package's client against the Wyoming
server, ``prometheus_client.parser`` on GET /metrics. The engine runs in process on the
tone synthesiser (``runtime_helpers.ToneSynth``); test_kokoro_protocols.py repeats the
main paths with the real Kokoro engine as a process."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import struct
import time
import wave

import pytest
from protocol_servers_helpers import (
    parse_metrics,
    read_until,
    request,
    sample,
    serving_engine,
    stats_of,
    wyoming_session,
)
from runtime_helpers import FakeDock, ToneSynth, cmd

from engines.runtime.admission import Admission, SchedulerHeadroom
from engines.runtime.requests import REQUEST_CALL_BASE, SentenceBuffer, pieces
from engines.runtime.synth import PlanInfo
from svc.http import HttpConfigError, HttpSettings, token_ok

openai = pytest.importorskip("openai")

from wyoming.audio import AudioChunk  # noqa: E402
from wyoming.event import Event  # noqa: E402
from wyoming.info import Describe, Info  # noqa: E402
from wyoming.tts import (  # noqa: E402
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

RATE = 24000


def client(port: int) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0
    )


class NoHeadroom:
    def headroom_calls(self) -> float | None:
        return 0.4


# ----------------------------------------------------------------------- OpenAI speech


async def test_openai_streaming_speech_arrives_while_it_is_made() -> None:
    synth = ToneSynth(phrase_ms=100, delay=0.15)  # 0.15 s of compute per 0.1 s of audio
    async with serving_engine(synth) as eng:
        t0 = time.monotonic()
        arrivals: list[tuple[float, int]] = []
        async with client(eng.http_port).audio.speech.with_streaming_response.create(
            model="tone",
            input="one two three four five six",
            voice="beta",
            response_format="pcm",
            extra_body={"stream": True},
        ) as resp:
            assert resp.headers["content-type"] == "audio/pcm"
            async for chunk in resp.iter_bytes():
                arrivals.append((time.monotonic() - t0, len(chunk)))
        total = sum(n for _t, n in arrivals)
        assert total == 6 * 2400 * 2  # six 100 ms phrases, 16-bit
        # the first audio left long before the end (five more phrases of 0.15 s each)
        assert len(arrivals) >= 2 and arrivals[0][0] < arrivals[-1][0] - 0.4
        assert synth.calls[0].voice == "beta"
        assert synth.calls[0].call_id >= REQUEST_CALL_BASE  # never a u32 dock call id


async def test_openai_whole_wav_is_a_playable_file() -> None:
    async with serving_engine(ToneSynth(phrase_ms=100)) as eng:
        resp = await client(eng.http_port).audio.speech.create(
            model="tone", input="Hello. How are you?", voice="alpha", response_format="wav"
        )
        with wave.open(io.BytesIO(resp.content)) as w:
            assert (w.getframerate(), w.getsampwidth(), w.getnchannels()) == (RATE, 2, 1)
            assert w.getnframes() == 4 * 2400
        # the OpenAI aliases are models too; speed reaches the synthesiser
        resp = await client(eng.http_port).audio.speech.create(
            model="tts-1", input="hi", voice="alpha", response_format="pcm", speed=1.5
        )
        assert len(resp.content) == 2400 * 2


async def test_streamed_wav_header_says_length_unknown() -> None:
    async with serving_engine(ToneSynth(phrase_ms=100)) as eng:
        async with client(eng.http_port).audio.speech.with_streaming_response.create(
            model="tone",
            input="a b",
            voice="alpha",
            response_format="wav",
            extra_body={"stream": True},
        ) as resp:
            data = await resp.read()
        assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt "
        assert struct.unpack("<I", data[4:8])[0] == 0xFFFFFFFF
        assert data[36:40] == b"data" and struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF
        assert len(data) == 44 + 2 * 2400 * 2


async def test_models_voices_health() -> None:
    async with serving_engine(ToneSynth()) as eng:
        models = await client(eng.http_port).models.list()
        assert [m.id for m in models.data][:2] == ["tone", "tts-1"]
        status, _h, body = await request(eng.http_port, "GET", "/v1/audio/voices")
        assert status == 200 and b'"voices": ["alpha", "beta"]' in body
        status, _h, body = await request(eng.http_port, "GET", "/health")
        assert status == 200
        health = json.loads(body)
        assert health["loaded"] is True and health["docked"] is False
        assert "plan" not in health  # the tone synthesiser exposes none


async def test_health_shows_a_plan_the_synthesiser_exposes() -> None:
    synth = ToneSynth()
    info = PlanInfo("fp32-conv2d", "measured", {1: 0.4, 2: 0.25}, 5.0)
    synth.plan = lambda: info  # type: ignore[attr-defined]
    async with serving_engine(synth, wyoming=False) as eng:
        _s, _h, body = await request(eng.http_port, "GET", "/health")
        assert json.loads(body)["plan"] == {
            "name": "fp32-conv2d",
            "source": "measured",
            "rtf": {"1": 0.4, "2": 0.25},
            "capacity_audio_s_per_s": 5.0,
        }
        _s, _h, raw = await request(eng.http_port, "GET", "/metrics")
        fams = parse_metrics(raw.decode())
        assert sample(fams, "ttsdock_engine_plan_info", plan="fp32-conv2d") == 1
        # the load meter predicts from the plan: 5.0 x 0.7 / 0.75 calls, none speaking
        assert sample(fams, "ttsdock_engine_headroom_calls") == pytest.approx(4.667, abs=0.01)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", "body"),
        (b"[1, 2]", "body"),
        ({"model": "tone", "input": "hi", "voice": "gamma"}, "voice"),
        ({"model": "tone", "input": "hi", "response_format": "mp3"}, "response_format"),
        ({"model": "tone", "input": "x" * 101}, "input"),
        ({"model": "tone", "input": ""}, "input"),
        ({"model": "tone", "input": "hi", "speed": 9}, "speed"),
        ({"model": "whisper", "input": "hi"}, "model"),
        ({"model": "tone", "input": "hi", "stream": "yes"}, "stream"),
        (b'{"input": "' + b"a" * 5000 + b'"}', "body"),  # over --http-max-body
    ],
)
async def test_bad_input_is_a_400_naming_the_field(body: object, param: str) -> None:
    http = HttpSettings(port=0, max_body=4096)
    async with serving_engine(ToneSynth(), http=http, wyoming=False, max_input=100) as eng:
        status, headers, raw = await request(eng.http_port, "POST", "/v1/audio/speech", body)  # type: ignore[arg-type]
        assert status == 400, raw
        assert headers["Content-Type"].startswith("application/json")
        err = json.loads(raw)["error"]
        assert err["param"] == param and err["type"] == "invalid_request_error" and err["message"]
        # the process is undisturbed: the next request is served
        resp = await client(eng.http_port).audio.speech.create(
            model="tone", input="ok", voice="alpha", response_format="pcm"
        )
        assert len(resp.content) == 2400 * 2
        prom = parse_metrics(await cmd(eng.cmd_port, "METRICS"))
        assert sample(prom, "ttsdock_engine_protocol_requests_rejected_total", field=param) == 1


async def test_unknown_route_is_a_json_404() -> None:
    async with serving_engine(ToneSynth(), wyoming=False) as eng:
        status, _h, raw = await request(eng.http_port, "GET", "/v1/nope")
        assert status == 404 and b'"error"' in raw
        status, _h, raw = await request(eng.http_port, "GET", "/v1/audio/speech")
        assert status == 405


async def test_disconnect_mid_stream_is_a_bargein_and_stops_inference() -> None:
    synth = ToneSynth(phrase_ms=100, delay=0.05)
    text = " ".join(f"w{i}" for i in range(60))
    async with serving_engine(synth, wyoming=False) as eng:
        async with client(eng.http_port).audio.speech.with_streaming_response.create(
            model="tone", input=text, voice="alpha", response_format="pcm",
            extra_body={"stream": True},
        ) as resp:  # fmt: skip
            async for _chunk in resp.iter_bytes():
                break  # first audio, then the client goes away
        async with asyncio.timeout(5):
            while synth.active:  # the generator is closed: no thread is inside it  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        phrases = synth.phrases
        await asyncio.sleep(0.4)
        assert synth.phrases == phrases < 60  # no more inference for it
        st = stats_of(await cmd(eng.cmd_port, "STATS"))
        assert st["bargeins"] == "1" and st["utterances_cancelled"] == "1"
        assert st["calls_active"] == "0"
        prom = parse_metrics(await cmd(eng.cmd_port, "METRICS"))
        assert (
            sample(prom, "ttsdock_engine_protocol_requests_cancelled_total", protocol="http") == 1
        )
        assert sample(prom, "ttsdock_engine_protocol_requests_active") == 0


async def test_no_headroom_is_a_503_with_retry_after_and_counted() -> None:
    async with serving_engine(ToneSynth()) as eng:
        eng.protocols.requests.admission.headroom = NoHeadroom()
        status, headers, raw = await request(
            eng.http_port, "POST", "/v1/audio/speech", {"model": "tone", "input": "hi"}
        )
        assert status == 503 and headers["Retry-After"] == "1"
        err = json.loads(raw)["error"]
        assert err["code"] == "no_headroom" and "phone calls come first" in err["message"]
        wy = await wyoming_session(eng.wyoming_port)
        await wy.write_event(Synthesize(text="hi").event())
        (ev,) = await read_until(wy, "audio-stop")
        assert ev.type == "error" and ev.data["code"] == "no_headroom"
        await wy.disconnect()
        prom = parse_metrics(await cmd(eng.cmd_port, "METRICS"))
        assert (
            sample(prom, "ttsdock_engine_protocol_requests_refused_total", reason="no_headroom")
            == 2
        )


async def test_protocol_max_requests_is_a_429() -> None:
    synth = ToneSynth(phrase_ms=100, delay=0.1)
    async with serving_engine(synth, wyoming=False, max_requests=1) as eng:
        async with client(eng.http_port).audio.speech.with_streaming_response.create(
            model="tone", input="a b c d e f g h", voice="alpha", response_format="pcm",
            extra_body={"stream": True},
        ) as resp:  # fmt: skip
            status, headers, _raw = await request(
                eng.http_port, "POST", "/v1/audio/speech", {"model": "tone", "input": "hi"}
            )
            assert status == 429 and headers["Retry-After"]
            assert len(await resp.read()) == 8 * 4800


def test_scheduler_headroom_fallback_reads_the_pool() -> None:
    class Calls:
        max_concurrent, running, waiting, pool = 4, 1, 0, None

    room = SchedulerHeadroom(Calls())  # type: ignore[arg-type]
    assert room.headroom_calls() == 3.0
    Calls.running, Calls.waiting = 3, 1
    assert room.headroom_calls() == 0.0
    adm = Admission(room, max_requests=8)
    refusal = adm.admit()
    assert refusal is not None and refusal.status == 503 and adm.refused["no_headroom"] == 1

    class Unknown:
        def headroom_calls(self) -> float | None:
            return None

    adm = Admission(Unknown(), max_requests=1)
    assert adm.admit() is None  # unknown headroom: admitted
    assert adm.admit() is not None and adm.refused["max_requests"] == 1
    adm.release()
    assert adm.admit() is None


# ----------------------------------------------------------------------- security, limits


def test_public_address_needs_a_token() -> None:
    with pytest.raises(HttpConfigError, match="--http-token-file"):
        HttpSettings(host="0.0.0.0").check()
    HttpSettings(host="0.0.0.0", token="t" * 16).check()
    HttpSettings(host="::1").check()
    assert token_ok("Bearer " + "s" * 20, "s" * 20)
    assert not token_ok("Bearer " + "s" * 19, "s" * 20)
    assert not token_ok("Basic " + "s" * 20, "s" * 20) and not token_ok(None, "s" * 20)


async def test_bearer_token_is_required_when_configured() -> None:
    token = "k" * 24
    async with serving_engine(
        ToneSynth(), http=HttpSettings(port=0, token=token), wyoming=False
    ) as eng:
        for headers in (None, {"Authorization": "Bearer wrong"}, {"Authorization": token}):
            status, h, raw = await request(eng.http_port, "GET", "/metrics", headers=headers)
            assert status == 401 and h["WWW-Authenticate"] == "Bearer", raw
        status, _h, _raw = await request(
            eng.http_port, "GET", "/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        assert status == 200
        c = openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{eng.http_port}/v1", api_key=token, max_retries=0
        )
        resp = await c.audio.speech.create(
            model="tone", input="hi", voice="alpha", response_format="pcm"
        )
        assert len(resp.content) == 4800


async def test_slow_client_cannot_hold_the_listener() -> None:
    """Slowloris: a client that sends its request head byte by byte is closed after the
    idle timeout; other requests are served meanwhile."""
    http = HttpSettings(port=0, idle_timeout=0.5)
    async with serving_engine(ToneSynth(), http=http, wyoming=False) as eng:
        reader, writer = await asyncio.open_connection("127.0.0.1", eng.http_port)
        t0 = time.monotonic()
        closed_after = None
        try:
            for b in b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Len":
                writer.write(bytes([b]))
                await writer.drain()
                status, _h, _b = await request(eng.http_port, "GET", "/health")
                assert status == 200
                try:
                    if await asyncio.wait_for(reader.read(1), 0.05) == b"":
                        closed_after = time.monotonic() - t0
                        break
                except TimeoutError:
                    pass
        except ConnectionError:
            closed_after = time.monotonic() - t0
        finally:
            writer.close()
        assert closed_after is not None and closed_after < 3.0


# ----------------------------------------------------------------------- Wyoming


async def test_wyoming_describe_lists_voices_and_streaming() -> None:
    async with serving_engine(ToneSynth()) as eng:
        wy = await wyoming_session(eng.wyoming_port)
        await wy.write_event(Describe().event())
        (ev,) = await read_until(wy, "info")
        info = Info.from_event(ev)
        (tts,) = info.tts
        assert tts.name == "tone" and tts.supports_synthesize_streaming
        assert [v.name for v in tts.voices] == ["alpha", "beta"]
        assert tts.voices[0].languages == ["en", "de"]
        await wy.disconnect()


async def test_wyoming_one_shot_synthesize() -> None:
    synth = ToneSynth(phrase_ms=100)
    async with serving_engine(synth) as eng:
        wy = await wyoming_session(eng.wyoming_port)
        await wy.write_event(
            Synthesize(text="Hello there. Bye now.", voice=SynthesizeVoice(name="beta")).event()
        )
        events = await read_until(wy, "audio-stop")
        assert events[0].type == "audio-start"
        assert events[0].data == {"rate": RATE, "width": 2, "channels": 1, "timestamp": None}
        chunks = [AudioChunk.from_event(e) for e in events if e.type == "audio-chunk"]
        assert sum(len(c.audio) for c in chunks) == 4 * 2400 * 2
        assert all(len(c.audio) <= 4800 * 2 and c.width == 2 for c in chunks)
        assert {c.voice for c in synth.calls} == {"beta"}
        # the connection stays open for the next request
        await wy.write_event(Synthesize(text="again").event())
        events = await read_until(wy, "audio-stop")
        assert events[-1].type == "audio-stop"
        await wy.disconnect()


async def test_wyoming_streaming_synthesize() -> None:
    synth = ToneSynth(phrase_ms=100)
    async with serving_engine(synth) as eng:
        wy = await wyoming_session(eng.wyoming_port)
        await wy.write_event(SynthesizeStart(voice=SynthesizeVoice(name="alpha")).event())
        for piece in ("Hel", "lo the", "re. How are", " you? Fi", "ne."):
            await wy.write_event(SynthesizeChunk(text=piece).event())
        # sent for backwards compatibility inside a stream: ignored
        await wy.write_event(Synthesize(text="Hello there. How are you? Fine.").event())
        await wy.write_event(SynthesizeStop().event())
        events = await read_until(wy, "synthesize-stopped")
        types = [e.type for e in events]
        assert types[0] == "audio-start" and types[-2:] == ["audio-stop", "synthesize-stopped"]
        audio = b"".join(e.payload or b"" for e in events if e.type == "audio-chunk")
        assert len(audio) == 6 * 2400 * 2  # six words, each once
        assert [c.text for c in synth.calls] == ["Hello there.", "How are you?", "Fine."]
        await wy.disconnect()


async def test_wyoming_errors_keep_the_connection() -> None:
    async with serving_engine(ToneSynth(), max_input=50) as eng:
        wy = await wyoming_session(eng.wyoming_port)
        await wy.write_event(Synthesize(text="hi", voice=SynthesizeVoice(name="nope")).event())
        (ev,) = await read_until(wy, "audio-stop")
        assert ev.type == "error" and ev.data["code"] == "bad_voice" and "nope" in ev.data["text"]
        await wy.write_event(Synthesize(text="x " * 40).event())
        events = await read_until(wy, "audio-stop")
        assert events[-1].type == "error" and events[-1].data["code"] == "text_too_long"
        await wy.write_event(Event(type="future-event", data={"x": 1}))  # ignored
        await wy.write_event(Synthesize(text="fine").event())
        events = await read_until(wy, "audio-stop")
        assert events[-1].type == "audio-stop"
        await wy.disconnect()


async def test_wyoming_oversized_frame_closes_only_that_connection() -> None:
    async with serving_engine(ToneSynth()) as eng:
        reader, writer = await asyncio.open_connection("127.0.0.1", eng.wyoming_port)
        writer.write(b'{"type": "synthesize", "data_length": 999999999}\n')
        await writer.drain()
        line = await asyncio.wait_for(reader.readline(), 5)
        assert b'"error"' in line
        assert await asyncio.wait_for(reader.read(), 5) is not None  # then EOF
        writer.close()
        writer2 = await wyoming_session(eng.wyoming_port)  # the server is fine
        await writer2.write_event(Describe().event())
        assert (await read_until(writer2, "info"))[-1].type == "info"
        await writer2.disconnect()


async def test_wyoming_closed_connection_stops_its_work() -> None:
    synth = ToneSynth(phrase_ms=100, delay=0.05)
    async with serving_engine(synth) as eng:
        wy = await wyoming_session(eng.wyoming_port)
        await wy.write_event(Synthesize(text=" ".join(f"w{i}" for i in range(60))).event())
        await read_until(wy, "audio-chunk")
        await wy.disconnect()
        async with asyncio.timeout(5):
            while synth.active:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        phrases = synth.phrases
        await asyncio.sleep(0.3)
        assert synth.phrases == phrases < 60
        st = stats_of(await cmd(eng.cmd_port, "STATS"))
        assert st["bargeins"] == "1" and st["utterances_cancelled"] == "1"


# ----------------------------------------------------------------------- metrics


async def test_metrics_parse_and_match_the_cmd_port() -> None:
    async with serving_engine(ToneSynth()) as eng:
        await client(eng.http_port).audio.speech.create(
            model="tone", input="a", voice="alpha", response_format="pcm"
        )
        status, headers, raw = await request(eng.http_port, "GET", "/metrics")
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        http = parse_metrics(raw.decode())
        port = parse_metrics(await cmd(eng.cmd_port, "METRICS"))
        assert set(http) == set(port)  # the same families
        assert sample(http, "ttsdock_engine_protocol_requests_total", protocol="http") == 1
        assert http["ttsdock_engine_ttfa_seconds"].type == "summary"
        assert sample(http, "ttsdock_engine_utterances_completed_total") == 1


async def test_docked_calls_and_protocol_requests_share_the_engine() -> None:
    """A phone call's audio still reaches the dock while an HTTP stream runs; their call
    ids never meet."""
    dock = FakeDock()
    await dock.start()
    try:
        synth = ToneSynth(phrase_ms=100, delay=0.02)
        async with serving_engine(synth, dock_port=dock.port, wyoming=False) as eng:
            s = await dock.session()
            async with client(eng.http_port).audio.speech.with_streaming_response.create(
                model="tone", input="a b c d e f", voice="alpha", response_format="pcm",
                extra_body={"stream": True},
            ) as resp:  # fmt: skip
                s.text(7, "x y z")
                await s.wait_audio(7, 3)
                assert len(await resp.read()) == 6 * 4800
            assert {r.event.call_id for r in s.audio()} == {7}  # type: ignore[attr-defined]
    finally:
        await dock.stop()


# ----------------------------------------------------------------------- text pieces


def test_pieces_first_sentence_alone_then_packed() -> None:
    assert pieces("One. Two! Three?") == ["One.", "Two! Three?"]
    many = pieces("First. " + "Word word word. " * 300)
    assert many[0] == "First." and len(many) <= 64 and all(len(p) < 500 for p in many[:-1])
    assert pieces("   ") == []


def test_sentence_buffer_joins_chunks_split_anywhere() -> None:
    b = SentenceBuffer()
    assert b.feed("Hel") == [] and b.feed("lo. How") == ["Hello."]
    assert b.feed(" are you?") == [] and b.feed(" ") == ["How are you?"]
    assert b.feed("Dr.") == [] and b.flush() == ["Dr."] and b.flush() == []


def test_loopback_socket_default() -> None:
    assert HttpSettings().host == "127.0.0.1"
    with socket.socket() as s:  # (nothing listens on a port of an engine without the flag)
        s.bind(("127.0.0.1", 0))


def test_engine_refuses_a_public_listener_without_token(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engines.runtime.cli import common_parser, run_engine

    args = common_parser("tone").parse_args(["--http-host", "0.0.0.0", "--http-port", "0"])
    assert run_engine(ToneSynth(), args) == 2  # a usage error, before anything is bound
    assert "--http-token-file" in capsys.readouterr().err
    token = tmp_path / "token"
    token.write_text("short\n")
    args = common_parser("tone").parse_args(["--http-port", "0", "--http-token-file", str(token)])
    assert run_engine(ToneSynth(), args) == 2
    assert "16 characters" in capsys.readouterr().err


async def test_the_load_meter_decides_admission() -> None:
    """With an execution plan the engine's load meter predicts the headroom: an engine
    whose capacity is half a call's demand refuses a protocol request (503)."""
    synth = ToneSynth()
    synth.plan = lambda: PlanInfo("slow", "measured", {1: 2.0}, 0.5)  # type: ignore[attr-defined]
    async with serving_engine(synth, wyoming=False) as eng:
        status, headers, raw = await request(
            eng.http_port, "POST", "/v1/audio/speech", {"model": "tone", "input": "hi"}
        )
        assert status == 503 and headers["Retry-After"] == "1", raw
        assert "predicted headroom 0.47 calls" in json.loads(raw)["error"]["message"]


async def test_wyoming_idle_connection_is_closed() -> None:
    async with serving_engine(ToneSynth(), http=None) as eng:
        eng.protocols.wyoming.idle_timeout = 0.3
        reader, writer = await asyncio.open_connection("127.0.0.1", eng.wyoming_port)
        t0 = time.monotonic()
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed by the server
        assert time.monotonic() - t0 < 3
        writer.close()
