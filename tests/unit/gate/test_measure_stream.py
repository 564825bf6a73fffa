"""What ``gate measure`` takes from one answered stream: a router's receipt (in its usage chunk or
its ``energy_receipt`` event), a region's ``energy`` object, or why there is no sample."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from scheduler.gate.measure import StreamFailed, read_stream

ENERGY = {"energy_j": 12.0, "energy_j_low": 10.0, "energy_j_high": 14.0, "measurement_source": "nvml",
          "attribution_method": "predicted-share-v1", "batch_size": 3.5}
USAGE = {"prompt_tokens": 20, "completion_tokens": 40, "total_tokens": 60}
CONTENT = 'data: {"choices": [{"index": 0, "delta": {"content": "hi"}}]}'


async def lines(*items: str) -> AsyncIterator[str]:
    for item in items:
        yield item


def read(*items: str) -> object:
    return asyncio.run(read_stream(lines(*items), "eu-north/h200-long"))


@pytest.mark.timeout(30)
def test_a_routers_receipt_event() -> None:
    receipt = {**ENERGY, "region": "us-east", "pool": "h100-chat", "completion_tokens": 40, "prompt_tokens": 20,
               "config_version": "cfg-7", "measurement_source": "model"}
    sample = read(CONTENT, "", f'data: {json.dumps({"choices": [], "usage": USAGE})}', "", "data: [DONE]", "",
                  "event: energy_receipt", f"data: {json.dumps({'energy_receipt': receipt})}", "")
    assert sample.place == "us-east/h100-chat" and sample.config_version == "cfg-7"  # type: ignore[attr-defined]
    assert sample.j_per_token == pytest.approx(12.0 / 40) and sample.measurement_source == "model"  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_a_routers_receipt_in_its_usage_chunk() -> None:
    receipt = {**ENERGY, "region": "us-east", "pool": "h100-chat", "completion_tokens": 40, "prompt_tokens": 20,
               "config_version": "cfg-8"}
    usage = {**USAGE, "energy_receipt": receipt}
    sample = read(CONTENT, "", f'data: {json.dumps({"choices": [], "usage": usage})}', "", "data: [DONE]", "")
    assert sample.place == "us-east/h100-chat" and sample.config_version == "cfg-8"  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
def test_a_regions_energy_object() -> None:
    sample = read(CONTENT, "", f'data: {json.dumps({"choices": [], "usage": USAGE, "energy": ENERGY})}', "",
                  "data: [DONE]", "")
    assert sample.place == "eu-north/h200-long" and sample.completion_tokens == 40  # type: ignore[attr-defined]
    assert sample.energy_j_low == 10.0 and sample.batch_size == 3.5  # type: ignore[attr-defined]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("items", "fragment"), [
    ((CONTENT, "data: [DONE]"), "without an energy receipt"),
    (('data: {"error": {"message": "engine died", "code": 503}}',), "engine died"),
    ((f'data: {json.dumps({"choices": [], "usage": {**USAGE, "completion_tokens": 0}, "energy": ENERGY})}',),
     "no output tokens"),
    ((f'data: {json.dumps({"choices": [], "usage": USAGE, "energy": {"energy_j": 1.0}})}',), "energy_j_low"),
])
def test_no_sample(items: tuple[str, ...], fragment: str) -> None:
    with pytest.raises(StreamFailed, match=fragment):
        read(*items)


@pytest.mark.timeout(30)
def test_a_target_that_does_not_answer_exits_1_after_one_round(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    from scheduler.cli import main

    out = tmp_path / "m.json"
    assert main(["gate", "measure", "--against", "http://127.0.0.1:1", "--requests", "local", "--out", str(out),
                 "--quiet"]) == 1
    result = json.loads(out.read_text())
    assert result["failed"] == 16 and all(b["rounds"] == 1 and b["n"] == 0 for b in result["buckets"].values())
    assert "16 streams gave no sample" in capsys.readouterr().err
    # --pool against something that is not a region's gateway: unusable arguments.
    assert main(["gate", "measure", "--against", "http://127.0.0.1:1", "--pool", "h200-long", "--out", str(out),
                 "--quiet"]) == 2
