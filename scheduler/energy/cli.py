"""``scheduler energy predict | fit-profiles | validate`` and ``scheduler calibrate``."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
from pathlib import Path
from typing import Any

from scheduler import exit_codes
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE, PRECISION_BYTES
from scheduler.energy.profiles import EMBEDDED_PROFILES, ProfileError, ProfileLibrary


def register(sub: Any) -> None:
    energy = sub.add_parser("energy", help="predict request energy; manage energy profiles")
    energy_sub = energy.add_subparsers(dest="energy_command", required=True, metavar="ACTION")

    predict = energy_sub.add_parser("predict", help="energy of one request on one pool, with its parts and interval")
    predict.add_argument("--model", required=True, help=f"one of {', '.join(MODEL_CATALOGUE)}")
    predict.add_argument("--gpu", required=True, help=f"one of {', '.join(GPU_CATALOGUE)}")
    predict.add_argument("--batch", type=float, required=True, help="expected concurrent sequences on the replica")
    predict.add_argument("--context", type=int, required=True, help="prompt tokens")
    predict.add_argument("--cached", type=int, default=0, help="prompt tokens served from the prefix cache")
    predict.add_argument("--output", type=int, required=True, help="output tokens")
    predict.add_argument("--precision", default="bf16", choices=sorted(PRECISION_BYTES))
    predict.add_argument("--tensor-parallel", type=int, default=None, help="default: the profile's, else 1")
    predict.add_argument("--others-context", type=float, default=None,
                         help="mean context of the other running sequences (default: this request's)")
    predict.add_argument("--profiles", type=Path, default=EMBEDDED_PROFILES, help="folder of profile YAML files")
    predict.add_argument("--json", action="store_true", help="print one JSON object")
    predict.set_defaults(handler=_predict)

    fit = energy_sub.add_parser("fit-profiles", help="fit the model to the published points; rewrite the profiles")
    fit.add_argument("--out", type=Path, default=EMBEDDED_PROFILES, help="folder to write the profile YAML files to")
    fit.add_argument("--fit-file", type=Path, default=None, help="where to write the fit summary "
                     "(default: scheduler/energy/published/fit.yaml)")
    fit.set_defaults(handler=_fit_profiles)

    validate = energy_sub.add_parser("validate", help="the model against the published points it was not fitted to")
    validate.add_argument("--all", action="store_true", help="also show the excluded points")
    validate.add_argument("--json", action="store_true", help="print one JSON object")
    validate.set_defaults(handler=_validate)

    calibrate = sub.add_parser("calibrate", help="measure a pool on an NVIDIA GPU (vLLM + NVML) and fit its profile")
    calibrate.add_argument("--model", required=True, type=Path, help="model folder (Hugging Face layout) for vLLM")
    calibrate.add_argument("--model-name", default=None, help="catalogue name (default: inferred from the folder)")
    calibrate.add_argument("--gpu-index", type=int, required=True, help="NVML index of the replica's first GPU")
    calibrate.add_argument("--tensor-parallel", type=int, default=1)
    calibrate.add_argument("--precision", default="bf16", choices=sorted(PRECISION_BYTES))
    calibrate.add_argument("--sweep", default="", help="e.g. 'batch=1,8,64;context=128,2048;output=32,256'")
    calibrate.add_argument("--repeats", type=int, default=2, help="metered runs per sweep point (median kept)")
    calibrate.add_argument("--idle-s", type=float, default=10.0, help="length of the idle-floor window")
    calibrate.add_argument("--out", type=Path, required=True, help="profile YAML file to write")
    calibrate.set_defaults(handler=_calibrate)


def _predict(args: argparse.Namespace) -> int:
    from scheduler.energy.profile_energy_model import ProfileEnergyModel

    model, gpu = MODEL_CATALOGUE.get(args.model), GPU_CATALOGUE.get(args.gpu)
    if model is None or gpu is None:
        wrong = f"--model {args.model!r}" if model is None else f"--gpu {args.gpu!r}"
        known = MODEL_CATALOGUE if model is None else GPU_CATALOGUE
        print(f"{wrong} is not known (known: {', '.join(known)})", file=sys.stderr)
        return 2
    if args.cached > args.context or min(args.context, args.cached, args.output) < 0 or args.batch <= 0:
        print("need batch > 0 and 0 <= cached <= context, output >= 0", file=sys.stderr)
        return 2
    try:
        library = ProfileLibrary.load(args.profiles)
    except ProfileError as exc:
        print(exc, file=sys.stderr)
        return exit_codes.CONFIG
    profile = library.get(model.name, gpu.name)
    tp = args.tensor_parallel or (profile.tensor_parallel if profile is not None else 1)
    others = args.others_context if args.others_context is not None else args.context + args.output / 2
    coefficients = ProfileEnergyModel(library=library).coefficients(
        model, gpu, args.precision, tp, args.batch, others)
    estimate = coefficients.estimate(args.context, args.cached, args.output)
    result = {
        "model": model.name,
        "gpu": gpu.name,
        "precision": args.precision,
        "tensor_parallel": tp,
        "batch": args.batch,
        "context": args.context,
        "cached": args.cached,
        "output": args.output,
        "energy_j": estimate.energy_j,
        "energy_per_token_j": estimate.energy_j / args.output if args.output else None,
        "low_j": estimate.low_j,
        "high_j": estimate.high_j,
        "parts": {"prefill_j": estimate.prefill_j, "decode_j": estimate.decode_j, "idle_j": estimate.idle_j},
        "avoided_j": coefficients.avoided_j(args.context, args.cached),
        "provenance": estimate.provenance,
    }
    if args.json:
        print(json.dumps(result))
        return 0
    per_token = f"{result['energy_per_token_j']:.4f}" if args.output else "n/a (no output tokens)"
    print(
        f"{model.name} on {gpu.name} ({args.precision}, tp{tp}), batch {args.batch:g}, "
        f"context {args.context} (cached {args.cached}), output {args.output}\n"
        f"energy_j            {estimate.energy_j:.2f}\n"
        f"energy_per_token_j  {per_token}\n"
        f"low_j               {estimate.low_j:.2f}\n"
        f"high_j              {estimate.high_j:.2f}\n"
        f"parts               prefill_j {estimate.prefill_j:.2f}  decode_j {estimate.decode_j:.2f}  "
        f"idle_j {estimate.idle_j:.2f}\n"
        f"avoided_j           {result['avoided_j']:.2f}\n"
        f"provenance          {estimate.provenance}"
    )
    return 0


def _fit_profiles(args: argparse.Namespace) -> int:
    from scheduler.energy.derive import FIT_FILE, write_fitted_profiles

    written = write_fitted_profiles(args.out, args.fit_file or FIT_FILE)
    print(f"wrote {written[0]} and {len(written) - 1} profiles to {args.out}")
    return 0


def _validate(args: argparse.Namespace) -> int:
    from scheduler.energy.validate import as_json, as_text, coverage, rows

    table = rows(roles=("held_out", "excluded") if args.all else ("held_out",))
    print(json.dumps(as_json(table)) if args.json else as_text(table))
    return 0 if all(c.passed for c in coverage(table)) else 1


def _calibrate(args: argparse.Namespace) -> int:
    from scheduler.energy.calibrate import (
        Calibrator,
        VllmEngine,
        calibrated_profile,
        calibration_note,
        fit_sweep,
        parse_sweep,
    )
    from scheduler.energy.nvml import NvmlMeter
    from scheduler.energy.profiles import write_profile

    try:
        sweep = parse_sweep(args.sweep)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    model_name = args.model_name or _infer_model_name(args.model)
    if model_name not in MODEL_CATALOGUE:
        print(f"cannot tell which catalogue model {args.model} is; pass --model-name "
              f"(one of {', '.join(MODEL_CATALOGUE)})", file=sys.stderr)
        return 2
    meter = NvmlMeter()
    if not meter.open():
        print(f"scheduler calibrate needs an NVIDIA GPU: NVML is unavailable ({meter.unavailable_reason})",
              file=sys.stderr)
        return exit_codes.FAILURE
    indices = list(range(args.gpu_index, args.gpu_index + args.tensor_parallel))
    if indices[-1] >= meter.gpu_count:
        print(f"--gpu-index {args.gpu_index} with tp {args.tensor_parallel}: this node has "
              f"{meter.gpu_count} GPU(s)", file=sys.stderr)
        return 2
    gpu_name = _gpu_name(args.gpu_index)
    if gpu_name is None:
        print("this GPU is not in the hardware catalogue (scheduler/energy/hardware.py)", file=sys.stderr)
        return 2
    # NVML numbers GPUs by PCI bus; make CUDA (vLLM) see the same ones.
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in indices)
    model = MODEL_CATALOGUE[model_name]
    engine = VllmEngine(str(args.model), args.tensor_parallel, max(sweep.batches), sweep.max_len)
    calibrator = Calibrator(meter=meter, engine=engine, gpu_indices=indices, repeats=args.repeats)
    idle_w = calibrator.idle_w(args.idle_s)
    points = calibrator.sweep(sweep)
    meter.close()
    fit = fit_sweep(model, GPU_CATALOGUE[gpu_name], args.precision, args.tensor_parallel, points, idle_w)
    profile = calibrated_profile(model, gpu_name, args.precision, args.tensor_parallel, fit, dt.date.today())
    write_profile(profile, calibration_note(fit, points), args.out)
    print(f"wrote {args.out}: {profile.provenance}; idle {idle_w:.1f} W; fit RMS {fit.rel_rmse:.3f}, "
          f"interval ±{profile.rel_error:.0%}")
    return 0


def _infer_model_name(folder: Path) -> str:
    base = folder.name.lower()
    return next((name for name in sorted(MODEL_CATALOGUE, key=len, reverse=True) if base.startswith(name)), "")


def _gpu_name(index: int) -> str | None:
    import pynvml

    from scheduler.energy.calibrate import catalogue_gpu_name

    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    name = pynvml.nvmlDeviceGetName(handle)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle).total
    return catalogue_gpu_name(name.decode() if isinstance(name, bytes) else str(name), int(memory))
