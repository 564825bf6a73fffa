"""A replica's cold start (scheduler.energy.cold_start): the pool's settings where given, else
derived from the weights to load and the GPUs' idle power."""

from __future__ import annotations

import pytest

from scheduler.energy.cold_start import ColdStart, cold_start
from scheduler.energy.hardware import GPU_CATALOGUE
from scheduler.energy.model_catalogue import MODEL_CATALOGUE

H100 = GPU_CATALOGUE["H100-80GB"]
EIGHT_B = MODEL_CATALOGUE["llama-3.1-8b"]
SEVENTY_B = MODEL_CATALOGUE["llama-3.1-70b"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("model", "precision", "tp", "seconds"), [
    # 30 s + the GPU's share of the weights at 2 GB/s.
    (EIGHT_B, "bf16", 1, 30 + 16.06e9 / 2e9),
    (SEVENTY_B, "bf16", 4, 30 + 141.1e9 / 4 / 2e9),
    (SEVENTY_B, "fp8", 2, 30 + 70.55e9 / 2 / 2e9),
])
def test_derived_from_the_weights_and_the_idle_power(model, precision: str, tp: int, seconds: float) -> None:  # type: ignore[no-untyped-def]
    derived = cold_start(H100, model, precision, tp)
    assert derived.source == "derived"
    assert derived.seconds == pytest.approx(seconds, rel=0.01)
    # every GPU of the replica at its idle draw (H100: 75 W) while it loads
    assert derived.joules == pytest.approx(derived.seconds * tp * 75.0)


@pytest.mark.timeout(30)
def test_the_pool_settings_win() -> None:
    assert cold_start(H100, EIGHT_B, "bf16", 1, 90.0, 5000.0) == ColdStart(90.0, 5000.0, "config")
    # Seconds given, joules derived from them.
    assert cold_start(H100, EIGHT_B, "bf16", 2, cold_start_s=10.0) == ColdStart(10.0, 1500.0, "config")
