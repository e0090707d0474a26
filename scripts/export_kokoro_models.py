"""Convert a Kokoro-82M torch checkpoint into the seed-001 model layout.

    python scripts/export_kokoro_models.py --checkpoint kokoro-v1_0.pth --config config.json \
        --voice df_eva.pt --voice dm_bernd.pt --variant german [--models-dir DIR] [--onnx]

Writes ``<models>/kokoro-<variant>/``: ``vocab.json``, ``<voice>_voice.bin`` (raw
float32, rows x 256), and on request

* ``--coreml``: ``coreml/kokoro_duration.mlpackage``, per bucket (3s/5s/10s)
  ``decoder_variants/kokoro_f0n_<b>.mlpackage`` and
  ``decoder_variants/kokoro_decoder_split_<b>.mlpackage``, and
  ``decoder_variants/split_config.json`` (buckets, HAR merge weights);
* ``--onnx``: ``kokoro.onnx``, one graph that the ONNX backend loads.

Needs ``torch`` and the ``kokoro`` package (hexgrad) for the model code, and
``coremltools`` for ``--coreml``; nothing is downloaded: the checkpoint,
config and voices are your files. Only the voice/vocab export and the
argument handling are tested; the CoreML and ONNX conversions are untested
here (no macOS, no kokoro package on the build machines).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BUCKETS = (("3s", 72), ("5s", 120), ("10s", 240))


class ExportError(Exception):
    """A clear, user-facing reason why the export cannot run."""


def _require(module: str, hint: str) -> Any:
    try:
        return __import__(module)
    except ImportError as exc:
        raise ExportError(f"{module} is not installed: {hint}") from exc


def export_voice(voice: Path, out_dir: Path) -> Path:
    """A torch ``.pt`` (510, 1, 256) or numpy voice -> raw float32 ``<name>_voice.bin``."""
    if voice.suffix in (".npy", ".npz", ".bin"):
        from engines.kokoro.models import load_voice_file

        packs = load_voice_file(voice)
    else:
        torch = _require("torch", "pip install torch")
        tensor = torch.load(str(voice), map_location="cpu", weights_only=True)
        packs = {voice.stem: np.asarray(tensor.float().numpy()).reshape(-1, 256)}
    written = out_dir
    for name, pack in packs.items():
        written = out_dir / f"{name}_voice.bin"
        tmp = written.with_suffix(".tmp")
        np.ascontiguousarray(pack, dtype="<f4").tofile(tmp)
        os.replace(tmp, written)
    return written


def export_vocab(config: dict[str, Any], out_dir: Path) -> Path:
    vocab = config.get("vocab")
    if not isinstance(vocab, dict) or not vocab:
        raise ExportError("config has no 'vocab' table")
    path = out_dir / "vocab.json"
    path.write_text(json.dumps({"vocab": vocab}, ensure_ascii=False, indent=1), "utf-8")
    return path


def _load_kmodel(checkpoint: Path, config: Path) -> Any:
    _require("torch", "pip install torch")
    kokoro = _require("kokoro", "pip install kokoro (hexgrad's package; provides KModel)")
    return kokoro.KModel(config=str(config), model=str(checkpoint), disable_complex=True).eval()


def export_onnx(model: Any, out: Path) -> None:  # pragma: no cover - needs kokoro
    torch = _require("torch", "pip install torch")
    Module: Any = torch.nn.Module

    class Wrapper(Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, tokens: Any, style: Any, speed: Any) -> Any:
            audio, _ = self.m.forward_with_tokens(tokens, style, speed)
            return audio

    tokens = torch.zeros((1, 32), dtype=torch.long)
    style = torch.zeros((1, 256))
    speed = torch.ones(1)
    torch.onnx.export(
        Wrapper(model),
        (tokens, style, speed),
        str(out),
        input_names=["tokens", "style", "speed"],
        output_names=["audio"],
        dynamic_axes={"tokens": {1: "sequence_length"}, "audio": {0: "audio_length"}},
        opset_version=20,
    )


def export_coreml(model: Any, out_dir: Path) -> None:  # pragma: no cover - needs kokoro+ct
    torch = _require("torch", "pip install torch")
    ct = _require("coremltools", "pip install 'coremltools>=8'")
    Module: Any = torch.nn.Module

    class Duration(Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, input_ids: Any, attention_mask: Any, ref_s: Any, speed: Any) -> Any:
            m = self.m
            lengths = attention_mask.sum(dim=-1)
            text_mask = attention_mask == 0
            bert = m.bert(input_ids, attention_mask=attention_mask.int())
            d_en = m.bert_encoder(bert).transpose(-1, -2)
            s = ref_s[:, 128:]
            d = m.predictor.text_encoder(d_en, s, lengths, text_mask)
            x, _ = m.predictor.lstm(d)
            duration = torch.sigmoid(m.predictor.duration_proj(x)).sum(dim=-1) / speed
            pred_dur = torch.round(duration).clamp(min=1)
            t_en = m.text_encoder(input_ids, lengths, text_mask)
            return pred_dur, d.transpose(-1, -2), t_en

    class F0N(Module):
        def __init__(self, m: Any) -> None:
            super().__init__()
            self.m = m

        def forward(self, en: Any, s: Any) -> Any:
            return self.m.predictor.F0Ntrain(en, s)

    class Decoder(Module):
        """The decoder with the harmonic source passed in (computed on CPU)."""

        def __init__(self, m: Any) -> None:
            super().__init__()
            self.dec = m.decoder

        def forward(self, asr: Any, F0_pred: Any, N_pred: Any, ref_s: Any, har: Any) -> Any:
            dec = self.dec
            f0 = dec.F0_conv(F0_pred.unsqueeze(1))
            n = dec.N_conv(N_pred.unsqueeze(1))
            x = torch.cat([asr, f0, n], dim=1)
            x = dec.encode(x, ref_s)
            asr_res = dec.asr_res(asr)
            res = True
            for block in dec.decode:
                if res:
                    x = torch.cat([x, asr_res, f0, n], dim=1)
                x = block(x, ref_s)
                if block.upsample_type != "none":
                    res = False
            gen = dec.generator
            for i in range(gen.num_upsamples):
                x = torch.nn.functional.leaky_relu(x, 0.1)
                x_source = gen.noise_res[i](gen.noise_convs[i](har), ref_s)
                x = gen.ups[i](x)
                if i == gen.num_upsamples - 1:
                    x = gen.reflection_pad(x)
                x = x + x_source
                xs = None
                for j in range(gen.num_kernels):
                    r = gen.resblocks[i * gen.num_kernels + j](x, ref_s)
                    xs = r if xs is None else xs + r
                x = xs / gen.num_kernels
            x = torch.nn.functional.leaky_relu(x)
            x = gen.conv_post(x)
            half = gen.post_n_fft // 2 + 1
            spec = torch.exp(x[:, :half, :])
            phase = torch.sin(x[:, half:, :])
            return gen.stft.inverse(spec, phase)

    target = ct.target.macOS13
    (out_dir / "coreml").mkdir(parents=True, exist_ok=True)
    dv = out_dir / "decoder_variants"
    dv.mkdir(parents=True, exist_ok=True)
    ids = torch.zeros((1, 512), dtype=torch.long)
    mask = torch.ones((1, 512), dtype=torch.long)
    ref = torch.zeros((1, 256))
    spd = torch.ones(1)
    traced = torch.jit.trace(Duration(model), (ids, mask, ref, spd))
    ct.convert(
        traced,
        inputs=[
            ct.TensorType(name=n, shape=t.shape)
            for n, t in (
                ("input_ids", ids),
                ("attention_mask", mask),
                ("ref_s", ref),
                ("speed", spd),
            )
        ],
        outputs=[ct.TensorType(name=n) for n in ("pred_dur", "d", "t_en")],
        minimum_deployment_target=target,
    ).save(str(out_dir / "coreml" / "kokoro_duration.mlpackage"))
    for name, frames in BUCKETS:
        en = torch.zeros((1, 640, frames))
        s = torch.zeros((1, 128))
        traced = torch.jit.trace(F0N(model), (en, s))
        ct.convert(
            traced,
            inputs=[
                ct.TensorType(name="en", shape=en.shape),
                ct.TensorType(name="s", shape=s.shape),
            ],
            outputs=[ct.TensorType(name="F0_pred"), ct.TensorType(name="N_pred")],
            minimum_deployment_target=target,
        ).save(str(dv / f"kokoro_f0n_{name}.mlpackage"))
        asr = torch.zeros((1, 512, frames))
        f0 = torch.zeros((1, frames * 2))
        har = torch.zeros((1, 22, frames * 600 // 5 + 1))
        traced = torch.jit.trace(Decoder(model), (asr, f0, f0, s, har))
        ct.convert(
            traced,
            inputs=[
                ct.TensorType(name=n, shape=t.shape)
                for n, t in (
                    ("asr", asr),
                    ("F0_pred", f0),
                    ("N_pred", f0),
                    ("ref_s", s),
                    ("har", har),
                )
            ],
            outputs=[ct.TensorType(name="waveform")],
            minimum_deployment_target=target,
        ).save(str(dv / f"kokoro_decoder_split_{name}.mlpackage"))
    lin = model.decoder.generator.m_source.l_linear
    config = {
        "buckets": [{"name": n, "frames": f} for n, f in BUCKETS],
        "har": {
            "weight": lin.weight.detach().reshape(-1).tolist(),
            "bias": float(lin.bias.detach().reshape(-1)[0]),
        },
    }
    (dv / "split_config.json").write_text(json.dumps(config, indent=1), "utf-8")


def main(argv: list[str] | None = None) -> int:
    from engines.kokoro.models import default_models_dir

    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint", type=Path, help="Kokoro torch checkpoint (.pth)")
    p.add_argument("--config", type=Path, help="the checkpoint's config.json (vocab included)")
    p.add_argument(
        "--voice",
        type=Path,
        action="append",
        default=[],
        help="voice file (.pt, .npy, .npz, .bin); repeatable",
    )
    p.add_argument("--variant", default="german")
    p.add_argument("--models-dir", type=Path, default=None)
    p.add_argument("--coreml", action="store_true", help="export the CoreML split layout")
    p.add_argument("--onnx", action="store_true", help="export one ONNX graph (kokoro.onnx)")
    args = p.parse_args(argv)
    out_dir = (args.models_dir or default_models_dir()) / f"kokoro-{args.variant}"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        for voice in args.voice:
            if not voice.is_file():
                raise ExportError(f"voice file {voice} does not exist")
            print("voice", export_voice(voice, out_dir))
        if args.config is not None:
            if not args.config.is_file():
                raise ExportError(f"config {args.config} does not exist")
            print("vocab", export_vocab(json.loads(args.config.read_text("utf-8")), out_dir))
        if args.coreml or args.onnx:
            if args.checkpoint is None or args.config is None:
                raise ExportError("--coreml/--onnx need --checkpoint and --config")
            if not args.checkpoint.is_file():
                raise ExportError(f"checkpoint {args.checkpoint} does not exist")
            model = _load_kmodel(args.checkpoint, args.config)
            if args.onnx:
                export_onnx(model, out_dir / "kokoro.onnx")
                print("onnx", out_dir / "kokoro.onnx")
            if args.coreml:
                export_coreml(model, out_dir)
                print("coreml", out_dir)
    except ExportError as exc:
        print(f"export_kokoro_models: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
