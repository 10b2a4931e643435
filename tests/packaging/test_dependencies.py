"""Dependencies stated truthfully: every third-party module a subpackage imports belongs to a distribution
that pyproject.toml declares for it (the core dependencies, or the extra that subpackage documents)."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.packaging.context import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
#: Which extras each subpackage may draw on besides the core dependencies.
EXTRAS_OF = {
    "solver": ("viz",),  # cairosvg, imported only to write PNG pictures
    "api": ("api",),
    # the loader talks to the service; worker/hf runs transformers and TRL; worker/megatron.py Megatron-Core
    "worker": ("worker", "api", "hf", "trl", "megatron"),
    "corpus": ("data",),
    "cli": ("api", "worker", "data", "viz", "hf"),  # each command imports its extra when it runs
}
#: Imported directly but installed by a declared distribution that pins it.
PROVIDED_BY: dict[str, str] = {"starlette": "fastapi"}


def declared(extras: tuple[str, ...]) -> set[str]:
    lines = [*PROJECT["dependencies"], *(line for e in extras for line in PROJECT["optional-dependencies"][e])]
    return {canonicalize_name(Requirement(line).name) for line in lines}


def third_party_imports(package: str) -> set[str]:
    names: set[str] = set()
    for path in (ROOT / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n not in ("skrull", "__future__")}


@pytest.mark.parametrize("package", sorted(EXTRAS_OF))
def test_every_third_party_import_is_a_declared_dependency(package: str) -> None:
    allowed = declared(EXTRAS_OF[package])
    distributions = metadata.packages_distributions()
    undeclared = []
    for module in sorted(third_party_imports(package)):
        if module in PROVIDED_BY:
            provider = PROVIDED_BY[module]
            assert canonicalize_name(provider) in allowed, (module, provider)
            continue
        owners = {canonicalize_name(d) for d in distributions.get(module, [module])}
        if not owners & allowed:
            undeclared.append(f"{module} ({', '.join(sorted(owners))})")
    assert undeclared == [], f"{package}/ imports modules pyproject.toml does not declare for it"


def test_torch_is_not_pinned_to_one_build_and_the_license_is_an_spdx_expression() -> None:
    for line in PROJECT["optional-dependencies"]["worker"]:
        requirement = Requirement(line)
        if requirement.name == "torch":
            assert not any(spec.operator in ("==", "===") for spec in requirement.specifier), line
    assert PROJECT["license"] == "Apache-2.0"


def test_the_core_dependencies_are_the_planner_s_own() -> None:
    assert declared(()) == {"numpy", "ortools", "pyscipopt"}


def test_the_cli_plans_with_the_core_dependencies_alone() -> None:
    # `pip install skrull` (no extras): every extra's modules unimportable, `skrull plan` still plans
    import subprocess

    blocked = ("tqdm", "httpx", "fastapi", "uvicorn", "starlette", "pydantic", "torch", "transformers", "tokenizers",
               "tiktoken", "datasets", "pyarrow", "cairosvg", "prometheus_client", "psycopg")  # fmt: skip
    code = (
        "import sys\n"
        f"for name in {blocked!r}:\n"
        "    sys.modules[name] = None\n"
        "from skrull.cli.main import main\n"
        "raise SystemExit(main(['plan', '-r', 'examples/requests/contract-example.json', '--solver', 'skrull',"
        " '--compact']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith('{"schema":"skrull.plan/v1"')
