"""Command-line plumbing shared by every engine: the common flags and ``run_engine``.

Rule 1: an engine's ``main`` builds ``common_parser(engine)``, adds its own
flags, builds a cheap ``Synthesizer`` and returns ``run_engine(synth, args)``.
Rule 2: this file does not know any model; it only wires flags, logging, the
event loop and the process exit status around ``engines.runtime.app``.

Exit status: 0 after an orderly stop (CUSTOM SHUTDOWN from the dock, SIGTERM,
SIGINT); 1 when the model cannot load or warm up (the engine then never
docks); 2 for bad flags or a bad environment variable (argparse usage error,
naming the flag or the variable).

Every flag's environment variable goes through ``svc.cli.env_default``, which
converts and checks it like the flag itself: argparse alone would skip the
type and the choices of a default that is not a string.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from engines.runtime.protocols import ProtocolConfig
from engines.runtime.schedule import SYNTH_WORKERS
from engines.runtime.synth import SAMPLE_RATE, SPEED_MAX, SPEED_MIN, Synthesizer
from engines.text import TextOptions
from svc.cli import (
    DefaultsFormatter,
    env_default,
    float_in,
    hostport,
    int_in,
    level,
    one_of,
    port,
)

DOCK_PORT_DEFAULT = 13143  # docs/wire.md#ports
CMD_PORT_DEFAULT = 13144  # docs/wire.md#ports
UDP_LOG_PORT = 22022  # docs/wire.md#ports
UDP_LOG_DEFAULT = f"127.0.0.1:{UDP_LOG_PORT}"
MAX_CONCURRENT_DEFAULT = 4

T = TypeVar("T")


_positive = int_in(1, None, "value")
DATE_ORDERS = ("mdy", "dmy")


def _yes_no(text: str) -> bool:
    t = text.strip().lower()
    if t in ("1", "true", "yes", "on"):
        return True
    if t in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not 1/0, true/false, yes/no or on/off")


_positive_float = float_in(1.0, 7 * 86400.0, "seconds")


def _name(text: str) -> str:
    from protocol.hello import NAME_RE

    if not NAME_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"engine name {text!r} must match [A-Za-z0-9_-]{{1,32}} (docs/wire.md#handshake)"
        )
    return text


def common_parser(
    engine: str, description: str | None = None, *, max_concurrent: int = MAX_CONCURRENT_DEFAULT
) -> argparse.ArgumentParser:
    """The flags every engine shares; each also reads an environment variable (flag wins).
    ``max_concurrent``: the engine's ``--max-concurrent`` default."""
    p = argparse.ArgumentParser(
        prog=f"ttsdock {engine}",
        description=description or f"Run the {engine} TTS engine and dock it into ttsdock.",
        formatter_class=DefaultsFormatter,
    )

    def env(name: str, convert: Callable[[str], T], fallback: T) -> T:
        return env_default(p, name, convert, fallback)

    g = p.add_argument_group("engine runtime (common to all engines)")
    g.add_argument(
        "--dock-host",
        default=env("TTSDOCK_DOCK_HOST", str, "127.0.0.1"),
        help="dock address to connect to [env TTSDOCK_DOCK_HOST]",
    )
    g.add_argument(
        "--dock-port",
        type=port,
        default=env("TTSDOCK_DOCK_PORT", port, DOCK_PORT_DEFAULT),
        help="dock engine port [env TTSDOCK_DOCK_PORT]",
    )
    g.add_argument(
        "--cmd-host",
        default=env("TTSDOCK_ENGINE_CMD_HOST", str, "127.0.0.1"),
        help="engine cmd port address [env TTSDOCK_ENGINE_CMD_HOST]",
    )
    g.add_argument(
        "--cmd-port",
        type=port,
        default=env("TTSDOCK_ENGINE_CMD_PORT", port, CMD_PORT_DEFAULT),
        help="engine cmd port; 0 picks a free port (logged) [env TTSDOCK_ENGINE_CMD_PORT]",
    )
    g.add_argument(
        "--name",
        type=_name,
        default=env("TTSDOCK_ENGINE_NAME", _name, engine),
        help="name sent in the HELLO [env TTSDOCK_ENGINE_NAME]",
    )
    g.add_argument(
        "--log-level",
        type=level,
        default=env("TTSDOCK_LOG_LEVEL", level, "INFO"),
        help="ERROR, WARN, INFO, DEBUG or TRACE [env TTSDOCK_LOG_LEVEL]",
    )
    g.add_argument(
        "--max-concurrent",
        type=_positive,
        default=env("TTSDOCK_MAX_CONCURRENT", _positive, max_concurrent),
        help="utterances in progress at once over all calls; the rest wait in order "
        "[env TTSDOCK_MAX_CONCURRENT]",
    )
    g.add_argument(
        "--synth-workers",
        type=_positive,
        default=env("TTSDOCK_SYNTH_WORKERS", _positive, SYNTH_WORKERS),
        help="inference threads; each advances the most urgent utterance by one unit of "
        "work (engines that schedule themselves, like qwen3, ignore it); one per core this "
        "process may use, within a cgroup CPU quota [env TTSDOCK_SYNTH_WORKERS]",
    )
    g.add_argument(
        "--call-idle-s",
        type=_positive_float,
        default=env("TTSDOCK_CALL_IDLE_S", _positive_float, 600.0),
        help="a call with no text or event for this long (and not speaking) is forgotten "
        "[env TTSDOCK_CALL_IDLE_S]",
    )
    g.add_argument(
        "--max-calls",
        type=_positive,
        default=env("TTSDOCK_MAX_CALLS", _positive, 4096),
        help="live calls kept; beyond it the least recently active idle call is forgotten "
        "[env TTSDOCK_MAX_CALLS]",
    )
    g.add_argument(
        "--out-dir",
        type=Path,
        default=env("TTSDOCK_OUT_DIR", Path, Path(".")),
        help="directory SYNTH_WAV writes under (relative paths only) [env TTSDOCK_OUT_DIR]",
    )
    g.add_argument(
        "--udp-log",
        nargs="?",
        type=hostport(UDP_LOG_PORT),
        const=UDP_LOG_DEFAULT,
        default=env("TTSDOCK_UDP_LOG", hostport(UDP_LOG_PORT), None),
        help=f"also send WhisperTalk UDP log lines (default: off; {UDP_LOG_DEFAULT} when "
        "given without a value) [env TTSDOCK_UDP_LOG]",
    )
    add_protocol_arguments(p)
    add_text_arguments(p)
    return p


