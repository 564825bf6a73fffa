"""The committed scheduler/v1/ matches a fresh generation from protos/ (``make protos``)."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[3]


def _gen_protos() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_code_matches_the_protos() -> None:
    problems = _gen_protos().drift(ROOT)
    assert problems == [], "scheduler/v1 is out of date; run `make protos`:\n" + "\n".join(problems)


def test_drift_is_detected(tmp_path: Path) -> None:
    copy = tmp_path / "scheduler" / "v1"
    shutil.copytree(ROOT / "scheduler" / "v1", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "router_pb2.py").write_text((copy / "router_pb2.py").read_text() + "# edited by hand\n")
    (copy / "admin_pb2.pyi").unlink()
    problems = _gen_protos().drift(tmp_path)
    assert problems == ["missing: scheduler/v1/admin_pb2.pyi", "differs from protos/: scheduler/v1/router_pb2.py"]


def test_generated_imports_need_no_rewriting() -> None:
    from scheduler.v1 import admin_pb2, messages_pb2, router_pb2

    assert router_pb2.DESCRIPTOR.package == "scheduler.v1"
    assert "from scheduler.v1 import messages_pb2" in (ROOT / "scheduler/v1/router_pb2.py").read_text()
    services = {s.full_name for m in (router_pb2, admin_pb2) for s in m.DESCRIPTOR.services_by_name.values()}
    assert services == {"scheduler.v1.GlobalRouter", "scheduler.v1.RouterAdmin"}
    receipt_fields = set(messages_pb2.EnergyReceipt.DESCRIPTOR.fields_by_name)
    # Every field of ARCHITECTURE section 6 / shared_formats.md.
    assert {
        "energy_j", "energy_j_low", "energy_j_high", "measurement_source", "confidence", "attribution_method",
        "waiting_j", "prefill_j", "decode_j", "postprocess_j", "idle_allocation_j", "batch_size", "padding_ratio",
        "prompt_tokens", "completion_tokens", "reused_tokens", "avoided_j", "carbon_g", "carbon_signal", "pue",
        "region", "pool", "decision_id", "fallbacks", "failovers",
    } <= receipt_fields
