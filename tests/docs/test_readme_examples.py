"""The README's library example runs as printed, from the repository root, and says what it claims."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

from skrull.solver.io import read_json, request_from_dict
from skrull.solver.planning import solve
from tests.docs.test_links import README, ROOT


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)


def test_the_library_example_prints_the_plan_it_makes() -> None:
    (block,) = [b for b in python_blocks() if "from skrull.solver import solve" in b]
    out = subprocess.run([sys.executable, "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    # auto's plan depends on how much of its budget this machine gives it: check the shape of the line,
    # and that the plan printed is at least as fast as one of auto's starts (packed) of the same request
    request = request_from_dict(read_json(ROOT / "examples" / "requests" / "default.json"))
    found = re.fullmatch(r"(feasible|optimal) (\d+\.\d) ms over (\d+) iterations", out.stdout.strip())
    assert found is not None, out.stdout
    assert int(found.group(3)) == len(request.batches)
    packed = solve(dataclasses.replace(request, solver="packed"))
    assert float(found.group(2)) <= packed.estimated_ms + 0.05


def test_every_python_example_compiles_and_imports_only_the_skrull_namespace() -> None:
    blocks = python_blocks()
    assert len(blocks) >= 3
    for block in blocks:
        compile(block, "README.md", "exec")
        modules = re.findall(r"^(?:from|import) ([\w.]+)", block, re.M)
        assert modules and all(m.split(".")[0] == "skrull" for m in modules), modules


def quick_start() -> list[str]:
    """The command lines of the README's CLI quick start, as printed."""
    section = README.read_text(encoding="utf-8").split("## Quick start: the CLI", 1)[1]
    (body,) = re.findall(r"^```sh\n(.*?)^```", section, re.S | re.M)[:1]
    return [line.split("  #", 1)[0].strip() for line in body.splitlines() if line.strip()]


def test_the_quick_start_activates_the_environment_and_reads_files_that_ship(tmp_path: Path) -> None:
    import shlex

    from skrull.cli.main import main

    lines = quick_start()
    assert lines[0] == ". .venv/bin/activate"  # `skrull` is not on PATH otherwise
    for prefix in ("skrull lengths ", "skrull derive-profile "):
        (line,) = [ln for ln in lines if ln.startswith(prefix)]
        argv = [str(ROOT / w) if w.startswith("examples/") else w for w in shlex.split(line)[1:]]
        argv = [str(tmp_path / "out.json") if w == "req.json" else w for w in argv]
        assert main(argv) == 0, line
    doc = read_json(tmp_path / "out.json")
    assert len(doc["batches"]) == 3 and all(len(b) == 32 for b in doc["batches"])
    assert doc["parallel"] == {"dp": 4, "cp": 8} and doc["solver"] == "auto"
