"""The Qwen2 text tokenizer, built from GGUF tokenizer metadata with the ``tokenizers`` library.

The GGUF holds ``tokenizer.ggml.tokens`` (one string per id), ``token_type``
(1 normal, 3 control, 4 user-defined, 5 unused gap filler) and ``merges``.
Normal tokens form the byte-level BPE vocabulary; control and user-defined
tokens are added tokens matched verbatim before pre-tokenisation (as in the
Hugging Face ``Qwen2TokenizerFast``). Pre-tokeniser: the Qwen2 regex, then
byte-level mapping; normaliser NFC.

Chat templates (as the official ``qwen_tts`` package builds them)::

    target:      <|im_start|>assistant\\n{text}<|im_end|>\\n<|im_start|>assistant\\n
    reference:   <|im_start|>assistant\\n{ref_text}<|im_end|>\\n
    instruction: <|im_start|>user\\n{instruct}<|im_end|>\\n
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from engines.qwen3.errors import GgufError, Qwen3TtsError
from engines.qwen3.weights.gguf_loader import GgufFile, open_gguf

QWEN2_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
    r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

TOKEN_NORMAL = 1
TOKEN_UNKNOWN = 2
TOKEN_CONTROL = 3
TOKEN_USER_DEFINED = 4
TOKEN_UNUSED = 5
TOKEN_BYTE = 6


def assistant_text(text: str) -> str:
    return f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n"


def ref_text_template(ref_text: str) -> str:
    return f"<|im_start|>assistant\n{ref_text}<|im_end|>\n"


def instruct_template(instruct: str) -> str:
    return f"<|im_start|>user\n{instruct}<|im_end|>\n"


def _looks_special(tok: str) -> bool:
    return (tok.startswith("<|") and tok.endswith("|>")) or (
        tok.startswith("<tts_") and tok.endswith(">")
    )


def build_tokenizer_json(
    tokens: Sequence[str], token_types: Sequence[int] | None, merges: Sequence[str]
) -> dict[str, Any]:
    """A ``tokenizer.json`` document equivalent to the Hugging Face Qwen2 fast tokenizer."""
    vocab: dict[str, int] = {}
    added: list[dict[str, Any]] = []
    for i, tok in enumerate(tokens):
        ttype = (
            token_types[i]
            if token_types is not None
            else (TOKEN_CONTROL if _looks_special(tok) else TOKEN_NORMAL)
        )
        if ttype in (TOKEN_CONTROL, TOKEN_USER_DEFINED):
            # Also in the BPE vocab: ``tokenizers`` gives an added token the model's id for
            # its string, and would otherwise number it after the vocab (wrong for gaps).
            vocab[tok] = i
            added.append(
                {
                    "id": i,
                    "content": tok,
                    "single_word": False,
                    "lstrip": False,
                    "rstrip": False,
                    "normalized": False,
                    "special": ttype == TOKEN_CONTROL,
                }
            )
        elif ttype == TOKEN_UNUSED:
            continue
        else:
            vocab[tok] = i
    byte_level = {
        "type": "ByteLevel",
        "add_prefix_space": False,
        "trim_offsets": False,
        "use_regex": False,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {
                    "type": "Split",
                    "pattern": {"Regex": QWEN2_PRETOKENIZE_REGEX},
                    "behavior": "Isolated",
                    "invert": False,
                },
                byte_level,
            ],
        },
        "post_processor": None,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": list(merges),
        },
    }


class TextTokenizer:
    """Qwen2 byte-level BPE plus the Qwen3-TTS chat templates."""

    def __init__(self, tokenizer: Tokenizer, source: str = "") -> None:
        self.tokenizer = tokenizer
        self.source = source

    @classmethod
    def from_tokens(
        cls,
        tokens: Sequence[str],
        token_types: Sequence[int] | None,
        merges: Sequence[str],
        source: str = "",
    ) -> TextTokenizer:
        doc = build_tokenizer_json(tokens, token_types, merges)
        try:
            tk = Tokenizer.from_str(json.dumps(doc))
        except Exception as exc:  # tokenizers raises plain Exception subclasses
            raise Qwen3TtsError(
                f"{source or 'tokenizer'}: cannot build BPE tokenizer: {exc}"
            ) from exc
        return cls(tk, source)

    @classmethod
    def from_gguf_file(cls, f: GgufFile) -> TextTokenizer:
        model = f.get("tokenizer.ggml.model")
        tokens = f.get("tokenizer.ggml.tokens")
        merges = f.get("tokenizer.ggml.merges")
        types = f.get("tokenizer.ggml.token_type")
        if tokens is None:
            raise GgufError(f.path, "no tokenizer metadata (tokenizer.ggml.tokens is missing)")
        if model is not None and model != "gpt2":
            raise GgufError(
                f.path,
                f"tokenizer.ggml.model is {model!r}; only byte-level BPE ('gpt2') is supported",
            )
        if merges is None:
            raise GgufError(f.path, "tokenizer.ggml.merges is missing")
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise GgufError(f.path, "tokenizer.ggml.tokens must be an array of strings")
        if types is not None and (not isinstance(types, list) or len(types) != len(tokens)):
            raise GgufError(
                f.path, "tokenizer.ggml.token_type must be an int array as long as the tokens"
            )
        return cls.from_tokens(tokens, types, merges, source=str(f.path))

    @classmethod
    def from_gguf(cls, path: str | Path) -> TextTokenizer:
        """Build (once per unchanged file) the tokenizer of a GGUF file."""
        f = open_gguf(path)
        with _CACHE_LOCK:
            tok = _CACHE.get(id(f))
            if tok is None or tok[0] is not f:
                tok = (f, cls.from_gguf_file(f))
                _CACHE[id(f)] = tok
        return tok[1]

    # -- plain encode/decode --------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    def token_to_id(self, token: str) -> int | None:
        return self.tokenizer.token_to_id(token)

    def tokens(self, ids: Sequence[int]) -> list[str]:
        return [self.tokenizer.id_to_token(i) or f"<{i}>" for i in ids]

    # -- chat templates -------------------------------------------------------------------

    def encode_tts_text(self, text: str) -> list[int]:
        """Target template ids: ``[ims, assistant, \\n] + T + [ime, \\n, ims, assistant, \\n]``."""
        return self.encode(assistant_text(text))

    def encode_ref_text(self, ref_text: str) -> list[int]:
        return self.encode(ref_text_template(ref_text))

    def encode_instruction_for_tts(self, instruct: str) -> list[int]:
        """All ids of ``<|im_start|>user\\n{instruct}<|im_end|>\\n`` (text track only)."""
        return self.encode(instruct_template(instruct))

    def text_token_ids(self, text: str) -> list[int]:
        """The target text tokens ``T`` (upstream ``input_ids[:, 3:-5]``)."""
        return self.encode_tts_text(text)[3:-5]

    def ref_token_ids(self, ref_text: str) -> list[int]:
        """The reference text tokens (upstream ``ref_ids[:, 3:-2]``)."""
        return self.encode_ref_text(ref_text)[3:-2]


_CACHE: dict[int, tuple[GgufFile, TextTokenizer]] = {}
_CACHE_LOCK = threading.Lock()
