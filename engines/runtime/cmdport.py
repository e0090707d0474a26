"""Engine cmd port commands (docs/wire.md#engine-cmd-port): one line in, one line out.

Rule 1: the command table and every reply format live here, byte-exact with
the reference (numbers like C++ ``std::to_string``, ms as integers); the
extensions VOICES, SET_VOICE, GET_VOICE and STATS follow the same style, and
METRICS answers Prometheus text (multi-line, like the dock's).
Rule 2: this file does not own sockets (``svc.net.start_cmd_server`` does)
and never blocks the loop: syntheses and file writes run in threads.
Rule 3: the offline syntheses (TEST_SYNTH, BENCHMARK, SYNTH_WAV) run one at a
time (``CMD_SYNTH_CONCURRENT``), apart from ``--max-concurrent``, which belongs
to the live calls: a cmd-port user can never run more than one extra synthesis
beside them. A request finding that capacity taken waits for it in arrival order
(each BENCHMARK iteration takes it anew, so a TEST_SYNTH is not stuck behind a
whole BENCHMARK) for at most ``CMD_SYNTH_WAIT`` seconds, then answers
``ERROR:synthesis failed`` (a BENCHMARK counts that iteration as failed) and
logs ``cmd_synthesis_busy``. The capacity is given back when the synthesis
thread ends, not when its request is abandoned. Each offline synthesis gets the
runtime's playback clock like a call's (a listener that plays its audio as it is
produced).
Rule 4: the calls are read through ``CallManager.snapshot`` / ``synthesis`` (a call's
voice is set through ``CallManager.set_call_voice``, for every engine), and an
optional engine command is answered only by an engine that declares it (the
``synth`` Protocols, checked once here). BENCHMARK runs 1..``BENCH_MAX``
iterations (a larger count is capped, 0 becomes 1).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
import wave
from collections.abc import Awaitable, Callable
from pathlib import Path, PurePosixPath
from typing import Protocol

import numpy as np
import structlog

from engines.runtime.audio import FloatArray, as_mono_f32, normalize_whole, to_pcm16
from engines.runtime.calls import CallManager, EngineSettings
from engines.runtime.load import LoadSnapshot
from engines.runtime.metrics import MetricSource, engine_families
from engines.runtime.playback import play_as_produced
from engines.runtime.stats import RuntimeStats, fmt_ms, render_latency
from engines.runtime.synth import (
    SAMPLE_RATE,
    SPEED_MAX,
    SPEED_MIN,
    CallState,
    CancelToken,
    ExecutionPlan,
    LexiconControl,
    PlanInfo,
    SpokenForm,
    Synthesizer,
    VoiceStore,
)
from engines.runtime.threads import in_thread
from engines.text import LexiconReload
from protocol.cmd import Command, cpp_double, parse_command
from svc.logs import set_level
from svc.metrics import render

log = structlog.get_logger(__name__)

BENCH_DEFAULT = 5  # docs/wire.md#engine-cmd-port: BENCHMARK iterations when none given
BENCH_MAX = 100
CMD_SYNTH_CONCURRENT = 1  # offline syntheses running at once (Rule 3)
CMD_SYNTH_WAIT = 60.0  # seconds a request waits for that capacity before failing
STATS_MAX_CALLS = 64  # calls listed one by one in STATS

ERR_UNKNOWN = "ERROR:Unknown command"
ERR_SPEED = "ERROR:Invalid speed value"
ERR_SYNTH = "ERROR:synthesis failed"
ERR_ALL_FAILED = "ERROR:all iterations failed"
ERR_WAV_FORMAT = "ERROR:format SYNTH_WAV:<path>|<text>"
ERR_WAV_EMPTY = "ERROR:empty path or text"
ERR_WAV_PATH = "ERROR:invalid path (no traversal or absolute paths)"
ERR_WAV_WRITE = "ERROR:write failed (disk full?)"
ERR_NO_TEXT_FRONT_END = "ERROR:0:this engine has no text front end"
ERR_NORMALIZE_EMPTY = "ERROR:format NORMALIZE:<text>"
RELOAD_PROBLEMS_MAX = 50  # bad lines listed in one RELOAD_LEXICON reply (all are logged)


class DockState(Protocol):
    @property
    def docked(self) -> bool: ...


def speed_text(x: float) -> str:
    return f"{x:.2f}"


def ms_int(seconds: float) -> int:
    """Whole milliseconds, truncated like ``std::chrono::duration_cast<milliseconds>``."""
    return int(seconds * 1000.0)


def safe_relative(path: str) -> PurePosixPath | None:
    """A relative path without ``..``, ``~``, NUL, backslash or drive; ``None`` if unsafe."""
    if not path or "\0" in path or "\\" in path or path.startswith(("/", "~")):
        return None
    p = PurePosixPath(path)
    if p.is_absolute() or any(part in ("..", "") for part in p.parts) or ":" in p.parts[0]:
        return None
    return p


class CommandHandler:
    """Answers one command line; ``__call__`` is the ``svc.net`` handler."""

    def __init__(
        self,
        synth: Synthesizer,
        settings: EngineSettings,
        calls: CallManager,
        dock: DockState,
        stats: RuntimeStats,
        out_dir: Path,
    ) -> None:
        self.synth = synth
        self.settings = settings
        self.calls = calls
        self.dock = dock
        self.stats = stats
        self.out_dir = out_dir
        self.synth_wait = CMD_SYNTH_WAIT
        self._offline = asyncio.Semaphore(CMD_SYNTH_CONCURRENT)  # offline synthesis capacity
        # optional commands: what the engine declares, checked once
        self._voice_store = synth if isinstance(synth, VoiceStore) else None
        self._spoken_form = synth if isinstance(synth, SpokenForm) else None
        self._table: dict[str, Callable[[Command], Awaitable[str]]] = {
            "TEST_SYNTH": self.test_synth,
            "BENCHMARK": self.benchmark,
            "SYNTH_WAV": self.synth_wav,
            "SET_SPEED": self.set_speed,
            "GET_SPEED": self.get_speed,
            "SET_LOG_LEVEL": self.set_log_level,
            "PING": self.ping,
            "STATUS": self.status,
            "VOICES": self.voices,
            "SET_VOICE": self.set_voice,
            "GET_VOICE": self.get_voice,
            "STATS": self.stats_line,
            "NORMALIZE": self.normalize,
            "RELOAD_LEXICON": self.reload_lexicon,
            "METRICS": self.metrics,
            "SET_CALL_VOICE": self.set_call_voice,
            "RELOAD_VOICES": self.reload_voices,
        }
        #: more METRICS families (the protocol servers register theirs)
        self.metric_sources: list[MetricSource] = []

    async def __call__(self, data: bytes) -> str:
        cmd = parse_command(data)
        fn = self._table.get(cmd.name)
        if fn is None:
            log.debug("command_unknown", command=cmd.raw[:64])
            return ERR_UNKNOWN
        try:
            return await fn(cmd)
        except Exception:
            log.exception("command_failed", command=cmd.name)
            return ERR_SYNTH if "SYNTH" in cmd.name or cmd.name == "BENCHMARK" else ERR_UNKNOWN

    # -- offline synthesis -----------------------------------------------------------------

    def _synth_blocking(self, text: str) -> tuple[FloatArray, float]:
        state = CallState(0, voice=self.settings.voice, speed=self.settings.speed)
        token = CancelToken()
        t0 = time.perf_counter()
        chunks = play_as_produced(state, lambda: self.synth.synthesize(text, state, token))
        parts = [as_mono_f32(c) for c in chunks]
        elapsed = time.perf_counter() - t0
        raw = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        return normalize_whole(raw), elapsed

    async def _synth(self, text: str) -> tuple[FloatArray, float] | None:
        if not text.strip():
            return None
        try:
            async with asyncio.timeout(self.synth_wait):
                await self._offline.acquire()
        except TimeoutError:
            log.warning("cmd_synthesis_busy", waited_s=self.synth_wait)
            return None
        loop = asyncio.get_running_loop()
        started = False

        def run() -> tuple[FloatArray, float]:
            nonlocal started
            started = True
            try:
                return self._synth_blocking(text)
            finally:  # in the thread: the capacity stays taken while it computes
                with contextlib.suppress(RuntimeError):  # loop closed at exit
                    loop.call_soon_threadsafe(self._offline.release)

        try:
            samples, elapsed = await in_thread(run)
        except Exception as exc:
            if not started:  # the thread never ran: nothing else gives the capacity back
                self._offline.release()
            log.error("synthesis_failed", source="cmd", error=f"{type(exc).__name__}: {exc}")
            return None
        if samples.size == 0:
            log.error("synthesis_failed", source="cmd", error="no audio produced")
            return None
        return samples, elapsed

    @staticmethod
    def _timing(samples: FloatArray, elapsed: float) -> tuple[str, float]:
        dur = samples.size / SAMPLE_RATE
        rtf = elapsed / dur if dur > 0 else 0.0
        return (
            f"{ms_int(elapsed)}ms:{samples.size}:{SAMPLE_RATE}:{cpp_double(dur)}s:"
            f"rtf={cpp_double(rtf)}",
            rtf,
        )

    async def test_synth(self, cmd: Command) -> str:
        res = await self._synth(cmd.arg or "")
        if res is None:
            return ERR_SYNTH
        samples, elapsed = res
        timing, _ = self._timing(samples, elapsed)
        peak = float(np.max(np.abs(samples)))
        rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64))))
        return f"SYNTH_RESULT:{timing}:peak={cpp_double(peak)}:rms={cpp_double(rms)}"

    async def benchmark(self, cmd: Command) -> str:
        text, n = (cmd.arg or ""), BENCH_DEFAULT
        head, bar, tail = text.rpartition("|")
        if bar and tail.strip().isdigit():
            text, n = head, max(1, min(BENCH_MAX, int(tail.strip())))
        times: list[float] = []
        rtfs: list[float] = []
        samples = 0
        for _ in range(n):
            res = await self._synth(text)
            if res is None:
                continue
            audio, elapsed = res
            times.append(elapsed * 1000.0)
            rtfs.append(self._timing(audio, elapsed)[1])
            samples = audio.size
        if not times:
            return ERR_ALL_FAILED
        s = sorted(times)
        avg = sum(times) / len(times)
        p50 = s[min(len(s) - 1, len(s) // 2)]
        p95 = s[min(len(s) - 1, int(len(s) * 0.95))]
        return (
            f"BENCH_RESULT:{int(avg)}ms:{int(p50)}ms:{int(p95)}ms:{len(times)}/{n}:"
            f"{samples}@{SAMPLE_RATE}:rtf={cpp_double(sum(rtfs) / len(rtfs))}"
        )

    async def synth_wav(self, cmd: Command) -> str:
        if cmd.arg is None or "|" not in cmd.arg:
            return ERR_WAV_FORMAT
        path, _, text = cmd.arg.partition("|")
        path = path.strip()
        if not path or not text.strip():
            return ERR_WAV_EMPTY
        rel = safe_relative(path)
        if rel is None:
            return ERR_WAV_PATH
        base = self.out_dir.resolve()
        target = base / rel
        try:
            inside = target.resolve().is_relative_to(base)
        except (OSError, RuntimeError):
            inside = False
        if not inside:  # e.g. a symlink inside the output dir pointing out of it
            return ERR_WAV_PATH
        res = await self._synth(text)
        if res is None:
            return ERR_SYNTH
        samples, elapsed = res
        try:
            await in_thread(write_wav, target, samples)
        except OSError as exc:
            log.error("wav_write_failed", path=str(target), error=str(exc))
            return ERR_WAV_WRITE
        timing, _ = self._timing(samples, elapsed)
        log.info("wav_written", path=str(target), samples=samples.size)
        return f"WAV_RESULT:{timing}:path={path}"

    # -- settings --------------------------------------------------------------------------

    async def set_speed(self, cmd: Command) -> str:
        try:
            x = float((cmd.arg or "").strip())
        except ValueError:
            return ERR_SPEED
        if not math.isfinite(x):
            return ERR_SPEED
        self.settings.speed = min(SPEED_MAX, max(SPEED_MIN, x))
        log.info("speed_set", speed=self.settings.speed)
        return f"SPEED:{speed_text(self.settings.speed)}"

    async def get_speed(self, cmd: Command) -> str:
        return f"SPEED:{speed_text(self.settings.speed)}"

    async def set_log_level(self, cmd: Command) -> str:
        try:
            set_level(cmd.arg or "")
        except ValueError:
            return (
                f"ERROR:Unknown log level {(cmd.arg or '').strip()[:32]} "
                "(ERROR, WARN, INFO, DEBUG, TRACE)"
            )
        return "OK"

    async def ping(self, cmd: Command) -> str:
        return "PONG"

    async def status(self, cmd: Command) -> str:
        try:
            suffix = await in_thread(self.synth.status_suffix)
        except Exception as exc:
            log.warning("status_suffix_failed", error=str(exc))
            suffix = ""
        dock = "connected" if self.dock.docked else "disconnected"
        return (
            f"ACTIVE_CALLS:{self.calls.active_calls()}:DOCK:{dock}:"
            f"SPEED:{speed_text(self.settings.speed)}{suffix}"
        )

    async def voices(self, cmd: Command) -> str:
        names = await in_thread(self.synth.voices)
        return "VOICES:" + ",".join(names)

    async def set_voice(self, cmd: Command) -> str:
        name = (cmd.arg or "").strip()
        names = await in_thread(self.synth.voices)
        if name not in names:
            return f"ERROR:Unknown voice {name[:64]}"
        self.settings.voice = name
        log.info("voice_set", voice=name)
        return f"VOICE:{name}"

    async def set_call_voice(self, cmd: Command) -> str:
        """``SET_CALL_VOICE:<call_id>|<voice>`` (empty voice: back to the engine's), for any
        engine: the runtime keeps the call's voice (``CallManager.set_call_voice``)."""
        cid, bar, name = (cmd.arg or "").partition("|")
        if not bar or not cid.strip().isdigit():
            return "ERROR:format SET_CALL_VOICE:<call_id>|<voice>"
        name = name.strip()
        names = await in_thread(self.synth.voices)
        if name and name not in names:
            return f"ERROR:Unknown voice {name[:64]}"
        self.calls.set_call_voice(int(cid), name or None)
        log.info("call_voice_set", call_id=int(cid), voice=name or None)
        return f"VOICE:{int(cid)}:{name or '-'}"

    async def reload_voices(self, cmd: Command) -> str:
        """``RELOAD_VOICES``: a synthesiser with ``reload_voices()`` rescans its stored voices."""
        store = self._voice_store
        if store is None:
            return ERR_UNKNOWN
        names = await in_thread(store.reload_voices)
        return "VOICES:" + ",".join(names)

    async def get_voice(self, cmd: Command) -> str:
        voice = self.settings.voice
        if voice is None:
            voice = await in_thread(lambda: self.synth.default_voice)
        return f"VOICE:{voice}"

    # -- text front end ----------------------------------------------------------------

    async def normalize(self, cmd: Command) -> str:
        front = self._spoken_form
        if front is None:
            return ERR_NO_TEXT_FRONT_END
        text = cmd.arg or ""
        if not text.strip():
            return ERR_NORMALIZE_EMPTY
        spoken = await in_thread(front.normalize, text)
        return str(spoken).replace("\r", " ").replace("\n", " ")

    async def reload_lexicon(self, cmd: Command) -> str:
        return await reload_lexicon_reply(self.synth)

    async def stats_line(self, cmd: Command) -> str:
        st = self.stats
        calls = self.calls.snapshot(STATS_MAX_CALLS)
        syn = self.calls.synthesis()
        fields = [
            f"calls_active={calls.active}",
            f"calls_started={st.calls_started}",
            f"calls_ended={st.calls_ended}",
            f"calls_evicted_idle={calls.evicted_idle}",
            f"calls_evicted_cap={calls.evicted_cap}",
            f"syntheses_running={syn.running}",
            f"syntheses_waiting={syn.waiting}",
            f"max_concurrent={syn.max_concurrent}",
            f"texts_received={st.texts_received}",
            f"texts_dropped={st.texts_dropped}",
            f"utterances_started={st.utterances_started}",
            f"utterances_completed={st.utterances_completed}",
            f"utterances_cancelled={st.utterances_cancelled}",
            f"utterances_failed={st.utterances_failed}",
            f"utterances_truncated={st.utterances_truncated}",
            f"packets_sent={st.packets_sent}",
            f"packets_suppressed={st.packets_suppressed}",
            f"packets_unsent={st.packets_unsent}",
            f"audio_s_sent={st.samples_sent / SAMPLE_RATE:.3f}",
            f"bargeins={st.bargeins}",
            f"docks={st.docks}",
            f"dock_losses={st.dock_losses}",
            f"hello_rejections={st.hello_rejections}",
            f"frames_malformed={st.frames_malformed}",
            f"pings_answered={st.pings_answered}",
            f"queue_depth={calls.queue_depth}",
            f"underruns={st.underruns}",
            f"underrun_ms={fmt_ms(st.underrun_ms)}",
        ]
        if syn.workers is not None:
            fields += [
                f"synth_workers={syn.workers}",
                f"sched_queued={syn.queued}",
                f"sched_parked={syn.parked}",
                f"sched_busy={syn.busy}",
                f"sched_open={syn.open_jobs}",
                f"sched_recalled={syn.recalled}",
            ]
        else:
            fields.append("synth_workers=self_scheduled")
        fields += render_load(self.calls.load_snapshot(), plan_of(self.synth))
        fields += render_latency("ttfa", st.ttfa)
        fields += render_latency("queue_wait", st.queue_wait)
        fields += render_latency("sched_wait", st.sched_wait)
        fields += render_latency("bargein_mute", st.bargein_mute)
        fields += render_latency("bargein_stop", st.bargein_stop)
        for c in calls.calls:
            fields.append(
                f"call.{c.call_id}={c.phase},queued={c.queued},"
                f"utterances={c.utterances},packets={c.packets},bargeins={c.bargeins},"
                f"ttfa_ms={fmt_ms(c.ttfa_ms)},underruns={c.underruns},"
                f"underrun_ms={fmt_ms(c.underrun_ms)},ahead_ms={fmt_ms(c.ahead_s * 1000)}"
            )
        try:
            extra = await in_thread(self.synth.stats)
        except Exception as exc:
            log.warning("synth_stats_failed", error=str(exc))
            extra = {}
        for k, v in extra.items():
            fields.append(f"synth.{k}={fmt_ms(float(v))}")
        return "STATS:" + ":".join(fields)

    async def metrics(self, cmd: Command) -> str:
        """Prometheus text exposition (multi-line, ends with a newline)."""
        return self.metrics_text()

    def metrics_text(self) -> str:
        """The engine's families plus those of ``metric_sources`` (``engines.runtime.metrics``)."""
        fams = engine_families(self.stats, self.calls, plan_of(self.synth))
        for source in self.metric_sources:
            fams += source()
        return render(fams)


def plan_of(synth: object) -> PlanInfo | None:
    """The engine's execution plan, when it reports one (``ExecutionPlan``)."""
    return synth.plan() if isinstance(synth, ExecutionPlan) else None


def render_load(load: LoadSnapshot, plan: PlanInfo | None) -> list[str]:
    """STATS fields of the load figures (``load.py``) and the execution plan."""
    headroom = "unknown" if load.headroom_calls is None else f"{load.headroom_calls:.1f}"
    fields = [
        f"utilisation={load.utilisation:.3f}",
        f"capacity_audio_s_per_s={load.capacity:.3f}",
        f"demand_audio_s_per_s={load.demand:.3f}",
        f"headroom_calls={headroom}",
    ]
    if plan is not None:
        rtf = ",".join(f"{n}t={r:.3f}" for n, r in sorted(plan.rtf.items()))
        fields += [f"plan={plan.name}", f"plan_source={plan.source}", f"plan_rtf={rtf}"]
    return fields


def reload_reply(res: LexiconReload) -> str:
    """``OK <entries>``, or ``ERROR:<line>:<reason>`` for every bad line ("; " between)."""
    if res.ok and res.loaded:
        return f"OK {res.entries}"
    shown = [str(p) for p in res.problems[:RELOAD_PROBLEMS_MAX]]
    more = len(res.problems) - len(shown)
    tail = f"; ... {more} more" if more > 0 else ""
    return "ERROR:" + "; ".join(shown) + tail


async def reload_lexicon_reply(synth: Synthesizer) -> str:
    """Reload the engine's lexicon off-loop and render the reply (cmd port and SIGHUP)."""
    if not isinstance(synth, LexiconControl):
        return ERR_NO_TEXT_FRONT_END
    res = await in_thread(synth.reload_lexicon)
    if not isinstance(res, LexiconReload):
        return ERR_NO_TEXT_FRONT_END
    for p in res.problems:
        log.warning("lexicon_line_rejected", line=p.line, reason=p.reason)
    return reload_reply(res)


def write_wav(path: Path, samples: FloatArray) -> None:
    """16-bit mono WAV at 24 kHz, written to a temporary name and renamed; a partial
    file is removed on failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.part")
    try:
        with wave.open(str(tmp), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(SAMPLE_RATE)
            w.writeframes(to_pcm16(samples))
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink()
        except OSError:
            pass
        raise
