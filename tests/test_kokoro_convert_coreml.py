"""``kokoro-convert --coreml``: the CoreML layout the engine's CoreML backend loads.

On Linux: conversion succeeds (coremltools converts anywhere), the packages'
inputs, outputs and bucket shapes are those ``engines.kokoro.coreml`` feeds and
reads, and the exact torch modules that were converted compute the official
forward (durations identical, audio within ``FLOAT32_TOLERANCE_DB`` with the
noise held equal). Running a CoreML prediction needs macOS: those tests are
marked ``macos`` and skipped elsewhere (README "Using the German model").
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("kokoro")
torch = pytest.importorskip("torch")
ct = pytest.importorskip("coremltools", reason="coremltools is not installed")

import kokoro_convert_helpers as kch  # noqa: E402

from engines.kokoro import coreml as backend  # noqa: E402
from engines.kokoro.convert import validate as va  # noqa: E402
from engines.kokoro.convert.checkpoint import remove_weight_norm  # noqa: E402
from engines.kokoro.convert.coreml_export import export_coreml  # noqa: E402
from engines.kokoro.convert.coreml_modules import (  # noqa: E402
    DecoderModel,
    DurationModel,
    F0NModel,
)

pytestmark = pytest.mark.slow

#: One small bucket keeps the conversion quick; the shapes follow ``Bucket`` as the C++
#: service's do.
TEST_BUCKET = backend.Bucket("test", 16)
FLOAT32, INT32 = 65568, 131104  # ArrayFeatureType data types in the spec


@pytest.fixture(scope="module")
def kmodel() -> Any:
    return kch.random_kmodel(kch.tiny_config(), seed=6)


@pytest.fixture(scope="module")
def layout(kmodel: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("coreml")
    folded = kch.random_kmodel(kch.tiny_config(), seed=6)
    remove_weight_norm(folded)
    summary = export_coreml(folded, out, buckets=(TEST_BUCKET,))
    print("coreml conversion seconds:", summary["seconds"])
    return out


def io(path: Path) -> tuple[dict[str, tuple[list[int], int]], dict[str, list[int]]]:
    spec = ct.utils.load_spec(str(path))
    inputs = {
        i.name: (list(i.type.multiArrayType.shape), i.type.multiArrayType.dataType)
        for i in spec.description.input
    }
    outputs = {o.name: list(o.type.multiArrayType.shape) for o in spec.description.output}
    return inputs, outputs


def test_the_default_buckets_are_the_seeds() -> None:
    assert export_coreml.__kwdefaults__["buckets"] == backend.REFERENCE_BUCKETS
    assert [(b.name, b.frames) for b in backend.REFERENCE_BUCKETS] == [
        ("3s", 72),
        ("5s", 120),
        ("10s", 240),
    ]


def test_the_layout_is_what_the_coreml_backend_finds(layout: Path, kmodel: Any) -> None:
    found = backend.SplitLayout.find(layout)
    assert [b.name for b in found.buckets] == ["test"]
    config = json.loads((layout / "decoder_variants" / "split_config.json").read_text())
    lin = kmodel.decoder.generator.m_source.l_linear
    np.testing.assert_allclose(config["har"]["weight"], lin.weight.detach().reshape(-1).numpy())
    assert config["har"]["bias"] == pytest.approx(float(lin.bias))
    assert len(config["har"]["weight"]) == backend.HARMONICS + 1


def test_the_packages_take_and_give_what_the_backend_feeds_and_reads(layout: Path) -> None:
    n = backend.DURATION_TOKENS
    inputs, outputs = io(layout / "coreml" / "kokoro_duration.mlpackage")
    assert inputs == {
        "input_ids": ([1, n], INT32),
        "attention_mask": ([1, n], INT32),
        "ref_s": ([1, 256], FLOAT32),
        "speed": ([1], FLOAT32),
    }
    assert outputs == {"pred_dur": [1, n], "d": [1, 640, n], "t_en": [1, 512, n]}
    b = TEST_BUCKET
    dv = layout / "decoder_variants"
    inputs, outputs = io(dv / f"kokoro_f0n_{b.name}.mlpackage")
    assert inputs == {"en": ([1, 640, b.frames], FLOAT32), "s": ([1, 128], FLOAT32)}
    assert outputs == {"F0_pred": [1, b.f0_frames], "N_pred": [1, b.f0_frames]}
    inputs, outputs = io(dv / f"kokoro_decoder_split_{b.name}.mlpackage")
    assert inputs == {
        "asr": ([1, 512, b.frames], FLOAT32),
        "F0_pred": ([1, b.f0_frames], FLOAT32),
        "N_pred": ([1, b.f0_frames], FLOAT32),
        "ref_s": ([1, 128], FLOAT32),
        "har": ([1, backend.ISTFT_N_FFT + 2, b.har_frames], FLOAT32),
    }
    assert outputs == {"waveform": [1, b.samples]}


def converted_chain(kmodel: Any, ref: va.Reference, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The converted modules as the CoreML backend chains them (512-token padding, the
    alignment on the CPU), with the harmonic source computed by the official modules."""
    n = ref.tokens.shape[1]
    ids = np.zeros((1, backend.DURATION_TOKENS), np.int32)
    ids[0, :n] = ref.tokens[0]
    mask = np.zeros_like(ids)
    mask[0, :n] = 1
    gen = kmodel.decoder.generator
    box: list[Any] = []
    with torch.no_grad(), va.held_noise(seed, box):
        pred_dur, d, t_en = DurationModel(kmodel)(
            torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(ref.style),
            torch.tensor([ref.speed]),
        )  # fmt: skip
        dur = backend.durations_to_frames(pred_dur.numpy(), n)
        en = backend.align(d.numpy()[0][:, :n], dur)[None]
        asr = backend.align(t_en.numpy()[0][:, :n], dur)[None]
        s_pred = torch.from_numpy(ref.style[:, 128:])
        f0, energy = F0NModel(kmodel)(torch.from_numpy(en), s_pred)
        source, _noise, _uv = gen.m_source(gen.f0_upsamp(f0[:, None]).transpose(1, 2))
        spec, phase = gen.stft.transform(source.transpose(1, 2).squeeze(1))
        har = torch.cat([spec, phase], dim=1)
        audio = DecoderModel(kmodel)(
            torch.from_numpy(asr), f0, energy, torch.from_numpy(ref.style[:, :128]), har
        )
    return dur, audio.numpy().reshape(-1)


