"""Model prices for history: :mod:`spawnkit.config.pricing`, under its historical name.

The pricing table lives below the history package because budgets (:mod:`spawnkit.budgets.budget`)
price runs while they happen; history prices them afterwards with the same table.
"""

from ..config.pricing import PER_MILLION, ModelPrice, PriceDict, PricingTable, default_pricing

__all__ = ["PER_MILLION", "ModelPrice", "PriceDict", "PricingTable", "default_pricing"]
