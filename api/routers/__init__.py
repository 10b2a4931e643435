"""One router per resource: plans, rank views, compare, profiles, health and metrics."""
