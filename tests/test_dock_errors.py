"""Peer mistakes against the real dock process: each closes only the offending connection
(with the protocol's error reply where one exists); the dock keeps serving everyone else."""

from __future__ import annotations

import asyncio
import os
import socket
import struct
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from dock_helpers import (
    ROOT,
    DockProcess,
    FakeEngine,
    FakeOap,
    Rig,
    eventually,
    make_rig,
    recv,
    recv_until,
)

from protocol.framing import FrameCipher, encode_frame
from protocol.hello import Hello, encode_hello
from protocol.mgmt import CallEnd, Custom, Ping, Pong, encode_mgmt
from protocol.packet import Packet, encode_packet

pytestmark = pytest.mark.slow


@pytest_asyncio.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    async with make_rig(tmp_path) as r:
        yield r


async def _still_serving(rig: Rig, eng: FakeEngine, call_id: int = 77) -> None:
    """The active engine, LLaMA and OAP are unaffected."""
    assert (await rig.dock.cmd("STATUS")).strip() == f"ACTIVE {eng.name}"
    rig.llama.text(call_id, "noch da")
    assert await eng.next_of(Packet) == Packet(call_id, b"noch da")
    eng.audio(call_id)
    assert (await recv(rig.oap.packets)).call_id == call_id


GOOD = encode_hello(Hello("good"))


@pytest.mark.parametrize(
    ("hello", "reason"),
    [
        (b'{"name":"x","sample_rate":24000,"channels":1}\n', "hello_missing_field"),
        (b"not json\n", "hello_missing_field"),
        (b"[1,2]\n", "hello_missing_field"),
        (encode_hello(Hello("bad name!")), "hello_bad_name"),
        (encode_hello(Hello("x" * 33)), "hello_bad_name"),
        (encode_hello(Hello("n", sample_rate=16000)), "hello_bad_sample_rate"),
        (encode_hello(Hello("n", channels=2)), "hello_bad_channels"),
        (encode_hello(Hello("n", format="s16le")), "hello_bad_format"),
        (b"x" * 1100 + b"\n", "hello_timeout_or_too_long"),
        (b'{"name":"a\x01"}\n', "hello_timeout_or_too_long"),
    ],
)
async def test_hello_rejected(rig: Rig, hello: bytes, reason: str) -> None:
    good = await rig.engine("good")
    bad = FakeEngine(rig.dock.ports["dock"], "bad", hello=hello)
    assert await bad.dock() == f"ERR {reason}".encode()
    assert rig.dock.events("engine_rejected")[-1]["reason"] == reason
    await _still_serving(rig, good)
    await bad.close()


async def test_hello_timeout(rig: Rig) -> None:
    good = await rig.engine("good")
    silent = FakeEngine(rig.dock.ports["dock"], "silent", hello=b'{"name":')
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await silent.dock() == b"ERR hello_timeout_or_too_long"
    assert loop.time() - t0 >= 1.9  # docs/wire.md#handshake: 2 s to send the HELLO
    await _still_serving(rig, good)
    await silent.close()


@pytest.mark.parametrize(
    ("garbage", "reason"),
    [
        (b"\x07", "unknown_tag"),
        (b"\x02\x63", "unknown_mgmt_type"),
        (b"\x01" + struct.pack(">II", 5, (1 << 20) + 1), "payload_too_large"),
        (b"\x01" + struct.pack(">II", 0, 4) + b"abcd", "bad_call_id"),
        (b"\x02\x0a" + struct.pack(">H", 5000), "custom_too_long"),
    ],
)
async def test_malformed_engine_frame_closes_only_that_engine(
    rig: Rig, garbage: bytes, reason: str
) -> None:
    # a replaced (draining) engine sending garbage does not disturb the active one
    old = await rig.engine("old")
    new = await rig.engine("new")
    await old.next_of(Custom)
    old.send_raw(garbage)
    await asyncio.wait_for(old.closed.wait(), 5)
    await _still_serving(rig, new)
    # the active engine sending garbage is closed and the slot cleared like a disconnect
    new.send_raw(garbage)
    await asyncio.wait_for(new.closed.wait(), 5)
    await eventually(lambda: rig.status_is("NONE"), what="slot cleared")
    reasons = [e["reason"] for e in rig.dock.events("engine_frame_rejected")]
    assert reasons == [reason, reason]
    again = await rig.engine("again")
    await _still_serving(rig, again)


