"""A disk that fills up under a running service (a real SQLite store on a small tmpfs, filled by the test)
spends no job's attempt: the solve that meets the full disk gives its job back uncharged, submissions are
refused with 503 ``store-unavailable`` and ``Retry-After`` meanwhile, and once space is back the same
server (no restart) solves the job, at its first charged attempt, and accepts work again."""

from __future__ import annotations

import contextlib
import errno
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import LiveServer, plan_request


def gate(marker_dir: Path, lengths: list[int]) -> Path:
    """``tests.api.plugin_planners.gate``, imported here: that module registers the test planners on import,
    which must not happen at collection (tests/api/conftest.py)."""
    from tests.api.plugin_planners import gate as plugin_gate

    return plugin_gate(marker_dir, lengths)

LIMIT_S = 180.0


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(folder: Path) -> Path:
    """Write a file until the disk is full; it is the test's to remove."""
    filler = folder / "filler"
    with open(filler, "wb") as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 65536)
            fh.flush()
    try:
        with open(folder / "probe", "wb") as fh:
            fh.write(b"\0" * 65536)
            fh.flush()
    except OSError as exc:
        assert exc.errno == errno.ENOSPC
    return filler


def test_a_full_disk_spends_no_attempt_and_the_job_is_solved_when_space_is_back(
    live_server_factory: Callable[..., LiveServer], small_disk: Path, tmp_path: Path
) -> None:
    env = {"SKRULL_TEST_MARKER_DIR": str(tmp_path), "SKRULL_MAX_ATTEMPTS": "1"}  # one attempt: none to spare
    server = live_server_factory(small_disk / "jobs.db", solver_processes=1, env=env).start()
    doc = plan_request([[10], [20], [30]], solver="test-gated", time_budget_s=60.0)
    plan_id = httpx.post(f"{server.url}/v1/plans", json=doc, timeout=60).json()["id"]
    deadline = time.monotonic() + LIMIT_S
    while httpx.get(f"{server.url}/v1/plans/{plan_id}", timeout=60).json()["status"] != "solving":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    filler = fill(small_disk)
    for lengths in ([10], [20], [30]):  # the solve goes on, and meets the full disk when it publishes
        gate(tmp_path, lengths).touch()
    while "the store failed under the solve" not in server.log.read_text():
        assert time.monotonic() < deadline, server.log.read_text()
        time.sleep(0.1)
    refused = httpx.post(f"{server.url}/v1/plans", json=plan_request([[7, 8]]), timeout=60)
    assert refused.status_code == 503, refused.text
    assert refused.json()["type"] == "urn:skrull:problem:store-unavailable" and refused.headers["retry-after"]
    filler.unlink()
    envelope = httpx.get(f"{server.url}/v1/plans/{plan_id}?wait=60&until=final", timeout=120).json()
    while envelope["status"] != "solved":
        assert envelope["status"] != "failed", envelope
        assert time.monotonic() < deadline, envelope
        envelope = httpx.get(f"{server.url}/v1/plans/{plan_id}?wait=10&until=final", timeout=120).json()
    assert envelope["attempts"] == 1
    fresh = httpx.post(f"{server.url}/v1/plans", json=plan_request([[7, 8]]), timeout=60)
    assert fresh.status_code == 202
