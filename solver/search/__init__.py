"""One search over every layout the contract allows (``auto``): starts, moves, budgets, bounds."""
