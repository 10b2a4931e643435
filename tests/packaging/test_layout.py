"""The repository's layout and the one import name: top-level folders (solver/, api/, ...) that install as
``skrull.solver``, ``skrull.api``, ... through setuptools' ``package-dir``, with no links in the
repository, importable from a checkout that was never installed, and every package listed."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
SKIP = {".git", ".venv", "build", "dist", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}


def test_the_repository_holds_no_symbolic_links() -> None:
    links = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIP and not d.endswith(".egg-info")]
        links += [Path(folder, n).relative_to(ROOT).as_posix() for n in dirs + names if Path(folder, n).is_symlink()]
    assert links == []


def test_every_folder_of_the_package_is_a_listed_regular_package() -> None:
    """A folder left out of pyproject's list is left out of the wheel (setuptools' finder cannot prefix
    mapped folders, so the list is written out); one without ``__init__.py`` would be a namespace package,
    which installs only if listed and tools read differently."""
    mapping: dict[str, str] = SETUPTOOLS["package-dir"]
    on_disk, without_init = set(), []
    for package, folder in mapping.items():
        base = ROOT / folder
        for source in [base / "__init__.py", *base.rglob("*.py")]:
            if "__pycache__" in source.parts or not source.exists():
                continue
            on_disk.add(".".join((package, *source.parent.relative_to(base).parts)))
            if not (source.parent / "__init__.py").is_file():
                without_init.append(source.parent.relative_to(ROOT).as_posix())
    assert without_init == []
    assert on_disk == set(SETUPTOOLS["packages"])


def _import_from(cwd: Path, *, args: list[str], pythonpath: str | None) -> dict[str, str]:
    """Import the package in a Python that processes no ``.pth`` file (``-S``: no editable-install finder),
    with the venv's site-packages on the path for numpy and friends."""
    code = (
        "import json, sys\n"
        f"sys.path += {[p for p in site.getsitepackages() if Path(p).is_dir()]!r}\n"
        "import skrull.solver.types, skrull.api.errors, skrull.cli.main\n"
        "from skrull.solver.resources import bundled_dir\n"
        "print(json.dumps({'types': skrull.solver.types.__file__, 'api': skrull.api.errors.__file__,"
        " 'profiles': str(bundled_dir('profiles')), 'finders': [repr(f) for f in sys.meta_path]}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    out = subprocess.run(
        [sys.executable, "-S", *args, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, check=True
    )
    doc: dict[str, str] = json.loads(out.stdout)
    return doc


def test_a_checkout_imports_without_installing_by_pythonpath_or_from_its_root(tmp_path: Path) -> None:
    for cwd, args, pythonpath in ((tmp_path, [], str(ROOT)), (ROOT, [], None)):
        got = _import_from(cwd, args=args, pythonpath=pythonpath)
        assert not any("editable" in f.lower() for f in got["finders"])  # the checkout alone, no install
        assert Path(got["types"]) == ROOT / "solver" / "types.py"
        assert Path(got["api"]) == ROOT / "api" / "errors.py"
        assert Path(got["profiles"]) == ROOT / "profiles"
        assert len(list(Path(got["profiles"]).glob("*.json"))) >= 1


def test_the_development_install_maps_the_same_folders() -> None:
    import skrull.solver.types
    import skrull.worker.hf
    from skrull.solver.resources import bundled_dir

    assert Path(skrull.solver.types.__file__) == ROOT / "solver" / "types.py"
    assert Path(skrull.worker.hf.__file__) == ROOT / "worker" / "hf" / "__init__.py"
    assert bundled_dir("distributions") == ROOT / "distributions"
