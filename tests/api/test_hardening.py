"""Hostile input against the service and the CLI: huge integers, deep nesting, NaN/Infinity, unicode,
duplicate keys and unknown fields never give a 5xx or a traceback; each is one named refusal."""

from __future__ import annotations

import contextlib
import io
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skrull.api.app import create_app
from skrull.api.settings import Settings
from skrull.cli.main import main as cli_main
from tests.api.conftest import HAND_PROFILE, plan_request

# -- hostile JSON text -------------------------------------------------------------------------------------

HUGE_INTS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30),
    st.integers(min_value=2**53, max_value=10**400),
    st.sampled_from([10**400, -(10**400), 2**63, 2**64 + 1, -(2**63) - 1]),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    HUGE_INTS,
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["\u0000", "\ud800", "\U0001f600" * 5, "é" * 3, "", "1e400"]),
)


def to_text(value: Any) -> str:
    """JSON text of ``value`` as Python writes it: NaN/Infinity literals, integers of any length, lone
    surrogates escaped."""
    return json.dumps(value, allow_nan=True)


JSON_VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
).map(to_text)


@st.composite
def deep(draw: st.DrawFn) -> str:
    depth = draw(st.integers(min_value=60, max_value=3000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    return opener * depth + "1" + closer * depth


@st.composite
def duplicate_keys(draw: st.DrawFn) -> str:
    key = draw(st.sampled_from(["batches", "parallel", "profile", "dp", "x"]))
    return "{" + f'"{key}": 1, "{key}": 2' + "}"


#: Literals Python cannot even write as text (more than 4300 digits), given as text.
RAW_LITERALS = st.sampled_from(["NaN", "Infinity", "-Infinity", "1" * 5000, "-" + "9" * 4400, "1e999999", "-0.0e-999"])
HOSTILE_VALUES = st.one_of(JSON_VALUES, deep(), duplicate_keys(), RAW_LITERALS)

#: Where a hostile value goes in an otherwise valid request (a JSON path), or a new key.
PLACES = [
    ("batches",),
    ("batches", 0),
    ("batches", 0, 0),
    ("parallel",),
    ("parallel", "dp"),
    ("parallel", "cp"),
    ("parallel", "pp"),
    ("profile",),
    ("profile", "compute", "fixed_ms"),
    ("profile", "compute", "flops_per_token_sq"),
    ("profile", "memory", "bucket_tokens"),
    ("profile", "sources"),
    ("time_budget_s",),
    ("bucket_tokens",),
    ("seed",),
    ("solver",),
    ("deterministic",),
    ("solvr",),
    ("\u00e9t\u00e9",),
]
MARK = "__HOSTILE__"


def with_hostile(place: tuple[str | int, ...], value_text: str) -> str:
    """A valid request's text with the value at ``place`` replaced by ``value_text`` (verbatim)."""
    doc: Any = json.loads(json.dumps(plan_request([[30, 40, 50]], dp=1, cp=1)))
    target = doc
    for key in place[:-1]:
        target = target[key]
    target[place[-1]] = MARK
    return json.dumps(doc).replace(f'"{MARK}"', value_text)


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    db = tmp_path_factory.mktemp("hostile") / "jobs.db"
    with TestClient(create_app(Settings(db=db, solver_processes=0, max_queued_jobs=10**6))) as client:
        yield client


def assert_named_refusal_or_success(response: Any, *, sent: str = "") -> None:
    """No 5xx; a refusal is problem+json whose detail quotes no body as a Python bytes literal (unless the
    value sent itself holds ``b'``) and no traceback."""
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        assert response.headers["content-type"].startswith("application/problem+json"), response.text
        problem = response.json()
        assert problem["status"] == response.status_code and problem["detail"]
        assert "b'" in sent or "b'" not in problem["detail"], problem
        assert "Traceback" not in response.text


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(place=st.sampled_from(PLACES), value=HOSTILE_VALUES)
def test_hostile_values_in_a_request_are_named_refusals_never_5xx(
    app: TestClient, place: tuple[str | int, ...], value: str
) -> None:
    body = with_hostile(place, value)
    r = app.post(
        "/v1/plans", content=body.encode("utf-8", "surrogatepass"), headers={"content-type": "application/json"}
    )
    assert_named_refusal_or_success(r, sent=value)
    if r.status_code == 422:
        problem = r.json()
        assert problem["field"], problem


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=HOSTILE_VALUES, key=st.sampled_from(["compute", "comm", "memory", "microbatch_ms", "extra", "name"]))
def test_hostile_profiles_are_named_refusals_never_5xx(app: TestClient, value: str, key: str) -> None:
    doc = json.loads(json.dumps({**HAND_PROFILE, "name": "hostile-profile"}))
    doc[key] = MARK
    body = json.dumps(doc).replace(f'"{MARK}"', value)
    r = app.post(
        "/v1/profiles", content=body.encode("utf-8", "surrogatepass"), headers={"content-type": "application/json"}
    )
    assert_named_refusal_or_success(r, sent=value)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=st.one_of(HOSTILE_VALUES, st.binary(max_size=64).map(lambda b: b.decode("latin-1"))))
