"""Serving: requests and their checks, the talker prefill, the batch scheduler, the frame
generator, the ONNX vocoder runtime, voice-clone prompts and the runtime's ``Synthesizer``."""
