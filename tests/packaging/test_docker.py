"""docker/: the image is the tested wheel, and every compose service runs that one image.

The image is built and tried by `make image-check` (docker/image-check.sh, root and podman); these tests
read the files on every run, with no container engine: the Dockerfile's build stage must run the
wheel test's `pip wheel` on the whole build context, its runtime stage must install that wheel with the
same extra, and its entry point must be the installed console script. Compose services must build the
image from that Dockerfile and start commands the CLI accepts.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from skrull.cli.main import build_parser
from tests.packaging.context import DOCKERIGNORE, IMAGE_EXTRAS, ROOT, WHEEL_COMMAND, ignore_patterns, is_ignored

DOCKERFILE = ROOT / "docker" / "Dockerfile"
COMPOSE_FILES = sorted((ROOT / "docker").glob("compose*.yaml"))
PINNED_PYTHON = re.compile(r"python:3\.(\d+)\.\d+-slim-[a-z]+")


@dataclass(frozen=True, slots=True, kw_only=True)
class Instruction:
    keyword: str
    args: str


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    image: str
    name: str | None
    instructions: tuple[Instruction, ...]

    def all(self, keyword: str) -> list[str]:
        return [i.args for i in self.instructions if i.keyword == keyword]


def parse_dockerfile(text: str) -> tuple[dict[str, str], list[Stage]]:
    """Global ARG defaults and the stages (continuation lines joined, comments dropped)."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "the Dockerfile ends inside a continued line"
    global_args: dict[str, str] = {}
    heads: list[tuple[str, str | None]] = []
    bodies: list[list[Instruction]] = []
    for line in logical:
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            words = args.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)], words[0])
            heads.append((image, words[2] if len(words) == 3 and words[1].upper() == "AS" else None))
            bodies.append([])
        elif not heads:
            assert keyword == "ARG", f"only ARG may precede the first FROM, not {keyword}"
            key, _, value = args.partition("=")
            global_args[key] = value
        else:
            bodies[-1].append(Instruction(keyword=keyword, args=args))
    stages = [Stage(image=i, name=n, instructions=tuple(b)) for (i, n), b in zip(heads, bodies, strict=True)]
    return global_args, stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse_dockerfile(DOCKERFILE.read_text(encoding="utf-8"))[1]


def test_both_stages_use_one_pinned_python_that_the_project_supports(stages: list[Stage]) -> None:
    assert len(stages) == 2
    assert stages[0].image == stages[1].image
    match = PINNED_PYTHON.fullmatch(stages[0].image)
    assert match, f"{stages[0].image}: pin the patch release and the Debian release"
    requires = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    assert requires == ">=3.11" and int(match.group(1)) >= 11


def test_build_stage_builds_the_wheel_from_the_whole_context_as_the_wheel_test_does(stages: list[Stage]) -> None:
    build = stages[0]
    assert build.name
    assert build.all("COPY") == [". ."], "the build stage copies the whole context, nothing hand-picked"
    (run,) = build.all("RUN")
    words = shlex.split(run)
    assert words[: len(WHEEL_COMMAND)] == list(WHEEL_COMMAND)
    assert words[len(WHEEL_COMMAND) + 1 :] == ["."]


def test_runtime_stage_installs_only_that_wheel_with_the_api_extra(stages: list[Stage]) -> None:
    build, runtime = stages
    wheel_dir = shlex.split(build.all("RUN")[0])[len(WHEEL_COMMAND)]
    (copy,) = runtime.all("COPY")
    assert copy.split() == [f"--from={build.name}", wheel_dir, "/tmp/dist"]
    install = runtime.all("RUN")[0].split("&&")[0].strip()
    assert install == f'pip install "$(ls /tmp/dist/skrull-*.whl)[{IMAGE_EXTRAS}]"'
    assert not any(i.keyword == "ADD" for i in runtime.instructions)


def test_entrypoint_is_the_installed_console_script_serving(stages: list[Stage]) -> None:
    (entrypoint,) = stages[1].all("ENTRYPOINT")
    command = json.loads(entrypoint)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert command[0] in scripts and scripts[command[0]] == "skrull.cli.main:main"
    assert command == ["skrull", "serve"]
    build_parser().parse_args(command[1:])


def _package_files() -> list[str]:
    """Every file the wheel is built from, as a path inside the repository: skrull/ and the folders
    pyproject.toml's ``package-dir`` maps into the package."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    files = ["pyproject.toml", pyproject["project"]["readme"]]
    for top in sorted(set(pyproject["tool"]["setuptools"]["package-dir"].values())):
        for folder, dirs, names in os.walk(ROOT / top):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            files.extend((Path(folder) / n).relative_to(ROOT).as_posix() for n in names)
    return files


def test_dockerignore_keeps_every_file_the_wheel_is_built_from_and_drops_local_state() -> None:
    patterns = ignore_patterns(DOCKERIGNORE)
    files = _package_files()
    assert len(files) > 50
    assert [f for f in files if is_ignored(f, patterns)] == []
    for local in (".git", ".venv", "solver/__pycache__", "skrull.db", "build", "dist"):
        assert is_ignored(local, patterns), local


def test_dockerignore_patterns_follow_docker_rules() -> None:
    patterns = ("**/__pycache__", "*.egg-info", "build")
    assert is_ignored("solver/planners/__pycache__/x.pyc", patterns)
    assert is_ignored("__pycache__", patterns)
    assert is_ignored("skrull.egg-info/PKG-INFO", patterns)
    assert not is_ignored("solver/skrull.egg-info", patterns)  # `*` stops at `/`
    assert is_ignored("build/lib/x.py", patterns)
    assert not is_ignored("solver/build.py", patterns)


def _services() -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for path in COMPOSE_FILES:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        out.extend((path.name, name, service) for name, service in doc["services"].items())
    return out


def test_every_skrull_service_builds_the_one_image_from_the_dockerfile() -> None:
    services = [(f, n, s) for f, n, s in _services() if "build" in s or str(s.get("image", "")).startswith("skrull")]
    assert {f for f, _, _ in services} == {p.name for p in COMPOSE_FILES}
    images = set()
    for file, name, service in services:
        build = service.get("build")
        assert isinstance(build, dict), f"{file}: {name} has no build: and may run a stale or pulled image"
        assert (ROOT / "docker" / build["context"]).resolve() == ROOT, (file, name)
        assert build["dockerfile"] == "docker/Dockerfile", (file, name)
        images.add(service["image"])
    assert len(images) == 1


def test_other_images_are_pinned_to_a_release() -> None:
    for file, name, service in _services():
        if "build" not in service:
            assert re.fullmatch(r"[\w./-]+:\d+\.\d+[\w.-]*", service["image"]), (file, name, service["image"])


def test_every_compose_command_is_one_the_cli_accepts() -> None:
    for file, name, service in _services():
        if "build" not in service:
            continue
        entrypoint = service.get("entrypoint", ["skrull", "serve"])
        assert entrypoint[0] == "skrull", (file, name)
        build_parser().parse_args([*entrypoint[1:], *service.get("command", [])])


def test_the_readme_names_the_pinned_base_image_and_the_check_that_builds_it(stages: list[Stage]) -> None:
    # the README and docs/service.md say the same thing: the image is built and tried by make image-check
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"`{stages[1].image}`" in readme
    assert "Built and tried in CI" in readme and "`make image-check`" in readme
    assert re.search(r"^image-check:", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
