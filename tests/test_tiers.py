"""The test tiers (tests/tiers.py): registered as markers, given to a test by its file, its fixtures and the
helpers its code calls, and the torchrun launcher refusing a test outside its tier."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from skrull.worker.launch import launch as worker_launch
from tests import launch
from tests.api.conftest import LiveServer
from tests.api.pg import temporary_database
from tests.tiers import DESCRIPTIONS, TIERS, tiers_of

ROOT = Path(__file__).resolve().parents[1]


def fake_item(obj: Any, *, fixtures: dict[str, Any] | None = None, params: dict[str, Any] | None = None) -> Any:
    """What tiers_of reads of a collected test: its function, its fixtures' definitions and parameters."""
    defs = {name: [SimpleNamespace(func=func, params=p)] for name, (func, p) in (fixtures or {}).items()}
    return SimpleNamespace(
        obj=obj,
        fixturenames=list(defs),
        callspec=SimpleNamespace(params=params or {}),
        _fixtureinfo=SimpleNamespace(name2fixturedefs=defs),
    )


def test_every_tier_is_a_registered_marker_with_its_description() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    markers = dict(m.split(": ", 1) for m in config["tool"]["pytest"]["ini_options"]["markers"])
    assert {t: markers.get(t) for t in TIERS} == DESCRIPTIONS


def _launches() -> None:
    launch.run_torchrun("script.py", nproc=2, cwd=ROOT)


def _spawns_a_process_group() -> None:
    worker_launch(print, world_size=2)


def _through_a_helper() -> None:
    _launches()


def _starts_python() -> None:
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def _serves() -> None:
    LiveServer(ROOT / "x.db").start()


def _serves_on_a_backend(param: str) -> None:
    with temporary_database() as url:
        LiveServer(url if param == "postgres" else ROOT / "x.db").start()


def _plain() -> None:
    assert sorted([2, 1]) == [1, 2]


def test_a_test_is_in_the_tier_of_what_its_code_reaches_through_helpers() -> None:
    assert tiers_of(fake_item(_launches), "tests/worker/test_x.py") == {"torchrun"}
    assert tiers_of(fake_item(_through_a_helper), "tests/worker/test_x.py") == {"torchrun"}
    assert tiers_of(fake_item(_spawns_a_process_group), "tests/worker/test_x.py") == {"torchrun"}
    assert tiers_of(fake_item(_starts_python), "tests/cli/test_x.py") == {"slow"}
    assert tiers_of(fake_item(_serves), "tests/api/test_x.py") == {"server"}
    assert tiers_of(fake_item(_plain), "tests/solver/test_x.py") == set()


def test_a_fixture_puts_its_tests_in_its_tier_and_a_parametrized_one_by_its_value() -> None:
    assert tiers_of(fake_item(_plain, fixtures={"live_server": (_plain, None)}), "tests/api/test_x.py") == {"server"}
    assert tiers_of(fake_item(_plain, fixtures={"my_server": (_serves, None)}), "tests/api/test_x.py") == {"server"}
    backends = {"backend": (_serves_on_a_backend, ["sqlite", "postgres"])}  # the value decides postgres
    on = fake_item(_plain, fixtures=backends, params={"backend": "postgres"})
    off = fake_item(_plain, fixtures=backends, params={"backend": "sqlite"})
    assert tiers_of(on, "tests/api/store/test_x.py") == {"postgres", "server"}
    assert tiers_of(off, "tests/api/store/test_x.py") == {"server"}


def test_a_file_listed_for_a_tier_puts_each_of_its_tests_there() -> None:
    assert tiers_of(fake_item(_plain), "tests/conformance/test_new_cells.py") == {"torchrun"}
    assert tiers_of(fake_item(_plain), "tests/api/store/test_postgres.py") == {"postgres"}


def test_every_file_listed_for_a_tier_is_in_the_tree() -> None:
    """A listed test file that moved would leave its tests in the unit tier unseen."""
    from tests import tiers

    listed = [*tiers.TORCHRUN_PATHS, *tiers.SERVER_PATHS, *tiers.POSTGRES_PATHS, *tiers.SLOW_PATHS]
    assert [p for p in listed if not (ROOT / p).exists()] == []


def test_this_test_is_in_the_unit_tier(request: pytest.FixtureRequest) -> None:
    assert not [m.name for m in request.node.iter_markers() if m.name in TIERS]


def test_the_launcher_refuses_a_test_outside_the_torchrun_tier() -> None:
    assert launch.current_test_is_torchrun is False and launch.current_test_id.endswith(
        "test_the_launcher_refuses_a_test_outside_the_torchrun_tier"
    )
    with pytest.raises(AssertionError, match="is not in the torchrun tier"):
        launch._check_tier()  # what run_torchrun and start_torchrun do first (calling them would mark this test)


def test_make_test_fast_leaves_out_every_tier_and_the_docs_name_only_tiers() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    (fast,) = re.findall(r"^FAST := (.+)$", makefile, re.M)
    assert fast == f"not ({' or '.join(TIERS)})"
    assert re.search(r'^test-fast:.*\n\t.* -m "\$\(FAST\)"', makefile, re.M)
    assert re.search(r"^test:.*\n\t.*pytest -q --durations=25$", makefile, re.M)
    page = (ROOT / "docs" / "testing.md").read_text(encoding="utf-8")
    expressions = re.findall(r'(?<!python) -m (?:"([^"]+)"|(\w+))', page)
    words = {w for pair in expressions for e in pair for w in re.findall(r"\w+", e)} - {"not", "or", "and"}
    assert len(expressions) >= 3 and words == set(TIERS), words


def test_reading_a_test_that_imports_test_planners_registers_none() -> None:
    from skrull.solver.planners.registry import planner_names

    def _imports_test_planners() -> None:
        from tests.api.plugin_planners import gate  # registers the test planners on its first import

        gate()

    before = set(planner_names())
    tiers_of(fake_item(_imports_test_planners), "tests/api/test_x.py")
    assert set(planner_names()) == before
