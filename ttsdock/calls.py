"""Per-call state of the upstream control stream (docs/wire.md#call-control).

Rule 1: everything that decides whether a CALL_END / SPEECH_ACTIVE / SPEECH_IDLE /
text packet for a call is passed on lives here, as one transition table.
Rule 2: this file does not know about sockets, engines or OAP; it only answers
"forward, suppress (no state change) or drop (call already ended)".

States: ``new`` (no speech event seen yet), ``idle``, ``speaking``, ``ended``.
``new`` exists so that the very first SPEECH_IDLE of a call is passed on (engines
use it to prewarm the call, docs/wire.md#per-call-engine-behaviour); afterwards only
changes are passed on.
"""

from __future__ import annotations

import enum
from collections import OrderedDict

from protocol.mgmt import CallEnd, CallMessage, SpeechActive, SpeechIdle
from svc.lru import ENDED_CALLS, ENDED_CALLS_MIN, EndedCalls

ENDED_MEMORY = ENDED_CALLS  # svc.lru says why this many
MAX_LIVE_CALLS = 65_536  # bound on calls tracked without a CALL_END (oldest evicted)


class CallState(enum.Enum):
    NEW = "new"
    IDLE = "idle"
    SPEAKING = "speaking"
    ENDED = "ended"


class CallEvent(enum.Enum):
    TEXT = "text"
    SPEECH_ACTIVE = "speech_active"
    SPEECH_IDLE = "speech_idle"
    CALL_END = "call_end"


class Action(enum.Enum):
    FORWARD = "forward"  # pass it on (downstream and to the engine)
    SUPPRESS = "suppress"  # no state change: do not pass it on
    DROP = "drop"  # the call has ended: discard and count


S, E, A = CallState, CallEvent, Action
TRANSITIONS: dict[CallState, dict[CallEvent, tuple[CallState, Action]]] = {
    S.NEW: {
        E.TEXT: (S.NEW, A.FORWARD),
        E.SPEECH_ACTIVE: (S.SPEAKING, A.FORWARD),
        E.SPEECH_IDLE: (S.IDLE, A.FORWARD),
        E.CALL_END: (S.ENDED, A.FORWARD),
    },
    S.IDLE: {
        E.TEXT: (S.IDLE, A.FORWARD),
        E.SPEECH_ACTIVE: (S.SPEAKING, A.FORWARD),
        E.SPEECH_IDLE: (S.IDLE, A.SUPPRESS),
        E.CALL_END: (S.ENDED, A.FORWARD),
    },
    S.SPEAKING: {
        E.TEXT: (S.SPEAKING, A.FORWARD),
        E.SPEECH_ACTIVE: (S.SPEAKING, A.SUPPRESS),
        E.SPEECH_IDLE: (S.IDLE, A.FORWARD),
        E.CALL_END: (S.ENDED, A.FORWARD),
    },
    S.ENDED: {
        E.TEXT: (S.ENDED, A.DROP),
        E.SPEECH_ACTIVE: (S.ENDED, A.DROP),
        E.SPEECH_IDLE: (S.ENDED, A.DROP),
        E.CALL_END: (S.ENDED, A.DROP),
    },
}
del S, E, A

_EVENT_OF: dict[type, CallEvent] = {
    CallEnd: CallEvent.CALL_END,
    SpeechActive: CallEvent.SPEECH_ACTIVE,
    SpeechIdle: CallEvent.SPEECH_IDLE,
}


class CallTracker:
    """Applies ``TRANSITIONS`` per call id. Memory is bounded: live calls are capped at
    ``max_live`` (least recently used evicted) and ended ids at ``ended_memory``."""

    __slots__ = ("_ended", "_live", "ended_memory", "max_live")

    def __init__(self, ended_memory: int = ENDED_MEMORY, max_live: int = MAX_LIVE_CALLS) -> None:
        if ended_memory < ENDED_CALLS_MIN:
            raise ValueError(
                f"ended_memory must be at least {ENDED_CALLS_MIN} (docs/wire.md#call-control)"
            )
        self.ended_memory = ended_memory
        self.max_live = max_live
        self._live: OrderedDict[int, CallState] = OrderedDict()
        self._ended = EndedCalls(ended_memory)

    def state(self, call_id: int) -> CallState:
        if call_id in self._ended:
            return CallState.ENDED
        return self._live.get(call_id, CallState.NEW)

    def apply(self, call_id: int, event: CallEvent) -> Action:
        state = self.state(call_id)
        new_state, action = TRANSITIONS[state][event]
        if new_state is CallState.ENDED:
            if state is not CallState.ENDED:
                self._live.pop(call_id, None)
                self._ended.add(call_id)
        else:
            self._live[call_id] = new_state
            self._live.move_to_end(call_id)
            if len(self._live) > self.max_live:
                self._live.popitem(last=False)
        return action

    def apply_message(self, msg: CallMessage) -> Action:
        return self.apply(msg.call_id, _EVENT_OF[type(msg)])

    def live(self) -> dict[int, CallState]:
        return dict(self._live)

    @property
    def ended_count(self) -> int:
        return len(self._ended)
