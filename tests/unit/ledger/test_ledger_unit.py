"""Ledger pieces that need no server: key/field format, months, budget levels, budget files."""

from __future__ import annotations

from pathlib import Path

import pytest

from scheduler.errors import BudgetExhausted
from scheduler.ledger.budget import BudgetError, TenantBudget, load_budgets
from scheduler.ledger.ledger import Ledger, LedgerEntry, month_of
from scheduler.state.memory_store import MemoryStore

JAN_31_LATE = 1_769_903_999.0  # 2026-01-31 23:59:59 UTC


def test_entry_writes_the_shared_format() -> None:
    e = LedgerEntry("acme", "eu-north", 12.5, 0.4, "marginal-v1", at=JAN_31_LATE)
    assert e.month == "2026-01" and month_of(JAN_31_LATE + 1) == "2026-02"
    assert e.writes() == (
        ("ledger:acme:2026-01", "eu-north|marginal-v1|energy_j", 12.5),
        ("ledger:acme:2026-01", "eu-north|marginal-v1|carbon_g", 0.4),
        ("ledger:acme:2026-01", "eu-north|marginal-v1|requests", 1.0),
        ("ledger:acme:2026-01", "eu-north|marginal-v1|prompt_tokens", 0.0),
        ("ledger:acme:2026-01", "eu-north|marginal-v1|completion_tokens", 0.0),
    )
    assert e.key is None  # no decision id: nothing to tell a retry by
    target = LedgerEntry("acme", "eu-north", 1.0, 0.1, "model-v1", at=JAN_31_LATE, decision_id="d1", pool="h200-long")
    assert target.key == "ledger_entry:d1:eu-north:h200-long"


@pytest.mark.parametrize(("energy_j", "carbon_g", "level", "what"), [
    (10.0, 1.0, "ok", ""),
    (60.0, 1.0, "soft", "energy_j"),
    (10.0, 6.0, "soft", "carbon_g"),
    (60.0, 11.0, "hard", "carbon_g"),
    (100.0, 1.0, "hard", "energy_j"),
])
def test_budget_levels(energy_j: float, carbon_g: float, level: str, what: str) -> None:
    budget = TenantBudget(soft_energy_j=50, hard_energy_j=100, soft_carbon_g=5, hard_carbon_g=10)
    assert budget.level(energy_j, carbon_g)[:2] == (level, what)


async def test_check_and_record_with_the_memory_store() -> None:
    warned = []
    ledger = Ledger(MemoryStore(), {"acme": TenantBudget(soft_energy_j=5.0, hard_energy_j=10.0)},
                    critical_workload_classes=("interactive",), clock=lambda: JAN_31_LATE,
                    on_soft_limit=warned.append)
    assert (await ledger.check("nobody", "batch")).level == "ok"
    await ledger.record(LedgerEntry("acme", "r", 6.0, 0.1, "shared-v1", at=JAN_31_LATE))
    assert (await ledger.check("acme", "batch")).level == "soft" and len(warned) == 1
    await ledger.record(LedgerEntry("acme", "r", 6.0, 0.1, "shared-v1", at=JAN_31_LATE))
    with pytest.raises(BudgetExhausted, match="hard energy_j budget"):
        await ledger.check("acme", "batch")
    assert (await ledger.check("acme", "interactive")).exempt


def test_budget_file_errors_name_file_field_and_value(tmp_path: Path) -> None:
    path = tmp_path / "budgets.yaml"
    path.write_text("tenants:\n  acme: {soft_kwh: 20, hard_kwh: 10}\n  beta: {hard_kwh: -1}\n  gamma: {hrad_kwh: 3}\n")
    with pytest.raises(BudgetError) as caught:
        load_budgets(path)
    text = str(caught.value)
    print("\n" + text)
    assert f"{path}: tenants.acme:" in text and "above the hard limit" in text
    assert f"{path}: tenants.beta.hard_kwh:" in text and "-1" in text
    assert f"{path}: tenants.gamma.hrad_kwh:" in text


def test_budget_file_units(tmp_path: Path) -> None:
    path = tmp_path / "budgets.yaml"
    path.write_text("tenants:\n  acme: {soft_kwh: 1, hard_kg_co2e: 2}\n")
    budget = load_budgets(path)["acme"]
    assert budget == TenantBudget(soft_energy_j=3.6e6, hard_carbon_g=2000.0)
