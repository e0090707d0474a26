"""Real processes for the system-level end-to-end tests (tests/test_e2e_*.py).

The dock (``python -m ttsdock serve``) and the engines (``python -m ttsdock kokoro`` /
``qwen3``) run as real processes on free loopback ports; the tests play LLaMA and OAP
over real sockets with the fakes of ``dock_helpers``. This module adds:

- ``EngineProcess``: one engine process (log file, cmd port, SIGTERM / SIGKILL);
- ``RecordingOap``: the fake OAP, also recording every audio packet with its arrival
  time, and a byte-level check of the audio payload that does not use ``protocol``;
- ``Cleanup``: stops everything a test started, whatever happened (by process id);
- small polling helpers (deadlines, never fixed sleeps).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from dock_helpers import DockProcess, FakeOap, FramedPeer, eventually
from runtime_helpers import cmd as engine_cmd

from protocol.mgmt import MgmtMessage
from protocol.packet import Packet, decode_packet

ROOT = Path(__file__).resolve().parent.parent
RATE = 24000
MAX_SAMPLES = 4800  # docs/wire.md#audio-payload: at most 200 ms per packet
START_TIMEOUT = 180.0  # model load + warm-up on a shared, noisy 2-core machine
TIMEOUT = 60.0  # anything else that should take well under a second


def now_us() -> int:
    return time.monotonic_ns() // 1000


def clean_env(**extra: str) -> dict[str, str]:
    """The environment of a child process: none of our settings leak in from the
    caller's shell (every flag also reads an environment variable)."""
    prefixes = ("TTSDOCK_", "KOKORO_", "WHISPERTALK_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(prefixes)}
    env.pop("NOTIFY_SOCKET", None)
    # Kokoro's windows paced as on a fast CPU, whatever this machine's speed: a test's
    # window layout (how much audio a barge-in can still stop) must not depend on it
    env.update(
        {
            "PYTHONPATH": str(ROOT),
            "PYTHONUNBUFFERED": "1",
            "KOKORO_ASSUME_RTF": "0.3",
            **extra,
        }
    )
    return env


def json_events(text: str, name: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            obj = json.loads(line)
            if isinstance(obj, dict) and obj.get("event") == name:
                out.append(obj)
    return out


# --------------------------------------------------------------------- engine processes
class EngineProcess:
    """``python -m ttsdock <kind> ...`` docking to ``dock_port``, cmd port ``cmd_port``."""

    def __init__(
        self,
        tmp: Path,
        kind: str,
        dock_port: int,
        cmd_port: int,
        *extra: str,
        tag: str = "",
        env: dict[str, str] | None = None,
    ) -> None:
        self.kind = kind
        self.env = clean_env(**(env or {}))
        self.cmd_port = cmd_port
        self.log_path = tmp / f"{tag or kind}.log"
        self.args = [
            sys.executable, "-m", "ttsdock", kind,
            "--dock-port", str(dock_port), "--cmd-port", str(cmd_port),
            "--log-level", "DEBUG", *extra,
        ]  # fmt: skip
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> EngineProcess:
        with open(self.log_path, "ab") as log:  # noqa: ASYNC230 - a local file, opened once
            self.proc = await asyncio.create_subprocess_exec(
                *self.args, stdout=log, stderr=log, env=self.env, cwd=str(self.log_path.parent)
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.returncode

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def events(self, name: str) -> list[dict[str, Any]]:
        return json_events(self.logs(), name)

    def check_alive(self) -> None:
        if self.returncode is not None:
            raise AssertionError(
                f"{self.kind} exited with {self.returncode}:\n{self.logs()[-4000:]}"
            )

    async def cmd(self, line: str, within: float = TIMEOUT) -> str:
        return await engine_cmd(self.cmd_port, line, within)

    async def stats(self) -> dict[str, str]:
        reply = await self.cmd("STATS")
        assert reply.startswith("STATS:"), reply
        return dict(f.split("=", 1) for f in reply[len("STATS:") :].split(":") if "=" in f)

    async def wait_exit(self, within: float = TIMEOUT) -> int:
        assert self.proc is not None
        return await asyncio.wait_for(self.proc.wait(), within)

    def kill(self) -> None:
        """SIGKILL now (a crash)."""
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)

    async def stop(self, within: float = 15.0) -> int:
        """SIGTERM, then SIGKILL if it does not exit ``within`` seconds; the exit status."""
        assert self.proc is not None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), within)
            except TimeoutError:
                self.kill()
                await self.proc.wait()
        assert self.proc.returncode is not None
        return self.proc.returncode


async def wait_active(dock: DockProcess, name: str, *watch: EngineProcess) -> None:
    """Poll the dock's STATUS until ``ACTIVE <name>``; fail at once if a watched process or
    the dock exits."""

    async def active() -> bool:
        for e in watch:
            e.check_alive()
        assert dock.proc is not None
        if dock.proc.returncode is not None:
            raise AssertionError(f"dock exited with {dock.proc.returncode}:\n{dock.logs()}")
        return (await dock.cmd("STATUS")).strip() == f"ACTIVE {name}"

    await eventually(active, START_TIMEOUT, f"dock STATUS == ACTIVE {name}")