@pytest.mark.parametrize(
    ("channel", "garbage"),
    [
        ("mgmt", struct.pack(">I", (1 << 20) + 257)),  # oversize length
        ("data", struct.pack(">I", 0xFFFFFFFF)),  # oversize length
    ],
)
async def test_llama_framing_error_closes_only_that_channel(
    rig: Rig, channel: str, garbage: bytes
) -> None:
    eng = await rig.engine()
    bad = rig.llama.mgmt if channel == "mgmt" else rig.llama.data
    other = rig.llama.data if channel == "mgmt" else rig.llama.mgmt
    assert bad is not None and other is not None
    bad.send_raw(garbage)
    await asyncio.wait_for(bad.closed.wait(), 5)
    assert not other.closed.is_set()
    assert rig.dock.events("frame_rejected")[-1]["channel"] == f"llama_{channel}"
    assert await rig.dock.stat(f"drop_malformed_llama_{channel}") == 1
    # LLaMA reconnects that channel and everything flows again
    from dock_helpers import FakeLlama

    rig.llama = await FakeLlama(rig.dock.ports).connect()
    await _still_serving(rig, eng)


BAD_DATA_BODIES = [
    (struct.pack(">II", 0, 1) + b"x", "bad_call_id"),  # call_id 0
    (struct.pack(">II", 1, 9) + b"x", "packet_size_mismatch"),
    (b"abc", "short_packet"),
    (struct.pack(">II", 1, (1 << 20) + 1) + b"x", "payload_too_large"),
]
BAD_MGMT_BODIES = [b"\x63", b"", b"\x01\x00\x00"]  # unknown type, empty, short CALL_END


@pytest.mark.parametrize(("body", "reason"), BAD_DATA_BODIES)
async def test_bad_llama_packet_costs_only_itself(rig: Rig, body: bytes, reason: str) -> None:
    # the valid packet right behind the bad one, in the same write, still arrives
    eng = await rig.engine()
    assert rig.llama.data is not None
    rig.llama.data.send_raw(encode_frame(body) + encode_frame(encode_packet(Packet(6, b"ok"))))
    assert await eng.next_of(Packet) == Packet(6, b"ok")
    assert not rig.llama.data.closed.is_set()
    assert await rig.dock.stat("drop_bad_packet") == 1
    assert await rig.dock.stat("drop_malformed_llama_data") == 0
    warn = rig.dock.events("packet_dropped")[-1]
    assert (warn["channel"], warn["reason"]) == ("llama_data", reason)
    await _still_serving(rig, eng)


@pytest.mark.parametrize("body", BAD_MGMT_BODIES)
async def test_bad_llama_mgmt_body_costs_only_itself(rig: Rig, body: bytes) -> None:
    eng = await rig.engine()
    assert rig.llama.mgmt is not None
    rig.llama.mgmt.send_raw(encode_frame(body) + encode_frame(encode_mgmt(CallEnd(12))))
    assert await recv_until(rig.oap.messages, lambda m: isinstance(m, CallEnd)) == CallEnd(12)
    assert not rig.llama.mgmt.closed.is_set()
    assert await rig.dock.stat("drop_bad_packet") == 1
    assert await rig.dock.stat("drop_malformed_llama_mgmt") == 0
    await _still_serving(rig, eng)


async def test_bad_packet_warn_is_rate_limited(rig: Rig) -> None:
    eng = await rig.engine()
    assert rig.llama.data is not None
    bad = encode_frame(struct.pack(">II", 0, 1) + b"x")
    rig.llama.data.send_raw(bad * 50 + encode_frame(encode_packet(Packet(6, b"ok"))))
    assert await eng.next_of(Packet) == Packet(6, b"ok")
    assert await rig.dock.stat("drop_bad_packet") == 50
    assert len(rig.dock.events("packet_dropped")) == 1  # one WARN per second at most


async def test_oap_framing_error_closes_oap_channel_dock_reconnects(rig: Rig) -> None:
    eng = await rig.engine()
    assert rig.oap.mgmt is not None
    first = rig.oap.mgmt_connects
    rig.oap.mgmt.send_raw(struct.pack(">I", 0xFFFFFFFF))
    await eventually(lambda: rig.oap.mgmt_connects > first, what="dock reconnects to OAP")
    assert rig.dock.events("frame_rejected")[-1]["channel"] == "oap_mgmt"
    rig.llama.send(CallEnd(3))
    assert await recv_until(rig.oap.messages, lambda m: isinstance(m, CallEnd)) == CallEnd(3)
    await _still_serving(rig, eng)