def test_whole_hostile_bodies_are_never_5xx(app: TestClient, body: str) -> None:
    for path in ("/v1/plans", "/v1/profiles", "/v1/compare"):
        r = app.post(path, content=body.encode("utf-8", "surrogatepass"), headers={"content-type": "application/json"})
        assert_named_refusal_or_success(r, sent=body)
        assert r.status_code != 202 or path == "/v1/plans"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (with_hostile(("profile", "compute", "fixed_ms"), str(10**400)), "profile.compute.fixed_ms"),
        (with_hostile(("profile", "compute", "fixed_ms"), "1" * 5000), "profile.compute.fixed_ms"),
        (with_hostile(("profile", "sources"), "[" * 800 + "]" * 800), "profile.sources"),
        (with_hostile(("time_budget_s",), "NaN"), "time_budget_s"),
        (with_hostile(("batches", 0, 0), "1e400"), "batches[0][0]"),
        ('{"batches": [[1]], "batches": [[2]], "parallel": {"dp": 1, "cp": 1}}', "batches"),
    ],
)
def test_the_reported_cases_name_the_field(app: TestClient, body: str, field: str) -> None:
    for path in ("/v1/plans", "/v1/compare"):
        r = app.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["field"].startswith(field), r.json()


def test_typos_are_refused_naming_the_field(app: TestClient) -> None:
    typo = {
        "batches": [[1024, 530, 31000]],
        "parallel": {"dp": 4, "cp": 8},
        "solvr": "ilp",
        "time_budget": 5,
        "bucket": 1000,
    }
    r = app.post("/v1/plans", json=typo)
    assert r.status_code == 422 and r.json()["field"] in {"solvr", "time_budget", "bucket"}, r.text
    r = app.post("/v1/plans", json={"batches": [[1024]], "parallel": {"dp": 4, "cp": 8, "pp": 2}})
    assert r.status_code == 422 and r.json()["field"] == "parallel.pp", r.text


def test_a_body_that_is_not_json_is_415_and_never_quoted_as_bytes(app: TestClient) -> None:
    body = json.dumps(plan_request([[10]]))
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {"content-type": content_type} if content_type else {}
        r = app.post("/v1/plans", content=body, headers=headers)
        assert r.status_code == 415, r.text
        problem = r.json()
        assert problem["field"] == "Content-Type" and "b'" not in r.text
    r = app.post("/v1/plans", content=body, headers={"content-type": "application/json; charset=utf-8"})
    assert r.status_code == 202, r.text


# -- the CLI ------------------------------------------------------------------------------------------------


def run_cli(*args: str) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli_main(list(args))
    return code, err.getvalue()