async def poll(pred: Callable[[], Awaitable[Any]], within: float = TIMEOUT, what: str = "") -> Any:
    """Like ``dock_helpers.eventually`` for an async predicate that may raise ``OSError``
    (a port not bound yet counts as "not yet")."""

    async def guarded() -> Any:
        try:
            return await pred()
        except OSError:
            return None

    return await eventually(guarded, within, what)


# --------------------------------------------------------------------- OAP
@dataclass(frozen=True)
class Arrival:
    """One audio Packet as it reached OAP: our monotonic clock (µs) and the raw payload."""

    t_us: int
    call_id: int
    payload: bytes

    @property
    def sample_rate(self) -> int:
        # host order (LE), docs/wire.md#audio-payload
        return int(struct.unpack_from("<i", self.payload, 0)[0])

    @property
    def t_engine_out_us(self) -> int:
        # big-endian, docs/wire.md#audio-payload
        return int(struct.unpack_from(">Q", self.payload, 4)[0])

    @property
    def n_samples(self) -> int:
        return (len(self.payload) - 12) // 4

    def samples(self) -> np.ndarray:
        return np.frombuffer(self.payload, dtype="<f4", offset=12)


class RecordingOap(FakeOap):
    """The fake OAP of ``dock_helpers``, also keeping every audio packet in arrival order."""

    def __init__(self) -> None:
        super().__init__()
        self.arrivals: list[Arrival] = []
        self.seen: list[MgmtMessage] = []  # every mgmt message ever received, in order

    async def _pump(self, src: asyncio.Queue[Any], dst: asyncio.Queue[Any]) -> None:
        while True:
            msg = await src.get()
            self.seen.append(msg)
            await dst.put(msg)

    async def _pump_packets(self, peer: FramedPeer) -> None:
        while True:
            body = await peer.bodies.get()
            pkt: Packet = decode_packet(body)
            self.arrivals.append(Arrival(now_us(), pkt.call_id, bytes(pkt.payload)))
            await self.packets.put(pkt)

    def of(self, call_id: int) -> list[Arrival]:
        return [a for a in self.arrivals if a.call_id == call_id]

    def samples(self, call_id: int) -> int:
        return sum(a.n_samples for a in self.of(call_id))

    def audio(self, call_id: int) -> np.ndarray:
        parts = [a.samples() for a in self.of(call_id)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)


def check_audio_packets(arrivals: list[Arrival], not_before_us: int) -> None:
    """docs/wire.md#audio-payload byte by byte, per packet and per call: 12-byte header,
    24000 LE, an engine timestamp on our monotonic clock (after ``not_before_us``, before arrival),
    non-decreasing within a call, 1..4800 whole float32 samples, finite, within [-1, 1]."""
    assert arrivals, "no audio packets"
    last: dict[int, int] = {}
    for i, a in enumerate(arrivals):
        where = f"packet {i} of call {a.call_id}"
        assert len(a.payload) >= 12, f"{where}: {len(a.payload)} bytes, no 12-byte header"
        assert (len(a.payload) - 12) % 4 == 0, f"{where}: PCM is not whole float32 samples"
        assert a.sample_rate == RATE, f"{where}: sample rate {a.sample_rate}"
        assert 1 <= a.n_samples <= MAX_SAMPLES, f"{where}: {a.n_samples} samples"
        t = a.t_engine_out_us
        assert not_before_us <= t <= a.t_us, (
            f"{where}: t_engine_out_us {t} outside [{not_before_us}, arrival {a.t_us}]"
        )
        assert t >= last.get(a.call_id, 0), f"{where}: timestamp went back"
        last[a.call_id] = t
        pcm = a.samples()
        assert np.all(np.isfinite(pcm)) and float(np.max(np.abs(pcm))) <= 1.0 + 1e-6, where


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(x, dtype=np.float64)))) if x.size else 0.0


# --------------------------------------------------------------------- cleanup
class Cleanup:
    """Everything a test started, stopped in reverse order at teardown (never raises).

    Engines and docks get SIGTERM, then SIGKILL by pid; fakes are closed."""

    def __init__(self) -> None:
        self._stack: list[Callable[[], Awaitable[Any]]] = []

    def engine(self, e: EngineProcess) -> EngineProcess:
        self._stack.append(e.stop)
        return e

    def dock(self, d: DockProcess) -> DockProcess:
        async def stop() -> None:
            if d.proc is not None:
                await d.stop()

        self._stack.append(stop)
        return d

    def later(self, fn: Callable[[], Awaitable[Any]]) -> None:
        self._stack.append(fn)

    async def run(self) -> None:
        while self._stack:
            fn = self._stack.pop()
            try:
                await asyncio.wait_for(fn(), 30)
            except BaseException as exc:  # teardown must reach every process
                print(f"cleanup: {fn!r} failed: {exc!r}", file=sys.stderr)
