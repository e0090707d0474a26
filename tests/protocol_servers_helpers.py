"""Helpers of the protocol-listener tests (HTTP: OpenAI speech, Prometheus; Wyoming).

The clients are the real ones we did not write: ``openai`` (``AsyncOpenAI``), the
``wyoming`` package's ``AsyncTcpClient``, ``prometheus_client.parser``; raw requests go
through ``aiohttp``'s client. Engines under test run in process (``ToneSynth``) or as
real processes (``e2e_helpers.EngineProcess``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from runtime_helpers import ToneSynth, free_port, running_engine

from engines.runtime.protocols import ProtocolConfig
from svc.http import HttpSettings

aiohttp = pytest.importorskip("aiohttp")
wyoming_client = pytest.importorskip("wyoming.client")
prom_parser = pytest.importorskip("prometheus_client.parser")

from wyoming.event import Event  # noqa: E402


@contextlib.asynccontextmanager
async def serving_engine(
    synth: ToneSynth,
    *,
    http: HttpSettings | None = None,
    wyoming: bool = True,
    dock_port: int | None = None,
    **protocols: Any,
) -> AsyncIterator[Any]:
    """An in-process engine with its HTTP listener (port 0) and Wyoming server (port 0)."""
    pc = ProtocolConfig(
        http=http if http is not None else HttpSettings(port=0),
        wyoming_uri="tcp://127.0.0.1:0" if wyoming else None,
        **protocols,
    )
    async with running_engine(synth, dock_port or free_port(), protocols=pc) as eng:
        async with asyncio.timeout(5):
            while eng.protocols.http is None or (wyoming and eng.protocols.wyoming is None):  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        eng.http_port = eng.protocols.http.port
        eng.wyoming_port = eng.protocols.wyoming.port if wyoming else None
        yield eng


async def request(
    port: int,
    method: str,
    path: str,
    body: bytes | str | dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    """One raw HTTP request: (status, headers, body)."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    async with aiohttp.ClientSession() as s:
        async with s.request(
            method, f"http://127.0.0.1:{port}{path}", data=data, headers=headers
        ) as r:
            return r.status, dict(r.headers), await r.read()


def parse_metrics(text: str) -> dict[str, Any]:
    """``prometheus_client.parser`` over an exposition; {family name: family}. Raises on
    anything a Prometheus server would reject."""
    return {f.name: f for f in prom_parser.text_string_to_metric_families(text)}


def sample(families: dict[str, Any], name: str, **labels: str) -> float:
    for fam in families.values():
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    raise KeyError(f"{name}{labels}")


async def wyoming_session(port: int) -> Any:
    client = wyoming_client.AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    return client


async def read_until(client: Any, *types: str, within: float = 30.0) -> list[Event]:
    """Events up to and including the first of ``types`` (or an ``error``)."""
    out: list[Event] = []
    async with asyncio.timeout(within):
        while True:
            ev = await client.read_event()
            assert ev is not None, f"connection closed after {[e.type for e in out]}"
            out.append(ev)
            if ev.type in types or ev.type == "error":
                return out


def stats_of(reply: str) -> dict[str, str]:
    assert reply.startswith("STATS:"), reply
    return dict(f.split("=", 1) for f in reply[len("STATS:") :].split(":") if "=" in f)


def http_port_from_log(log: Path) -> int | None:
    m = re.search(r'"event": "http_listening".*?"port": (\d+)', log.read_text(errors="replace"))
    if m is None:
        m = re.search(r'"port": (\d+).*?"event": "http_listening"', log.read_text())
    return int(m[1]) if m else None
