"""Engine runtime shared by all engines: dock client, per-call workers,
audio framing and the engine cmd port (docs/wire.md: #engine-dock, #audio-payload,
#engine-cmd-port, #per-call-engine-behaviour)."""

from engines.runtime.synth import (
    SAMPLE_RATE,
    SPEED_MAX,
    SPEED_MIN,
    CallState,
    CancelToken,
    FloatArray,
    SynthesisCancelled,
    SynthesisError,
    Synthesizer,
    VoiceNotFound,
)

__all__ = [
    "SAMPLE_RATE",
    "SPEED_MAX",
    "SPEED_MIN",
    "CallState",
    "CancelToken",
    "FloatArray",
    "SynthesisCancelled",
    "SynthesisError",
    "Synthesizer",
    "VoiceNotFound",
]
