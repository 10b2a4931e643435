"""The exact planner's integer linear programme: a backend-neutral model (``model``), the joint GDS/DACP
builder (``builder``), the CP-SAT and SCIP backends, and the budgeted child-process runner (``runner``)."""
