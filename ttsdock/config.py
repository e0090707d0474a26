"""Command line and environment of ``ttsdock serve``.

Every flag has an environment variable ``TTSDOCK_<FLAG>`` (upper case, dashes as
underscores); the flag wins over the variable, the variable over the default.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from protocol.framing import FrameCipher, flag_on
from svc.cli import env_default, hostport, int_in, level, port
from svc.logs import UDP_LOG_DEFAULT
from svc.lru import ENDED_CALLS, ENDED_CALLS_MIN
from ttsdock import hold

LOOPBACK = "127.0.0.1"
ENV_PREFIX = "TTSDOCK_"
OAP_BUFFER_BYTES = 4 << 20  # audio queued while OAP data is down before frames are dropped
OAP_QUEUE_SECONDS = 1.0  # audio queued while OAP is down is stale after this
# back-pressure (ttsdock.hop): above the high-water mark of OAP data's write buffer the
# active engine's socket is not read, below the low-water mark it is read again; memory
# per engine is bounded by the high-water mark plus one socket read
# (4 MiB / 1 MiB: a burst through the dock runs at the direct path's rate, measured with
# benchmarks/dock_hop.py; 1 MiB / 256 KiB cost ~15 % of it in pause/resume cycles)
OAP_HIGH_WATER = 4 << 20
OAP_LOW_WATER = 1 << 20


@dataclass(frozen=True, slots=True)
class Config:
    llama_host: str = LOOPBACK
    llama_mgmt_port: int = 13140
    llama_data_port: int = 13141
    cmd_host: str = LOOPBACK
    cmd_port: int = 13142
    dock_host: str = LOOPBACK
    dock_port: int = 13143
    oap_host: str = LOOPBACK
    oap_mgmt_port: int = 13150
    oap_data_port: int = 13151
    ic_key: Path | None = None
    ic_flag: Path | None = None
    hold_packets: int = hold.HOLD_PACKETS
    hold_bytes: int = hold.HOLD_BYTES
    hold_seconds: float = hold.HOLD_SECONDS
    hold_calls: int = hold.HOLD_CALLS
    hold_total_bytes: int = hold.HOLD_TOTAL_BYTES
    oap_buffer_bytes: int = OAP_BUFFER_BYTES
    oap_queue_seconds: float = OAP_QUEUE_SECONDS
    oap_high_water: int = OAP_HIGH_WATER
    oap_low_water: int = OAP_LOW_WATER
    ended_calls: int = ENDED_CALLS
    log_level: str = "INFO"
    udp_log: tuple[str, int] | None = None
    ready_file: Path | None = None
    http_host: str = LOOPBACK
    http_port: int | None = None  # None: no HTTP listener (/metrics, /health)
    http_token_file: Path | None = None

    def cipher(self) -> FrameCipher | None:
        """The interconnect cipher, or ``None`` when encryption is off. Raises ``ValueError``
        naming the file when the key is missing or malformed."""
        if self.ic_key is None:
            if self.ic_flag is not None and flag_on(self.ic_flag):
                raise ValueError(f"{self.ic_flag} switches encryption on but --ic-key is not set")
            return None
        return FrameCipher.from_files(self.ic_key, self.ic_flag)


_nonneg_int = int_in(0, None, "value")


def _nonneg_float(value: str) -> float:
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not x >= 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return x


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ttsdock serve",
        description="The TTS dock: LLaMA text in (13140/13141), hot-swappable engines "
        "(13143), audio out to OAP (13150/13151), cmd port 13142. Every flag can also be "
        "set by the environment variable TTSDOCK_<FLAG> (e.g. TTSDOCK_DOCK_PORT).",
    )
    d = Config()

    def add(flag: str, default: object, help_: str, **kw: object) -> None:
        env = ENV_PREFIX + flag.lstrip("-").replace("-", "_").upper()
        conv = kw.get("type")
        default = env_default(p, env, conv if callable(conv) else str, default)
        p.add_argument(flag, default=default, help=f"{help_} [env {env}]", **kw)  # type: ignore[arg-type]

    add("--llama-host", d.llama_host, "listen address for LLaMA (default %(default)s)")
    add(
        "--llama-mgmt-port",
        d.llama_mgmt_port,
        "LLaMA mgmt listener (default %(default)s)",
        type=port,
    )
    add(
        "--llama-data-port",
        d.llama_data_port,
        "LLaMA data listener (default %(default)s)",
        type=port,
    )
    add("--cmd-host", d.cmd_host, "cmd port address (default %(default)s)")
    add("--cmd-port", d.cmd_port, "cmd port (default %(default)s)", type=port)
    add("--dock-host", d.dock_host, "engine dock address (default %(default)s)")
    add("--dock-port", d.dock_port, "engine dock port (default %(default)s)", type=port)
    add("--oap-host", d.oap_host, "OAP address to connect to (default %(default)s)")
    add("--oap-mgmt-port", d.oap_mgmt_port, "OAP mgmt port (default %(default)s)", type=port)
    add("--oap-data-port", d.oap_data_port, "OAP data port (default %(default)s)", type=port)
    add("--ic-key", None, "interconnect AES-256-GCM key file, 32 raw bytes (ic_key.bin)", type=Path)
    add(
        "--ic-flag",
        None,
        "encryption flag file (ic_encryption.flag): on when it starts with 1; "
        "without it, --ic-key alone switches encryption on",
        type=Path,
    )
    add(
        "--hold-packets",
        d.hold_packets,
        "text packets held per call with no engine (default %(default)s)",
        type=_nonneg_int,
    )
    add(
        "--hold-bytes",
        d.hold_bytes,
        "text bytes held per call (default %(default)s)",
        type=_nonneg_int,
    )
    add(
        "--hold-seconds",
        d.hold_seconds,
        "how long text waits for an engine (default %(default)s)",
        type=_nonneg_float,
    )
    add(
        "--hold-calls",
        d.hold_calls,
        "calls with held text at most (default %(default)s)",
        type=_nonneg_int,
    )
    add(
        "--hold-total-bytes",
        d.hold_total_bytes,
        "text bytes held over all calls together (default %(default)s)",
        type=_nonneg_int,
    )
    add(
        "--oap-buffer-bytes",
        d.oap_buffer_bytes,
        "audio bytes queued while OAP data is down, before dropping (default %(default)s)",
        type=_nonneg_int,
    )
    add(
        "--oap-queue-seconds",
        d.oap_queue_seconds,
        "audio queued while OAP is down is dropped after this (default %(default)s)",
        type=_nonneg_float,
    )
    add(
        "--oap-high-water",
        d.oap_high_water,
        "OAP data write buffer above which the active engine is not read (back-pressure; "
        "default %(default)s)",
        type=_nonneg_int,
    )
    add(
        "--oap-low-water",
        d.oap_low_water,
        "OAP data write buffer below which the engine is read again, <= high water "
        "(default %(default)s)",
        type=_nonneg_int,
    )
    add(
        "--ended-calls",
        d.ended_calls,
        f"ended call ids remembered, >= {ENDED_CALLS_MIN} (default %(default)s)",
        type=_nonneg_int,
    )
    add(
        "--log-level",
        d.log_level,
        "ERROR, WARN, INFO, DEBUG or TRACE (default %(default)s)",
        type=level,
    )
    add(
        "--udp-log",
        None,
        "send WhisperTalk UDP log lines to HOST:PORT (default 127.0.0.1:22022 when given "
        "without a value)",
        nargs="?",
        const=f"{UDP_LOG_DEFAULT[0]}:{UDP_LOG_DEFAULT[1]}",
    )
    add(
        "--http-host",
        d.http_host,
        "HTTP listen address (/metrics, /health); a non-loopback address needs "
        "--http-token-file (default %(default)s)",
    )
    add(
        "--http-port",
        None,
        "HTTP port for GET /metrics (Prometheus) and GET /health (default: off; 0 picks "
        "a free port; needs the http extra)",
        type=port,
    )
    add(
        "--http-token-file",
        None,
        "file whose first line is the bearer token HTTP requests must send",
        type=Path,
    )
    add(
        "--ready-file",
        None,
        "write a JSON of the bound ports here once all listeners are up",
        type=Path,
    )
    return p


def parse_args(argv: list[str] | None = None) -> Config:
    p = build_parser()
    ns = p.parse_args(argv)
    udp: tuple[str, int] | None = None
    if ns.udp_log:
        try:
            udp = hostport(UDP_LOG_DEFAULT[1])(ns.udp_log)
        except argparse.ArgumentTypeError as exc:
            p.error(f"--udp-log: {exc}")
    if ns.oap_low_water > ns.oap_high_water:
        p.error("--oap-low-water must not exceed --oap-high-water")
    if ns.ended_calls < ENDED_CALLS_MIN:
        p.error(f"--ended-calls must be at least {ENDED_CALLS_MIN} (docs/wire.md#call-control)")
    return Config(
        llama_host=ns.llama_host,
        llama_mgmt_port=ns.llama_mgmt_port,
        llama_data_port=ns.llama_data_port,
        cmd_host=ns.cmd_host,
        cmd_port=ns.cmd_port,
        dock_host=ns.dock_host,
        dock_port=ns.dock_port,
        oap_host=ns.oap_host,
        oap_mgmt_port=ns.oap_mgmt_port,
        oap_data_port=ns.oap_data_port,
        ic_key=ns.ic_key,
        ic_flag=ns.ic_flag,
        hold_packets=ns.hold_packets,
        hold_bytes=ns.hold_bytes,
        hold_seconds=ns.hold_seconds,
        hold_calls=ns.hold_calls,
        hold_total_bytes=ns.hold_total_bytes,
        oap_buffer_bytes=ns.oap_buffer_bytes,
        oap_queue_seconds=ns.oap_queue_seconds,
        oap_high_water=ns.oap_high_water,
        oap_low_water=ns.oap_low_water,
        ended_calls=ns.ended_calls,
        log_level=ns.log_level,
        udp_log=udp,
        ready_file=ns.ready_file,
        http_host=ns.http_host,
        http_port=ns.http_port,
        http_token_file=ns.http_token_file,
    )
