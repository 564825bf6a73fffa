"""``PowerCapper`` against the fake NVML library: set, clamp, read back, refuse, restore, dry run."""

from __future__ import annotations

import inspect

import pynvml
import pytest

from scheduler.config.schema import PoolConfig, RegionConfig
from scheduler.plugins.checked_fleet import load_checked_fleet
from scheduler.region.power_caps import (
    PowerCapper,
    PowerLimitLibrary,
    RegionCapReport,
    apply_region_caps,
    dry_run_report,
    matches,
    region_pool_caps,
)
from tests.unit.region.fake_nvml import FakeGpu, FakeNvml


@pytest.fixture(scope="module")
def regions() -> dict[str, RegionConfig]:
    return {r.name: r for r in load_checked_fleet().regions}


def with_caps(region: RegionConfig, eco: bool = False, **caps: float) -> RegionConfig:
    pools = tuple(p.model_copy(update={"power_cap_w": caps[p.name]}) if p.name in caps else p for p in region.pools)
    return region.model_copy(update={"eco": eco, "pools": pools})


def h100(**kw: object) -> FakeGpu:
    return FakeGpu(name="NVIDIA H100 80GB HBM3", **kw)  # type: ignore[arg-type]


def test_the_fake_has_every_call_of_the_protocol_as_pynvml_has_it() -> None:
    names = [n for n in dir(PowerLimitLibrary) if n.startswith("nvml")]
    assert len(names) == 8
    for name in names:
        real, fake = getattr(pynvml, name), getattr(FakeNvml, name)
        assert len(inspect.signature(real).parameters) == len(inspect.signature(fake).parameters) - 1, name
    assert issubclass(pynvml.NVMLError, Exception)


@pytest.mark.parametrize(("catalogue", "nvml", "same"), [
    ("H100-80GB", "NVIDIA H100 80GB HBM3", True),
    ("H100-80GB", "NVIDIA H100 PCIe", True),
    ("H200-141GB", "NVIDIA H200", True),
    ("A100-80GB", "NVIDIA A100-SXM4-80GB", True),
    ("A100-40GB", "NVIDIA A100-SXM4-80GB", False),
    ("A100-80GB", "NVIDIA A100 80GB PCIe", True),
    ("H100-80GB", "NVIDIA H200", False),
    ("L4", "NVIDIA L4", True),
    ("L4", "NVIDIA L40S", False),
    ("B200", "NVIDIA B200", True),
])
def test_device_names_match_the_catalogue(catalogue: str, nvml: str, same: bool) -> None:
    assert matches(catalogue, nvml) is same


def test_sets_the_target_in_milliwatts_and_reads_it_back(regions: dict[str, RegionConfig]) -> None:
    region = with_caps(regions["us-east"], **{"h100-chat": 450.0})
    library = FakeNvml(gpus=[h100(), h100()])
    capper = PowerCapper(library)
    assert capper.open()
    report = capper.apply(region, region_pool_caps(region, ["h100-chat"]))
    assert report.mode == "nvml"
    (pool,) = report.pools
    assert pool.applied and pool.target_w == 450.0
    assert library.set_calls == [(0, 450_000), (1, 450_000)]
    for device in pool.devices:
        assert (device.from_w, device.to_w, device.read_back_w, device.clamped) == (700.0, 450.0, 450.0, "")
        assert device.applied and not device.assumed
    assert "set GPU 0 (NVIDIA H100 80GB HBM3): 700 W -> 450 W" in "\n".join(pool.lines())


def test_a_request_outside_the_constraints_is_clamped_and_says_to_which(regions: dict[str, RegionConfig]) -> None:
    region = with_caps(regions["us-east"], **{"h100-chat": 150.0})
    library = FakeNvml(gpus=[h100(min_limit_mw=200_000)])
    capper = PowerCapper(library)
    capper.open()
    (device,) = capper.apply(region, region_pool_caps(region, ["h100-chat"])).pools[0].devices
    assert (device.requested_w, device.to_w, device.clamped, device.min_w) == (150.0, 200.0, "min", 200.0)
    assert device.applied and library.set_calls == [(0, 200_000)]
    assert "clamped to the device's min 200 W from 150 W" in device.describe(False)


