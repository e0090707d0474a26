"""Engine cmd port: offline syntheses run one at a time, apart from the live calls'
``--max-concurrent``; a request waits a bounded time for its turn; BENCHMARK is capped."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from runtime_helpers import ToneSynth, cmd, free_port, running_engine

from engines.runtime.cmdport import BENCH_MAX, CMD_SYNTH_CONCURRENT

D6 = r"\d+\.\d{6}"


async def wait_for(cond, within: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    async with asyncio.timeout(within):
        while not cond():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


def test_one_slot() -> None:
    assert CMD_SYNTH_CONCURRENT == 1


async def test_concurrent_cmd_syntheses_run_one_at_a_time(tmp_path: Path) -> None:
    synth = ToneSynth(phrase_ms=50, delay=0.05)
    async with running_engine(synth, free_port(), out_dir=tmp_path, max_concurrent=4) as eng:
        port = eng.cmd_port
        replies = await asyncio.gather(
            cmd(port, "TEST_SYNTH:a b c"),
            cmd(port, "BENCHMARK:a b|3"),
            cmd(port, "SYNTH_WAV:x.wav|a b c"),
            cmd(port, "TEST_SYNTH:d e"),
        )
    assert replies[0].startswith("SYNTH_RESULT:"), replies
    assert re.fullmatch(rf"BENCH_RESULT:\d+ms:\d+ms:\d+ms:3/3:2400@24000:rtf={D6}", replies[1])
    assert replies[2].startswith("WAV_RESULT:"), replies
    assert replies[3].startswith("SYNTH_RESULT:"), replies
    assert len(synth.calls) == 6  # every synthesis ran ...
    assert synth.max_active == 1  # ... but never two at once (--max-concurrent is 4)


async def test_waiting_is_bounded_then_synthesis_failed(tmp_path: Path) -> None:
    synth = ToneSynth(phrase_ms=50, delay=0.3)
    async with running_engine(synth, free_port(), out_dir=tmp_path) as eng:
        eng.commands.synth_wait = 0.05
        first = asyncio.create_task(cmd(eng.cmd_port, "TEST_SYNTH:a b c d"))
        await wait_for(lambda: synth.active == 1)
        assert await cmd(eng.cmd_port, "TEST_SYNTH:late") == "ERROR:synthesis failed"
        bench = await cmd(eng.cmd_port, "BENCHMARK:late|2")
        assert bench == "ERROR:all iterations failed"  # every iteration found the slot taken
        assert (await first).startswith("SYNTH_RESULT:")
        eng.commands.synth_wait = 30.0
        assert (await cmd(eng.cmd_port, "TEST_SYNTH:after")).startswith("SYNTH_RESULT:")
    assert [c.text for c in synth.calls] == ["a b c d", "after"]
    assert synth.max_active == 1


async def test_slot_held_until_an_abandoned_synthesis_ends(tmp_path: Path) -> None:
    """A request whose handler is cancelled (client gone, shutdown) leaves its thread
    computing: the next one must still wait for that thread."""
    synth = ToneSynth(phrase_ms=50, delay=0.1)
    async with running_engine(synth, free_port(), out_dir=tmp_path) as eng:
        abandoned = asyncio.create_task(eng.commands(b"TEST_SYNTH:a b c d e\n"))
        await wait_for(lambda: synth.active == 1)
        abandoned.cancel()
        reply = await cmd(eng.cmd_port, "TEST_SYNTH:next")
        assert reply.startswith("SYNTH_RESULT:"), reply
    assert synth.max_active == 1
    assert [c.text for c in synth.calls] == ["a b c d e", "next"]


async def test_benchmark_count_is_capped(tmp_path: Path) -> None:
    synth = ToneSynth(phrase_ms=10)
    async with running_engine(synth, free_port(), out_dir=tmp_path) as eng:
        big = await cmd(eng.cmd_port, "BENCHMARK:hi|100000")
        assert f":{BENCH_MAX}/{BENCH_MAX}:" in big, big
        assert len(synth.calls) == BENCH_MAX
        zero = await cmd(eng.cmd_port, "BENCHMARK:hi|0")
        assert ":1/1:" in zero, zero
    assert BENCH_MAX == 100
