"""Shipped profiles and their drift, the loader's errors, the profile model, the CLI."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from scheduler import exit_codes
from scheduler.energy import cli
from scheduler.energy.derive import TARGETS, derive_profiles, fit_document, fit_published
from scheduler.energy.energy_model import ANALYTIC
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE
from scheduler.energy.nvml import NvmlMeter
from scheduler.energy.profile_energy_model import ProfileEnergyModel
from scheduler.energy.profiles import EMBEDDED_PROFILES, ProfileError, ProfileLibrary, load_profile
from scheduler.energy.published import POINTS_FILE, load_points
from scheduler.energy.step import StepCosts

REQUIRED_MODELS = ("llama-3.2-1b", "llama-3.2-3b", "llama-3.1-8b", "llama-3.1-70b", "qwen3-32b")
REQUIRED_GPUS = ("A100-40GB", "A100-80GB", "H100-80GB", "H200-141GB")


def main(argv: list[str]) -> int:
    """The energy commands as ``scheduler`` runs them (without the other areas' commands)."""
    parser = argparse.ArgumentParser(prog="scheduler")
    cli.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


@pytest.fixture(scope="module")
def library() -> ProfileLibrary:
    return ProfileLibrary.load()


@pytest.mark.parametrize("model", REQUIRED_MODELS)
@pytest.mark.parametrize("gpu", REQUIRED_GPUS)
def test_every_required_pool_has_a_fitted_sourced_profile(library: ProfileLibrary, model: str, gpu: str) -> None:
    profile = library.get(model, gpu)
    assert profile is not None, f"no profile for {model} on {gpu}"
    assert profile.method == "fitted" and profile.parameters is not None
    assert profile.sources and all(s.url.startswith("https://") for s in profile.sources)
    assert profile.provenance.startswith(f"profile: {gpu.lower()}-{model}@fitted")
    assert 0 < profile.rel_error < 1
    fit_ids = {p.id for p in load_points().role("fit")}
    assert profile.points and set(profile.points) <= fit_ids


def test_shipped_files_are_what_fit_profiles_generates(library: ProfileLibrary) -> None:
    """The YAML files (profiles and published/fit.yaml) are what `scheduler energy
    fit-profiles` writes from points.yaml: no hand edits, no stale fit."""
    summary = fit_published()
    for derived in derive_profiles(summary):
        shipped = library.get(derived.model, derived.gpu)
        assert shipped is not None
        assert (shipped.method, shipped.tensor_parallel, shipped.rel_error, shipped.points) == (
            derived.method, derived.tensor_parallel, derived.rel_error, derived.points)
        for f in fields(StepCosts):
            assert getattr(shipped.costs, f.name) == pytest.approx(getattr(derived.costs, f.name), rel=1e-4), f.name
    shipped_fit = yaml.safe_load((POINTS_FILE.parent / "fit.yaml").read_text())
    generated = fit_document(summary)
    assert shipped_fit["parameters"] == pytest.approx(generated["parameters"], rel=1e-4)
    assert shipped_fit["rel_error_measured"] == generated["rel_error_measured"]
    assert shipped_fit["rel_error_transfer"] == generated["rel_error_transfer"]
    assert len(library.profiles) == len(TARGETS)


def test_intervals_come_from_out_of_fit_residuals() -> None:
    summary = fit_published()
    loo = max(abs(e) for e in summary.loo_errors.values())
    transfer = max(abs(e) for e in summary.transfer_errors.values())
    print(f"\nfit {len(summary.fit_errors)} points, max |fit error| {max(map(abs, summary.fit_errors.values())):.3f}; "
          f"max |leave-one-out| {loo:.3f} -> ±{summary.rel_error_measured}; max |transfer| {transfer:.3f} "
          f"-> ±{summary.rel_error_transfer}")
    assert loo <= summary.rel_error_measured < loo + 0.01
    assert transfer <= summary.rel_error_transfer < transfer + 0.01
    assert summary.rel_error("H100-80GB") == summary.rel_error_measured
    assert summary.rel_error("H200-141GB") == summary.rel_error("A100-40GB") == summary.rel_error_transfer


def test_loader_error_names_file_field_and_value(tmp_path: Path) -> None:
    doc = yaml.safe_load((EMBEDDED_PROFILES / "llama-3.1-8b__H100-80GB.yaml").read_text())
    doc["gpu"] = "H300"
    doc["step_costs"]["e_step"] = -1.0
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError) as caught:
        load_profile(bad)
    text = str(caught.value)
    print("\n" + text)
    assert f"{bad}: gpu:" in text and "'H300'" in text
    assert f"{bad}: step_costs.e_step:" in text and "-1.0" in text


def test_fitted_profile_needs_its_parameters(tmp_path: Path) -> None:
    doc = yaml.safe_load((EMBEDDED_PROFILES / "llama-3.1-8b__H100-80GB.yaml").read_text())
    del doc["parameters"]
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError, match="needs its parameters"):
        load_profile(bad)