async def test_bad_oap_mgmt_body_costs_only_itself(rig: Rig) -> None:
    eng = await rig.engine()
    assert rig.oap.mgmt is not None
    first = rig.oap.mgmt_connects
    rig.oap.mgmt.send_raw(encode_frame(b"\x63") + encode_frame(encode_mgmt(Ping())))
    assert await recv_until(rig.oap.messages, lambda m: isinstance(m, Pong)) == Pong()
    assert await rig.dock.stat("drop_bad_packet") == 1
    assert rig.oap.mgmt_connects == first
    await _still_serving(rig, eng)


async def test_oap_ping_and_custom_answered(rig: Rig) -> None:
    assert rig.oap.mgmt is not None
    rig.oap.mgmt.send(Ping())
    rig.oap.mgmt.send(Custom(b"HELLO_FROM_OAP"))
    assert await recv_until(rig.oap.messages, lambda m: isinstance(m, Pong)) == Pong()
    assert await recv_until(rig.oap.messages, lambda m: isinstance(m, Custom)) == Custom(b"")


async def test_flush_unanswered_does_not_block(rig: Rig) -> None:
    rig.oap.answer_flush = False
    eng = await rig.engine("a")
    eng.abort()
    await rig.oap.flushes()
    eng2 = await rig.engine("b")
    await _still_serving(rig, eng2)
    await eventually(lambda: rig.dock.stat("flushes_unanswered"), what="unanswered counted")


# ---------------------------------------------------------------------------- cmd port
async def test_cmd_port_commands(rig: Rig) -> None:
    d = rig.dock
    assert await d.cmd("PING") == "PONG\n"
    assert await d.cmd("STATUS") == "NONE\n"
    eng = await rig.engine("kokoro")
    assert await d.cmd("STATUS\r\n") == "ACTIVE kokoro\n"
    assert await d.cmd("SET_LOG_LEVEL:WARN") == "OK\n"
    assert (await d.cmd("SET_LOG_LEVEL:LOUD")).startswith("ERR ")
    assert "log_level=WARN" in await d.cmd("STATS")
    assert await d.cmd("SET_LOG_LEVEL:debug") == "OK\n"
    assert await d.cmd("BOGUS") == "ERR unknown_command\n"
    assert await d.cmd(b"\x00\xff\xfe garbage \x01\n") == "ERR unknown_command\n"
    assert await d.cmd(b"A" * 2000) == "ERR unknown_command\n"
    assert await d.cmd(b"") == "ERR unknown_command\n"
    eng.audio(5)
    await recv(rig.oap.packets)
    stats = (await d.cmd("STATS")).strip()
    assert stats.count("\n") == 0 and "audio_frames_out=1" in stats and "hop_p99_us=" in stats
    assert "engine=kokoro" in stats and "oap_data_connected=1" in stats
    engines = await d.cmd("ENGINES")
    assert "slot=active" in engines and "active=kokoro/1/uptime=" in engines
    rig.llama.text(9, "x")
    await eng.next_of(Packet)
    assert "9:new:held=0/0B" in await d.cmd("CALLS")
    metrics = await d.cmd("METRICS")
    assert "# TYPE ttsdock_audio_frames_out_total counter" in metrics
    assert "ttsdock_audio_frames_out_total 1\n" in metrics
    assert 'ttsdock_hop_latency_seconds{quantile="0.99"}' in metrics
    assert "ttsdock_engine_active 1\n" in metrics


