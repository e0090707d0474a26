"""Pipeline channel framing: ``u32 BE length N`` + N body bytes (docs/wire.md#frames).

Rule 1: a frame body is at most ``MAX_FRAME_BODY`` bytes (1 MiB + 256); a
larger announced length is a protocol error before any body byte is read.
Rule 2: this file does not know whether the channel is mgmt or data, nor who
is upstream; it only turns bytes into bodies and back (plus the optional
AES-256-GCM body encryption, which is pure computation).
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

from protocol.errors import ProtocolError

LENGTH = struct.Struct(">I")
MAX_FRAME_BODY = 1_048_576 + 256  # docs/wire.md#frames

# AES-256-GCM interconnect encryption (docs/wire.md#encryption): IV(12) || ciphertext || tag(16).
IV_SIZE = 12
TAG_SIZE = 16
KEY_SIZE = 32


class NeedData:
    """Sentinel type: the decoder needs more bytes before it can return an event."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = NeedData()


def encode_frame(body: bytes) -> bytes:
    if len(body) > MAX_FRAME_BODY:
        raise ProtocolError("frame_too_large", f"{len(body)} > {MAX_FRAME_BODY}")
    return LENGTH.pack(len(body)) + body


class ReceiveBuffer:
    """The byte buffer under every incremental decoder: ``feed`` appends, decoders consume
    by moving ``_pos``.

    Linear in the bytes processed: consumed bytes are only skipped by moving
    an offset, and the buffer is compacted once per ``feed`` (amortised), so a
    peer trickling bytes cannot make parsing quadratic. Decoders consume every
    complete frame before the next ``feed``, so the buffer never holds more than
    one maximal frame plus one read's worth of bytes.
    """

    __slots__ = ("_buf", "_pos")

    def __init__(self) -> None:
        self._buf = bytearray()
        self._pos = 0

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        if self._pos:
            del self._buf[: self._pos]
            self._pos = 0
        self._buf += data

    @property
    def buffered(self) -> int:
        return len(self._buf) - self._pos


class FrameDecoder(ReceiveBuffer):
    """Incremental decoder: ``feed(bytes)``, then ``next_body()`` until ``NEED_DATA``."""

    __slots__ = ()

    def next_body(self) -> bytes | NeedData:
        buf, pos = self._buf, self._pos
        if len(buf) - pos < 4:
            return NEED_DATA
        (n,) = LENGTH.unpack_from(buf, pos)
        if n > MAX_FRAME_BODY:
            raise ProtocolError("frame_too_large", f"announced {n} > {MAX_FRAME_BODY}")
        end = pos + 4 + n
        if len(buf) < end:
            return NEED_DATA
        body = bytes(buf[pos + 4 : end])
        self._pos = end
        return body


def flag_on(flag_path: Path) -> bool:
    """The C++ ``ic_encryption.flag`` convention: on when the file starts with ``1``; a
    missing file means off; an unreadable one is a ``ValueError`` naming the path."""
    try:
        return flag_path.read_bytes()[:1] == b"1"
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise ValueError(f"cannot read interconnect flag {flag_path}: {exc.strerror}") from exc


class FrameCipher:
    """AES-256-GCM frame-body sealing compatible with the C++ interconnect."""

    __slots__ = ("_aead",)

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_SIZE:
            raise ValueError(f"interconnect key must be {KEY_SIZE} raw bytes, got {len(key)}")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self._aead = AESGCM(key)

    def seal(self, body: bytes, iv: bytes | None = None) -> bytes:
        iv = os.urandom(IV_SIZE) if iv is None else iv
        if len(iv) != IV_SIZE:
            raise ValueError("IV must be 12 bytes")
        return iv + self._aead.encrypt(iv, body, None)

    def open(self, sealed: bytes) -> bytes:
        if len(sealed) < IV_SIZE + TAG_SIZE:
            raise ProtocolError("short_ciphertext", f"{len(sealed)} bytes")
        from cryptography.exceptions import InvalidTag

        try:
            return self._aead.decrypt(sealed[:IV_SIZE], sealed[IV_SIZE:], None)
        except InvalidTag as exc:
            raise ProtocolError("bad_tag", "AES-GCM authentication failed") from exc

    @classmethod
    def from_files(cls, key_path: Path, flag_path: Path | None = None) -> FrameCipher | None:
        """The C++ convention: encryption is on when ``flag_path`` exists and starts with
        ``1`` (or when no flag path is given); the key is 32 raw bytes in ``key_path``.
        Returns ``None`` when the flag says off. Raises ``ValueError`` with the path on a
        missing or malformed key.
        """
        if flag_path is not None and not flag_on(flag_path):
            return None
        try:
            key = key_path.read_bytes()
        except OSError as exc:
            raise ValueError(f"cannot read interconnect key {key_path}: {exc.strerror}") from exc
        if len(key) != KEY_SIZE:
            raise ValueError(
                f"interconnect key {key_path} must be {KEY_SIZE} bytes, has {len(key)}"
            )
        return cls(key)
