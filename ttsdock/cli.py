"""The ``ttsdock`` command: dispatches to subcommands registered as plug-ins.

Subcommands are entry points in the group ``ttsdock.commands`` (see
pyproject.toml): ``serve`` and ``ctl`` live in this package; ``kokoro``,
``kokoro-convert``, ``qwen3``, ``qwen3-convert`` and ``qwen3-synth`` live in ``engines`` and are
found by name at run time, so the dock never imports engine code (README "Layout").
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib.metadata import EntryPoint, entry_points

GROUP = "ttsdock.commands"

_SUMMARY = {
    "serve": "run the dock daemon (LLaMA 13140/13141, cmd 13142, engines 13143, OAP 13150/13151)",
    "ctl": "send one command to a cmd port (dock 13142, engines 13144) and print the reply",
    "kokoro": "run the Kokoro-82M engine and dock it",
    "kokoro-convert": "convert a Kokoro checkpoint (.pth, config, voices) into the engine's files",
    "qwen3": "run the Qwen3-TTS engine and dock it",
    "qwen3-convert": "convert an official Qwen3-TTS checkpoint into GGUF files",
    "qwen3-synth": "synthesise with Qwen3-TTS offline, without the dock",
    "qwen3-clone-prompt": "make a Qwen3-TTS voice-clone prompt (Base) from a reference WAV",
}


def _commands() -> dict[str, EntryPoint]:
    return {ep.name: ep for ep in entry_points(group=GROUP)}


def _usage(commands: dict[str, EntryPoint]) -> str:
    lines = ["usage: ttsdock <command> [options]   (ttsdock <command> --help for details)", ""]
    lines.append("commands:")
    for name in sorted(commands, key=lambda n: (n not in _SUMMARY, n)):
        lines.append(f"  {name:<18} {_SUMMARY.get(name, '')}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    commands = _commands()
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage(commands))
        return 0
    if args[0] == "--version":
        from ttsdock import __version__

        print(f"ttsdock {__version__}")
        return 0
    ep = commands.get(args[0])
    if ep is None:
        print(f"ttsdock: unknown command {args[0]!r}\n\n{_usage(commands)}", file=sys.stderr)
        return 2
    try:
        func: Callable[[list[str]], int | None] = ep.load()
    except ImportError as exc:
        print(
            f"ttsdock: command {args[0]!r} is not available: {exc}. "
            f"Install the matching extra, e.g. pip install 'ttsdock[{args[0].split('-')[0]}]'.",
            file=sys.stderr,
        )
        return 2
    rc = func(args[1:])
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
