"""The QTS GGUF format: metadata keys, the GGUF loader, the text tokenizer and model file paths."""