@pytest.fixture(scope="module")
def tiny_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cli")
    request = folder / "request.json"
    request.write_text(json.dumps(plan_request([[30, 40, 50]], dp=1, cp=1)))
    plan = folder / "plan.json"
    code, err = run_cli("plan", "--request", str(request), "--output", str(plan))
    assert code == 0, err
    return plan


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(place=st.sampled_from(PLACES), value=HOSTILE_VALUES)
def test_the_cli_refuses_hostile_request_files_with_one_line(
    tiny_plan: Path, tmp_path_factory: pytest.TempPathFactory, place: tuple[str | int, ...], value: str
) -> None:
    path = tmp_path_factory.mktemp("req") / "r.json"
    path.write_bytes(with_hostile(place, value).encode("utf-8", "surrogatepass"))
    code, err = run_cli("validate", "--request", str(path), "--plan", str(tiny_plan))
    assert code in (0, 2), err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("skrull: error: "), err
        assert "Traceback" not in err


def test_the_cli_names_typos_in_request_files(tmp_path: Path) -> None:
    for key, value in (("solvr", "ilp"), ("time_budget", 5), ("bucket", 1000)):
        path = tmp_path / f"{key}.json"
        path.write_text(json.dumps({**plan_request([[30]], dp=1, cp=1), key: value}))
        code, err = run_cli("plan", "--request", str(path))
        assert code == 2 and err.startswith(f"skrull: error: {key}: ") and err.count("\n") == 1, err
    path = tmp_path / "pp.json"
    path.write_text(json.dumps(plan_request([[30]], dp=1, cp=1) | {"parallel": {"dp": 1, "cp": 1, "pp": 2}}))
    code, err = run_cli("plan", "--request", str(path))
    assert code == 2 and err.startswith("skrull: error: parallel.pp: "), err


def test_the_cli_reports_a_huge_literal_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(with_hostile(("profile", "compute", "fixed_ms"), str(10**400)))
    code, err = run_cli("plan", "--request", str(path))
    assert code == 2 and "profile.compute.fixed_ms" in err and err.count("\n") == 1, err


def test_submitting_to_an_unreachable_service_is_one_line(tmp_path: Path) -> None:
    from tests.corpus.tiny import build_bpe_tokenizer, sample_texts

    tokenizer = build_bpe_tokenizer(tmp_path / "tokenizer.json")
    data = tmp_path / "d.jsonl"
    data.write_text("".join(json.dumps({"text": t}) + "\n" for t in sample_texts(8)))
    code, err = run_cli(
        "lengths",
        str(data),
        "--tokenizer",
        str(tokenizer),
        "--global-batch-size",
        "4",
        "--submit",
        "http://127.0.0.1:1",
    )
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err, err
    assert lines[-1].startswith("skrull: error: --submit: ") and "cannot reach" in lines[-1], err


def test_bounds_hold_for_documents_built_in_code() -> None:
    from skrull.solver.errors import RequestError
    from skrull.solver.io import request_from_dict

    for bad in (10**400, math.inf, math.nan, -(10**400)):
        doc = plan_request([[30]], dp=1, cp=1)
        doc["profile"] = {**HAND_PROFILE, "compute": {**HAND_PROFILE["compute"], "fixed_ms": bad}}
        with pytest.raises(RequestError) as err:
            request_from_dict(doc)
        assert err.value.field == "profile.compute.fixed_ms"


def test_usage_mistakes_and_a_taken_port_are_one_line_with_status_2(tmp_path: Path) -> None:
    import socket

    from tests.cli.test_main import skrull

    out = skrull("plan", "--no-such-flag")
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "--no-such-flag" in out.stderr, out.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = skrull("serve", "--port", str(port), "--db", str(tmp_path / "jobs.db"), "--solver-processes", "0")
    assert out.returncode == 2 and out.stderr.startswith("skrull: error: --port: "), out.stderr
    assert out.stderr.count("\n") == 1
