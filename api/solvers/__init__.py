"""Where the service runs planners: processes beside the server, so no solve ever runs on its event loop.

``pool`` is the pool of solver processes and its supervisor (claims, leases, retries, hard limits) for the
queued jobs of ``POST /v1/plans``; ``job_solving`` turns one claimed job into stored iterations and a
validated plan, batch by batch for planners that stream; ``compare_pool`` runs ``POST /v1/compare`` in its
own bounded set of processes with a deadline that kills. The rest of the service (routers, store, long-polls)
never imports a planner.
"""
