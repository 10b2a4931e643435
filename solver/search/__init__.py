"""One search over every layout the plan format allows (``auto``): starts, moves, budgets, bounds."""
