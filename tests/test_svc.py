"""svc/: logging levels, host:port parsing, socket options, sd_notify, the watchdog and the
one-command-per-connection cmd server, all on real sockets."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from svc import logs, net, systemd
from svc.logs import current_level, parse_hostport, parse_level, set_level
from svc.net import SOCKET_BUFFER, is_loopback, start_cmd_server, tune_socket
from svc.systemd import sd_notify, watchdog_interval, watchdog_loop


@pytest.fixture
def restore_logging() -> Iterator[None]:
    cfg = structlog.get_config()
    state = dict(logs._state)
    try:
        yield
    finally:
        structlog.configure(**cfg)
        logs._state.update(state)
        structlog.contextvars.unbind_contextvars("service")


# ----------------------------------------------------------------- levels


@pytest.mark.parametrize(
    ("name", "level"),
    [
        ("ERROR", logging.ERROR),
        ("WARN", logging.WARNING),
        ("WARNING", logging.WARNING),
        ("INFO", logging.INFO),
        ("DEBUG", logging.DEBUG),
        ("TRACE", 5),
        ("debug", logging.DEBUG),
        ("Warn", logging.WARNING),
        (" info\r\n", logging.INFO),
    ],
)
def test_parse_level(name: str, level: int) -> None:
    assert parse_level(name) == level


@pytest.mark.parametrize("name", ["", "VERBOSE", "CRITICAL", "FATAL", "10", "INF O"])
def test_parse_level_rejects_with_a_clear_message(name: str) -> None:
    with pytest.raises(ValueError, match="unknown log level") as info:
        parse_level(name)
    assert repr(name) in str(info.value)
    assert "TRACE" in str(info.value)


@pytest.mark.usefixtures("restore_logging")
def test_set_level_changes_level_and_filters() -> None:
    for name, shown in [
        ("ERROR", "ERROR"),
        ("warning", "WARN"),
        ("DEBUG", "DEBUG"),
        ("INFO", "INFO"),
    ]:
        set_level(name)
        assert current_level() == shown
    set_level("ERROR")
    with structlog.testing.capture_logs() as captured:
        log = structlog.get_logger("t")
        log.info("frame_dropped")
        log.error("engine_lost")
    assert [e["event"] for e in captured] == ["engine_lost"]
    set_level("DEBUG")
    with structlog.testing.capture_logs() as captured:
        structlog.get_logger("t").debug("frame_seen")
    assert [e["event"] for e in captured] == ["frame_seen"]


@pytest.mark.usefixtures("restore_logging")
def test_set_level_trace() -> None:
    set_level("TRACE")  # docs/wire.md#command-ports: SET_LOG_LEVEL:TRACE answers OK
    assert current_level() == "TRACE"
    with structlog.testing.capture_logs() as captured:
        structlog.get_logger("t").debug("frame_seen")
    assert [e["event"] for e in captured] == ["frame_seen"]


@pytest.mark.usefixtures("restore_logging")
def test_set_level_rejects_unknown_and_keeps_level() -> None:
    set_level("WARN")
    with pytest.raises(ValueError):
        set_level("LOUD")
    assert current_level() == "WARN"


@pytest.mark.usefixtures("restore_logging")
def test_udp_log_line() -> None:
    sink = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sink.bind(("127.0.0.1", 0))
    sink.settimeout(5)
    port = sink.getsockname()[1]
    try:
        logs.configure_logging("kokoro", "INFO", udp_log=("127.0.0.1", port), json_output=True)
        log = structlog.get_logger("t")
        log.warning("frame_dropped", call_id=7, reason="no_engine")
        assert sink.recv(2048).decode() == "KOKORO WARN 7 frame_dropped reason=no_engine"
        log.info("engine_docked", name="kokoro")
        assert sink.recv(2048).decode() == "KOKORO INFO 0 engine_docked name=kokoro"
        log.debug("not_sent")
        log.error("engine_lost", call_id=3)
        assert sink.recv(2048).decode() == "KOKORO ERROR 3 engine_lost"
    finally:
        sink.close()


# ----------------------------------------------------------------- host:port


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("127.0.0.1:13143", ("127.0.0.1", 13143)),
        ("localhost:9", ("localhost", 9)),
        (":9000", ("127.0.0.1", 9000)),
        ("127.0.0.1", ("127.0.0.1", 22022)),
        ("example.host", ("example.host", 22022)),
        ("", ("127.0.0.1", 22022)),
        ("10.1.2.3:0", ("10.1.2.3", 0)),
    ],
)
def test_parse_hostport(value: str, expected: tuple[str, int]) -> None:
    assert parse_hostport(value, 22022) == expected


@pytest.mark.parametrize("value", ["host:port", "127.0.0.1:", "h:1.5"])
def test_parse_hostport_bad_port(value: str) -> None:
    with pytest.raises(ValueError):
        parse_hostport(value, 1)


# ----------------------------------------------------------------- loopback


@pytest.mark.parametrize(
    ("host", "loop"),
    [
        ("127.0.0.1", True),
        ("127.1.2.3", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("::1%lo", True),
        ("10.0.0.1", False),
        ("192.168.1.10", False),
        ("0.0.0.0", False),
        ("::", False),
        ("::ffff:10.0.0.1", False),
        ("fe80::1%eth0", False),
        ("localhost", False),  # not an address: refuse rather than resolve
        ("", False),
    ],
)
def test_is_loopback(host: str, loop: bool) -> None:
    assert is_loopback(host) is loop


# ----------------------------------------------------------------- socket options


def test_tune_socket_on_a_real_tcp_socket() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) == 0
        tune_socket(s)
        assert s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) != 0
        rmem = Path("/proc/sys/net/core/rmem_max")
        if rmem.exists() and int(rmem.read_text()) >= SOCKET_BUFFER:
            # Linux reports twice the requested size (bookkeeping overhead)
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF) >= SOCKET_BUFFER
            assert s.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) >= SOCKET_BUFFER


async def test_tune_socket_on_a_connected_stream() -> None:
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        sock = writer.get_extra_info("socket")
        tune_socket(sock)
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
        assert net.peer_host(writer) == "127.0.0.1"
        writer.close()
    finally:
        server.close()
        await server.wait_closed()


def test_tune_socket_tolerates_other_sockets() -> None:
    tune_socket(None)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        tune_socket(a)  # no TCP_NODELAY on AF_UNIX: best effort, no error


# ----------------------------------------------------------------- systemd


@pytest.fixture
def notify_socket(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    with tempfile.TemporaryDirectory(prefix="sdn") as d:  # short: AF_UNIX paths <= 107 bytes
        path = os.path.join(d, "notify")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        s.bind(path)
        s.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", path)
        try:
            yield s
        finally:
            s.close()


def test_sd_notify_real_socket(notify_socket: socket.socket) -> None:
    assert sd_notify("READY=1") is True
    assert notify_socket.recv(256) == b"READY=1"
    assert sd_notify("STOPPING=1") is True
    assert notify_socket.recv(256) == b"STOPPING=1"


def test_sd_notify_abstract_socket(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"ttsdock-test-{os.getpid()}-{id(monkeypatch)}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind("\0" + name)
        s.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        assert sd_notify("WATCHDOG=1") is True
        assert s.recv(256) == b"WATCHDOG=1"


def test_sd_notify_without_systemd(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sd_notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "")
    assert sd_notify("READY=1") is False
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/ttsdock/notify")
    assert sd_notify("READY=1") is False


@pytest.mark.parametrize(
    ("usec", "pid", "expected"),
    [
        ("2000000", None, 1.0),
        ("2000000", "self", 1.0),
        ("30000000", "self", 15.0),
        ("2000000", "1", None),  # watchdog meant for another process
        ("1", None, 0.01),  # clamped
        (None, None, None),
        ("", None, None),
        ("abc", None, None),
    ],
)
def test_watchdog_interval(
    monkeypatch: pytest.MonkeyPatch, usec: str | None, pid: str | None, expected: float | None
) -> None:
    for key, value in (("WATCHDOG_USEC", usec), ("WATCHDOG_PID", pid)):
        if value is None:
            monkeypatch.delenv(key, raising=False)
        else:
            monkeypatch.setenv(key, str(os.getpid()) if value == "self" else value)
    assert watchdog_interval() == expected


async def test_watchdog_loop_pings(
    monkeypatch: pytest.MonkeyPatch, notify_socket: socket.socket
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "20000")  # every 10 ms
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    notify_socket.setblocking(False)
    loop = asyncio.get_running_loop()
    task = asyncio.create_task(watchdog_loop())
    try:
        got = [await asyncio.wait_for(loop.sock_recv(notify_socket, 64), 5) for _ in range(3)]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert got == [b"WATCHDOG=1"] * 3


async def test_watchdog_loop_returns_without_watchdog(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    await asyncio.wait_for(watchdog_loop(), 5)
    assert systemd.watchdog_interval() is None


# ----------------------------------------------------------------- cmd server


class Recorder:
    def __init__(self, reply: str | None = None) -> None:
        self.calls: list[bytes] = []
        self.reply = reply

    async def __call__(self, data: bytes) -> str:
        self.calls.append(data)
        if self.reply is not None:
            return self.reply
        line = data.split(b"\n", 1)[0].rstrip(b"\r")  # as protocol.parse_command does
        return "PONG" if line == b"PING" else "ERR unknown_command"


async def _serve(handler: Recorder, **kw: Any) -> tuple[asyncio.Server, int]:
    server = await start_cmd_server("127.0.0.1", 0, handler, **kw)
    assert server is not None
    return server, server.sockets[0].getsockname()[1]


async def _close(server: asyncio.Server) -> None:
    server.close()
    await server.wait_closed()


async def _exchange(port: int, data: bytes, *, half_close: bool = False) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        if half_close:
            writer.write_eof()
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5)  # until the server closes
    finally:
        writer.close()


async def test_cmd_server_one_command_one_reply_then_close() -> None:
    h = Recorder()
    server, port = await _serve(h, max_len=512)
    try:
        assert server.sockets[0].getsockname()[0] == "127.0.0.1"
        assert await _exchange(port, b"PING\r\n") == b"PONG\n"
        assert await _exchange(port, b"NOPE\n") == b"ERR unknown_command\n"
        assert h.calls == [b"PING\r\n", b"NOPE\n"]
    finally:
        await _close(server)


async def test_cmd_server_second_line_on_same_connection_is_not_served() -> None:
    h = Recorder()
    server, port = await _serve(h, max_len=512)
    try:
        reply = await _exchange(port, b"PING\nPING\n")
        assert reply == b"PONG\n"  # exactly one reply line, then EOF
        assert len(h.calls) == 1
    finally:
        await _close(server)


async def test_cmd_server_eof_without_newline() -> None:
    h = Recorder()
    server, port = await _serve(h, max_len=512)
    try:
        assert await _exchange(port, b"PING", half_close=True) == b"PONG\n"
        assert h.calls == [b"PING"]
    finally:
        await _close(server)


async def test_cmd_server_reads_at_most_max_len() -> None:
    h = Recorder(reply="OK")
    server, port = await _serve(h, max_len=16)
    try:
        # no newline and the connection stays open: the server must stop at 16 bytes
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"A" * 40)
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b"OK\n"
        writer.close()
        assert h.calls == [b"A" * 16]
    finally:
        await _close(server)


async def test_cmd_server_engine_and_dock_bounds() -> None:
    h = Recorder(reply="OK")
    server, port = await _serve(h, max_len=512)
    try:
        await _exchange(port, b"TEST_SYNTH:" + b"x" * 1000 + b"\n")
        assert len(h.calls[-1]) == 512
    finally:
        await _close(server)


async def test_cmd_server_timeout_closes_without_reply() -> None:
    h = Recorder()
    server, port = await _serve(h, max_len=512, read_timeout=0.2)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # nothing sent: closed
        writer.close()
        assert h.calls == []
        assert await _exchange(port, b"PING\n") == b"PONG\n"  # still serving
    finally:
        await _close(server)


async def test_cmd_server_answers_a_command_without_newline() -> None:
    """docs/wire.md#command-ports: the reference answers after one read, so `printf STATUS | nc` (no
    newline, socket kept open) gets its reply; a line split over two quick writes is
    still read whole."""
    h = Recorder()
    server, port = await _serve(h, max_len=512, read_timeout=5)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PING")  # no newline, no half-close
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b"PONG\n"
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"PI")
        await writer.drain()
        writer.write(b"NG\n")
        await writer.drain()
        assert await asyncio.wait_for(reader.read(), 5) == b"PONG\n"
        writer.close()
        assert h.calls[-2:] == [b"PING", b"PING\n"]
    finally:
        await _close(server)


async def test_cmd_server_reply_is_one_line() -> None:
    h = Recorder(reply="first\nsecond")
    server, port = await _serve(h, max_len=512)
    try:
        assert await _exchange(port, b"X\n") == b"first second\n"
    finally:
        await _close(server)


async def test_cmd_server_concurrent_clients() -> None:
    h = Recorder()
    server, port = await _serve(h, max_len=512)
    try:
        replies = await asyncio.gather(*(_exchange(port, b"PING\n") for _ in range(10)))
        assert replies == [b"PONG\n"] * 10
    finally:
        await _close(server)


async def test_cmd_server_client_gone_early() -> None:
    h = Recorder()
    server, port = await _serve(h, max_len=512)
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.close()
        await asyncio.sleep(0.05)
        assert await _exchange(port, b"PING\n") == b"PONG\n"
    finally:
        await _close(server)


def _occupied_port() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s


async def test_bind_conflict_without_retry_raises() -> None:
    with _occupied_port() as blocker:
        port = blocker.getsockname()[1]
        with pytest.raises(OSError):
            await start_cmd_server("127.0.0.1", port, Recorder(), max_len=64)


async def test_retry_bind_succeeds_after_port_is_released() -> None:
    blocker = _occupied_port()
    port = blocker.getsockname()[1]
    task = asyncio.create_task(
        start_cmd_server("127.0.0.1", port, Recorder(), max_len=64, retry_bind=True)
    )
    try:
        await asyncio.sleep(0.5)  # a couple of 200 ms retries
        assert not task.done()
        blocker.close()
        server = await asyncio.wait_for(task, 5)
        assert server is not None
        try:
            assert server.sockets[0].getsockname()[1] == port
            assert await _exchange(port, b"PING\n") == b"PONG\n"
        finally:
            await _close(server)
    finally:
        blocker.close()
        task.cancel()


async def test_retry_bind_stops_when_asked() -> None:
    with _occupied_port() as blocker:
        port = blocker.getsockname()[1]
        stop = asyncio.Event()
        task = asyncio.create_task(
            start_cmd_server("127.0.0.1", port, Recorder(), max_len=64, retry_bind=True, stop=stop)
        )
        await asyncio.sleep(0.1)
        assert not task.done()
        stop.set()
        assert await asyncio.wait_for(task, 5) is None
