"""The wheel as a user gets it: built from the image's build context, installed into a fresh virtual
environment outside the source tree, run from an unrelated folder with no PYTHONPATH.

The new environment has no pip and no network: the wheel goes in with ``pip --python``, and its
dependencies come from the environment running the tests, through a path entry placed after the wheel's
own site-packages (``.pth`` files in that entry are not run, so an editable install of the source tree
there stays inactive). Every test checks that ``skrull`` resolves to the installed files.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import site
import socket
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from packaging.requirements import Requirement

from skrull.solver.io import plan_from_dict, plan_to_dict, request_from_dict
from skrull.solver.planning import solve
from skrull.solver.validate import plan_problems
from skrull.solver.worker_view import plan_rank_view
from tests.api.conftest import START_TIMEOUT_S
from tests.packaging.context import IMAGE_EXTRAS, ROOT, WHEEL_COMMAND, copy_build_context

REQUEST = ROOT / "examples" / "requests" / "contract-example.json"
DIST_INFO = re.compile(r"skrull-[^/]+\.dist-info")


@dataclass(frozen=True, slots=True, kw_only=True)
class Installed:
    wheel: Path
    venv: Path
    site_packages: Path
    workdir: Path
    env: dict[str, str]

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    @property
    def skrull(self) -> Path:
        return self.venv / "bin" / "skrull"

    def run(self, *args: str | Path, timeout_s: float = START_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [str(a) for a in args], cwd=self.workdir, env=self.env, capture_output=True, text=True, timeout=timeout_s
        )
        assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        return result


def _run(args: list[str], cwd: Path) -> None:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"


def _check_build_backend() -> None:
    """The wheel is built without isolation, so the backend pyproject.toml names must be installed here."""
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["build-system"]["requires"]:
        requirement = Requirement(line)
        try:
            installed_version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            installed_version = None
        assert installed_version is not None and requirement.specifier.contains(installed_version), (
            f"building the wheel needs {requirement} (found {installed_version}): pip install '{requirement}'"
        )


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    _check_build_backend()
    base = tmp_path_factory.mktemp("wheel")
    context = copy_build_context(base / "context")
    dist = base / "dist"
    # The image's build stage runs the same `pip wheel`; here without build isolation (no network).
    _run([sys.executable, "-m", *WHEEL_COMMAND, str(dist), "--no-build-isolation", "."], cwd=context)
    (wheel,) = dist.glob("skrull-*.whl")
    shutil.rmtree(context)  # nothing of the source tree is left to fall back on

    venv = base / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=base)
    _run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "--no-deps",
          "--no-index", "--quiet", f"{wheel}[{IMAGE_EXTRAS}]"], cwd=base)  # fmt: skip
    (site_packages,) = (venv / "lib").glob("python3*/site-packages")
    dependencies = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (site_packages / "zz-dependencies.pth").write_text("\n".join(dependencies) + "\n", encoding="utf-8")

    workdir = base / "work"
    workdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("SKRULL_")}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    yield Installed(wheel=wheel, venv=venv, site_packages=site_packages, workdir=workdir, env=env)


def test_wheel_holds_only_the_skrull_package_with_its_profiles_and_distributions(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        names = whl.namelist()
        (dist_info,) = {n.split("/")[0] for n in names if DIST_INFO.fullmatch(n.split("/")[0])}
        assert whl.read(f"{dist_info}/top_level.txt").decode().split() == ["skrull"]
        metadata = whl.read(f"{dist_info}/METADATA").decode()
    assert {n.split("/")[0] for n in names} == {"skrull", dist_info}
    for kind in ("profiles", "distributions"):
        shipped = {
            n.removeprefix(f"skrull/{kind}/") for n in names if n.startswith(f"skrull/{kind}/") and n.endswith(".json")
        }
        assert shipped == {p.name for p in (ROOT / kind).glob("*.json")}, kind
    service_needs = {"fastapi", "uvicorn", "pydantic", "pydantic-settings", "httpx"}
    extra = {
        re.split(r"[\[<>=;! ]", line.removeprefix("Requires-Dist: "))[0]
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist: ") and f'extra == "{IMAGE_EXTRAS}"' in line
    }
    assert service_needs <= extra, f"the image installs [{IMAGE_EXTRAS}]; `skrull serve` needs {service_needs}"
    packages = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert packages == set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert not [n for n in names if n.endswith(".py") and "/tests/" in n]


def test_import_skrull_resolves_to_the_installed_wheel(installed: Installed) -> None:
    out = installed.run(
        installed.python,
        "-c",
        "import json, sys, skrull; from skrull.solver.profile import profiles_dir; "
        "print(json.dumps([skrull.__file__, str(profiles_dir()), sys.path, skrull.__version__]))",
    ).stdout
    module_file, profiles, path, version = json.loads(out)
    assert Path(module_file).is_relative_to(installed.site_packages)
    assert Path(profiles).is_relative_to(installed.site_packages)
    # No source-tree folder on the path (the test environment's own site-packages may live under the tree).
    tree_paths = [
        p
        for p in path
        if (installed.workdir / p).resolve().is_relative_to(ROOT)
        and not (installed.workdir / p).resolve().is_relative_to(Path(sys.prefix).resolve())
    ]
    assert tree_paths == []
    assert version == installed.wheel.name.split("-")[1]


def test_import_skrull_solver_loads_numpy_but_no_solver_backend_torch_or_web_stack(installed: Installed) -> None:
    out = installed.run(
        installed.python,
        "-c",
        "import json, sys, skrull.solver, skrull.solver.planning, skrull.solver.planners.registry; "
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))",
    ).stdout
    loaded = set(json.loads(out))
    assert "numpy" in loaded
    assert loaded.isdisjoint({"ortools", "pyscipopt", "torch", "fastapi", "pydantic", "uvicorn", "httpx"})


def test_skrull_profiles_lists_the_bundled_profiles(installed: Installed) -> None:
    out = installed.run(installed.skrull, "profiles").stdout
    assert out.split() == sorted(p.stem.replace("__", "/") for p in (ROOT / "profiles").glob("*.json"))


def test_skrull_plan_plans_a_bundled_request_from_outside_the_tree(installed: Installed) -> None:
    request = shutil.copy(REQUEST, installed.workdir / "request.json")
    # deterministic: auto's work clock gives the same plan on any machine and under any load
    installed.run(installed.skrull, "plan", "-r", request, "--deterministic", "-o", "plan.json")
    doc = json.loads((installed.workdir / "plan.json").read_text())
    request_value = dataclasses.replace(request_from_dict(json.loads(REQUEST.read_text())), deterministic=True)
    assert plan_problems(plan_from_dict(doc), request_value) == []
    expected = plan_to_dict(solve(request_value))  # the source tree's planner: the same plan, but for timing
    for plan_doc in (doc, expected):
        del plan_doc["solve"]["wall_ms"]
    assert doc == expected
    assert "valid:" in installed.run(installed.skrull, "validate", "-r", request, "-p", "plan.json").stdout


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


CLIENT = """
import json, sys
from skrull.api.client import PlanningClient
with PlanningClient(sys.argv[1]) as client:
    plan_id = client.submit(json.load(open("request.json")))
    envelope = client.wait(plan_id, timeout_s=float(sys.argv[2]))
    view = client.rank_view(plan_id, 0, 0, timeout_s=float(sys.argv[2]))
