"""Precision tiers end to end: the decision lists each candidate's precision, the receipt says
which precision served the request, and a sensitive task class stays at bf16 even when it asks
for less, while a request that asks for fp8 gets the fp8 pool."""

from __future__ import annotations

import pytest

from scheduler.client import AsyncSchedulerClient, UnschedulableError

from .conftest import Fleet, RouterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# us-east serves llama-3.1-70b at bf16 on h200-long and at fp8 on h100-chat (regions/us-east.yaml).
MODEL = "llama-3.1-70b"


async def test_the_receipt_names_the_precision_that_served(stub_fleet: Fleet, make_router: RouterFactory) -> None:
    router = await make_router(stub_fleet.configs)
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        fp8 = client.generate("hi", model=MODEL, max_tokens=3, jurisdictions=["US"], precision="fp8",
                              decision_detail="full")
        await fp8.text()
        medical = client.generate("hi", model=MODEL, max_tokens=3, jurisdictions=["US"], task_class="medical",
                                  decision_detail="full")
        await medical.text()
        with pytest.raises(UnschedulableError) as refused:
            await client.generate("hi", model=MODEL, max_tokens=3, jurisdictions=["US"], task_class="medical",
                                  precision="fp8").text()
    assert fp8.receipt is not None and fp8.decision is not None
    assert (fp8.receipt.pool, fp8.receipt.precision) == ("h100-chat", "fp8")
    assert [c.precision for c in fp8.decision.ranked] == ["fp8"]
    assert medical.receipt is not None and medical.decision is not None
    assert (medical.receipt.pool, medical.receipt.precision) == ("h200-long", "bf16")
    assert {c.precision for c in medical.decision.ranked} == {"bf16"}
    assert any("reduced precision fp8" in r.reason for r in medical.decision.rejected)
    assert any("reduced precision fp8" in v.description for v in refused.value.violations)