def test_duplicate_profiles_are_refused(tmp_path: Path) -> None:
    source = EMBEDDED_PROFILES / "llama-3.1-8b__H100-80GB.yaml"
    for name in ("a.yaml", "b.yaml"):
        (tmp_path / name).write_text(source.read_text())
    with pytest.raises(ProfileError, match="already profiled"):
        ProfileLibrary.load(tmp_path)


def test_missing_profile_falls_back_to_the_fitted_parameters(library: ProfileLibrary) -> None:
    model = ProfileEnergyModel(library=library)
    rated = model.rated_costs(MODEL_CATALOGUE["tiny-llama"], GPU_CATALOGUE["L4"], "bf16", 1)
    e = model.coefficients(MODEL_CATALOGUE["tiny-llama"], GPU_CATALOGUE["L4"], "bf16", 1, 4).estimate(100, 0, 50)
    print(f"\ntiny-llama on L4: {e.energy_j:.4f} J [{e.low_j:.4f}, {e.high_j:.4f}] ({e.provenance})")
    assert rated.provenance == ANALYTIC and rated.rel_error == model.fitted.rel_error_transfer
    assert e.low_j < e.energy_j < e.high_j


def test_precision_and_tp_are_carried_through_the_fitted_parameters(library: ProfileLibrary) -> None:
    model = ProfileEnergyModel(library=library)
    llama70, h100 = MODEL_CATALOGUE["llama-3.1-70b"], GPU_CATALOGUE["H100-80GB"]
    bf16 = model.rated_costs(llama70, h100, "bf16", 4)
    fp8 = model.rated_costs(llama70, h100, "fp8", 2)
    int4 = model.rated_costs(llama70, h100, "int4", 4)
    print(f"\n70B on H100 e_step: bf16 tp4 {bf16.costs.e_step:.3f} ({bf16.provenance}); fp8 tp2 "
          f"{fp8.costs.e_step:.3f} ({fp8.provenance}); int4 tp4 {int4.costs.e_step:.3f}")
    bf16_tp2 = model.rated_costs(llama70, h100, "bf16", 2)
    assert fp8.costs.t_token == pytest.approx(bf16_tp2.costs.t_token / 2)  # FP8 tensor cores on Hopper
    assert int4.costs.e_kv == pytest.approx(bf16.costs.e_kv, rel=1e-4)  # 16-bit KV cache
    assert fp8.costs.idle_w == pytest.approx(bf16.costs.idle_w / 2)  # half the GPUs idle
    assert "at fp8 tp2" in fp8.provenance and fp8.rel_error > bf16.rel_error


def test_predict_cli(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["energy", "predict", "--model", "llama-3.1-8b", "--gpu", "H100-80GB", "--batch", "64",
                 "--context", "512", "--cached", "256", "--output", "256", "--json"])
    out = json.loads(capsys.readouterr().out)
    print(f"\n{out['energy_per_token_j']:.4f} J per output token; parts {out['parts']}; avoided {out['avoided_j']:.2f}")
    assert code == 0
    assert out["low_j"] < out["energy_j"] < out["high_j"]
    assert out["energy_j"] == pytest.approx(sum(out["parts"].values()))
    assert out["avoided_j"] > 0 and "fitted" in out["provenance"]
    assert main(["energy", "predict", "--model", "qwen3-32b", "--gpu", "H200-141GB", "--batch", "8",
                 "--context", "2048", "--cached", "1024", "--output", "128"]) == 0
    text = capsys.readouterr().out
    for name in ("energy_j", "energy_per_token_j", "low_j", "high_j", "prefill_j", "decode_j", "avoided_j"):
        assert name in text
    assert main(["energy", "predict", "--model", "gpt-9", "--gpu", "H100-80GB", "--batch", "1",
                 "--context", "1", "--output", "1"]) == 2
    assert "gpt-9" in capsys.readouterr().err


def test_fit_profiles_cli_writes_loadable_profiles(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["energy", "fit-profiles", "--out", str(tmp_path), "--fit-file", str(tmp_path / "fit.yaml")]) == 0
    assert "20 profiles" in capsys.readouterr().out
    (tmp_path / "fit.yaml").unlink()
    assert len(ProfileLibrary.load(tmp_path).profiles) == 20


def test_calibrate_without_gpu_fails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    meter = NvmlMeter()
    if meter.open():
        meter.close()
        pytest.skip("this machine has an NVIDIA GPU: the no-GPU path cannot be shown here")
    code = main(["calibrate", "--model", str(tmp_path / "Llama-3.1-8B-Instruct"), "--gpu-index", "0",
                 "--out", str(tmp_path / "p.yaml")])
    err = capsys.readouterr().err
    print("\n" + err)
    assert code == exit_codes.FAILURE
    assert "needs an NVIDIA GPU" in err
    assert not (tmp_path / "p.yaml").exists()