print(json.dumps({"envelope": envelope, "view": view}))
"""


def test_skrull_serve_solves_a_plan_and_answers_a_rank_view(installed: Installed) -> None:
    shutil.copy(REQUEST, installed.workdir / "request.json")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log = (installed.workdir / "serve.log").open("wb")
    cmd = [installed.skrull, "serve", "--host", "127.0.0.1", "--port", str(port), "--db", "serve.db"]
    server = subprocess.Popen(
        [*map(str, cmd), "--solver-processes", "1", "--log-level", "warning"],
        cwd=installed.workdir,
        env=installed.env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        # A fresh environment's first imports are slow on a loaded machine: the bound only tells a start from none.
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            assert server.poll() is None, (installed.workdir / "serve.log").read_text()
            assert time.monotonic() < deadline, f"the service did not answer /healthz within {START_TIMEOUT_S} s"
            try:
                if httpx.get(f"{url}/healthz", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        # The client may wait for a solver process to start (START_TIMEOUT_S) and then for the plan.
        client = installed.run(installed.python, "-c", CLIENT, url, str(START_TIMEOUT_S), timeout_s=3 * START_TIMEOUT_S)
        out = json.loads(client.stdout)
    finally:
        server.terminate()
        try:  # this test does not judge how fast the service stops, only that it is gone afterwards
            server.wait(timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        log.close()
    envelope, view = out["envelope"], out["view"]
    assert envelope["status"] == "solved"
    request = request_from_dict(json.loads(REQUEST.read_text()))
    plan = plan_from_dict(envelope["plan"])
    assert plan_problems(plan, request) == []
    expected = plan_rank_view(plan, request.batches[0], iteration=0, rank=0).to_dict(plan_id=envelope["id"])
    assert view == expected
    assert (installed.workdir / "serve.db").is_file()
