"""The import rule of README "Layout", checked on the source files present at test time.

- ``protocol`` and ``svc`` import nothing of ours (only themselves, stdlib, third party);
- ``ttsdock`` never imports ``engines``; ``engines`` never imports ``ttsdock``;
- ``engines.kokoro`` and ``engines.qwen3`` never import each other;
- ``engines.runtime`` never imports an engine (``engines.kokoro``, ``engines.qwen3``);
- ``engines.text`` (the shared text front end) imports no engine, not the runtime and not
  ``ttsdock``: only itself and ``protocol``/``svc``-free third-party code.

Imports anywhere in a file count (also inside functions and ``if TYPE_CHECKING``);
relative imports are resolved against the file's package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = ("protocol", "svc", "ttsdock", "engines")


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, module: str, is_package: bool) -> set[str]:
    """Absolute names of every module ``source`` imports, including ``pkg.name`` for each
    ``from pkg import name`` (``name`` may be a submodule)."""
    package = module if is_package else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".") if package else []
                keep = len(base_parts) - (node.level - 1)
                base = ".".join(base_parts[: max(keep, 0)])
                target = ".".join(p for p in (base, node.module or "") if p)
            else:
                target = node.module or ""
            if target:
                found.add(target)
            found.update(f"{target}.{alias.name}" if target else alias.name for alias in node.names)
    return found


def is_under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def sources(package: str) -> list[Path]:
    root = ROOT / package
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def imports_of(path: Path) -> set[str]:
    return imported_modules(
        path.read_text(encoding="utf-8"), module_name(path), path.name == "__init__.py"
    )


def violations(
    package: str, forbidden: tuple[str, ...], allowed_self: str | None = None
) -> list[str]:
    bad: list[str] = []
    for path in sources(package):
        for name in sorted(imports_of(path)):
            if allowed_self is not None and is_under(name, allowed_self):
                continue
            if any(is_under(name, f) for f in forbidden):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


# ----------------------------------------------------------------- the checker itself


@pytest.mark.parametrize(
    ("source", "module", "is_pkg", "expected"),
    [
        ("import engines.qwen3.talker", "engines.kokoro.cli", False, "engines.qwen3.talker"),
        ("from engines.qwen3 import x", "engines.kokoro.cli", False, "engines.qwen3.x"),
        ("from ..qwen3 import x", "engines.kokoro.cli", False, "engines.qwen3"),
        ("from .. import qwen3", "engines.kokoro.cli", False, "engines.qwen3"),
        ("from ..qwen3.a import b", "engines.kokoro", True, "engines.qwen3.a.b"),
        ("from . import cli", "engines.kokoro", True, "engines.kokoro.cli"),
        ("from .mgmt import Ping", "protocol.packet", False, "protocol.mgmt"),
        ("def f():\n    import ttsdock.slot\n", "engines.runtime.cli", False, "ttsdock.slot"),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from svc import net\n",
            "protocol.hello",
            False,
            "svc.net",
        ),
    ],
)
def test_checker_resolves_imports(source: str, module: str, is_pkg: bool, expected: str) -> None:
    assert expected in imported_modules(source, module, is_pkg)


def test_checker_finds_a_planted_violation(tmp_path: Path) -> None:
    pkg = tmp_path / "engines" / "kokoro"
    pkg.mkdir(parents=True)
    f = pkg / "bad.py"
    f.write_text("from ..qwen3 import talker\n")
    names = imported_modules(f.read_text(), module_name(f, tmp_path), False)
    assert any(is_under(n, "engines.qwen3") for n in names)


def test_module_name() -> None:
    assert module_name(ROOT / "protocol" / "__init__.py") == "protocol"
    assert module_name(ROOT / "engines" / "kokoro" / "cli.py") == "engines.kokoro.cli"


# ----------------------------------------------------------------- the rule


def test_protocol_present() -> None:
    assert len(sources("protocol")) >= 7  # the scan must not pass by finding nothing


def test_protocol_imports_nothing_of_ours() -> None:
    assert violations("protocol", OURS, allowed_self="protocol") == []


def test_svc_imports_nothing_of_ours() -> None:
    assert len(sources("svc")) >= 5  # the scan must not pass by finding nothing
    assert violations("svc", OURS, allowed_self="svc") == []


def test_runtime_never_imports_an_engine() -> None:
    assert len(sources("engines/runtime")) >= 5
    assert violations("engines/runtime", ("engines.kokoro", "engines.qwen3")) == []


def test_checker_finds_a_planted_runtime_violation(tmp_path: Path) -> None:
    pkg = tmp_path / "engines" / "runtime"
    pkg.mkdir(parents=True)
    f = pkg / "bad.py"
    f.write_text("def f():\n    from ..kokoro.synth import KokoroSynthesizer\n")
    names = imported_modules(f.read_text(), module_name(f, tmp_path), False)
    assert any(is_under(n, "engines.kokoro") for n in names)


def test_text_front_end_imports_no_engine_and_no_runtime() -> None:
    assert len(sources("engines/text")) >= 5
    forbidden = ("engines.kokoro", "engines.qwen3", "engines.runtime", "ttsdock", "protocol")
    assert violations("engines/text", forbidden) == []


def test_checker_finds_a_planted_text_violation(tmp_path: Path) -> None:
    pkg = tmp_path / "engines" / "text"
    pkg.mkdir(parents=True)
    f = pkg / "bad.py"
    f.write_text("from ..runtime.synth import SynthesisError\n")
    names = imported_modules(f.read_text(), module_name(f, tmp_path), False)
    assert any(is_under(n, "engines.runtime") for n in names)


def test_ttsdock_never_imports_engines() -> None:
    assert violations("ttsdock", ("engines",)) == []


def test_engines_never_import_ttsdock() -> None:
    assert violations("engines", ("ttsdock",)) == []


def test_kokoro_never_imports_qwen3() -> None:
    assert violations("engines/kokoro", ("engines.qwen3",)) == []


def test_qwen3_never_imports_kokoro() -> None:
    assert violations("engines/qwen3", ("engines.kokoro",)) == []


def test_qwen3_model_knows_no_requests_files_or_commands() -> None:
    assert len(sources("engines/qwen3/model")) >= 5
    forbidden = tuple(f"engines.qwen3.{p}" for p in ("serving", "weights", "conversion", "cli"))
    assert violations("engines/qwen3/model", forbidden) == []


def test_engines_ship_no_test_support() -> None:
    test_support = ("tests", "qwen3_vocoder_fixture", "qwen3_measure", "qwen3_helpers")
    assert violations("engines", test_support) == []


def test_every_file_parses() -> None:
    for package in OURS:
        for path in sources(package):
            imports_of(path)  # a syntax error would hide imports from the checks above
