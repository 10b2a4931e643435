"""Tenants share the queue fairly, on every backend: a solver takes the next job of the tenant with the
fewest jobs solving, then the one served least recently; each tenant's queued jobs and solver seconds are
bounded inside the submit transaction."""

from __future__ import annotations

import json

import pytest

from skrull.api.store.base import JobStore, NewJob, QuotaExceededError, TenantQuota
from skrull.api.tenants import plan_id_for, tenant_prefix


def job(tenant: str, n: int, *, budget_s: float = 1.0) -> NewJob:
    return NewJob(
        job_id=plan_id_for(tenant, json.dumps({"n": n})),
        request_json=json.dumps({"n": n}),
        solver="skrull",
        num_iterations=1,
        num_sequences=1,
        num_gpus=1,
        time_budget_s=budget_s,
    )


def test_a_tenant_behind_another_tenants_backlog_is_served_next(store: JobStore) -> None:
    """team-b queues 4 jobs, then team-a one: with one solver, team-a's job is the second one claimed
    (before: fifth, after all of team-b's)."""
    b_jobs = [job("team-b", n) for n in range(4)]
    a_job = job("team-a", 100)
    for j in (*b_jobs, a_job):
        store.submit(j)
    order = []
    for _ in range(5):
        claimed = store.claim(owner="solver-1", lease_s=30)
        assert claimed is not None
        order.append(claimed.job_id)
        store.fail(job_id=claimed.job_id, owner="solver-1", error_json="{}")
    assert order[0] == b_jobs[0].job_id
    assert order[1] == a_job.job_id
    assert order[2:] == [j.job_id for j in b_jobs[1:]]


def test_claims_alternate_between_tenants_with_backlogs(store: JobStore) -> None:
    for n in range(3):
        store.submit(job("team-b", n))
    for n in range(3):
        store.submit(job("", 10 + n))  # the default tenant
    tenants = []
    for _ in range(6):
        claimed = store.claim(owner="s", lease_s=30)
        assert claimed is not None
        tenants.append(claimed.job_id.partition("-")[0] if "-" in claimed.job_id else "")
        store.fail(job_id=claimed.job_id, owner="s", error_json="{}")
    b = tenant_prefix("team-b")
    assert tenants == [b, "", b, "", b, ""]


def test_a_tenant_with_a_job_solving_waits_behind_one_without(store: JobStore) -> None:
    store.submit(job("team-b", 0))
    store.submit(job("team-b", 1))
    assert store.claim(owner="s1", lease_s=30) is not None  # team-b solving one
    store.submit(job("team-a", 2))
    claimed = store.claim(owner="s2", lease_s=30)
    assert claimed is not None and claimed.job_id == job("team-a", 2).job_id


def test_each_tenant_has_its_own_quota_of_queued_jobs_and_solver_seconds(store: JobStore) -> None:
    quota_b = TenantQuota(tenant=tenant_prefix("team-b"), max_queued=3, max_solver_s=1000)
    for n in range(3):
        store.submit(job("team-b", n), max_queued=10, quota=quota_b)
    with pytest.raises(QuotaExceededError, match="SKRULL_TENANT_MAX_QUEUED_JOBS"):
        store.submit(job("team-b", 3), max_queued=10, quota=quota_b)
    # team-a is not affected by team-b's full share
    quota_a = TenantQuota(tenant=tenant_prefix("team-a"), max_queued=3, max_solver_s=1000)
    store.submit(job("team-a", 0), max_queued=10, quota=quota_a)
    # a duplicate of a queued job adds nothing and is answered, quota or not
    assert not store.submit(job("team-b", 0), max_queued=10, quota=quota_b).created
    # solver seconds: queued + solving budgets
    quota_d = TenantQuota(tenant="", max_queued=100, max_solver_s=1500)
    store.submit(job("", 1, budget_s=600), quota=quota_d)
    store.submit(job("", 2, budget_s=600), quota=quota_d)
    with pytest.raises(QuotaExceededError, match="SKRULL_TENANT_MAX_SOLVER_S"):
        store.submit(job("", 3, budget_s=600), quota=quota_d)
    store.submit(job("", 4, budget_s=60), quota=quota_d)