def test_without_root_nothing_is_claimed(regions: dict[str, RegionConfig]) -> None:
    region = with_caps(regions["us-east"], **{"h100-chat": 450.0})
    capper = PowerCapper(FakeNvml(gpus=[h100()], root=False))
    capper.open()
    pool = capper.apply(region, region_pool_caps(region, ["h100-chat"])).pools[0]
    (device,) = pool.devices
    assert not device.applied and not pool.applied
    assert "needs root" in device.error and device.describe(False).startswith("NOT set")
    assert capper.restore() == []


def test_a_limit_the_driver_did_not_keep_is_not_reported_as_set(regions: dict[str, RegionConfig]) -> None:
    region = with_caps(regions["us-east"], **{"h100-chat": 450.0})
    capper = PowerCapper(FakeNvml(gpus=[h100(limit_sticks=False)]))
    capper.open()
    (device,) = capper.apply(region, region_pool_caps(region, ["h100-chat"])).pools[0].devices
    assert not device.applied and device.read_back_w == 700.0 and "read back" in device.error


def test_a_device_already_at_the_target_is_left_alone(regions: dict[str, RegionConfig]) -> None:
    library = FakeNvml(gpus=[h100()])
    capper = PowerCapper(library)
    capper.open()
    region = regions["us-east"]  # power_cap_w defaults to TDP: 700 W
    (device,) = capper.apply(region, region_pool_caps(region, ["h100-chat"])).pools[0].devices
    assert library.set_calls == [] and device.unchanged and not device.applied
    assert "already at the target" in device.describe(False)


def test_only_devices_of_the_pools_gpu_and_the_lower_cap_when_pools_share_them(
        regions: dict[str, RegionConfig]) -> None:
    region = regions["us-east"]
    second = region.pools[1].model_copy(update={"name": "h100-batch", "power_cap_w": 400.0})
    region = region.model_copy(update={"pools": (*region.pools, second)})
    region = with_caps(region, **{"h100-chat": 500.0})
    library = FakeNvml(gpus=[h100(), FakeGpu(name="NVIDIA H200", max_limit_mw=700_000)])
    capper = PowerCapper(library)
    capper.open()
    report = capper.apply(region, region_pool_caps(region))
    by_pool = {p.pool: p for p in report.pools}
    assert [d.index for d in by_pool["h200-long"].devices] == [1]
    assert library.gpus[1].limit_mw == 700_000  # h200-long: TDP, unchanged
    assert library.gpus[0].limit_mw == 400_000  # the two H100 pools share GPU 0: the lower cap
    assert by_pool["h100-chat"].devices[0].shared_with == "h100-chat, h100-batch"
    assert by_pool["h100-batch"].devices == by_pool["h100-chat"].devices
    assert by_pool["h200-long"].devices[0].shared_with == ""


def test_restore_puts_back_what_was_found(regions: dict[str, RegionConfig]) -> None:
    region = with_caps(regions["us-east"], **{"h100-chat": 450.0})
    library = FakeNvml(gpus=[h100(limit_mw=650_000)])
    capper = PowerCapper(library)
    capper.open()
    capper.apply(region, region_pool_caps(region, ["h100-chat"]))
    assert library.gpus[0].limit_mw == 450_000
    (restored,) = capper.restore()
    assert restored.applied and library.gpus[0].limit_mw == 650_000
    capper.close()
    assert library.shutdowns == 1


def test_eco_sets_the_efficient_cap(regions: dict[str, RegionConfig]) -> None:
    region = with_caps(regions["us-east"], eco=True)
    library = FakeNvml(gpus=[h100()])
    capper = PowerCapper(library)
    capper.open()
    (pool,) = capper.apply(region, region_pool_caps(region, ["h100-chat"])).pools
    assert pool.eco and pool.target_w == pool.eco_w < pool.configured_w == 700.0
    assert library.gpus[0].limit_mw == round(pool.eco_w * 1000)


