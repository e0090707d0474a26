"""The one error type of the wire protocol.

Rule: every malformed input, whatever the codec, raises ``ProtocolError``
and nothing else. The I/O layer turns it into "close this connection" (and,
where the protocol has one, an error reply first). ``reason`` is a short
machine-friendly token suitable for logs and counters.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """A peer broke the wire contract; the connection that produced it must be closed."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)
