"""The multi-process metrics directory of one server: made before ``prometheus_client`` is imported,
removed when the server stops.

``prometheus_client`` chooses its value store when it is first imported: with ``PROMETHEUS_MULTIPROC_DIR``
set, every process writes its counters and histograms into memory-mapped files there, and a scrape adds
them up (``api.metrics``). This module imports nothing of the library, so ``skrull serve`` can set the
variable before anything else of the service is imported, and its solver processes inherit it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from types import FrameType

#: The environment variable of ``prometheus_client``'s multi-process mode.
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"


@contextlib.contextmanager
def metrics_directory() -> Iterator[str]:
    """``PROMETHEUS_MULTIPROC_DIR`` for this server and its solver processes (``api.metrics``).

    It must be set before ``prometheus_client`` is first imported (the library picks its multi-process
    value store then) and before the solver processes start (they inherit it). A directory the operator
    set is used as given and kept; otherwise a fresh one is made and removed when the server stops, so no
    stale counts of an earlier run are ever summed; also when SIGTERM ends the server.
    """
    given = os.environ.get(MULTIPROC_ENV)
    if given:
        yield given
        return
    made = tempfile.mkdtemp(prefix="skrull-metrics-")
    os.environ[MULTIPROC_ENV] = made

    def remove_then_terminate(signum: int, frame: FrameType | None) -> None:
        # uvicorn shuts down gracefully on SIGTERM, puts the handler it found (this one) back and raises
        # the signal again, so that the process ends as killed by it: remove the directory, then do so
        shutil.rmtree(made, ignore_errors=True)
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)

    previous = signal.signal(signal.SIGTERM, remove_then_terminate)
    try:
        yield made
    finally:
        signal.signal(signal.SIGTERM, previous)
        os.environ.pop(MULTIPROC_ENV, None)
        shutil.rmtree(made, ignore_errors=True)
