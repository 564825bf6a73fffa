"""The tenant energy ledger: joules and gCO2e per tenant, month, region and attribution rule;
per-tenant budgets."""
