"""Cost of the text front end per sentence (markup filter + normaliser + lexicon).

Budget: at most 5 ms p95 per sentence on the 2-vCPU box, because the front
end sits in front of the first audio. Runs LLM-style telephony sentences in English
and German (the test tables' inputs plus markdown), each with a fresh cache state
for num2words (first use) and then warm, and prints p50/p95/p99/max per sentence,
plus the cost of the pathological inputs (10,000 digits, nested markdown, 1 MiB line).

    python benchmarks/text_frontend.py [--rounds 20] [--lexicon FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from engines.text import TextFrontEnd, TextOptions  # noqa: E402

EXTRA = [
    "## Your order\n- **Total:** $42.50\n- Delivery: Mon–Fri 😀",
    "Hello Mr. Nguyen, your appointment with Dr. Patel is on Dec. 15 at 3:30 PM; "
    "call 555-0142 or email john.miller@example.com if you need to reschedule.",
    "Guten Tag Hr. Schmidt, Ihr Termin am 3.12.2026 um 14:30 Uhr ist bestätigt; "
    "rufen Sie bei Fragen die 0800 123 4567 an oder schreiben Sie an info@beispiel.de.",
]


def sentences() -> list[str]:
    from test_text_normalize import DE_CASES, EN_CASES

    return [w for w, _ in EN_CASES] + [w for w, _ in DE_CASES] + EXTRA


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--rounds", type=int, default=20, help="passes over all sentences")
    p.add_argument("--lexicon", type=Path, help="a lexicon file to apply (default: none)")
    args = p.parse_args(argv)
    texts = sentences()
    import subprocess

    code = "import time; t=time.perf_counter(); import engines.text; print(time.perf_counter()-t)"
    imp = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    import_ms = float(imp.stdout.strip() or "nan") * 1000
    fe = TextFrontEnd(TextOptions(lexicon=args.lexicon), ipa=True)
    t0 = time.perf_counter()
    for t in texts:  # first use: babel/num2words/phonenumbers lazy loads, caches cold
        fe.speak(t)
    first_pass_ms = (time.perf_counter() - t0) * 1000
    per: list[float] = []
    for _ in range(args.rounds):
        for t in texts:
            t1 = time.perf_counter()
            fe.speak(t)
            per.append((time.perf_counter() - t1) * 1000)
    print(f"loadavg {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print(f"import engines.text (babel, num2words, phonenumbers): {import_ms:.0f} ms")
    print(
        f"sentences {len(texts)} x {args.rounds} rounds; first pass {first_pass_ms:.1f} ms "
        f"for all ({first_pass_ms / len(texts):.2f} ms/sentence, cold)"
    )
    print(
        f"per sentence ms: mean {statistics.fmean(per):.3f}  p50 {pct(per, 0.5):.3f}  "
        f"p95 {pct(per, 0.95):.3f}  p99 {pct(per, 0.99):.3f}  max {max(per):.3f}"
    )
    budget = 5.0
    print(f"p95 budget {budget:.1f} ms: {'OK' if pct(per, 0.95) <= budget else 'OVER'}")
    patho = {
        "10,000 digits": "1" * 10_000,
        "nested markdown 20k": "*" * 10_000 + "x" + "_" * 10_000,
        "nested links 20k": "[" * 10_000 + "x" + "]" * 10_000,
        "1 MiB line": ("Call 555-0142 or pay $42.50 on Dec. 15 **now** 😀 " * 22_000)[: 1 << 20],
    }
    for name, text in patho.items():
        t1 = time.perf_counter()
        out = fe.speak(text).text
        ms = (time.perf_counter() - t1) * 1000
        print(f"{name}: {ms:.1f} ms, {len(text)} -> {len(out)} chars")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
