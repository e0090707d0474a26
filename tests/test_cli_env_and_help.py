"""Engine command lines: environment defaults are checked like flags; help says each default
once and truthfully."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from engines.kokoro import cli as kokoro_cli
from engines.kokoro.models import DEFAULT_VOICE
from engines.qwen3.cli import dock as qwen3_cli
from engines.qwen3.cli import synth as qwen3_synth_cli
from engines.runtime.cli import common_parser, run_engine

ROOT = Path(__file__).resolve().parent.parent

ENV_NAMES = (
    "KOKORO_SPEED", "KOKORO_LANG", "KOKORO_THREADS", "KOKORO_G2P", "KOKORO_VOICE",
    "KOKORO_VARIANT", "TTSDOCK_DOCK_HOST", "TTSDOCK_DOCK_PORT", "TTSDOCK_ENGINE_CMD_HOST",
    "TTSDOCK_ENGINE_CMD_PORT", "TTSDOCK_ENGINE_NAME", "TTSDOCK_LOG_LEVEL",
    "TTSDOCK_MAX_CONCURRENT", "TTSDOCK_OUT_DIR", "TTSDOCK_UDP_LOG",
)  # fmt: skip


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)


def kokoro_parser() -> argparse.ArgumentParser:
    return kokoro_cli.build_parser()


def qwen3_parser() -> argparse.ArgumentParser:
    return qwen3_cli.build_parser()


BAD_ENV = [
    (kokoro_parser, "KOKORO_SPEED", "3"),
    (kokoro_parser, "KOKORO_SPEED", "fast"),
    (kokoro_parser, "KOKORO_SPEED", "nan"),
    (kokoro_parser, "KOKORO_LANG", "fr"),
    (kokoro_parser, "KOKORO_THREADS", "abc"),
    (kokoro_parser, "KOKORO_THREADS", "0"),
    (kokoro_parser, "KOKORO_G2P", "magic"),
    (kokoro_parser, "KOKORO_VOICE", "   "),
    (kokoro_parser, "TTSDOCK_DOCK_PORT", "x"),
    (qwen3_parser, "TTSDOCK_ENGINE_CMD_PORT", "70000"),
    (qwen3_parser, "TTSDOCK_MAX_CONCURRENT", "0"),
    (qwen3_parser, "TTSDOCK_LOG_LEVEL", "LOUD"),
    (qwen3_parser, "TTSDOCK_UDP_LOG", "127.0.0.1:99999"),
    (qwen3_parser, "TTSDOCK_ENGINE_NAME", "bad name!"),
]


@pytest.mark.parametrize(("make", "name", "value"), BAD_ENV)
def test_bad_environment_value_is_a_usage_error_naming_it(
    make: Callable[[], argparse.ArgumentParser],
    name: str,
    value: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as info:
        make().parse_args([])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert name in err and "Traceback" not in err, err


def test_good_environment_values_are_converted(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in [("KOKORO_SPEED", "1.5"), ("KOKORO_LANG", "de"), ("KOKORO_THREADS", "3"),
                        ("KOKORO_G2P", "espeak"), ("KOKORO_VOICE", "af_heart"),
                        ("TTSDOCK_MAX_CONCURRENT", "2")]:  # fmt: skip
        monkeypatch.setenv(name, value)
    a = kokoro_parser().parse_args([])
    assert (a.speed, a.lang, a.threads, a.g2p, a.voice) == (1.5, "de", 3, "espeak", "af_heart")
    assert a.max_concurrent == 2
    b = kokoro_parser().parse_args(["--speed", "0.5", "--lang", "en", "--threads", "1"])
    assert (b.speed, b.lang, b.threads) == (0.5, "en", 1)  # the flag wins
    c = kokoro_parser().parse_args([])
    assert isinstance(c.speed, float) and isinstance(c.threads, int)


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--speed", "3"], "outside 0.5..2"),
        (["--lang", "fr"], "invalid choice"),
        (["--threads", "abc"], "not an integer"),
    ],
)
def test_bad_flags_still_usage_errors(
    flags: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as info:
        kokoro_parser().parse_args(flags)
    assert info.value.code == 2 and needle in capsys.readouterr().err


def test_kokoro_process_exits_two_on_a_bad_environment_variable() -> None:
    """The real entry point: exit status 2, one message naming the variable, no traceback."""
    env = dict(os.environ, KOKORO_SPEED="3", PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, "-m", "ttsdock", "kokoro", "--cmd-port", "0"],
        capture_output=True,
        timeout=120,
        env=env,
        cwd=str(ROOT),
    )
    err = res.stderr.decode(errors="replace")
    assert res.returncode == 2, err[-2000:]
    assert "KOKORO_SPEED" in err and "Traceback" not in err


def test_run_engine_refuses_an_unclamped_speed(capsys: pytest.CaptureFixture[str]) -> None:
    args = common_parser("tone").parse_args([])
    args.speed = 3.0
    assert run_engine(object(), args) == 2  # type: ignore[arg-type]
    assert "speed 3.0 outside 0.5..2.0" in capsys.readouterr().err


def test_udp_log_from_the_environment_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TTSDOCK_UDP_LOG", "[::1]:9000")
    assert common_parser("tone").parse_args([]).udp_log == ("::1", 9000)


# ----------------------------------------------------------------------------- help


def helps(p: argparse.ArgumentParser) -> list[tuple[argparse.Action, str]]:
    fmt = p._get_formatter()
    return [(a, fmt._expand_help(a)) for a in p._actions if a.help and a.dest != "help"]


PARSERS: list[tuple[str, Callable[[], argparse.ArgumentParser]]] = [
    ("kokoro", kokoro_parser),
    ("qwen3", qwen3_parser),
    ("qwen3-synth", qwen3_synth_cli.build_parser),
]


@pytest.mark.parametrize(("name", "make"), PARSERS)
def test_help_states_each_default_once(
    name: str, make: Callable[[], argparse.ArgumentParser]
) -> None:
    items = helps(make())
    assert len(items) > 15
    for action, text in items:
        flag = action.option_strings[0] if action.option_strings else action.dest
        n = text.lower().count("default")
        has_value = action.default not in (None, False, [], argparse.SUPPRESS)
        if has_value:
            assert n == 1, (flag, text)
        else:
            assert n <= 1, (flag, text)
        assert "(default: None)" not in text, (flag, text)
        if has_value and f"(default: {action.default})" in text:
            continue  # the formatter's own suffix: true by construction
        if has_value:  # stated by hand: must name the real value
            assert str(action.default) in text or flag in ("--udp-log",), (flag, text)


@pytest.mark.parametrize(("name", "make"), PARSERS)
def test_every_option_has_help(name: str, make: Callable[[], argparse.ArgumentParser]) -> None:
    p = make()
    missing = [a.option_strings for a in p._actions if a.option_strings and not a.help]
    assert missing == []


def test_help_texts_name_the_real_defaults() -> None:
    k = dict((a.dest, t) for a, t in helps(kokoro_parser()))
    assert f"(default: {DEFAULT_VOICE}" in k["voice"]
    assert "(default: 1.0)" in k["speed"] and "(default: auto)" in k["lang"]
    q = dict((a.dest, t) for a, t in helps(qwen3_parser()))
    assert q["mode"].count("customvoice") == 1 and "(default: customvoice)" in q["mode"]
    assert "(default: cpu)" in q["device"] and "(default: float32)" in q["dtype"]
    s = dict((a.dest, t) for a, t in helps(qwen3_synth_cli.build_parser()))
    assert "(default: float32)" in s["dtype"] and "(default: auto)" in s["language"]


def test_qwen3_synth_help_exits_zero(capsys: pytest.CaptureFixture[str]) -> None:
    assert qwen3_synth_cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "(default: customvoice) (default: customvoice)" not in out
    assert "--device" in out and "where the model runs" in out


def test_kokoro_lets_several_utterances_per_core_be_in_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kokoro's windows are decoded just in time, so an utterance is in progress for most
    of its playback: its ``--max-concurrent`` default is per core, not the runtime's 4
    (the environment and the flag still win)."""
    from engines.runtime.cpus import available_cpus

    monkeypatch.delenv("TTSDOCK_MAX_CONCURRENT", raising=False)
    default = kokoro_parser().parse_args([]).max_concurrent
    assert default == kokoro_cli.KOKORO_MAX_CONCURRENT_PER_CPU * available_cpus() >= 8
    assert kokoro_parser().parse_args(["--max-concurrent", "3"]).max_concurrent == 3
    monkeypatch.setenv("TTSDOCK_MAX_CONCURRENT", "5")
    assert kokoro_parser().parse_args([]).max_concurrent == 5