async def _ctl(*args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ttsdock", "ctl", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    out, err = await proc.communicate()
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_ctl_exit_codes(rig: Rig) -> None:
    port = str(rig.dock.ports["cmd"])
    assert await _ctl("--port", port, "STATUS") == (0, "NONE\n", "")
    assert await _ctl("--port", port, "PING") == (0, "PONG\n", "")
    rc, out, _ = await _ctl("--port", port, "NOPE")
    assert (rc, out) == (1, "ERR unknown_command\n")
    rc, out, _ = await _ctl("--port", port, "SET_LOG_LEVEL:NOISY")
    assert rc == 1 and out.startswith("ERR ")
    rc, out, _ = await _ctl("--port", port, "METRICS")
    assert rc == 0 and out.count("\n") > 10
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        free = str(s.getsockname()[1])
    rc, out, err = await _ctl("--port", free, "STATUS")
    assert rc == 2 and out == "" and "cannot reach 127.0.0.1:" in err


# ---------------------------------------------------------------------------- encryption
async def test_encryption_on_both_channels(tmp_path: Path) -> None:
    key = os.urandom(32)
    (tmp_path / "ic_key.bin").write_bytes(key)
    (tmp_path / "ic_encryption.flag").write_text("1\n")
    cipher = FrameCipher(key)
    args = (
        "--ic-key",
        str(tmp_path / "ic_key.bin"),
        "--ic-flag",
        str(tmp_path / "ic_encryption.flag"),
    )
    async with make_rig(tmp_path, *args, cipher=cipher) as rig:
        eng = await rig.engine()
        rig.llama.text(4, "geheim")
        assert await eng.next_of(Packet) == Packet(4, b"geheim")
        rig.llama.send(CallEnd(5))
        assert await recv_until(rig.oap.messages, lambda m: isinstance(m, CallEnd)) == CallEnd(5)
        eng.audio(4, samples=100)
        got = await recv(rig.oap.packets)
        assert got.call_id == 4 and len(got.payload) == 412
        assert rig.dock.events("dock_started")[0]["encryption"] is True
        # a plaintext frame fails authentication: that channel is closed, nothing else
        assert rig.llama.mgmt is not None
        rig.llama.mgmt.send_raw(encode_frame(b"\x04"))
        await asyncio.wait_for(rig.llama.mgmt.closed.wait(), 5)
        assert rig.dock.events("frame_rejected")[-1]["reason"] in ("bad_tag", "short_ciphertext")


async def test_encryption_flag_off_means_plaintext(tmp_path: Path) -> None:
    (tmp_path / "k.bin").write_bytes(os.urandom(32))
    (tmp_path / "f").write_text("0")
    async with make_rig(
        tmp_path, "--ic-key", str(tmp_path / "k.bin"), "--ic-flag", str(tmp_path / "f")
    ) as rig:
        eng = await rig.engine()
        rig.llama.text(4, "klar")
        assert await eng.next_of(Packet) == Packet(4, b"klar")


async def test_bad_key_is_a_clear_startup_error(tmp_path: Path) -> None:
    (tmp_path / "k.bin").write_bytes(b"short")
    oap = await FakeOap().start()
    dock = DockProcess(tmp_path, oap.ports, "--ic-key", str(tmp_path / "k.bin"))
    with pytest.raises(AssertionError, match="must be 32 bytes"):
        await dock.start()
    await oap.stop()


# ---------------------------------------------------------------------------- service
async def test_sd_notify_ready_watchdog_stopping(tmp_path: Path) -> None:
    sock_path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_path))
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    oap = await FakeOap().start()
    dock = await DockProcess(tmp_path, oap.ports).start(
        env={"NOTIFY_SOCKET": str(sock_path), "WATCHDOG_USEC": "100000"}
    )
    got: list[bytes] = []
    async with asyncio.timeout(10):
        while b"WATCHDOG=1" not in got or b"READY=1" not in got:
            got.append(await loop.sock_recv(sock, 256))
    assert got.count(b"READY=1") == 1  # once, however many watchdog pings
    assert await dock.stop() == 0
    async with asyncio.timeout(10):
        while b"STOPPING=1" not in got:
            got.append(await loop.sock_recv(sock, 256))
    sock.close()
    await oap.stop()
    assert "Traceback" not in dock.logs()


async def test_port_from_environment_and_bad_flags(tmp_path: Path) -> None:
    oap = await FakeOap().start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    dock = DockProcess(tmp_path, oap.ports)
    dock.args[dock.args.index("--cmd-port") : dock.args.index("--cmd-port") + 2] = []
    await dock.start(env={"TTSDOCK_CMD_PORT": str(free)})
    assert dock.ports["cmd"] == free
    assert await dock.stop() == 0
    await oap.stop()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ttsdock", "serve", "--dock-port", "70000",
        stderr=asyncio.subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    _, err = await proc.communicate()
    assert proc.returncode == 2 and b"port out of range" in err
