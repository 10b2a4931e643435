"""Start W worker processes on this machine with a process group (gloo on CPU, NCCL on GPUs).

Used by ``skrull execute``, the tests and the benchmarks: one process per GPU rank, rendezvous over TCP
on 127.0.0.1, each child restricted to one intra-op thread on CPU so that W processes share the cores
instead of oversubscribing them. A child's exception fails the whole launch with its message.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.multiprocessing.spawn import ProcessExitedException, ProcessRaisedException, spawn

from skrull.solver.errors import RequestError

BACKENDS: tuple[str, ...] = ("gloo", "nccl")


class LaunchError(RuntimeError):
    """A worker process failed; the message is the child's error."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def check_backend(backend: str, world_size: int) -> None:
    """Refuse a backend this machine cannot run, naming the field and the value."""
    if backend not in BACKENDS:
        raise RequestError("--backend", backend, f"unknown backend; known: {', '.join(BACKENDS)}")
    if world_size < 1:
        raise RequestError("--world-size", world_size, "must be an integer >= 1")
    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RequestError("--backend", backend, "needs CUDA GPUs; none is available here (use gloo)")
        if torch.cuda.device_count() < world_size:
            raise RequestError(
                "--world-size", world_size, f"nccl needs one GPU per process; {torch.cuda.device_count()} visible"
            )


def device_for(backend: str, rank: int) -> torch.device:
    if backend == "nccl":
        torch.cuda.set_device(rank)
        return torch.device("cuda", rank)
    return torch.device("cpu")


def _child(rank: int, fn: Callable[..., None], world_size: int, backend: str, port: int, args: tuple[Any, ...]) -> None:
    if backend == "gloo":
        torch.set_num_threads(1)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, backend, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def launch(fn: Callable[..., None], *, world_size: int, backend: str = "gloo", args: tuple[Any, ...] = ()) -> None:
    """Run ``fn(rank, world_size, backend, *args)`` in ``world_size`` processes inside one process group.

    ``fn`` must be importable (a module-level function); results travel through files or queues.
    """
    check_backend(backend, world_size)
    try:
        spawn(  # type: ignore[no-untyped-call]
            _child, args=(fn, world_size, backend, free_port(), args), nprocs=world_size, join=True
        )
    except ProcessRaisedException as exc:
        raise LaunchError(str(exc).strip().splitlines()[-1]) from exc
    except ProcessExitedException as exc:
        raise LaunchError(f"a worker process exited unexpectedly: {exc}") from exc
