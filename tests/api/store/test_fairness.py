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


def test_a_solver_kept_for_short_work_takes_only_short_jobs(store: JobStore) -> None:
    """Claims with ``max_budget_s`` skip jobs of a larger budget however old they are; other claims take any."""
    long_job, short_job = job("team-b", 1, budget_s=600.0), job("team-a", 2, budget_s=2.0)
    store.submit(long_job)
    store.submit(short_job)
    claimed = store.claim(owner="short", lease_s=30, max_budget_s=10.0)
    assert claimed is not None and claimed.job_id == short_job.job_id
    assert store.claim(owner="short", lease_s=30, max_budget_s=10.0) is None
    claimed = store.claim(owner="any", lease_s=30)
    assert claimed is not None and claimed.job_id == long_job.job_id


def test_a_tenant_s_solver_seconds_add_its_queued_and_solving_jobs_and_what_it_holds_elsewhere(
    store: JobStore,
) -> None:
    store.submit(job("team-a", 1, budget_s=3.0))
    store.submit(job("team-a", 2, budget_s=4.0))
    store.submit(job("team-b", 3, budget_s=100.0))
    assert store.tenant_solver_s(tenant_prefix("team-a")) == pytest.approx(7.0)
    quota = TenantQuota(tenant=tenant_prefix("team-a"), max_queued=100, max_solver_s=10.0, held_elsewhere_s=2.5)
    with pytest.raises(QuotaExceededError):
        store.submit(job("team-a", 4, budget_s=1.0), quota=quota)  # 7 + 2.5 (a compare) + 1 > 10
    store.submit(job("team-a", 5, budget_s=0.5), quota=quota)


def test_idempotency_keys_are_bounded_per_tenant_keeping_the_newest(store: JobStore) -> None:
    """A tenant's oldest keys are forgotten past its bound; another tenant's keys are untouched."""
    a = TenantQuota(tenant=tenant_prefix("team-a"), max_queued=100, max_solver_s=1e6, max_idempotency_keys=3)
    b = TenantQuota(tenant=tenant_prefix("team-b"), max_queued=100, max_solver_s=1e6, max_idempotency_keys=3)
    store.submit(job("team-b", 99), idempotency_key=f"{b.tenant}:k", quota=b)
    for n in range(6):
        store.submit(job("team-a", n), idempotency_key=f"{a.tenant}:k{n}", quota=a)
    from skrull.api.store.base import IdempotencyConflictError

    for n in (3, 4, 5):  # the newest three still name their plans
        with pytest.raises(IdempotencyConflictError):
            store.submit(job("team-a", 50 + n), idempotency_key=f"{a.tenant}:k{n}", quota=a)
    # the oldest were forgotten: the key is free again (and now names the new plan)
    store.submit(job("team-a", 60), idempotency_key=f"{a.tenant}:k0", quota=a)
    with pytest.raises(IdempotencyConflictError):
        store.submit(job("team-b", 61), idempotency_key=f"{b.tenant}:k", quota=b)


def test_profiles_are_per_tenant_with_a_quota(store: JobStore) -> None:
    from skrull.api.store.base import ProfileQuotaError

    a, b = tenant_prefix("team-a"), tenant_prefix("team-b")
    assert store.put_profile("lab/x", '{"v": "b"}', scope=b, max_profiles=2)
    assert store.put_profile("lab/x", '{"v": "a"}', scope=a, max_profiles=2)  # the same name, another tenant
    assert store.put_profile("lab/x", '{"v": "default"}')
    assert store.get_profile("lab/x", scope=a) == '{"v": "a"}'
    assert store.get_profile("lab/x", scope=b) == '{"v": "b"}'
    assert store.get_profile("lab/x") == '{"v": "default"}'
    assert store.put_profile("lab/y", "{}", scope=a, max_profiles=2)
    with pytest.raises(ProfileQuotaError):
        store.put_profile("lab/z", "{}", scope=a, max_profiles=2)
    assert not store.put_profile("lab/y", "{}", scope=a, max_profiles=2)  # the identical one: no new row
    assert store.profile_names(scope=a) == ["lab/x", "lab/y"]
    assert store.profile_names(scope=b) == ["lab/x"]
    assert store.profile_names(scope="") == ["lab/x"]
