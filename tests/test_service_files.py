"""Service files: systemd units (systemd-analyze verify when available, else an INI parse)
and launchd plists (plistlib)."""

from __future__ import annotations

import configparser
import plistlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
UNITS = sorted((ROOT / "systemd").glob("*.service"))
PLISTS = sorted((ROOT / "launchd").glob("*.plist"))
DOCK_UNIT = ROOT / "systemd" / "ttsdock.service"
DOCK_PLIST = ROOT / "launchd" / "com.whispertalk.ttsdock.plist"


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """systemd INI: repeated keys allowed (kept in order), no interpolation."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        assert current is not None, f"{path.name}:{n}: key outside a section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}:{n}: not key=value: {raw!r}"
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_parses(unit: Path) -> None:
    sections = parse_unit(unit)
    assert {"Unit", "Service", "Install"} <= set(sections)
    assert sections["Service"]["ExecStart"]
    # the stdlib parser agrees on the structure (strict=False: repeated keys are legal)
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]
    cp.read_string(unit.read_text())
    assert cp.has_section("Service")


@pytest.mark.parametrize("unit", UNITS, ids=lambda p: p.name)
def test_unit_verifies(unit: Path, tmp_path: Path) -> None:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        pytest.skip("systemd-analyze not installed (the INI parse test still ran)")
    # ExecStart points at the installed venv; verify a copy that runs this interpreter
    text = "\n".join(
        f"ExecStart={sys.executable} -m ttsdock serve" if ln.startswith("ExecStart=") else ln
        for ln in unit.read_text().splitlines()
    )
    copy = tmp_path / unit.name
    copy.write_text(text + "\n")
    proc = subprocess.run([tool, "verify", str(copy)], capture_output=True, text=True, timeout=60)
    problems = [
        ln for ln in (proc.stdout + proc.stderr).splitlines()
        if unit.name in ln or "Unknown" in ln or "Invalid" in ln
    ]  # fmt: skip
    assert proc.returncode == 0 and not problems, proc.stdout + proc.stderr


def test_dock_unit_contract() -> None:
    svc = parse_unit(DOCK_UNIT)["Service"]
    assert svc["Type"] == ["notify"]
    assert svc["Restart"] == ["on-failure"]
    assert int(svc["WatchdogSec"][0]) > 0
    assert svc["ExecStart"][0].endswith("ttsdock serve")
    assert svc["IPAddressDeny"] == ["any"] and svc["IPAddressAllow"] == ["localhost"]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp", "PrivateDevices"):
        assert svc[key] == ["yes"], key
    assert svc["ProtectSystem"] == ["strict"]
    assert svc["CapabilityBoundingSet"] == [""]


@pytest.mark.parametrize("plist", PLISTS, ids=lambda p: p.name)
def test_plist_parses(plist: Path) -> None:
    data = plistlib.loads(plist.read_bytes())
    assert data["Label"] == plist.stem
    assert isinstance(data["ProgramArguments"], list) and data["ProgramArguments"]


def test_dock_plist_contract() -> None:
    data = plistlib.loads(DOCK_PLIST.read_bytes())
    assert data["ProgramArguments"][-1] == "serve"
    assert data["RunAtLoad"] is True
    assert data["KeepAlive"] == {"SuccessfulExit": False}  # restart on failure only
    # launchd rule: never daemonise; the program stays in the foreground
    assert "--daemon" not in " ".join(data["ProgramArguments"])


# -- engines (engine runtime) --------------------------------------------------------------

ENGINE_UNIT = ROOT / "systemd" / "ttsdock-engine@.service"
ENGINE_PLISTS = {
    e: ROOT / "launchd" / f"com.whispertalk.ttsdock.{e}.plist" for e in ("kokoro", "qwen3")
}


def test_engine_unit_contract() -> None:
    unit = parse_unit(ENGINE_UNIT)
    svc = unit["Service"]
    assert svc["Type"] == ["notify"]  # READY=1 after load + warm-up
    assert svc["Restart"] == ["on-failure"]  # SHUTDOWN after a hot swap exits 0: stays down
    assert int(svc["WatchdogSec"][0]) > 0
    exec_start = svc["ExecStart"][0].split()
    assert exec_start[0].endswith("/ttsdock") and exec_start[1] == "%i"  # instance = engine
    assert svc["IPAddressDeny"] == ["any"] and svc["IPAddressAllow"] == ["localhost"]
    # GPUs stay visible and onnxruntime/torch may JIT
    assert svc["PrivateDevices"] == ["no"]
    assert svc["MemoryDenyWriteExecute"] == ["no"]
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert svc[key] == ["yes"], key
    assert svc["ProtectSystem"] == ["strict"]
    assert svc["CapabilityBoundingSet"] == [""]
    assert int(svc["TimeoutStopSec"][0]) >= 2  # the orderly stop takes at most 2 s
    assert "ttsdock.service" in unit["Unit"]["After"][0]


@pytest.mark.parametrize("engine", sorted(ENGINE_PLISTS))
def test_engine_plist_contract(engine: str) -> None:
    data = plistlib.loads(ENGINE_PLISTS[engine].read_bytes())
    assert data["Label"] == f"com.whispertalk.ttsdock.{engine}"
    assert data["ProgramArguments"][-1] == engine
    assert data["ProgramArguments"][0].endswith("/ttsdock")
    assert data["KeepAlive"] == {"SuccessfulExit": False}  # restart on failure only
    assert data["EnvironmentVariables"]["TTSDOCK_ENGINE_CMD_PORT"] == "13144"
    assert data["EnvironmentVariables"]["TTSDOCK_DOCK_PORT"] == "13143"
    assert isinstance(data["RunAtLoad"], bool)
