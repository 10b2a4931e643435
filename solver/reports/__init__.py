"""Reports on plans: the comparison table of planners (``compare``) and the SVG timeline (``render``).

Nothing here plans or checks a plan: these modules read finished plans and the cost model to tell people
how the planners did (``skrull compare``, ``make demo``, the service's ``/v1/compare`` and plan pictures).
"""
