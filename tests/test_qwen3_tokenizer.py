"""Tokenizer from GGUF metadata: real special ids, GPT-2 byte order, chat templates."""

from __future__ import annotations

from pathlib import Path

import pytest
import qwen3_helpers as qh

from engines.qwen3.conversion.gguf_convert import read_hf_tokenizer
from engines.qwen3.weights.text_tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tok(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    d = tmp_path_factory.mktemp("tok")
    qh.write_tiny_tokenizer(d)
    tokens, types, merges = read_hf_tokenizer(d)
    path = qh.write_gguf(
        d / "tokenizer.gguf",
        {
            "tokenizer.ggml.model": "gpt2",
            "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": merges,
        },
    )
    return TextTokenizer.from_gguf(path)


def test_special_and_byte_ids(tok: TextTokenizer) -> None:
    for tid, text in qh.SPECIAL_TOKENS.items():
        assert tok.token_to_id(text) == tid
        assert tok.encode(text) == [tid]
    assert tok.encode("\n") == [198]
    assert tok.tokens([198]) == ["Ċ"]
    assert tok.encode("assistant") == [77091]
    assert tok.encode("!") == [0]


def test_templates_tokenize_like_qwen2(tok: TextTokenizer) -> None:
    ids = tok.encode_tts_text("Hello world")
    assert ids[:3] == [151644, 77091, 198]
    assert ids[-5:] == [151645, 198, 151644, 77091, 198]
    assert tok.decode(ids[3:-5]) == "Hello world"
    assert tok.text_token_ids("Hello world") == ids[3:-5]
    ref = tok.encode_ref_text("Hello")
    assert ref[:3] == [151644, 77091, 198] and ref[-2:] == [151645, 198]
    assert tok.ref_token_ids("Hello") == ref[3:-2]
    ins = tok.encode_instruction_for_tts("Speak warmly.")
    assert ins[:3] == [151644, 872, 198] and ins[-2:] == [151645, 198]
    assert tok.decode(ins) == "<|im_start|>user\nSpeak warmly.<|im_end|>\n"


def test_special_token_text_inside_user_text_is_matched_verbatim(tok: TextTokenizer) -> None:
    assert tok.encode("a<tts_pad>b") == [*tok.encode("a"), 151671, *tok.encode("b")]


def test_unicode_round_trip(tok: TextTokenizer) -> None:
    for text in ["Grüße, Straße!", "日本語のテキスト", "emoji 🙂 ok", "  spaces\n\nnewlines"]:
        assert tok.decode(tok.encode(text)) == text


def test_missing_tokenizer_metadata_is_a_clear_error(tmp_path: Path) -> None:
    from engines.qwen3.errors import GgufError

    path = qh.write_gguf(tmp_path / "empty.gguf", {"x": 1})
    with pytest.raises(GgufError, match=r"empty\.gguf: no tokenizer metadata"):
        TextTokenizer.from_gguf(path)
