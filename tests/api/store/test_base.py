"""The job store contract (``api.store.base``) on every backend, a real SQLite file and a real PostgreSQL
database: idempotent submission, leases, recovery, durability."""

from __future__ import annotations

import json
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.api.store.base import IdempotencyConflictError, IterationRecord, JobStore, NewJob, ProfileConflictError
from tests.api.store.conftest import Backend

REASON = json.dumps({"type": "urn:skrull:problem:solver-died", "detail": "died"})


def job(n: int, *, iterations: int = 1) -> NewJob:
    return NewJob(
        job_id=f"job{n:04d}",
        request_json=json.dumps({"n": n}),
        solver="skrull",
        num_iterations=iterations,
        num_sequences=3,
        num_gpus=4,
        time_budget_s=1.0,
    )


def record(job_id: str, index: int) -> IterationRecord:
    return IterationRecord(
        job_id=job_id,
        index=index,
        doc_json=json.dumps({"index": index}),
        digest=f"d{index}",
        wall_ms=1.0,
        status="heuristic",
        bound_ms=None,
        pending_json="[]",
    )


def test_submitting_the_same_job_twice_stores_it_once(store: JobStore) -> None:
    first = store.submit(job(1))
    again = store.submit(job(1))
    assert first.created and not again.created
    assert again.job.job_id == first.job.job_id
    assert store.count_by_status() == {"queued": 1}


def test_refuses_an_idempotency_key_reused_for_a_different_request(store: JobStore) -> None:
    store.submit(job(1), idempotency_key="run-7/step-100")
    assert not store.submit(job(1), idempotency_key="run-7/step-100").created
    with pytest.raises(IdempotencyConflictError, match="job0001"):
        store.submit(job(2), idempotency_key="run-7/step-100")
    assert store.get("job0002") is None


def test_claims_the_oldest_queued_job_first_and_only_once(store: JobStore) -> None:
    for n in range(3):
        store.submit(job(n))
    claimed = [store.claim(owner="w", lease_s=10) for _ in range(4)]
    assert [c.job_id if c else None for c in claimed] == ["job0000", "job0001", "job0002", None]
    assert all(c.attempts == 1 for c in claimed if c)