def test_the_converted_torch_modules_compute_the_official_forward(kmodel: Any) -> None:
    vocab = kch.tiny_config()["vocab"]
    tokens = kch.probe_tokens(vocab, 24, seed=6)
    style = (np.random.default_rng(6).standard_normal(256) * 0.15).astype(np.float32)
    ref = va.official_forward(kmodel, tokens, style, 1.1, seed=6)
    durations, audio = converted_chain(kmodel, ref, seed=6)
    np.testing.assert_array_equal(durations, ref.durations)
    distance = va.spectral_distance(ref.audio, audio)
    print(f"CoreML modules vs official forward: {distance:.4f} dB")
    assert distance <= va.FLOAT32_TOLERANCE_DB


@pytest.mark.macos
@pytest.mark.skipif(sys.platform != "darwin", reason="CoreML predictions run on macOS only")
def test_coreml_predictions_match_the_converted_modules(layout: Path, kmodel: Any) -> None:
    """On a Mac: the duration package gives the official durations, and the decoder
    package renders what the torch module renders from the same inputs."""
    vocab = kch.tiny_config()["vocab"]
    tokens = [0, *kch.probe_tokens(vocab, 10, seed=8), 0]
    ids = np.zeros((1, backend.DURATION_TOKENS), np.int32)
    ids[0, : len(tokens)] = tokens
    mask = (ids > 0).astype(np.int32)
    mask[0, : len(tokens)] = 1
    style = (np.random.default_rng(8).standard_normal((1, 256)) * 0.15).astype(np.float32)
    ref = va.official_forward(kmodel, tokens[1:-1], style, 1.0, seed=8)
    duration = ct.models.MLModel(str(layout / "coreml" / "kokoro_duration.mlpackage"))
    out = duration.predict(
        {"input_ids": ids, "attention_mask": mask, "ref_s": style, "speed": np.ones(1, np.float32)}
    )
    np.testing.assert_array_equal(
        backend.durations_to_frames(out["pred_dur"], len(tokens)), ref.durations
    )
    b = TEST_BUCKET
    rng = np.random.default_rng(9)
    feeds = {
        "asr": rng.standard_normal((1, 512, b.frames)).astype(np.float32),
        "F0_pred": np.full((1, b.f0_frames), 120.0, np.float32),
        "N_pred": rng.standard_normal((1, b.f0_frames)).astype(np.float32),
        "ref_s": style[:, :128],
        "har": rng.standard_normal((1, 22, b.har_frames)).astype(np.float32),
    }
    dec = ct.models.MLModel(
        str(layout / "decoder_variants" / f"kokoro_decoder_split_{b.name}.mlpackage")
    )
    got = np.asarray(dec.predict(feeds)["waveform"]).reshape(-1)
    with torch.no_grad():
        want = DecoderModel(kmodel)(*(torch.from_numpy(v) for v in feeds.values())).numpy()
    assert va.spectral_distance(want.reshape(-1), got) <= va.FLOAT32_TOLERANCE_DB
