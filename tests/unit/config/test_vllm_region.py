"""Regions of kind ``vllm`` (plain vLLM servers, docs/byo-vllm.md): what the schema accepts,
what it refuses (naming file, field and value), and the defaults the loader fills."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from scheduler.config.compile import compile_fleet
from scheduler.config.loader import ConfigError, load_region

pytestmark = pytest.mark.timeout(30)

VLLM_REGION = """
name: eu-byo
kind: vllm
jurisdiction: EU
grid_zone: SE
pue: 1.2
price_per_kwh: 0.08
location: {lat: 59.3, lon: 18.1}
pools:
  - name: a100-chat
    gpu: A100-80GB
    count: 8
    models:
      - {name: llama-3.1-8b, max_context: 32768}
    vllm:
      urls: [http://10.0.0.5:8000, http://10.0.0.6:8000]
      served_model_names: {llama-3.1-8b: meta-llama/Llama-3.1-8B-Instruct}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "eu-byo.yaml"
    path.write_text(text)
    return path


def edited(**changes: object) -> str:
    """The example with top-level keys replaced (None: removed)."""
    data = yaml.safe_load(VLLM_REGION)
    for key, value in changes.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return yaml.safe_dump(data)


def test_a_vllm_region_loads_with_its_servers_and_defaults(tmp_path: Path) -> None:
    region = load_region(write(tmp_path, VLLM_REGION))
    pool = region.pools[0]
    assert region.kind == "vllm"
    compiled = compile_fleet((region,)).regions[0]
    assert not compiled.tickets_enforced and not compiled.energy_measured
    # No endpoint given: the first server's, what the routers probe.
    assert region.endpoint == "http://10.0.0.5:8000"
    assert pool.vllm is not None and pool.vllm.urls == ("http://10.0.0.5:8000", "http://10.0.0.6:8000")
    served = compiled.pools[0]
    assert served.served_model_name("llama-3.1-8b") == "meta-llama/Llama-3.1-8B-Instruct"
    # A model without a served name is asked for by its catalogue name.
    assert served.served_model_name("llama-3.2-3b") == "llama-3.2-3b"


def test_a_given_endpoint_is_kept(tmp_path: Path) -> None:
    region = load_region(write(tmp_path, edited(endpoint="http://lb.byo.internal:8080")))
    assert region.endpoint == "http://lb.byo.internal:8080"


def test_regions_are_ray_serve_by_default_and_enforce_tickets(tmp_path: Path) -> None:
    data = yaml.safe_load(VLLM_REGION)
    data.pop("kind")
    data["endpoint"] = "http://127.0.0.1:8000/eu-byo"
    del data["pools"][0]["vllm"]
    region = load_region(write(tmp_path, yaml.safe_dump(data)))
    compiled = compile_fleet((region,)).regions[0]
    assert region.kind == "ray-serve" and compiled.tickets_enforced and compiled.energy_measured


@dataclass(frozen=True)
class Bad:
    name: str
    text: str
    field: str
    fragment: str


def _pool(**vllm: object) -> list[dict[str, object]]:
    pool = yaml.safe_load(VLLM_REGION)["pools"][0]
    pool["vllm"] = vllm or None
    if not vllm:
        del pool["vllm"]
    return [pool]


BAD = [
    Bad("a vllm pool without servers", edited(pools=_pool(), endpoint="http://x:1"), "(top level)",
        "kind 'vllm': pools ['a100-chat'] have no vllm.urls"),
    Bad("servers on a ray-serve region", edited(kind="ray-serve", endpoint="http://x:1"), "(top level)",
        "pools ['a100-chat'] list vllm servers, which only a region of kind 'vllm' has"),
    Bad("an unknown kind", edited(kind="litellm"), "kind", "'litellm'"),
    Bad("no urls", edited(pools=_pool(urls=[]), endpoint="http://x:1"), "pools[0].vllm.urls", "at least 1"),
    Bad("a url that is not one", edited(pools=_pool(urls=["10.0.0.5:8000"])), "pools[0].vllm.urls[0]",
        "'10.0.0.5:8000'"),
    Bad("a server twice", edited(pools=_pool(urls=["http://a:1", "http://a:1"])), "pools[0].vllm",
        "a server is listed twice: ['http://a:1']"),
    Bad("a served name for a model the pool lacks",
        edited(pools=_pool(urls=["http://a:1"], served_model_names={"qwen3-32b": "Qwen/Qwen3-32B"})),
        "pools[0]", "vllm.served_model_names: ['qwen3-32b'] are not models of this pool"),
    Bad("a served name for an unknown model",
        edited(pools=_pool(urls=["http://a:1"], served_model_names={"gpt-9": "x"})),
        "pools[0].vllm.served_model_names.gpt-9", "'gpt-9' is not a known model"),
    Bad("an API key's variable that is not a name", edited(pools=_pool(urls=["http://a:1"], api_key_env="my-key")),
        "pools[0].vllm.api_key_env", "'my-key'"),
    Bad("autoscaling on a vllm region", edited(pools=[{**_pool(urls=["http://a:1"])[0], "models": [
        {"name": "llama-3.1-8b", "max_context": 32768, "autoscaling": {"min_replicas": 0, "max_replicas": 2}}]}]),
        "(top level)", "plain vLLM servers are neither autoscaled nor woken from zero; remove autoscaling of "
        "a100-chat/llama-3.1-8b"),
    Bad("a cold start on a vllm region", edited(pools=[{**_pool(urls=["http://a:1"])[0], "cold_start_s": "30s"}]),
        "(top level)", "remove cold_start of a100-chat"),
    Bad("eco on a vllm region", edited(eco=True), "(top level)", "kind 'vllm': eco needs the region to set"),
    Bad("a local profile on a vllm region", edited(local={"pools": [{"pool": "a100-chat"}]}), "(top level)",
        "kind 'vllm': a plain vLLM region has no local profile"),
]


@pytest.mark.parametrize("case", BAD, ids=lambda c: c.name)
def test_bad_vllm_regions_name_file_field_and_value(tmp_path: Path, case: Bad) -> None:
    path = write(tmp_path, case.text)
    with pytest.raises(ConfigError) as caught:
        load_region(path)
    messages = [str(issue) for issue in caught.value.issues]
    assert any(m.startswith(f"{path}: {case.field}: ") and case.fragment in m for m in messages), messages
    # Pydantic's echo of an item's error ("should have at least 1 item after validation") around
    # the field is not listed.
    assert not any("after validation, not 0" in m and not m.startswith(f"{path}: {case.field}: ")
                   for m in messages), messages
