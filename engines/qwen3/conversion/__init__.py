"""Convert time only: official checkpoint -> GGUF files, and the torch codec decoder, codec
encoder and speaker encoder exported to ONNX (``ttsdock qwen3-convert``)."""
