"""Argparse value types and environment-variable defaults shared by every command line.

Rule 1: a type raises ``argparse.ArgumentTypeError`` with a message naming the bad
value; argparse turns it into a usage error (exit status 2).
Rule 2: help lines say their default once: ``DefaultsFormatter`` appends
``(default: X)`` only to a help text that does not state its default itself and
only when there is a value to show (not ``None``, ``False`` or empty).
Rule 3: argparse runs ``type`` and ``choices`` only on values it parses, never on a
non-string default, so a default read from the environment goes through
``env_default``, which converts it with the same type and ends with a usage error
naming the variable (``parser.error``, exit status 2) when it is bad.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Iterable
from typing import TypeVar

from svc.logs import parse_hostport, parse_level

T = TypeVar("T")


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``ArgumentDefaultsHelpFormatter`` without the doubled or meaningless suffixes."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if "default" in text.lower() or default is None or default is argparse.SUPPRESS:
            return action.help
        if default is False or (isinstance(default, list | tuple) and not default):
            return action.help
        return super()._get_help_string(action)


def port(text: str) -> int:
    """A TCP/UDP port number, 0..65535 (0: pick a free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range 0..65535: {value}")
    return value


def level(text: str) -> str:
    """A log level name (ERROR, WARN, INFO, DEBUG, TRACE; any case), upper-cased."""
    try:
        parse_level(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text.strip().upper()


def hostport(default_port: int) -> Callable[[str], tuple[str, int]]:
    """A ``host[:port]`` type (see ``svc.logs.parse_hostport``)."""

    def convert(text: str) -> tuple[str, int]:
        try:
            return parse_hostport(text, default_port)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r} ({exc})") from None

    return convert


def int_in(lo: int, hi: int | None, what: str) -> Callable[[str], int]:
    """An integer in ``lo..hi`` (``hi=None``: no upper bound); ``what`` names it in errors."""

    def convert(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not an integer") from None
        if value < lo or (hi is not None and value > hi):
            span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise argparse.ArgumentTypeError(f"{what} {value} outside {span}")
        return value

    return convert


def float_in(lo: float, hi: float, what: str) -> Callable[[str], float]:
    """A finite number in ``lo..hi``; ``what`` names it in errors."""

    def convert(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not a number") from None
        if not (math.isfinite(value) and lo <= value <= hi):
            raise argparse.ArgumentTypeError(f"{what} {value} outside {lo:g}..{hi:g}")
        return value

    return convert


def one_of(options: Iterable[str], what: str) -> Callable[[str], str]:
    """One of ``options`` (exact match), for environment values of ``choices`` flags."""
    allowed = tuple(options)

    def convert(text: str) -> str:
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{what} {text!r} is not one of {', '.join(allowed)}")
        return text

    return convert


def env_default(
    parser: argparse.ArgumentParser,
    env: str,
    convert: Callable[[str], T],
    fallback: T,
) -> T:
    """The value of the environment variable ``env`` converted by ``convert``, or
    ``fallback`` when it is unset or empty. A bad value ends the program with a usage
    error naming the variable (exit status 2)."""
    text = os.environ.get(env)
    if text is None or text == "":
        return fallback
    try:
        return convert(text)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        parser.error(f"environment variable {env}={text!r}: {exc}")
