"""The router: where text and call events from LLaMA go, and what a slot switch does.

Rule 1: every decision about upstream traffic lives here (on top of the three tables it
drives: ``calls.CallTracker``, ``hold.HoldBuffer``, ``slot.Slot``): text to the active
engine or held for the next one, CALL_END / SPEECH_* teed to OAP and the engine or
dropped, held text delivered on dock or discarded on CALL_END / barge-in / expiry, the old
engine retired and OAP flushed on a swap or when the active engine leaves. Every drop is
counted here, by reason, and returned as a ``Dropped`` for the shell to log.
Rule 2: this file reads no clock and knows no sockets: the shell passes ``now``, performs
the returned actions in order, and reports what it could not do (an engine that is
closing or not reading).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from protocol.mgmt import CallEnd, CallMessage, SpeechActive, SpeechIdle
from protocol.packet import Packet
from ttsdock.calls import Action, CallEvent, CallState, CallTracker
from ttsdock.hold import Discard, HoldBuffer
from ttsdock.slot import EngineRecord, Slot
from ttsdock.stats import Stats

H = TypeVar("H")


@dataclass(frozen=True, slots=True)
class SendText:
    """Text for the active engine (the shell counts ``engine_backlog`` / ``engine_closing``
    when it cannot be written)."""

    packet: Packet
    from_hold: bool = False


@dataclass(frozen=True, slots=True)
class SendMgmt:
    """A call event for the active engine."""

    message: CallMessage


@dataclass(frozen=True, slots=True)
class ToOap:
    """A call event for OAP mgmt (the shell counts ``mgmt_oap_down`` when it is down)."""

    message: CallMessage


@dataclass(frozen=True, slots=True)
class Retire(Generic[H]):
    """The replaced engine: CUSTOM SHUTDOWN now, force-close after the 2 s grace."""

    record: EngineRecord[H]


@dataclass(frozen=True, slots=True)
class FlushOap:
    """CUSTOM FLUSH_TTS to OAP (its buffered audio belongs to an engine that is gone)."""

    why: str


@dataclass(frozen=True, slots=True)
class Dropped:
    """Counted already; the shell logs it (rate-limited WARN)."""

    event: str  # text_dropped, mgmt_dropped
    call_id: int
    reason: str
    extra: dict[str, int | str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CallEnded:
    """A call's CALL_END was passed on (the shell logs ``call_ended``)."""

    call_id: int


RouterAction = SendText | SendMgmt | ToOap | Retire[H] | FlushOap | Dropped | CallEnded


class Router(Generic[H]):
    def __init__(self, stats: Stats, tracker: CallTracker, hold: HoldBuffer) -> None:
        self.stats = stats
        self.tracker = tracker
        self.hold = hold
        self.slot: Slot[H] = Slot()

    @property
    def engine(self) -> H | None:
        active = self.slot.active
        return active.handle if active is not None else None

    # ---------------------------------------------------------------- upstream
    def text(self, pkt: Packet, now: float, engine_ready: bool) -> list[RouterAction[H]]:
        """A text Packet from LLaMA (``engine_ready``: an engine is active and writable;
        an engine that is closing would drop the write silently, so its text is held for
        the next one as if none were docked)."""
        stats = self.stats
        stats.text_frames_in += 1
        stats.text_bytes_in += len(pkt.payload)
        cid = pkt.call_id
        if self.tracker.apply(cid, CallEvent.TEXT) is Action.DROP:
            stats.drops["call_ended"] += 1
            return [Dropped("text_dropped", cid, "call_ended")]
        if engine_ready and self.slot.active is not None:
            return [SendText(pkt)]
        discard = self.hold.hold(cid, pkt.payload, now)
        if discard is not None:
            return [self._discarded(discard)]
        stats.text_held += 1
        return []

    def call_message(self, msg: CallMessage) -> list[RouterAction[H]]:
        """CALL_END / SPEECH_* from LLaMA, teed to OAP and the active engine when they
        change the call's state. **beyond**: the first SPEECH_IDLE of a call nobody has
        heard of goes to the engine (it prewarms the call) but not to OAP (nothing changed
        for OAP: the reference, which starts every call idle, passes nothing on)."""
        cid = msg.call_id
        first_idle = isinstance(msg, SpeechIdle) and self.tracker.state(cid) is CallState.NEW
        action = self.tracker.apply_message(msg)
        if action is Action.DROP:
            reason = "duplicate_call_end" if isinstance(msg, CallEnd) else "speech_after_end"
            self.stats.drops[reason] += 1
            return []
        if action is not Action.FORWARD:
            return []
        out: list[RouterAction[H]] = []
        if isinstance(msg, CallEnd):
            self.stats.calls_ended += 1
            discard = self.hold.discard(cid, "call_ended")
            if discard is not None:
                out.append(self._discarded(discard))
            out.append(CallEnded(cid))
        elif isinstance(msg, SpeechActive):
            # barge-in: text still waiting for an engine would be spoken over the caller
            discard = self.hold.discard(cid, "barge_in")
            if discard is not None:
                out.append(self._discarded(discard))
        if not first_idle:
            out.append(ToOap(msg))
        if self.slot.active is not None:
            out.append(SendMgmt(msg))
        return out

    def expire(self, now: float) -> list[RouterAction[H]]:
        """Held text past its deadline is given up."""
        return [self._discarded(d) for d in self.hold.expire(now)]

    def _discarded(self, d: Discard) -> Dropped:
        self.stats.drops[d.reason] += d.packets
        return Dropped(
            "text_dropped", d.call_id, d.reason, {"packets": d.packets, "bytes": d.nbytes}
        )

    # ---------------------------------------------------------------- the slot
    def dock(self, name: str, handle: H, now: float) -> tuple[int, list[RouterAction[H]]]:
        """An engine passed HELLO: it is active at once (last connect wins); returns its
        generation and: retire the replaced engine, held text in order to the newcomer,
        FLUSH_TTS to OAP on a swap."""
        result = self.slot.dock(name, handle, now)
        self.stats.engines_docked += 1
        out: list[RouterAction[H]] = []
        if result.replaced is not None:
            out.append(Retire(result.replaced))
        for cid, payload in self.hold.drain():  # held text, in order, to the newcomer
            out.append(SendText(Packet(cid, payload), from_hold=True))
        if result.replaced is not None:
            self.stats.swaps += 1
            out.append(FlushOap("swap"))
        return result.generation, out

    def leave(self, generation: int, now: float, reason: str) -> list[RouterAction[H]]:
        """An engine connection closed; when it was the active one, OAP is flushed."""
        if self.slot.leave(generation, now, reason):
            return [FlushOap(reason)]
        return []
