"""The Qwen3-TTS talker and code predictor: transformer stack, weights on a device, sampling,
the batch of rows of one frame step and its CUDA graphs. Knows no requests or files."""
