"""Socket helpers: the socket options of docs/wire.md#socket-options, loopback checks,
and the one-command-per-connection text cmd server used by the dock (13142) and the
engines (13144)."""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import socket
from collections.abc import Awaitable, Callable

import structlog

SOCKET_BUFFER = 128 * 1024  # docs/wire.md#socket-options: 128 KiB buffers
CMD_TIMEOUT = 10.0  # docs/wire.md#engine-cmd-port: 10 s receive timeout
# docs/wire.md#engine-cmd-port: retry the cmd-port bind every 200 ms during a hot swap
BIND_RETRY = 0.2
LINE_GRACE = 0.05  # seconds to wait for the rest of a command line that arrived without \n

log = structlog.get_logger(__name__)


def tune_socket(sock: socket.socket | None) -> None:
    """TCP_NODELAY, SO_KEEPALIVE, 128 KiB send/receive buffers (best effort)."""
    if sock is None:
        return
    for level, opt, val in (
        (socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER),
        (socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER),
    ):
        try:
            sock.setsockopt(level, opt, val)
        except OSError:
            pass


def is_loopback(host: str) -> bool:
    try:
        addr = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped.is_loopback
    return addr.is_loopback


def peer_host(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(peer[0]) if isinstance(peer, tuple) and peer else ""


CommandHandler = Callable[[bytes], Awaitable[str]]


async def _serve_one(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    handler: CommandHandler,
    max_len: int,
    read_timeout: float,
) -> None:
    try:
        data = bytearray()
        async with asyncio.timeout(read_timeout):
            data += await reader.read(max_len)
        # The reference answers after one read; a line split over several segments is
        # completed as long as more bytes follow quickly, and a client that sends no
        # newline and keeps the socket open (plain `printf CMD | nc`) is answered too.
        while data and len(data) < max_len and b"\n" not in data:
            try:
                async with asyncio.timeout(LINE_GRACE):
                    chunk = await reader.read(max_len - len(data))
            except TimeoutError:
                break
            if not chunk:
                break
            data += chunk
        try:
            reply = await handler(bytes(data))
        except Exception as exc:  # a bad command must never take the service down
            log.error("command_failed", error=repr(exc))
            reply = "ERROR:internal"
        # One reply line; a handler may return a pre-formatted multi-line reply by ending
        # it with a newline (e.g. the dock's METRICS): the connection closes after it anyway.
        line = reply if reply.endswith("\n") else reply.replace("\n", " ") + "\n"
        writer.write(line.encode("utf-8", errors="replace"))
        await writer.drain()
    except TimeoutError:
        log.warning("command_timed_out", peer=peer_host(writer))
    except (ConnectionError, OSError) as exc:
        log.debug("command_connection_lost", error=str(exc))
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def start_cmd_server(
    host: str,
    port: int,
    handler: CommandHandler,
    *,
    max_len: int,
    read_timeout: float = CMD_TIMEOUT,
    retry_bind: bool = False,
    stop: asyncio.Event | None = None,
) -> asyncio.Server | None:
    """Serve one command per connection: read up to ``max_len`` bytes or a newline, reply
    one line, close. With ``retry_bind`` the bind is retried every 200 ms while the port is
    taken (the old engine still holds it during a hot swap) until ``stop`` is set; returns
    ``None`` if stopped before binding."""

    async def on_conn(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _serve_one(reader, writer, handler, max_len, read_timeout)

    logged = False
    while True:
        try:
            return await asyncio.start_server(on_conn, host, port, reuse_address=True)
        except OSError as exc:
            if not retry_bind or exc.errno != errno.EADDRINUSE:
                raise
            if not logged:
                log.info("cmd_port_busy", host=host, port=port, error=exc.strerror)
                logged = True
            if stop is not None and stop.is_set():
                return None
            await asyncio.sleep(BIND_RETRY)
