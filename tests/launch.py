"""The one way a test starts ``torchrun``: ``python -m torch.distributed.run`` of the test's own interpreter
(the ``torchrun`` script is that module's entry point, so no look-up on PATH), with this checkout on
``PYTHONPATH`` and one OpenMP thread per process (gloo on CPU; torchrun otherwise prints a banner about the
variable and the ranks fight over the machine's cores).

A test that calls :func:`run_torchrun` or :func:`start_torchrun`, directly or through a helper of its own, is
in the ``torchrun`` tier (tests/conftest.py finds the call by reading the test's code) and is run by
``make test`` only, never by ``make test-fast``; a launch from a test outside that tier fails, naming the
test, so the fast tier cannot grow a torchrun run unseen."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Set by tests/conftest.py while a test runs: whether it carries the ``torchrun`` marker (None outside pytest).
current_test_is_torchrun: bool | None = None
current_test_id: str = ""


def torchrun_command(
    script: Path | str,
    args: Sequence[str] = (),
    *,
    nproc: int,
    nnodes: int | None = None,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
) -> list[str]:
    """The command line: ``--standalone`` on one node, or a c10d rendezvous at ``rdzv_endpoint`` for ``nnodes``
    nodes (each its own launcher, ``node_rank`` its place)."""
    cmd = [sys.executable, "-m", "torch.distributed.run"]
    if nnodes is None:
        cmd.append("--standalone")
    else:
        assert node_rank is not None and rdzv_endpoint is not None, "a multi-node launch needs its rank and endpoint"
        cmd += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-backend", "c10d"]
        cmd += ["--rdzv-endpoint", rdzv_endpoint]
    return [*cmd, "--nproc-per-node", str(nproc), str(script), *map(str, args)]


def torchrun_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The launcher's environment: this process's, the checkout on ``PYTHONPATH`` (the scripts import
    ``tests.`` and ``examples.``), ``OMP_NUM_THREADS=1``, then ``env`` over them."""
    path = os.environ.get("PYTHONPATH")
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT) + (os.pathsep + path if path else ""),
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }


def _check_tier() -> None:
    if current_test_is_torchrun is False:
        raise AssertionError(
            f"{current_test_id} launches torchrun but is not in the torchrun tier: tests/conftest.py marks a "
            "test that calls tests.launch (directly or through a helper it names); mark it "
            "@pytest.mark.torchrun if the call is hidden from it"
        )


def run_torchrun(
    script: Path | str,
    args: Sequence[str] = (),
    *,
    nproc: int,
    cwd: Path,
    timeout_s: float = 600,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``script args`` on ``nproc`` processes of one node, to the end; stdout and stderr captured as text.
    The exit status is the caller's to check (tests print the stderr's tail on failure)."""
    _check_tier()
    return subprocess.run(
        torchrun_command(script, args, nproc=nproc),
        capture_output=True, text=True, timeout=timeout_s, cwd=cwd, env=torchrun_env(env), check=False,
    )  # fmt: skip


def start_torchrun(
    script: Path | str,
    args: Sequence[str] = (),
    *,
    nproc: int,
    cwd: Path,
    env: dict[str, str] | None = None,
    nnodes: int | None = None,
    node_rank: int | None = None,
    rdzv_endpoint: str | None = None,
    capture: bool = True,
) -> subprocess.Popen[str]:
    """The launcher started and left running (a test that kills it, or starts several nodes); with
    ``capture`` its stdout and stderr are pipes to ``communicate()``, else discarded."""
    _check_tier()
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    return subprocess.Popen(
        torchrun_command(script, args, nproc=nproc, nnodes=nnodes, node_rank=node_rank, rdzv_endpoint=rdzv_endpoint),
        stdout=out, stderr=out, text=True, cwd=cwd, env=torchrun_env(env),
    )  # fmt: skip