def _wyoming_uri(text: str) -> str:
    if not text.startswith(("tcp://", "unix://")):
        raise argparse.ArgumentTypeError(f"{text!r}: use tcp://HOST:PORT or unix:///PATH")
    return text


def add_protocol_arguments(p: argparse.ArgumentParser) -> None:
    """HTTP (OpenAI speech, Prometheus, health) and Wyoming listeners; off by default."""

    def env(name: str, convert: Callable[[str], T], fallback: T) -> T:
        return env_default(p, name, convert, fallback)

    g = p.add_argument_group(
        "protocol listeners (README 'HTTP: OpenAI speech, metrics, health', 'Wyoming'; "
        "need the http extra: pip install ttsdock[http])"
    )
    g.add_argument(
        "--http-host",
        default=env("TTSDOCK_HTTP_HOST", str, "127.0.0.1"),
        help="HTTP listen address; any non-loopback address needs --http-token-file "
        "[env TTSDOCK_HTTP_HOST]",
    )
    g.add_argument(
        "--http-port",
        type=port,
        default=env("TTSDOCK_HTTP_PORT", port, None),
        help="HTTP port: /v1/audio/speech, /v1/models, /v1/audio/voices, /health, /metrics "
        "(default: off; 0 picks a free port, logged) [env TTSDOCK_HTTP_PORT]",
    )
    g.add_argument(
        "--http-token-file",
        type=Path,
        metavar="PATH",
        default=env("TTSDOCK_HTTP_TOKEN_FILE", Path, None),
        help="file whose first line is the bearer token HTTP requests must send "
        "(Authorization: Bearer <token>) [env TTSDOCK_HTTP_TOKEN_FILE]",
    )
    g.add_argument(
        "--http-idle-timeout",
        type=_timeout,
        default=env("TTSDOCK_HTTP_IDLE_TIMEOUT", _timeout, 15.0),
        help="seconds an idle connection, or one still sending its request head, is kept "
        "[env TTSDOCK_HTTP_IDLE_TIMEOUT]",
    )
    g.add_argument(
        "--http-max-body",
        type=_body,
        default=env("TTSDOCK_HTTP_MAX_BODY", _body, 65536),
        help="bytes of request body accepted [env TTSDOCK_HTTP_MAX_BODY]",
    )
    g.add_argument(
        "--wyoming-uri",
        type=_wyoming_uri,
        default=env("TTSDOCK_WYOMING_URI", _wyoming_uri, None),
        help="Wyoming TTS server, e.g. tcp://127.0.0.1:10200 or unix:///run/tts.sock "
        "(default: off) [env TTSDOCK_WYOMING_URI]",
    )
    g.add_argument(
        "--protocol-max-requests",
        type=_positive,
        default=env("TTSDOCK_PROTOCOL_MAX_REQUESTS", _positive, 2),
        help="HTTP + Wyoming syntheses running at once; more get 429 / an error event "
        "[env TTSDOCK_PROTOCOL_MAX_REQUESTS]",
    )
    g.add_argument(
        "--protocol-max-input",
        type=_positive,
        default=env("TTSDOCK_PROTOCOL_MAX_INPUT", _positive, 4096),
        help="characters of text per HTTP or Wyoming request [env TTSDOCK_PROTOCOL_MAX_INPUT]",
    )
    g.add_argument(
        "--protocol-min-headroom",
        type=_calls,
        default=env("TTSDOCK_PROTOCOL_MIN_HEADROOM", _calls, 1.0),
        help="predicted headroom (calls) a new HTTP or Wyoming request needs, else 503 / "
        "an error event; 0: never refuse for headroom (an engine without phone calls) "
        "[env TTSDOCK_PROTOCOL_MIN_HEADROOM]",
    )