def test_eco_never_raises_a_configured_cap(regions: dict[str, RegionConfig]) -> None:
    region = with_caps(regions["us-east"], eco=True, **{"h100-chat": 250.0})
    (cap,) = region_pool_caps(region, ["h100-chat"]).values()
    assert cap.eco_w > 250.0 and cap.target_w == 250.0


def test_without_a_gpu_it_is_a_dry_run_that_says_what_it_would_set(regions: dict[str, RegionConfig]) -> None:
    region = with_caps(regions["eu-north"], eco=True)
    report, capper = apply_region_caps(region, ["h200-long", "a100-batch"],
                                       capper=PowerCapper(FakeNvml(library_found=False)))
    assert report.mode == "dry-run" and not capper.available
    assert "LibraryNotFound" in report.reason
    text = "\n".join(report.lines())
    assert "applied" not in text and "read back" not in text
    for index, pool in enumerate(report.pools):
        assert not pool.applied and pool.mode == "dry-run" and pool.reason == report.reason
        (device,) = pool.devices
        assert device.index == index and device.assumed and device.from_w == pool.tdp_w
        assert device.to_w == pool.eco_w and not device.applied and device.read_back_w is None
        assert f"would set GPU {index} ({pool.gpu}): {pool.tdp_w:.0f} W (assumed: the default limit, TDP) -> " \
               f"{pool.eco_w:.0f} W" in text
    assert text.count("dry run: no GPU") == 2


