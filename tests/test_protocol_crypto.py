"""Interconnect encryption (docs/wire.md#encryption): frame body = IV(12) || AES-256-GCM
ciphertext || tag(16), no associated data, 32-byte raw key; switched on by
``ic_encryption.flag`` starting with ``1``.

Known answers are the AES-256 test cases 13-15 of the GCM specification (McGrew & Viega),
which use a 96-bit IV and no AAD, exactly the interconnect's layout.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol import FrameCipher, FrameDecoder, ProtocolError, decode_packet, encode_frame
from protocol.framing import IV_SIZE, KEY_SIZE, TAG_SIZE

ZERO_KEY = bytes(32)
ZERO_IV = bytes(12)
# GCM spec test case 13: empty plaintext -> only the tag.
TC13_TAG = bytes.fromhex("530f8afbc74536b9a963b4f1c4cb738b")
# Test case 14: 16 zero bytes.
TC14_CT = bytes.fromhex("cea7403d4d606b6e074ec5d3baf39d18")
TC14_TAG = bytes.fromhex("d0d1c8a799996bf0265b98b5d48ab919")
# Test case 15.
TC15_KEY = bytes.fromhex("feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308")
TC15_IV = bytes.fromhex("cafebabefacedbaddecaf888")
TC15_PT = bytes.fromhex(
    "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a72"
    "1c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255"
)
TC15_CT = bytes.fromhex(
    "522dc1f099567d07f47f37a32a84427d643a8cdcbfe5c0c97598a2bd2555d1aa"
    "8cb08e48590dbb3da7b08b1056828838c5f61e6393ba7a0abcc9f662898015ad"
)
TC15_TAG = bytes.fromhex("b094dac5d93471bdec1a502270e3cc6c")


def test_sizes() -> None:
    assert (IV_SIZE, TAG_SIZE, KEY_SIZE) == (12, 16, 32)


@pytest.mark.parametrize(
    ("key", "iv", "plain", "sealed"),
    [
        (ZERO_KEY, ZERO_IV, b"", ZERO_IV + TC13_TAG),
        (ZERO_KEY, ZERO_IV, bytes(16), ZERO_IV + TC14_CT + TC14_TAG),
        (TC15_KEY, TC15_IV, TC15_PT, TC15_IV + TC15_CT + TC15_TAG),
    ],
)
def test_known_answers_layout_iv_ct_tag(key: bytes, iv: bytes, plain: bytes, sealed: bytes) -> None:
    c = FrameCipher(key)
    assert c.seal(plain, iv) == sealed
    assert c.open(sealed) == plain


def test_sealed_packet_in_a_frame() -> None:
    body = b"\x00\x00\x00\x07\x00\x00\x00\x0bHallo Welt."
    c = FrameCipher(TC15_KEY)
    sealed = c.seal(body, TC15_IV)
    assert len(sealed) == 12 + len(body) + 16
    assert sealed[:12] == TC15_IV
    wire = encode_frame(sealed)
    assert wire[:4] == (12 + 19 + 16).to_bytes(4, "big")
    dec = FrameDecoder()
    dec.feed(wire)
    got = dec.next_body()
    assert isinstance(got, bytes)
    assert decode_packet(c.open(got)).payload == b"Hallo Welt."


def test_random_iv_each_seal() -> None:
    c = FrameCipher(TC15_KEY)
    a, b = c.seal(b"same"), c.seal(b"same")
    assert a[:12] != b[:12]
    assert c.open(a) == c.open(b) == b"same"


@pytest.mark.parametrize("where", [0, 11, 12, 20, -17, -1])
def test_tamper_any_byte_is_rejected(where: int) -> None:
    c = FrameCipher(TC15_KEY)
    sealed = bytearray(TC15_IV + TC15_CT + TC15_TAG)
    sealed[where] ^= 0x01
    with pytest.raises(ProtocolError) as info:
        c.open(bytes(sealed))
    assert info.value.reason == "bad_tag"


def test_truncated_and_extended_rejected() -> None:
    c = FrameCipher(ZERO_KEY)
    sealed = ZERO_IV + TC14_CT + TC14_TAG
    with pytest.raises(ProtocolError):
        c.open(sealed[:-1])
    with pytest.raises(ProtocolError):
        c.open(sealed + b"\x00")


def test_wrong_key_rejected() -> None:
    sealed = FrameCipher(TC15_KEY).seal(b"secret", TC15_IV)
    with pytest.raises(ProtocolError) as info:
        FrameCipher(ZERO_KEY).open(sealed)
    assert info.value.reason == "bad_tag"


@pytest.mark.parametrize("n", [0, 1, 12, 27])
def test_short_ciphertext(n: int) -> None:
    with pytest.raises(ProtocolError) as info:
        FrameCipher(ZERO_KEY).open(bytes(n))
    assert info.value.reason == "short_ciphertext"


def test_minimal_sealed_length_is_28() -> None:
    assert FrameCipher(ZERO_KEY).open(ZERO_IV + TC13_TAG) == b""


@pytest.mark.parametrize("n", [0, 16, 24, 31, 33, 64])
def test_key_must_be_32_bytes(n: int) -> None:
    with pytest.raises(ValueError, match="32"):
        FrameCipher(bytes(n))


@pytest.mark.parametrize("n", [0, 8, 11, 13, 16])
def test_iv_must_be_12_bytes(n: int) -> None:
    with pytest.raises(ValueError, match="12"):
        FrameCipher(ZERO_KEY).seal(b"x", bytes(n))


def test_from_files(tmp_path: Path) -> None:
    key = tmp_path / "ic_key.bin"
    flag = tmp_path / "ic_encryption.flag"
    key.write_bytes(TC15_KEY)
    # no flag file -> off
    assert FrameCipher.from_files(key, flag) is None
    flag.write_bytes(b"0\n")
    assert FrameCipher.from_files(key, flag) is None
    flag.write_bytes(b"")
    assert FrameCipher.from_files(key, flag) is None
    flag.write_bytes(b" 1")
    assert FrameCipher.from_files(key, flag) is None
    for on in (b"1", b"1\n", b"10"):
        flag.write_bytes(on)
        c = FrameCipher.from_files(key, flag)
        assert c is not None
        assert c.seal(TC15_PT, TC15_IV) == TC15_IV + TC15_CT + TC15_TAG
    # no flag path given: on
    assert FrameCipher.from_files(key) is not None


def test_from_files_bad_key(tmp_path: Path) -> None:
    key = tmp_path / "ic_key.bin"
    with pytest.raises(ValueError, match=r"ic_key\.bin"):
        FrameCipher.from_files(key)
    key.write_bytes(bytes(31))
    with pytest.raises(ValueError, match=r"ic_key\.bin.*31"):
        FrameCipher.from_files(key)
    # a disabled flag does not even read the key
    flag = tmp_path / "flag"
    flag.write_bytes(b"0")
    assert FrameCipher.from_files(key, flag) is None


@given(st.binary(max_size=512), st.binary(min_size=12, max_size=12))
def test_roundtrip(body: bytes, iv: bytes) -> None:
    c = FrameCipher(TC15_KEY)
    sealed = c.seal(body, iv)
    assert sealed[:12] == iv
    assert len(sealed) == len(body) + 28
    assert c.open(sealed) == body


@given(st.binary(max_size=80))
def test_arbitrary_bytes_only_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        FrameCipher(TC15_KEY).open(data)