_timeout = float_in(0.1, 3600.0, "seconds")
_calls = float_in(0.0, 1000.0, "calls")
_body = int_in(1024, 16 << 20, "bytes")


def protocol_config(args: argparse.Namespace) -> ProtocolConfig:
    """``ProtocolConfig`` from parsed flags; ``HttpConfigError`` for a listener that must
    not start (a non-loopback address without a token, an unreadable token file)."""
    from svc.http import HttpSettings, read_token

    http: HttpSettings | None = None
    # getattr: the protocol flags are optional (``add_protocol_arguments``); a parser
    # without them gets the defaults
    if getattr(args, "http_port", None) is not None:
        token_file = getattr(args, "http_token_file", None)
        http = HttpSettings(
            host=args.http_host,
            port=int(args.http_port),
            token=read_token(token_file) if token_file is not None else None,
            idle_timeout=float(args.http_idle_timeout),
            max_body=int(args.http_max_body),
        )
        http.check()
    return ProtocolConfig(
        http=http,
        wyoming_uri=getattr(args, "wyoming_uri", None),
        max_requests=int(getattr(args, "protocol_max_requests", 2)),
        max_input=int(getattr(args, "protocol_max_input", 4096)),
        min_headroom=float(getattr(args, "protocol_min_headroom", 1.0)),
    )


