"""Command-line plumbing shared by every engine: the common flags and ``run_engine``.

Rule 1: an engine's ``main`` builds ``common_parser(engine)``, adds its own
flags, builds a cheap ``Synthesizer`` and returns ``run_engine(synth, args)``.
Rule 2: this file does not know any model; it only wires flags, logging, the
event loop and the process exit status around ``engines.runtime.app``.

Exit status: 0 after an orderly stop (CUSTOM SHUTDOWN from the dock, SIGTERM,
SIGINT); 1 when the model cannot load or warm up (the engine then never
docks); 2 for bad flags (argparse).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from engines.runtime.synth import SAMPLE_RATE, Synthesizer

DOCK_PORT_DEFAULT = 13143  # WIRE.md 1
CMD_PORT_DEFAULT = 13144  # WIRE.md 1
UDP_LOG_DEFAULT = "127.0.0.1:22022"  # WIRE.md 1
MAX_CONCURRENT_DEFAULT = 4


def _env(name: str, default: str) -> str:
    value = os.environ.get(name)
    return value if value not in (None, "") else default


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"port must be an integer, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {value}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _name(text: str) -> str:
    from protocol.hello import NAME_RE

    if not NAME_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"engine name {text!r} must match [A-Za-z0-9_-]{{1,32}} (WIRE.md 3)"
        )
    return text


def _level(text: str) -> str:
    from svc.logs import parse_level

    try:
        parse_level(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip().upper()


def _hostport(text: str) -> tuple[str, int]:
    from svc.logs import parse_hostport

    try:
        return parse_hostport(text, 22022)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--udp-log expects host:port, got {text!r}") from None


def common_parser(engine: str, description: str | None = None) -> argparse.ArgumentParser:
    """The flags every engine shares; each also reads an environment variable (flag wins)."""
    p = argparse.ArgumentParser(
        prog=f"ttsdock {engine}",
        description=description or f"Run the {engine} TTS engine and dock it into ttsdock.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    g = p.add_argument_group("engine runtime (common to all engines)")
    g.add_argument(
        "--dock-host",
        default=_env("TTSDOCK_DOCK_HOST", "127.0.0.1"),
        help="dock address to connect to [env TTSDOCK_DOCK_HOST]",
    )
    g.add_argument(
        "--dock-port",
        type=_port,
        default=_env("TTSDOCK_DOCK_PORT", str(DOCK_PORT_DEFAULT)),
        help="dock engine port [env TTSDOCK_DOCK_PORT]",
    )
    g.add_argument(
        "--cmd-host",
        default=_env("TTSDOCK_ENGINE_CMD_HOST", "127.0.0.1"),
        help="engine cmd port address [env TTSDOCK_ENGINE_CMD_HOST]",
    )
    g.add_argument(
        "--cmd-port",
        type=_port,
        default=_env("TTSDOCK_ENGINE_CMD_PORT", str(CMD_PORT_DEFAULT)),
        help="engine cmd port; 0 picks a free port (logged) [env TTSDOCK_ENGINE_CMD_PORT]",
    )
    g.add_argument(
        "--name",
        type=_name,
        default=_env("TTSDOCK_ENGINE_NAME", engine),
        help="name sent in the HELLO [env TTSDOCK_ENGINE_NAME]",
    )
    g.add_argument(
        "--log-level",
        type=_level,
        default=_env("TTSDOCK_LOG_LEVEL", "INFO"),
        help="ERROR, WARN, INFO, DEBUG or TRACE [env TTSDOCK_LOG_LEVEL]",
    )
    g.add_argument(
        "--max-concurrent",
        type=_positive,
        default=_env("TTSDOCK_MAX_CONCURRENT", str(MAX_CONCURRENT_DEFAULT)),
        help="syntheses running at once over all calls; the rest wait in order "
        "[env TTSDOCK_MAX_CONCURRENT]",
    )
    g.add_argument(
        "--out-dir",
        type=Path,
        default=Path(_env("TTSDOCK_OUT_DIR", ".")),
        help="directory SYNTH_WAV writes under (relative paths only) [env TTSDOCK_OUT_DIR]",
    )
    g.add_argument(
        "--udp-log",
        nargs="?",
        type=_hostport,
        const=UDP_LOG_DEFAULT,
        default=os.environ.get("TTSDOCK_UDP_LOG") or None,
        help=f"also send WhisperTalk UDP log lines (default {UDP_LOG_DEFAULT} when given "
        "without a value) [env TTSDOCK_UDP_LOG]",
    )
    return p


def run_engine(synth: Synthesizer, args: argparse.Namespace) -> int:
    """Load and warm up ``synth`` off-loop, then dock and serve until told to stop.

    Returns the process exit status (see the module docstring). Never returns
    while docked; the caller should ``return`` its value from ``main``.
    """
    from engines.runtime.app import EngineConfig, serve_forever

    udp = args.udp_log
    if isinstance(udp, str):  # from the environment: not converted by argparse
        udp = _hostport(udp)
    try:
        config = EngineConfig(
            name=args.name,
            dock_host=args.dock_host,
            dock_port=int(args.dock_port),
            cmd_host=args.cmd_host,
            cmd_port=int(args.cmd_port),
            max_concurrent=int(args.max_concurrent),
            out_dir=Path(args.out_dir),
            log_level=args.log_level,
            udp_log=udp,
            speed=float(getattr(args, "speed", None) or 1.0),
            voice=getattr(args, "voice", None),
        )
    except (TypeError, ValueError) as exc:
        print(f"ttsdock {args.name}: bad option: {exc}", file=sys.stderr)
        return 2
    if synth.sample_rate != SAMPLE_RATE:
        print(
            f"ttsdock {config.name}: synthesizer rate {synth.sample_rate} Hz, "
            f"the dock only accepts {SAMPLE_RATE} Hz (WIRE.md 3)",
            file=sys.stderr,
        )
        return 1
    return serve_forever(synth, config)