def test_concurrent_claims_from_two_connections_never_share_a_job(backend: Backend) -> None:
    stores = [backend.open() for _ in range(2)]
    for n in range(60):
        stores[0].submit(job(n))
    got: list[list[str]] = [[], [], [], []]

    def claim_all(k: int) -> None:
        s = stores[k % 2]
        while (c := s.claim(owner=f"w{k}", lease_s=10)) is not None:
            got[k].append(c.job_id)

    threads = [threading.Thread(target=claim_all, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [j for g in got for j in g]
    assert sorted(every) == [f"job{n:04d}" for n in range(60)]


def test_only_the_lease_owner_may_publish_or_complete(store: JobStore) -> None:
    store.submit(job(1, iterations=2))
    claimed = store.claim(owner="a", lease_s=10)
    assert claimed is not None
    assert not store.publish_iteration(record("job0001", 0), owner="b")
    assert store.publish_iteration(record("job0001", 0), owner="a")
    assert store.get("job0001").iterations_solved == 1
    assert not store.complete(job_id="job0001", owner="b", plan_json="{}")
    assert store.complete(job_id="job0001", owner="a", plan_json='{"plan": 1}', iterations=[record("job0001", 1)])
    done = store.get("job0001")
    assert done.status == "solved" and done.plan_json == '{"plan": 1}' and done.iterations_solved == 2
    assert done.lease_owner is None
    assert [r.index for r in store.iterations("job0001")] == [0, 1]


def test_refuses_to_complete_a_job_with_iterations_missing(store: JobStore) -> None:
    store.submit(job(1, iterations=3))
    store.claim(owner="a", lease_s=10)
    store.publish_iteration(record("job0001", 0), owner="a")
    with pytest.raises(ValueError, match="2 of 3 iterations"):
        store.complete(job_id="job0001", owner="a", plan_json="{}", iterations=[record("job0001", 1)])
    unchanged = store.get("job0001")
    assert unchanged.status == "solving" and unchanged.iterations_solved == 1
    assert store.iteration("job0001", 1) is None


def test_a_dead_owners_job_is_retried_once_then_failed_with_the_reason(store: JobStore) -> None:
    store.submit(job(1))
    store.claim(owner="a", lease_s=10)
    first = store.release(owner="a", reason_json=REASON, max_attempts=2)
    assert [(r.job_id, r.status) for r in first] == [("job0001", "queued")]
    assert store.get("job0001").last_error_json == REASON
    store.claim(owner="b", lease_s=10)
    second = store.release(owner="b", reason_json=REASON, max_attempts=2)
    assert [(r.job_id, r.status) for r in second] == [("job0001", "failed")]
    failed = store.get("job0001")
    assert failed.status == "failed" and failed.error_json == REASON and failed.attempts == 2


def test_releasing_at_shutdown_does_not_charge_an_attempt(store: JobStore) -> None:
    store.submit(job(1))
    for _ in range(5):
        store.claim(owner="a", lease_s=10)
        store.release(owner="a", reason_json=REASON, max_attempts=2, count_attempt=False)
    again = store.get("job0001")
    assert again.status == "queued" and again.attempts == 0


def test_expired_leases_are_taken_back(store: JobStore) -> None:
    store.submit(job(1))
    store.submit(job(2))
    store.claim(owner="crashed", lease_s=0.01)
    store.claim(owner="alive", lease_s=60)
    time.sleep(0.05)
    recovered = store.recover_expired(reason_json=REASON, max_attempts=2)
    assert [(r.job_id, r.status) for r in recovered] == [("job0001", "queued")]
    assert store.get("job0002").status == "solving"


def test_heartbeat_keeps_a_lease_alive_and_fails_once_it_is_lost(store: JobStore) -> None:
    store.submit(job(1))
    # A lease long enough that the heartbeat lands inside it however loaded the machine; the sleep then
    # outlasts it, so only the heartbeat's renewal keeps the job from being taken back.
    store.claim(owner="a", lease_s=2.0)
    assert store.heartbeat(job_id="job0001", owner="a", lease_s=60)
    time.sleep(2.5)
    assert store.recover_expired(reason_json=REASON, max_attempts=2) == []
    store.release(owner="a", reason_json=REASON, max_attempts=2)
    assert not store.heartbeat(job_id="job0001", owner="a", lease_s=60)


def test_an_expired_lease_is_fenced_off_before_anyone_takes_it_back(store: JobStore) -> None:
    # A solver that paused past its lease (or whose server vanished) must not write, even while the job is
    # still marked solving under its name: the next owner would find its work overwritten.
    store.submit(job(1, iterations=2))
    store.claim(owner="late", lease_s=0.05)
    time.sleep(0.12)
    assert store.get("job0001").lease_owner == "late"  # nobody has taken it back yet
    assert not store.heartbeat(job_id="job0001", owner="late", lease_s=60)  # no resurrection
    assert not store.publish_iteration(record("job0001", 0), owner="late")
    assert not store.complete(
        job_id="job0001", owner="late", plan_json="{}", iterations=[record("job0001", 0), record("job0001", 1)]
    )
    assert not store.fail(job_id="job0001", owner="late", error_json=REASON)
    assert store.iterations("job0001") == [] and store.get("job0001").status == "solving"
    assert [r.job_id for r in store.recover_expired(reason_json=REASON, max_attempts=2)] == ["job0001"]
    assert store.claim(owner="next", lease_s=60) is not None
    assert store.publish_iteration(record("job0001", 0), owner="next")


def test_resubmitting_a_failed_job_queues_it_again(store: JobStore) -> None:
    store.submit(job(1))
    store.claim(owner="a", lease_s=10)
    assert store.fail(job_id="job0001", owner="a", error_json=REASON)
    outcome = store.submit(job(1))
    assert outcome.requeued and outcome.job.status == "queued" and outcome.job.attempts == 0
    assert outcome.job.error_json is None and outcome.job.last_error_json == REASON


def test_everything_survives_reopening_the_store(backend: Backend) -> None:
    first = backend.open()
    first.submit(job(1))
    first.submit(job(2, iterations=2))
    first.claim(owner="a", lease_s=10)
    first.complete(job_id="job0001", owner="a", plan_json="{}", iterations=[record("job0001", 0)])
    first.put_profile("lab/a100", '{"name": "lab/a100"}')
    first.close()
    second = backend.open()
    assert second.get("job0001").status == "solved"
    assert second.get("job0002").status == "queued"
    assert second.iteration("job0001", 0) is not None
    assert second.get_profile("lab/a100") == '{"name": "lab/a100"}'


def test_a_profile_name_keeps_one_meaning(store: JobStore) -> None:
    assert store.put_profile("lab/a100", '{"v": 1}')
    assert not store.put_profile("lab/a100", '{"v": 1}')
    with pytest.raises(ProfileConflictError):
        store.put_profile("lab/a100", '{"v": 2}')
    assert store.profile_names() == ["lab/a100"]


OPS = st.lists(
    st.tuples(st.sampled_from(["submit", "claim", "publish", "complete", "fail", "die", "expire"]), st.integers(0, 4)),
    max_size=40,
)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_no_job_is_ever_solving_without_an_owner_or_lost(backend: Backend, ops: list[tuple[str, int]]) -> None:
    """Whatever happens, every submitted job is in exactly one state, and a solving job always has a lease."""
    s = backend.fresh()
    submitted: set[str] = set()
    owners = ["w0", "w1"]
    for op, k in ops:
        owner = owners[k % 2]
        if op == "submit":
            s.submit(job(k, iterations=2))
            submitted.add(f"job{k:04d}")
        elif op == "claim":
            s.claim(owner=owner, lease_s=60)
        elif op == "publish":
            for j in s.solving_owned():
                if j.lease_owner == owner:
                    s.publish_iteration(record(j.job_id, 0), owner=owner)
        elif op == "complete":
            for j in s.solving_owned():
                if j.lease_owner == owner:
                    s.complete(
                        job_id=j.job_id, owner=owner, plan_json="{}", iterations=[record(j.job_id, i) for i in (0, 1)]
                    )
        elif op == "fail":
            for j in s.solving_owned():
                s.fail(job_id=j.job_id, owner=owner, error_json=REASON)
        elif op == "die":
            s.release(owner=owner, reason_json=REASON, max_attempts=2)
        else:
            for j in s.solving_owned():  # a negative renewal puts the lease in the past: it has expired
                if j.lease_owner == owner:
                    s.heartbeat(job_id=j.job_id, owner=owner, lease_s=-1)
            s.recover_expired(reason_json=REASON, max_attempts=2)
    counts = s.count_by_status()
    assert sum(counts.values()) == len(submitted)
    for job_id in submitted:
        j = s.get(job_id)
        assert j is not None
        assert (j.status == "solving") == (j.lease_owner is not None)
        assert j.attempts <= 2 or j.status != "queued"
        if j.status == "solved":
            assert j.iterations_solved == 2 and j.plan_json is not None
        if j.status == "failed":
            assert j.error_json is not None