def add_text_arguments(p: argparse.ArgumentParser) -> None:
    """The text front end's flags (``engines.text``), the same for every engine."""

    def env(name: str, convert: Callable[[str], T], fallback: T) -> T:
        return env_default(p, name, convert, fallback)

    g = p.add_argument_group("text front end (markup filter, normaliser, lexicon)")
    g.add_argument(
        "--no-normalize",
        action="store_true",
        default=env("TTSDOCK_NO_NORMALIZE", _yes_no, False),
        help="speak the text as written: no markup filter, no number/date/symbol "
        "normalisation (a --lexicon still applies) [env TTSDOCK_NO_NORMALIZE]",
    )
    g.add_argument(
        "--lexicon",
        type=Path,
        metavar="PATH",
        default=env("TTSDOCK_LEXICON", Path, None),
        help="pronunciation lexicon, one 'phrase | lang | replacement [| flags]' a line "
        "(README 'Text front end'); reloaded on SIGHUP and cmd RELOAD_LEXICON "
        "(default: none) [env TTSDOCK_LEXICON]",
    )
    g.add_argument(
        "--date-order",
        choices=DATE_ORDERS,
        default=env("TTSDOCK_DATE_ORDER", one_of(DATE_ORDERS, "date order"), "mdy"),
        help="how English 11/24 is read: mdy (US, November 24th) or dmy (UK); German "
        "dates are always day first [env TTSDOCK_DATE_ORDER]",
    )


def text_options(args: argparse.Namespace) -> TextOptions:
    """``TextOptions`` from parsed flags (defaults where a parser lacks the text flags)."""
    # getattr: the text flags are optional (``add_text_arguments``)
    order = getattr(args, "date_order", "mdy")
    return TextOptions(
        normalize=not getattr(args, "no_normalize", False),
        lexicon=getattr(args, "lexicon", None),
        date_order="dmy" if order == "dmy" else "mdy",
    )


def run_engine(synth: Synthesizer, args: argparse.Namespace) -> int:
    """Load and warm up ``synth`` off-loop, then dock and serve until told to stop.

    Returns the process exit status (see the module docstring). Never returns
    while docked; the caller should ``return`` its value from ``main``.
    """
    from engines.runtime.app import EngineConfig, serve_forever
    from svc.http import HttpConfigError

    # getattr: --speed, --synth-workers and --voice are each engine's own flags
    speed = getattr(args, "speed", None)
    speed = 1.0 if speed is None else float(speed)
    if not (math.isfinite(speed) and SPEED_MIN <= speed <= SPEED_MAX):
        print(
            f"ttsdock {args.name}: bad option: speed {speed} outside {SPEED_MIN}..{SPEED_MAX}",
            file=sys.stderr,
        )
        return 2
    try:
        config = EngineConfig(
            name=args.name,
            dock_host=args.dock_host,
            dock_port=int(args.dock_port),
            cmd_host=args.cmd_host,
            cmd_port=int(args.cmd_port),
            max_concurrent=int(args.max_concurrent),
            synth_workers=int(getattr(args, "synth_workers", SYNTH_WORKERS)),
            call_idle_s=float(args.call_idle_s),
            max_calls=int(args.max_calls),
            out_dir=Path(args.out_dir),
            log_level=args.log_level,
            udp_log=args.udp_log,
            speed=speed,
            voice=getattr(args, "voice", None),
            protocols=protocol_config(args),
        )
    except (TypeError, ValueError, HttpConfigError) as exc:
        print(f"ttsdock {args.name}: bad option: {exc}", file=sys.stderr)
        return 2
    if synth.sample_rate != SAMPLE_RATE:
        print(
            f"ttsdock {config.name}: synthesizer rate {synth.sample_rate} Hz, "
            f"the dock only accepts {SAMPLE_RATE} Hz (docs/wire.md#handshake)",
            file=sys.stderr,
        )
        return 1
    return serve_forever(synth, config)
