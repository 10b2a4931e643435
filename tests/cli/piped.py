"""Run a command as ``cmd | tee log`` or a CI runner does: stdout (and stderr with it) a pipe, not a terminal,
read line by line while it runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: a phase line of a long command's progress: ``skrull <command>: <what it does now>``
PHASE = re.compile(r"^skrull [a-z-]+(?: --[a-z-]+)?: ")


@dataclass(frozen=True)
class PipedRun:
    lines: list[str]
    #: whether the process was still running when its first line had arrived
    running_after_first_line: bool
    returncode: int

    def phases(self) -> list[str]:
        return [line for line in self.lines if PHASE.match(line)]


def run_piped(argv: list[str], *, timeout_s: float = 600, cwd: Path = ROOT) -> PipedRun:
    """Start ``argv`` with stdout and stderr on one pipe; read its first line, note whether the process is
    still running (it has a whole run left: a line written early arrives early), then read the rest."""
    proc = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    assert proc.stdout is not None
    watchdog = threading.Timer(timeout_s, proc.kill)  # a hung run ends the read with EOF, then fails
    watchdog.start()
    try:
        first = proc.stdout.readline()
        running = proc.poll() is None
        rest = proc.stdout.read()
        returncode = proc.wait()
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return PipedRun(lines=(first + rest).splitlines(), running_after_first_line=running, returncode=returncode)


def skrull_argv(*args: str) -> list[str]:
    exe = shutil.which("skrull", path=str(Path(sys.executable).parent))
    return [*([exe] if exe else [sys.executable, "-m", "skrull.cli.main"]), *args]