def test_no_device_and_the_dry_run_switch_are_dry_runs_too(regions: dict[str, RegionConfig],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    region = regions["us-east"]
    report, _ = apply_region_caps(region, ["h200-long"], capper=PowerCapper(FakeNvml(gpus=[])))
    assert report.mode == "dry-run" and report.reason == "NVML sees no GPU"
    monkeypatch.setenv("SCHEDULER_POWER_CAPS", "dry-run")
    library = FakeNvml(gpus=[h100()])
    report, _ = apply_region_caps(region, ["h100-chat"], capper=PowerCapper(library))
    assert report.mode == "dry-run" and "SCHEDULER_POWER_CAPS=dry-run" in report.reason
    assert library.set_calls == [] and not library.initialised


def test_a_node_without_the_pools_gpu_sets_nothing_and_says_so(regions: dict[str, RegionConfig]) -> None:
    capper = PowerCapper(FakeNvml(gpus=[FakeGpu(name="NVIDIA L4", limit_mw=72_000, max_limit_mw=72_000)]))
    capper.open()
    (pool,) = capper.apply(regions["us-east"], region_pool_caps(regions["us-east"], ["h200-long"])).pools
    assert pool.mode == "nvml" and pool.devices == () and "no GPU of type H200-141GB" in pool.reason


def test_the_report_round_trips_as_json(regions: dict[str, RegionConfig]) -> None:
    import json

    report = dry_run_report(with_caps(regions["eu-north"], eco=True), ["h200-long", "a100-batch"])
    assert RegionCapReport.from_dict(json.loads(json.dumps(report.as_dict()))) == report


def test_real_pynvml_without_gpu_dry_runs(regions: dict[str, RegionConfig]) -> None:
    """On this machine (no NVIDIA driver) the real library cannot initialise: a dry run. On a
    GPU machine this opens NVML and reads the devices (scripts/gpu_power_cap_check.py sets)."""
    capper = PowerCapper()
    if capper.open():
        capper.close()
        pytest.skip("a GPU is here: scripts/gpu_power_cap_check.py checks the real path")
    report = capper.apply(regions["us-east"], region_pool_caps(regions["us-east"], ["h200-long"]))
    assert report.mode == "dry-run" and not any(p.applied for p in report.pools)


def test_pool_config_caps_stay_validated_against_tdp() -> None:
    with pytest.raises(ValueError, match="exceeds the H100-80GB TDP"):
        PoolConfig(name="p", gpu="H100-80GB", count=1, power_cap_w=800,
                   models=({"name": "llama-3.1-8b", "max_context": 8192},))  # type: ignore[arg-type]


def _check_script():  # type: ignore[no-untyped-def]
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "scripts" / "gpu_power_cap_check.py"
    spec = importlib.util.spec_from_file_location("gpu_power_cap_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_check_script_exits_2_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    script = _check_script()
    monkeypatch.setattr("sys.argv", ["gpu_power_cap_check.py", "--no-load"])
    if PowerCapper().open():
        pytest.skip("a GPU is here: run the script itself (it sets limits; needs root)")
    assert script.main() == 2


def test_the_gpu_check_script_compares_with_the_model() -> None:
    from scheduler.energy.hardware import GPU_CATALOGUE

    script = _check_script()
    h100 = GPU_CATALOGUE["H100-80GB"]
    assert script.catalogue_gpu("NVIDIA H100 80GB HBM3") is h100
    # A GEMM drawing 690 W under a 400 W cap slows with the clock; a copy drawing 450 W does not.
    compute = script.model_ratio(h100, 400.0, 690.0, compute=True)
    assert 0.6 < compute < 0.95
    assert script.model_ratio(h100, 400.0, 450.0, compute=False) == 1.0
    assert script.model_ratio(h100, 700.0, 690.0, compute=True) == 1.0


def _gateway_run(region: RegionConfig, pools: list[str]):  # type: ignore[no-untyped-def]
    """The gateway's constructor (without Ray: Serve awaits the same async __init__), its
    ``GET /power-caps``, then its teardown."""
    import asyncio
    import json

    from scheduler.region.gateway import GatewaySettings, PoolEngine, RegionGateway

    cls = RegionGateway.func_or_class
    settings = GatewaySettings(region=region, pools={p: (PoolEngine("tiny-llama", 2048),) for p in pools},
                               tickets="disabled")

    async def run() -> tuple[int, dict[str, object], object]:
        gateway = cls.__new__(cls)
        await gateway.__init__({p: {"tiny-llama": object()} for p in pools}, settings)
        answer = await gateway._power_caps_view(None)
        profiles = dict(gateway._profiles)
        await gateway.__del__()

        class Stopped(cls):  # type: ignore[misc, valid-type]
            def __del__(self) -> None:  # torn down above: nothing for the garbage collector to await
                pass

        gateway.__class__ = Stopped
        return answer.status_code, json.loads(answer.body), profiles

    return asyncio.run(run())


def test_the_gateway_dry_runs_at_start_without_a_gpu_and_shows_it(regions: dict[str, RegionConfig],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("scheduler.region.power_caps._load_pynvml", lambda: FakeNvml(library_found=False))
    status, body, profiles = _gateway_run(with_caps(regions["eu-north"], eco=True), ["h200-long", "a100-batch"])
    report = RegionCapReport.from_dict(body)
    assert status == 200 and report.mode == "dry-run" and report.eco
    assert [p.pool for p in report.pools] == ["h200-long", "a100-batch"]
    # The region's model-based bill is for its pools at the cap it would set.
    assert {name: profile.cap_w for name, profile in profiles.items()} == {p.pool: p.target_w for p in report.pools}


def test_the_gateway_sets_caps_at_start_and_restores_them_when_it_stops(regions: dict[str, RegionConfig],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    library = FakeNvml(gpus=[FakeGpu(name="NVIDIA H200", limit_mw=700_000)])
    monkeypatch.setattr("scheduler.region.power_caps._load_pynvml", lambda: library)
    monkeypatch.setattr("scheduler.energy.nvml._load_pynvml", lambda: FakeNvml(library_found=False))
    status, body, _ = _gateway_run(with_caps(regions["us-east"], **{"h200-long": 500.0}), ["h200-long"])
    (pool,) = RegionCapReport.from_dict(body).pools
    assert status == 200 and pool.applied and pool.devices[0].read_back_w == 500.0
    assert library.set_calls == [(0, 500_000), (0, 700_000)]  # set at start, put back at stop
    assert library.gpus[0].limit_mw == 700_000
