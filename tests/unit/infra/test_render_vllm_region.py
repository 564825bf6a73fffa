"""infra/render.py renders Ray Serve regions only: a plain vLLM region (kind ``vllm``) is refused
by name, never rendered as a RayService that would start a second copy of its servers."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.unit.config.test_vllm_region import VLLM_REGION
from tests.unit.infra.infra_files import REPO, load_render

pytestmark = pytest.mark.timeout(60)


def test_a_vllm_region_is_refused_by_name(tmp_path: Path) -> None:
    regions = tmp_path / "regions"
    shutil.copytree(REPO / "regions", regions)
    (regions / "eu-byo.yaml").write_text(VLLM_REGION)
    render = load_render()
    with pytest.raises(ValueError, match=r"regions/eu-byo\.yaml: kind vllm: this renders Ray Serve regions only"):
        render.render(render.default_options(), regions, REPO / "policies")
