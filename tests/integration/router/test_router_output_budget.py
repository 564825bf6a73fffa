"""Output budgets through a real router and stub regions: ``suggest`` reports the quality-per-joule
max_tokens in the decision and the receipt and sends the request as asked; ``enforce`` sends the
region the budget (proxy and direct mode) and the receipt bills what ran."""

from __future__ import annotations

import pytest

from scheduler.client import AsyncSchedulerClient
from scheduler.config.loader import load_fleet
from scheduler.config.schema import OutputBudgetConfig, PolicyConfig
from scheduler.tickets import TicketKeyRing

from .conftest import TEST_REGIONS, Fleet, RouterFactory

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

MODEL = "llama-3.1-8b"
# Illustrative numbers for the test, not an evaluation.
TABLE = {"model": MODEL, "task_class": "summarize", "quality": [
    {"max_tokens": 8, "quality": 0.30}, {"max_tokens": 16, "quality": 0.80}, {"max_tokens": 64, "quality": 0.85}]}


def policy(mode: str) -> PolicyConfig:
    return load_fleet().policy("default").model_copy(
        update={"output_budget": OutputBudgetConfig.model_validate({"mode": mode, "tables": [TABLE]})})


async def test_suggest_reports_the_budget_and_sends_the_request_as_asked(
    stub_fleet: Fleet, make_router: RouterFactory,
) -> None:
    router = await make_router(stub_fleet.configs, policy=policy("suggest"))
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}") as client:
        generation = client.generate("a long text to summarise", model=MODEL, max_tokens=64, task_class="summarize")
        await generation.text()
        assert generation.receipt is not None
        sent = stub_fleet.regions[generation.receipt.region].log.bodies[-1]["max_tokens"]
        other = client.generate("no table for this task", model=MODEL, max_tokens=64, task_class="chat")
        await other.text()
    decision, receipt = generation.decision, generation.receipt
    assert decision is not None and receipt is not None
    budget = decision.output_budget
    assert budget.mode == "suggest" and not budget.enforced and budget.requested_max_tokens == 64
    assert budget.max_tokens < 64 and budget.quality < budget.quality_requested
    assert budget.energy_j < budget.energy_j_requested
    assert receipt.output_budget == budget and receipt.completion_tokens == 64
    assert sent == 64
    assert other.decision is not None and not other.decision.HasField("output_budget")


async def test_enforce_runs_the_request_at_the_budget_in_proxy_and_direct_mode(
    stub_fleet: Fleet, make_router: RouterFactory,
) -> None:
    router = await make_router(stub_fleet.configs, policy=policy("enforce"), http=True,
                               ticket_keys=TicketKeyRing.generate(TEST_REGIONS))
    async with AsyncSchedulerClient(f"127.0.0.1:{router.port}", http_url=f"http://127.0.0.1:{router.http_port}",
                                    ) as client:
        sent = []
        for mode in ("proxy", "direct"):
            generation = client.generate("a long text to summarise", model=MODEL, max_tokens=64,
                                         task_class="summarize", mode=mode)
            text = await generation.text()
            decision = generation.decision
            assert decision is not None
            budget = decision.output_budget
            assert budget.enforced and budget.requested_max_tokens == 64 and budget.max_tokens < 64
            assert len(text.split()) == budget.max_tokens  # the stub streams one word per token
            region = decision.ranked[0].region  # the stub regions never fail: the first target ran
            sent.append((stub_fleet.regions[region].log.bodies[-1]["max_tokens"], budget.max_tokens))
            if mode == "proxy":  # (stub regions sign no receipts in direct mode)
                receipt = generation.receipt
                assert receipt is not None and receipt.output_budget == budget
                assert receipt.completion_tokens == budget.max_tokens
    assert all(region_got == budget for region_got, budget in sent)
