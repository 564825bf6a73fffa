"""Shipped profiles, the loader's errors, the profile model's scaling and fallback, the CLI."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from scheduler.cli import main
from scheduler.config.loader import EMBEDDED_POLICIES, EMBEDDED_REGIONS, load_fleet
from scheduler.datalayer.snapshot import SnapshotBuilder
from scheduler.energy.derive import ML_ENERGY_ANCHOR, derive_profiles
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model import ANALYTIC, weights_read_ratio
from scheduler.energy.models import MODEL_CATALOGUE, ModelSpec
from scheduler.energy.nvml import NvmlMeter
from scheduler.energy.profile_model import ProfileEnergyModel
from scheduler.energy.profiles import EMBEDDED_PROFILES, ProfileError, ProfileLibrary, load_profile

REQUIRED_MODELS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "qwen3-32b")
REQUIRED_GPUS = ("A100-40GB", "H100-80GB", "H200-141GB")


@pytest.fixture(scope="module")
def library() -> ProfileLibrary:
    return ProfileLibrary.load()


@pytest.mark.parametrize("model", REQUIRED_MODELS)
@pytest.mark.parametrize("gpu", REQUIRED_GPUS)
def test_every_required_pool_has_a_sourced_profile(library: ProfileLibrary, model: str, gpu: str) -> None:
    profile = library.get(model, gpu)
    assert profile is not None, f"no profile for {model} on {gpu}"
    assert profile.sources and all(s.url.startswith("https://") for s in profile.sources)
    assert profile.provenance.startswith(f"profile: {gpu.lower()}-{model}@")
    assert 0 < profile.rel_error < 1


def test_shipped_profiles_match_their_derivation(library: ProfileLibrary) -> None:
    """The YAML files are what `scheduler energy derive-profiles` writes (no hand edits drift)."""
    for derived in derive_profiles():
        shipped = library.get(derived.model, derived.gpu)
        assert shipped is not None
        assert (shipped.method, shipped.tensor_parallel, shipped.rel_error) == (
            derived.method, derived.tensor_parallel, derived.rel_error)
        for f in fields(derived.replica):
            assert getattr(shipped.replica, f.name) == pytest.approx(getattr(derived.replica, f.name), rel=1e-4)
    anchored = [p for p in library.profiles.values() if p.method == "anchored"]
    assert [(p.model, p.gpu) for p in anchored] == [(ML_ENERGY_ANCHOR.model, ML_ENERGY_ANCHOR.gpu)]


def test_loader_error_names_file_field_and_value(tmp_path: Path) -> None:
    doc = yaml.safe_load((EMBEDDED_PROFILES / "llama-3.1-8b__H100-80GB.yaml").read_text())
    doc["gpu"] = "H300"
    doc["coefficients"]["step_weights_j"] = -1.0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError) as caught:
        load_profile(bad)
    text = str(caught.value)
    print("\n" + text)
    assert f"{bad}: gpu:" in text and "'H300'" in text
    assert f"{bad}: coefficients.step_weights_j:" in text and "-1.0" in text


def test_duplicate_profiles_are_refused(tmp_path: Path) -> None:
    source = EMBEDDED_PROFILES / "llama-3.1-8b__H100-80GB.yaml"
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text(source.read_text())
    with pytest.raises(ProfileError, match="already profiled"):
        ProfileLibrary.load(tmp_path)


def test_missing_profile_falls_back_to_analytic(library: ProfileLibrary) -> None:
    model = ProfileEnergyModel(library=library)
    c = model.coefficients(MODEL_CATALOGUE["tiny-llama"], GPU_CATALOGUE["L4"], "bf16", 1, 4)
    e = c.estimate(100, 0, 50)
    print(f"\ntiny-llama on L4: {e.energy_j:.4f} J [{e.low_j:.4f}, {e.high_j:.4f}] ({e.provenance})")
    assert c.provenance == ANALYTIC
    assert e.low_j < e.energy_j < e.high_j


def test_precision_and_tp_are_scaled_from_the_profile(library: ProfileLibrary) -> None:
    model = ProfileEnergyModel(library=library)
    llama70, h100 = MODEL_CATALOGUE["llama-3.1-70b"], GPU_CATALOGUE["H100-80GB"]
    bf16 = model.coefficients(llama70, h100, "bf16", 4, 16)
    fp8 = model.coefficients(llama70, h100, "fp8", 2, 16)
    int4 = model.coefficients(llama70, h100, "int4", 4, 16)
    print(f"\n70B on H100 batch 16 step_j: bf16 tp4 {bf16.step_j:.3f} ({bf16.provenance}); fp8 tp2 "
          f"{fp8.step_j:.3f} ({fp8.provenance}); int4 tp4 {int4.step_j:.3f}; kv/token bf16 "
          f"{bf16.step_j_per_context_token:.2e}, fp8 {fp8.step_j_per_context_token:.2e}, "
          f"int4 {int4.step_j_per_context_token:.2e}")
    assert fp8.step_j < bf16.step_j and int4.step_j < fp8.step_j
    assert fp8.prefill_j_per_token < bf16.prefill_j_per_token  # FP8 tensor cores on Hopper
    assert int4.step_j_per_context_token == pytest.approx(bf16.step_j_per_context_token)  # 16-bit KV cache
    assert fp8.step_j_per_context_token == pytest.approx(bf16.step_j_per_context_token / 2)
    assert fp8.idle_w == pytest.approx(bf16.idle_w / 2)  # half the GPUs idle
    assert "scaled to fp8 tp2" in fp8.provenance and fp8.rel_error > bf16.rel_error


def test_moe_reads_more_experts_as_batch_grows() -> None:
    moe = ModelSpec("moe-test", params_b=47.0, layers=32, hidden=4096, kv_heads=8, head_dim=128,
                    max_context=32768, active_params_b=13.0)
    ratios = {b: weights_read_ratio(moe, b) for b in (1, 2, 8, 64)}
    print("\nMoE weights read per step / active weights: " + ", ".join(f"batch {b}: {r:.2f}" for b, r in ratios.items()))
    assert ratios[1] == pytest.approx(1.0)
    assert ratios[1] < ratios[2] < ratios[8] < ratios[64] <= 47.0 / 13.0
    assert weights_read_ratio(MODEL_CATALOGUE["llama-3.1-8b"], 64) == 1.0


def test_snapshot_builder_uses_the_profile_model() -> None:
    fleet = load_fleet(EMBEDDED_REGIONS, EMBEDDED_POLICIES)
    builder = SnapshotBuilder(regions=fleet.regions, policy=next(iter(fleet.policies.values())))
    snapshot = builder.build(now=0.0)
    provenances = {p.energy.provenance for p in snapshot.perf}
    print("\n" + "\n".join(sorted(provenances)))
    assert any(p.startswith("profile: h100-80gb-llama-3.1-8b@anchored") for p in provenances)
    assert any("scaled to fp8 tp2" in p for p in provenances)


def test_predict_cli_reproduces_the_ml_energy_anchor(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["energy", "predict", "--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--batch", "64",
                 "--context", "512", "--output", "256", "--json"])
    out = json.loads(capsys.readouterr().out)
    print(f"\n{out['energy_per_token_j']:.4f} J per output token (ML.ENERGY v3: 0.12); parts {out['parts']}")
    assert code == 0
    assert out["energy_per_token_j"] == pytest.approx(0.12, rel=0.25)
    assert out["low_j"] < out["energy_j"] < out["high_j"]
    assert out["energy_j"] == pytest.approx(sum(out["parts"].values()))


def test_predict_cli_text_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["energy", "predict", "--model", "qwen3-32b", "--gpu", "H200-141GB", "--batch", "8",
                 "--context", "2048", "--cached", "1024", "--output", "128"]) == 0
    text = capsys.readouterr().out
    for name in ("energy_j", "energy_per_token_j", "low_j", "high_j", "prefill_j", "decode_j", "idle_j"):
        assert name in text
    assert main(["energy", "predict", "--model", "gpt-9", "--gpu", "H100-80GB", "--batch", "1",
                 "--context", "1", "--output", "1"]) == 2
    assert "gpt-9" in capsys.readouterr().err


def test_calibrate_without_gpu_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    meter = NvmlMeter()
    if meter.open():
        meter.close()
        pytest.skip("this machine has an NVIDIA GPU: the no-GPU path cannot be shown here")
    code = main(["calibrate", "--model", str(tmp_path / "Llama-3.1-8B-Instruct"), "--gpu-index", "0",
                 "--out", str(tmp_path / "p.yaml")])
    err = capsys.readouterr().err
    print("\n" + err)
    assert code == 2
    assert "needs an NVIDIA GPU" in err
    assert not (tmp_path / "p.yaml").exists()
