"""``ttsdock ctl``: send one command to a cmd port and print the reply.

Works with the dock (13142) and the engines (13144). Exit status: 0 for a reply,
1 for an ``ERR``/``ERROR`` reply, 2 for a connection problem or bad usage.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys

from protocol.cmd import is_error_reply

DEFAULT_PORT = 13142
MAX_REPLY = 1 << 20


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="ttsdock ctl",
        description="Send one command to a cmd port (dock 13142, engines 13144) and print "
        "the reply. Exit 0 on a reply, 1 on an ERR/ERROR reply, 2 on a connection error.",
    )
    p.add_argument(
        "--host",
        default=os.environ.get("TTSDOCK_CTL_HOST", "127.0.0.1"),
        help="cmd port host (default %(default)s) [env TTSDOCK_CTL_HOST]",
    )
    p.add_argument(
        "--port",
        type=int,
        default=os.environ.get("TTSDOCK_CTL_PORT", str(DEFAULT_PORT)),
        help="cmd port (dock 13142, engines 13144; default %(default)s) [env TTSDOCK_CTL_PORT]",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=15.0,
        help="seconds to wait for the reply (default %(default)s)",
    )
    p.add_argument(
        "command", nargs="+", help="e.g. STATUS, STATS, SET_LOG_LEVEL:DEBUG, TEST_SYNTH:Hallo Welt"
    )
    return p


def send(host: str, port: int, command: str, timeout: float = 15.0) -> str:
    """One command, one reply (everything until the server closes). Raises ``OSError``."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(command.encode("utf-8") + b"\n")
        chunks: list[bytes] = []
        total = 0
        while total < MAX_REPLY:
            chunk = s.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    return b"".join(chunks).decode("utf-8", errors="replace")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = " ".join(args.command)
    try:
        reply = send(args.host, args.port, command, args.timeout)
    except TimeoutError:
        print(
            f"ttsdock ctl: no reply from {args.host}:{args.port} within {args.timeout:g} s",
            file=sys.stderr,
        )
        return 2
    except OSError as exc:
        reason = exc.strerror or str(exc)
        print(f"ttsdock ctl: cannot reach {args.host}:{args.port}: {reason}", file=sys.stderr)
        return 2
    if not reply:
        print(f"ttsdock ctl: {args.host}:{args.port} closed without a reply", file=sys.stderr)
        return 2
    sys.stdout.write(reply if reply.endswith("\n") else reply + "\n")
    return 1 if is_error_reply(reply) else 0


if __name__ == "__main__":
    sys.exit(main())
