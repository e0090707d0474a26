"""Logging: structlog to stderr (JSON when not a TTY), runtime level changes, and the
optional WhisperTalk UDP log line ``<SERVICE> <LEVEL> <CALL_ID> <message>``
(docs/wire.md#log-lines)."""

from __future__ import annotations

import logging
import socket
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

# WhisperTalk levels -> stdlib levels. TRACE sits below DEBUG.
TRACE = 5
logging.addLevelName(TRACE, "TRACE")
LEVELS: dict[str, int] = {
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": TRACE,
}
_WT_NAME = {
    logging.ERROR: "ERROR",
    logging.WARNING: "WARN",
    logging.INFO: "INFO",
    logging.DEBUG: "DEBUG",
    TRACE: "TRACE",
}
UDP_LOG_DEFAULT = ("127.0.0.1", 22022)

_state: dict[str, Any] = {"level": logging.INFO, "udp": None, "service": "TTS"}


def parse_level(name: str) -> int:
    """``ERROR|WARN|INFO|DEBUG|TRACE`` (case-insensitive) -> level; ``ValueError`` otherwise."""
    try:
        return LEVELS[name.strip().upper()]
    except KeyError:
        raise ValueError(f"unknown log level {name!r} (ERROR, WARN, INFO, DEBUG, TRACE)") from None


def current_level() -> str:
    return _WT_NAME.get(_state["level"], "INFO")


def set_level(name: str) -> None:
    """Change the level at once for every logger (cmd ``SET_LOG_LEVEL``)."""
    level = parse_level(name)
    _state["level"] = level
    structlog.configure(wrapper_class=_filtering(level))


def _filtering(level: int) -> Any:
    # structlog has no TRACE method level: TRACE enables everything DEBUG does.
    return structlog.make_filtering_bound_logger(max(level, logging.DEBUG))


class _UdpSink:
    def __init__(self, host: str, port: int) -> None:
        family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        self.addr = addr
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.setblocking(False)

    def send(self, line: str) -> None:
        try:
            self.sock.sendto(line.encode("utf-8", errors="replace")[:1400], self.addr)
        except OSError:
            pass  # a log sink must never hurt the service


def _udp_processor(
    _logger: Any, method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    sink: _UdpSink | None = _state["udp"]
    if sink is not None:
        level = {"warning": "WARN", "exception": "ERROR", "critical": "ERROR"}.get(
            method, method.upper()
        )
        call_id = event_dict.get("call_id", 0)
        extra = " ".join(
            f"{k}={v}"
            for k, v in event_dict.items()
            if k not in ("event", "call_id", "timestamp", "level", "service")
        )
        msg = f"{event_dict.get('event', '')} {extra}".strip()
        sink.send(f"{_state['service']} {level} {call_id} {msg}")
    return event_dict


def configure_logging(
    service: str,
    level: str = "INFO",
    *,
    udp_log: tuple[str, int] | None = None,
    json_output: bool | None = None,
) -> None:
    """Configure structlog once per process. ``json_output`` defaults to "stderr is not a TTY"."""
    lvl = parse_level(level)
    _state["level"] = lvl
    _state["service"] = service.upper()
    _state["udp"] = _UdpSink(*udp_log) if udp_log else None
    as_json = (not sys.stderr.isatty()) if json_output is None else json_output
    renderer: Any = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _udp_processor,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=_filtering(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    structlog.contextvars.bind_contextvars(service=service)


def parse_hostport(value: str, default_port: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``:port``, ``[v6]:port`` or a bare IPv6 address -> (host, port);
    host defaults to 127.0.0.1. Raises ``ValueError`` naming the bad value."""
    value = value.strip()
    if value.startswith("["):
        host, sep, rest = value[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"bad address {value!r}: expected [IPv6]:port")
        if not rest:
            return (host, default_port)
        port_s = rest[1:]
    elif value.count(":") > 1:
        return (value, default_port)  # bare IPv6 address
    else:
        host, sep, port_s = value.partition(":")
        if not sep:
            return (host or "127.0.0.1", default_port)
    if not port_s:
        raise ValueError(f"missing port after ':' in address {value!r}")
    try:
        port = int(port_s)
    except ValueError:
        raise ValueError(f"bad port {port_s!r} in address {value!r}") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"port {port} out of range in address {value!r}")
    return (host or "127.0.0.1", port)
