"""Each model's replica range from its region file (scheduler.config.autoscaling): the blocks as
given, the documented defaults, the Ray Serve autoscaling_config, and the error when a pool's
models at their maxima need more GPUs than it has."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.config.autoscaling import ReplicaRange, replica_ranges
from scheduler.config.loader import ConfigError, load_region
from scheduler.config.schema import PoolConfig

EIGHT_B = {"name": "llama-3.1-8b", "max_context": 131072}
SEVENTY_B = {"name": "llama-3.1-70b", "max_context": 65536, "tensor_parallel": 4}


def pool_config(count: int, *models: dict[str, Any], **extra: Any) -> PoolConfig:
    return PoolConfig.model_validate({"name": "p", "gpu": "H100-80GB", "count": count, "power_cap_w": 700,
                                      "models": list(models), **extra})


@dataclass
class Case:
    name: str
    pool: PoolConfig
    ranges: dict[str, tuple[int, int]]


CASES = [
    Case("one model, no block: one replica up, the whole pool at most", pool_config(64, EIGHT_B),
         {"llama-3.1-8b": (1, 64)}),
    Case("two models, no blocks: the GPUs split evenly", pool_config(128, EIGHT_B, SEVENTY_B),
         {"llama-3.1-8b": (1, 64), "llama-3.1-70b": (1, 16)}),
    Case("a block, and the default for the rest of the GPUs",
         pool_config(128, {**EIGHT_B, "autoscaling": {"min_replicas": 0, "max_replicas": 64}}, SEVENTY_B),
         {"llama-3.1-8b": (0, 64), "llama-3.1-70b": (1, 16)}),
    Case("too small for one of each at once: at least one each (2 GPUs each: 0 and 2 replicas)",
         pool_config(4, SEVENTY_B, EIGHT_B), {"llama-3.1-70b": (1, 1), "llama-3.1-8b": (1, 2)}),
]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_replica_ranges(case: Case) -> None:
    ranges = replica_ranges(case.pool)
    assert {model: (r.min_replicas, r.max_replicas) for model, r in ranges.items()} == case.ranges


@pytest.mark.timeout(30)
def test_ray_config_derives_the_target_from_max_num_seqs_unless_given() -> None:
    derived = ReplicaRange(0, 4).ray_config(max_num_seqs=256)
    assert derived == {"min_replicas": 0, "initial_replicas": 0, "max_replicas": 4, "target_ongoing_requests": 192.0,
                       "upscale_delay_s": 30.0, "downscale_delay_s": 600.0, "metrics_interval_s": 10.0,
                       "look_back_period_s": 30.0}
    assert ReplicaRange(1, 2, target_ongoing_requests=8).ray_config(256)["target_ongoing_requests"] == 8


@pytest.mark.timeout(30)
def test_blocks_whose_maxima_exceed_the_pool_are_an_error_naming_file_field_and_values(tmp_path: Path) -> None:
    raw = yaml.safe_load(Path("regions/eu-north.yaml").read_text())
    raw["pools"][0]["models"] = [
        {**EIGHT_B, "autoscaling": {"min_replicas": 0, "max_replicas": 48}},
        {**SEVENTY_B, "autoscaling": {"min_replicas": 0, "max_replicas": 8}},
    ]
    path = tmp_path / "eu-north.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ConfigError) as raised:
        load_region(path)
    message = str(raised.value)
    print(f"\n{message}")
    assert str(path) in message and "pools[0]" in message
    assert "sums to 80 GPUs (models[0] llama-3.1-8b: 48 x 1, models[1] llama-3.1-70b: 8 x 4)" in message
    assert "count=64" in message


@pytest.mark.timeout(30)
def test_min_above_max_is_an_error() -> None:
    with pytest.raises(ValueError, match="min_replicas 3 exceeds max_replicas 2"):
        pool_config(8, {**EIGHT_B, "autoscaling": {"min_replicas": 3, "max_replicas": 2}})
