"""ttsdock: the TTS stage daemon (dock) of the WhisperTalk-compatible voice pipeline."""

__version__ = "0.1.0"
