"""Continuous batching of the Qwen3 engine: batch files, seeded rows, concurrent calls.

* ``batch_file``: the JSONL request parser (examples and properties);
* seeded sampling: a seeded request gives the same codes alone and in a batch of
  requests with other sampling setups;
* admission: beyond ``max_batch`` utterances wait and the most urgent goes first;
* ``ttsdock qwen3-synth --batch``: codes per request, bad lines cost only themselves;
* the synthesiser serves concurrent calls from one engine (``self_scheduled``).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import qwen3_helpers as qh
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.qwen3.cli.batch_file import MAX_LINE_BYTES, BatchLine, BatchLineError, parse_batch
from engines.qwen3.modes import PresetSpeaker
from engines.qwen3.serving.frame_generator import BatchOptions, FrameGenerator
from engines.qwen3.serving.request import ModeSynthesizeRequest
from engines.runtime.synth import SynthesisCancelled

# -- batch files ---------------------------------------------------------------------------


def test_batch_file_lines() -> None:
    text = "\n".join(
        [
            '{"name": "a", "text": "Hello.", "language": "english", "non_streaming": true,'
            ' "max_frames": 9}',
            "# a comment",
            "",
            '{"name": "b", "text": "Hi", "speaker": "eric", "instruct": "calm"}',
            "not json",
            '{"name": "../x", "text": "Hi"}',
            '{"name": "c", "text": ""}',
            '{"name": "d", "text": "x", "max_frames": true}',
            '{"name": "a", "text": "again"}',
            '{"name": "e", "text": "x", "volume": 3}',
            "[1, 2]",
        ]
    )
    got = parse_batch(text)
    assert got[0] == BatchLine(1, "a", "Hello.", "english", None, None, True, 9)
    assert got[1] == BatchLine(4, "b", "Hi", None, "eric", "calm", None, None)
    errors = [g for g in got if isinstance(g, BatchLineError)]
    assert [e.lineno for e in errors] == [5, 6, 7, 8, 9, 10, 11]
    assert "not JSON" in errors[0].message
    assert "'name'" in errors[1].message
    assert "request 'c'" in errors[2].message and "text" in errors[2].message
    assert "max_frames" in errors[3].message
    assert "duplicate" in errors[4].message
    assert "volume" in errors[5].message
    assert "object" in errors[6].message


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_batch_parser_never_raises(text: str) -> None:
    for item in parse_batch(text):
        assert isinstance(item, BatchLine | BatchLineError)
        if isinstance(item, BatchLineError):
            assert item.message.startswith(f"line {item.lineno}")


@settings(max_examples=100, deadline=None)
@given(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True),
    st.text(min_size=1, max_size=50).filter(str.strip),
    st.booleans(),
    st.integers(1, 5000),
)
def test_batch_line_round_trip(name: str, text: str, ns: bool, mf: int) -> None:
    line = json.dumps({"name": name, "text": text, "non_streaming": ns, "max_frames": mf})
    (got,) = parse_batch(line)
    assert got == BatchLine(1, name, text, None, None, None, ns, mf)
    assert isinstance(parse_batch("x" * (MAX_LINE_BYTES + 1))[0], BatchLineError)


# -- the engine ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eng(tmp_path_factory: pytest.TempPathFactory) -> FrameGenerator:
    e = qh.build_tiny_engine(tmp_path_factory.mktemp("batch"), hidden=64, cp_hidden=32)[0]
    e.batching = BatchOptions(max_batch=8, max_context=128)  # before the first request
    return e


def _req(**kw: Any) -> ModeSynthesizeRequest:
    base: dict[str, Any] = dict(text="Hello world, a test.", speaker=PresetSpeaker.Ryan)
    base.update(kw)
    base.setdefault("max_frames", 10)
    return ModeSynthesizeRequest(**base)


def test_seeded_rows_give_the_same_codes_alone_and_batched(eng: FrameGenerator) -> None:
    reqs = [
        ("s1", _req(seed=1)),
        ("s2", _req(seed=2, text="Another sentence here.", top_k=7, subtalker_top_k=100)),
        ("g", _req(greedy=True, max_frames=6)),
        ("s3", _req(seed=3, top_p=0.8, temperature=0.7, non_streaming=True)),
        ("s4", _req(seed=4, speaker=PresetSpeaker.Eric, language="auto", top_k=0)),
    ]
    alone = {name: eng.generate_codes(r)[0] for name, r in reqs}
    batched = eng.generate_batch(reqs)
    for res in batched:
        assert res.error is None and res.codes is not None
        np.testing.assert_array_equal(res.codes, alone[res.name], err_msg=res.name)
    assert not np.array_equal(alone["s1"], eng.generate_codes(_req(seed=9))[0])


def test_beyond_max_batch_the_most_urgent_waits_least(eng: FrameGenerator) -> None:
    e = FrameGenerator(eng.model, eng.tokenizer, eng.mode, batching=BatchOptions(max_batch=1))
    hold = threading.Event()
    first = e.submit(_req(greedy=True, max_frames=90), name="first", cancel=hold.is_set)
    next(first)  # "first" holds the only row until ``hold`` is set
    relaxed = e.submit(_req(greedy=True, max_frames=2), name="relaxed", urgency=lambda: 5.0)
    urgent = e.submit(_req(greedy=True, max_frames=2), name="urgent", urgency=lambda: -0.2)
    hold.set()  # barge-in on "first": its row frees, the waiting ones are admitted
    with pytest.raises(SynthesisCancelled):
        list(first)
    order: list[str] = []

    def drain(name: str, stream: Any) -> None:
        list(stream)
        order.append(name)

    threads = [
        threading.Thread(target=drain, args=(n, s))
        for n, s in (("relaxed", relaxed), ("urgent", urgent))
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(order) == ["relaxed", "urgent"]
    # "relaxed" was queued first, so only urgency can admit "urgent" before it
    assert urgent.timings["queue"] < relaxed.timings["queue"]
    st = e.batch_stats()
    assert st["queued"] == 2 and st["batch_size_max"] == 1 and st["queue_wait_ms_max"] > 0
    assert st["cancelled"] == 1
    e.close()


def test_batch_over_max_batch_reports_the_excess(eng: FrameGenerator) -> None:
    e = FrameGenerator(eng.model, eng.tokenizer, eng.mode, batching=BatchOptions(max_batch=2))
    res = e.generate_batch([(n, _req(greedy=True, max_frames=3)) for n in ("a", "b", "c")])
    assert [r.error is None for r in res] == [True, True, False]
    assert res[2].error is not None and "c" in res[2].error and "max_batch=2" in res[2].error
    e.close()


# -- ttsdock qwen3-synth --batch -----------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("qwen3batchcli")
    hf = qh.write_checkpoint(d / "hf", qh.tiny_config("custom_voice"))
    out = d / "models"
    qh.convert_checkpoint(hf, out, dtype="f32")
    return out


def test_synth_cli_batch_writes_codes_equal_to_single_runs(
    tiny_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from engines.qwen3.cli import synth as synth_cli

    lines = [
        {"name": "one", "text": "Hello world.", "speaker": "ryan", "max_frames": 8},
        {"name": "two", "text": "Good day to you.", "non_streaming": True, "max_frames": 5},
        {"name": "three", "text": "Hi.", "speaker": "eric", "language": "auto"},
        {"name": "bad-speaker", "text": "x", "speaker": "nobody"},
        {"name": "bad-lang", "text": "x", "language": "klingon"},
    ]
    jsonl = tmp_path / "reqs.jsonl"
    jsonl.write_text("\n".join([*map(json.dumps, lines), "{broken"]) + "\n")
    base = ["--model-dir", str(tiny_dir), "--mode", "customvoice", "--greedy"]
    out_dir = tmp_path / "codes"
    rc = synth_cli.main(
        [*base, "--max-frames", "9", "--batch", str(jsonl), "--codes-dir", str(out_dir)]
    )
    cap = capsys.readouterr()
    assert rc == 2  # some requests failed ...
    assert sorted(p.name for p in out_dir.iterdir()) == ["one.npy", "three.npy", "two.npy"]
    err = cap.err.strip().splitlines()
    assert len(err) == 3
    assert any("line 6" in e and "JSON" in e for e in err)
    assert any("'bad-speaker'" in e and "nobody" in e for e in err)
    assert any("'bad-lang'" in e and "klingon" in e for e in err)
    assert "batch: 3 requests" in cap.out
    for line in lines[:3]:  # ... and the others equal single runs
        single = tmp_path / f"{line['name']}-single.npy"
        args = [*base, "--text", str(line["text"]), "--codes-out", str(single)]
        args += ["--max-frames", str(line.get("max_frames", 9))]
        if "speaker" in line:
            args += ["--speaker", str(line["speaker"])]
        if "language" in line:
            args += ["--language", str(line["language"])]
        if line.get("non_streaming"):
            args.append("--non-streaming")
        assert synth_cli.main(args) == 0
        np.testing.assert_array_equal(np.load(out_dir / f"{line['name']}.npy"), np.load(single))
    capsys.readouterr()


def test_synth_cli_batch_flag_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engines.qwen3.cli import synth as synth_cli

    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text('{"name": "a", "text": "x"}\n')
    assert synth_cli.main(["--model-dir", str(tmp_path), "--batch", str(jsonl)]) == 2
    assert "--codes-dir" in capsys.readouterr().err
    rc = synth_cli.main(["--model-dir", str(tmp_path), "--text", "x", "--codes-dir", "d"])
    assert rc == 2 and "--batch" in capsys.readouterr().err


# -- the synthesiser: concurrent calls share the batch --------------------------------------


def test_concurrent_calls_share_the_batch_and_bargein_frees_one_row(tiny_dir: Path) -> None:
    pytest.importorskip("onnxruntime")
    from qwen3_vocoder_fixture import export_tiny_vocoder

    from engines.qwen3.serving.synthesizer import Qwen3Options, Qwen3Synthesizer
    from engines.qwen3.serving.vocoder import SAMPLES_PER_FRAME
    from engines.qwen3.weights.paths import VOCODER_FILE
    from engines.runtime.synth import CallState, CancelToken

    export_tiny_vocoder(tiny_dir / VOCODER_FILE)
    s = Qwen3Synthesizer(Qwen3Options(model_dir=tiny_dir, greedy=True, max_frames=12, max_batch=4))
    s.load()
    assert s.self_scheduled is True
    samples: dict[int, int] = {}
    outcome: dict[int, str] = {}
    barge = CancelToken()
    started = threading.Barrier(3)

    def call(cid: int, token: CancelToken) -> None:
        n = 0
        started.wait()
        try:
            for i, chunk in enumerate(s.synthesize("Hello there, caller.", CallState(cid), token)):
                n += chunk.shape[0]
                if cid == 3 and i == 1:
                    token.cancel()  # barge-in on call 3 after its second chunk
            outcome[cid] = "done"
        except SynthesisCancelled:
            outcome[cid] = "cancelled"
        samples[cid] = n

    threads = [
        threading.Thread(target=call, args=(cid, barge if cid == 3 else CancelToken()))
        for cid in (1, 2, 3)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert outcome == {1: "done", 2: "done", 3: "cancelled"}
    assert samples[1] == samples[2] and samples[1] % SAMPLES_PER_FRAME == 0
    assert samples[3] < samples[1]
    st = s.stats()
    assert st["batch_batch_size_max"] >= 2 and st["batch_active"] == 0
    # TTFA, underruns and per-call figures are the runtime's (its STATS), not the engine's
    gone = ("ttfa_ms_p50", "ttfa_ms_p95", "total_underruns", "call.1.utterances")
    assert not [k for k in st if k in gone or k.startswith("call.")]
    assert st["total_utterances"] == 3 and st["last_queue_ms"] >= 0
    assert st["vocoder_windows"] >= st["vocoder_runs"] > 0
    s.close()


def test_engine_cli_does_not_serialise_qwen3_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    from engines.qwen3.cli import dock as cli

    monkeypatch.delenv("TTSDOCK_MAX_CONCURRENT", raising=False)
    args = cli.build_parser().parse_args(["--model-dir", "m", "--max-batch", "8"])
    assert args.max_concurrent == cli.QWEN3_MAX_CONCURRENT and args.max_batch == 8
    opts = cli.options_from_args(args)
    assert opts.max_batch == 8 and opts.max_context is None
    args = cli.build_parser().parse_args(["--model-dir", "m", "--max-concurrent", "3"])
    assert args.max_concurrent == 3


def test_vocoder_batcher_decodes_concurrent_windows_in_one_run(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    from qwen3_vocoder_fixture import export_tiny_vocoder

    from engines.qwen3.serving.vocoder import Vocoder
    from engines.qwen3.serving.vocoder_batch import VocoderBatcher

    voc = Vocoder(export_tiny_vocoder(tmp_path / "v.onnx"))
    rng = np.random.default_rng(0)
    windows = [rng.integers(0, 2048, size=(29, 16), dtype=np.int64) for _ in range(4)]
    want = [voc.decode(w) for w in windows]
    batcher = VocoderBatcher(voc, active=lambda: 4, gather_s=5.0)  # waits for all four
    got: dict[int, np.ndarray] = {}

    def run(i: int) -> None:
        got[i] = batcher.run(windows[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert batcher.runs == 1 and batcher.windows == 4
    for i in range(4):
        np.testing.assert_allclose(got[i], want[i], atol=1e-5)
    alone = VocoderBatcher(voc, gather_s=5.0)  # one active utterance: no waiting at all
    np.testing.assert_allclose(alone.run(windows[0]), want[0], atol=1e-5)
    odd = rng.integers(0, 2048, size=(7, 16), dtype=np.int64)  # other lengths: own run
    np.testing.assert_allclose(alone.run(odd), voc.decode(odd), atol=1e-5)
