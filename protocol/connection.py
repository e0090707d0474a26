"""One engine-dock connection as a state machine, for both sides (docs/wire.md#engine-dock).

Rule 1: everything that decides what the bytes of an engine-dock connection mean lives
here: first the HELLO phase (the engine's HELLO line, the dock's ``OK`` / ``ERR`` line),
then the tagged frame stream; the phases and their transitions are the table below.
Rule 2: this file does not know sockets, clocks or which timeouts apply: the I/O layer
feeds bytes, takes events, writes the bytes it is given, and reports a HELLO timeout by
calling ``reject``.

Dock side:   HELLO --Hello received--> DECIDING --accept()--> FRAMES
                                                --reject()--> CLOSED
Engine side: HELLO --HelloReply ok---> FRAMES
                   --HelloReply ERR--> CLOSED
Either side: any malformed input or ``close()`` --> CLOSED

Bounded: the HELLO phase buffers at most one line (``MAX_HELLO_LINE`` on the dock side,
``MAX_REPLY_LINE`` on the engine side); bytes after the line wait in the frame decoder,
which never holds more than one maximal frame plus one ``feed``.
"""

from __future__ import annotations

import enum

from protocol.engine_frames import EngineEvent, EngineFrameDecoder
from protocol.errors import ProtocolError
from protocol.framing import NEED_DATA, NeedData
from protocol.hello import (
    MAX_HELLO_LINE,
    MAX_REPLY_LINE,
    OK_LINE,
    Hello,
    HelloRejected,
    HelloReply,
    LineReader,
    encode_hello,
    parse_hello,
    parse_hello_reply,
)


class Role(enum.Enum):
    DOCK = "dock"
    ENGINE = "engine"


class Phase(enum.Enum):
    HELLO = "hello"  # dock: waiting for the HELLO line; engine: for the reply line
    DECIDING = "deciding"  # dock only: HELLO received, accept() or reject() pending
    FRAMES = "frames"  # tagged frames both ways
    CLOSED = "closed"


class Step(enum.Enum):
    HELLO_RECEIVED = "hello_received"
    ACCEPT = "accept"
    REJECT = "reject"
    REPLY_OK = "reply_ok"
    REPLY_ERR = "reply_err"
    ERROR = "error"
    CLOSE = "close"


P, S = Phase, Step
TRANSITIONS: dict[Role, dict[Phase, dict[Step, Phase]]] = {
    Role.DOCK: {
        P.HELLO: {
            S.HELLO_RECEIVED: P.DECIDING,
            S.REJECT: P.CLOSED,
            S.ERROR: P.CLOSED,
            S.CLOSE: P.CLOSED,
        },
        P.DECIDING: {S.ACCEPT: P.FRAMES, S.REJECT: P.CLOSED, S.CLOSE: P.CLOSED},
        P.FRAMES: {S.ERROR: P.CLOSED, S.CLOSE: P.CLOSED},
        P.CLOSED: {S.CLOSE: P.CLOSED, S.ERROR: P.CLOSED, S.REJECT: P.CLOSED},
    },
    Role.ENGINE: {
        P.HELLO: {
            S.REPLY_OK: P.FRAMES,
            S.REPLY_ERR: P.CLOSED,
            S.ERROR: P.CLOSED,
            S.CLOSE: P.CLOSED,
        },
        P.FRAMES: {S.ERROR: P.CLOSED, S.CLOSE: P.CLOSED},
        P.CLOSED: {S.CLOSE: P.CLOSED, S.ERROR: P.CLOSED},
    },
}
del P, S


class ConnectionStateError(RuntimeError):
    """A step missing from the table: a bug in the caller, never a peer mistake."""


ConnectionEvent = Hello | HelloReply | EngineEvent


class EngineDockConnection:
    """``feed(data)``, then ``next_event()`` until ``NEED_DATA``.

    Dock side: the first event is the peer's ``Hello`` (or ``HelloRejected`` is raised:
    send ``exc.reply``, close); answer it with ``accept()`` or ``reject(exc)``, which
    return the bytes to write. Engine side: ``hello(Hello)`` gives the line to send; the
    first event is the dock's ``HelloReply``. Then ``Packet`` / mgmt events. A malformed
    input raises ``ProtocolError`` (from ``feed`` in the HELLO phase, from ``next_event``
    afterwards) and the connection is ``CLOSED``.
    """

    __slots__ = ("_event", "_line", "frames", "phase", "role")

    def __init__(self, role: Role) -> None:
        self.role = role
        self.phase = Phase.HELLO
        self._line: LineReader | None = LineReader(
            MAX_HELLO_LINE if role is Role.DOCK else MAX_REPLY_LINE
        )
        self.frames = EngineFrameDecoder()
        self._event: Hello | HelloReply | None = None  # the HELLO phase's one event

    def _step(self, step: Step) -> None:
        try:
            self.phase = TRANSITIONS[self.role][self.phase][step]
        except KeyError:
            raise ConnectionStateError(
                f"{self.role.value}: no {step.value} in {self.phase.value}"
            ) from None

    # ---------------------------------------------------------------- bytes in
    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Raises ``ProtocolError`` (``HelloRejected`` on the dock side) on a bad line."""
        phase = self.phase
        if phase is Phase.FRAMES or phase is Phase.DECIDING:
            self.frames.feed(data)
        elif phase is Phase.HELLO:
            self._hello_line(bytes(data))

    def _hello_line(self, data: bytes) -> None:
        reader = self._line
        assert reader is not None
        try:
            line = reader.feed(data)
            if line is None:
                return
            event: Hello | HelloReply
            event = parse_hello(line) if self.role is Role.DOCK else parse_hello_reply(line)
        except ProtocolError:
            self._step(Step.ERROR)
            self._line = None
            raise
        self._line = None
        self._event = event
        if isinstance(event, Hello):
            self._step(Step.HELLO_RECEIVED)
        else:
            self._step(Step.REPLY_OK if event.ok else Step.REPLY_ERR)
        if reader.rest and self.phase is not Phase.CLOSED:
            self.frames.feed(reader.rest)

    def next_event(self) -> ConnectionEvent | NeedData:
        """The next event, or ``NEED_DATA``. Raises ``ProtocolError`` on a bad frame."""
        event = self._event
        if event is not None:
            self._event = None
            return event
        if self.phase is not Phase.FRAMES:
            return NEED_DATA  # HELLO: line incomplete; DECIDING: frames wait for accept()
        try:
            return self.frames.next_event()
        except ProtocolError:
            self._step(Step.ERROR)
            raise

    # ---------------------------------------------------------------- bytes out
    def hello(self, hello: Hello) -> bytes:
        """Engine side: the HELLO line to send first."""
        if self.role is not Role.ENGINE or self.phase is not Phase.HELLO:
            raise ConnectionStateError(f"{self.role.value}: no HELLO in {self.phase.value}")
        return encode_hello(hello)

    def accept(self) -> bytes:
        """Dock side: the HELLO passed; returns ``OK\\n``. Frames that came with the HELLO
        are returned by the next ``next_event`` calls."""
        self._step(Step.ACCEPT)
        return OK_LINE

    def reject(self, exc: HelloRejected) -> bytes:
        """Dock side: refuse (bad HELLO, timeout); returns the ``ERR <reason>`` line."""
        self._step(Step.REJECT)
        self._line = None
        return exc.reply

    def close(self) -> None:
        self._step(Step.CLOSE)
        self._line = None

    @property
    def in_frames(self) -> bool:
        return self.phase is Phase.FRAMES
