"""The dock's HTTP listener (``ttsdock serve --http-port``): /metrics parses with
``prometheus_client.parser`` and carries the cmd port's METRICS families; /health; a
bearer token when configured; a public address without a token is a usage error."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from dock_helpers import ROOT, DockProcess
from protocol_servers_helpers import parse_metrics, request, sample
from runtime_helpers import free_port


async def test_dock_metrics_and_health(tmp_path: Path) -> None:
    token = "t" * 32
    (tmp_path / "token").write_text(token + "\n")
    dock = DockProcess(
        tmp_path, (free_port(), free_port()), "--http-port", "0",
        "--http-token-file", str(tmp_path / "token"),
    )  # fmt: skip
    await dock.start()
    try:
        port = dock.ports["http"]
        status, _h, _b = await request(port, "GET", "/metrics")
        assert status == 401
        auth = {"Authorization": f"Bearer {token}"}
        status, headers, raw = await request(port, "GET", "/metrics", headers=auth)
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        http = parse_metrics(raw.decode())
        cmd = parse_metrics(await dock.cmd("METRICS"))
        assert set(http) == set(cmd)
        assert sample(http, "ttsdock_engine_active") == 0
        assert http["ttsdock_hop_latency_seconds"].type == "summary"
        status, _h, raw = await request(port, "GET", "/health", headers=auth)
        health = json.loads(raw)
        assert status == 200 and health["slot"] == "empty" and health["engine"] is None
    finally:
        assert await dock.stop() == 0
    assert "Traceback" not in dock.logs()


async def test_dock_refuses_public_http_without_token(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "ttsdock", "serve", "--llama-mgmt-port", "0",
        "--llama-data-port", "0", "--cmd-port", "0", "--dock-port", "0",
        "--http-host", "0.0.0.0", "--http-port", "0",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    _out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2
    assert b"--http-token-file" in err


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
