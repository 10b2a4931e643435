"""The shell in README.md and docs/ cannot go stale.

Every ``skrull`` command shown (in sh/bash blocks, and every ``$ ...`` line of a transcript) is parsed by
the real command-line parser, every ``make`` target named exists, every file a command reads from the
repository exists, and every transcript (a ``$ command`` line followed by what it printed) is run and its
output compared with the text, with what legitimately changes from run to run masked: decimal numbers
(timings, estimates, errors), timestamps, ETags, and the throughput column. A transcript that needs a
CUDA GPU is run only where one is present; the curl walk-through runs against a real ``skrull serve``.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.docs.test_links import PAGES, ROOT

BLOCK = re.compile(r"^```([\w-]*)\n(.*?)^```", re.S | re.M)
SHELL_BLOCKS = {"sh", "bash", "shell", "console"}
OPERATORS = {"&&", "||", "|", ";", "&"}
#: Files a transcript reads that the text describes but the repository does not hold.
FIXTURES = {
    "bad.json": {
        "batches": [[1024, 530], [77, 12000, -5]],
        "parallel": {"dp": 4, "cp": 8},
        "profile": "h100-80g/qwen2.5-0.5b",
    }
}


@dataclass(frozen=True)
class Transcript:
    page: Path
    line: int
    command: str
    expected: str


def _logical_lines(body: str) -> Iterator[tuple[int, str]]:
    """Lines of a block with backslash continuations joined, with their offset in the block."""
    pending: list[str] = []
    start = 0
    for k, line in enumerate(body.splitlines()):
        if not pending:
            start = k
        if line.rstrip().endswith("\\"):
            pending.append(line.rstrip()[:-1])
            continue
        pending.append(line)
        yield start, " ".join(part.strip() for part in pending)
        pending = []


def blocks(page: Path) -> Iterator[tuple[str, int, str]]:
    """(language, first line number, body) of every fenced block of a page."""
    text = page.read_text(encoding="utf-8")
    for match in BLOCK.finditer(text):
        yield match.group(1), text.count("\n", 0, match.start(2)) + 1, match.group(2)


def shell_commands() -> list[tuple[str, str]]:
    """(where, command line) of every shell command shown: sh/bash lines and ``$`` lines of any block."""
    found = []
    for page in PAGES:
        for lang, first, body in blocks(page):
            for offset, line in _logical_lines(body):
                where = f"{page.relative_to(ROOT)}:{first + offset}"
                if line.startswith("$ "):
                    found.append((where, line[2:]))
                elif lang in SHELL_BLOCKS and line.strip() and not line.lstrip().startswith("#"):
                    found.append((where, line))
    return found


def simple_commands(line: str) -> list[list[str]]:
    """A command line split into its simple commands (at ``&&``, ``|``, ...), comments and env prefixes off."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars="|&;")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    commands: list[list[str]] = [[]]
    for token in lexer:
        if token in OPERATORS:
            commands.append([])
        else:
            commands[-1].append(token)
    result = []
    for words in commands:
        while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
            words = words[1:]
        if words:
            result.append(words)
    return result


def skrull_invocations() -> list[tuple[str, list[str]]]:
    calls = []
    for where, line in shell_commands():
        for words in simple_commands(line):
            if Path(words[0]).name == "skrull":
                calls.append((where, words[1:]))
    return calls


def test_the_docs_show_the_commands_a_user_runs() -> None:
    calls = skrull_invocations()
    subcommands = {argv[0] for _, argv in calls if argv}
    assert len(calls) >= 30, len(calls)
    assert {"plan", "compare", "request", "serve", "show", "lengths", "execute", "finetune"} <= subcommands


@pytest.mark.parametrize(("where", "argv"), skrull_invocations(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_skrull_command_in_the_docs_parses(where: str, argv: list[str]) -> None:
    from skrull.cli.main import build_parser

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as exc:  # --help and --version exit 0; a stale flag or subcommand exits 2
        assert exc.code == 0, f"{where}: skrull {' '.join(argv)}: {stderr.getvalue().strip()}"
    for k, word in enumerate(argv):  # a repository file a command reads must exist
        if re.fullmatch(r"(examples|profiles|docs|bench)/[\w./-]+\.(json|jsonl|py)", word):
            written = k > 0 and argv[k - 1] in ("-o", "--output", "--plot")
            assert written or (ROOT / word).is_file(), f"{where}: {word} does not exist"


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    return set(re.findall(r"^([a-z][\w-]*):", text, re.M))


def test_every_make_target_in_the_docs_exists() -> None:
    targets = make_targets()
    named = {
        (where, words[1]) for where, line in shell_commands() for words in simple_commands(line) if words[0] == "make"
    }
    for page in PAGES:  # and in inline code: `make demo`
        text = page.read_text(encoding="utf-8")
        named |= {(page.name, t) for t in re.findall(r"`make (?:[A-Z_]+=[^\s`]+ )*([a-z][\w-]*)", text)}
    stale = {(where, t) for where, t in named if t not in targets}
    assert len(named) >= 5 and not stale, stale


# -- transcripts ------------------------------------------------------------------------------------------


def transcripts() -> list[Transcript]:
    found = []
    for page in PAGES:
        for _lang, first, body in blocks(page):
            lines = list(_logical_lines(body))
            for k, (offset, line) in enumerate(lines):
                if not line.startswith("$ "):
                    continue
                out = []
                for _, following in lines[k + 1 :]:
                    if following.startswith("$ "):
                        break
                    out.append(following)
                found.append(Transcript(page, first + offset, line[2:], "\n".join(out)))
    return found


FLOAT = re.compile(r"-?\d+\.\d+(?:e[-+]?\d+)?")
ETAG = re.compile(r'"[0-9a-f]{20}\.\d+"')
#: per-rank throughput of ``skrull execute``: the last cell of a table row with timings
RATE_CELL = re.compile(r"(<F> \|) \d+ \|$", re.M)
BUDGET_NOTE = re.compile(r'"status":"(?:feasible|optimal)"')
#: whether the solve got its share of the CPU depends on the machine's load, not on the service
STARVED = re.compile(r'"cpu_starved":(?:true|false)')


#: response headers the walk-through leaves out (they change with the moment and the server's version)
UNSHOWN_HEADERS = re.compile(r"^(?:date|server|content-length): .*\n", re.M | re.I)


def masked(text: str) -> str:
    text = UNSHOWN_HEADERS.sub("", text)
    text = ETAG.sub('"<etag>"', text)
    text = FLOAT.sub("<F>", text)
    text = BUDGET_NOTE.sub('"status":"<solve status>"', text)
    text = STARVED.sub('"cpu_starved":<load>', text)
    text = re.sub(r"[ \t]+", " ", text)
    text = RATE_CELL.sub(r"\1 <N> |", text)
    text = re.sub(r"-{3,}", "---", text)
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def _needs_gpu(t: Transcript) -> bool:
    return t.command.startswith("skrull profile") and "--device cpu" not in t.command


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


#: a long command's progress on stderr when it is not a terminal (``skrull execute: [1/2] ...``): what a
#: terminal shows as a bar instead, so the transcripts leave it out (tests/cli test it)
PROGRESS_LINE = re.compile(r"^skrull [a-z-]+(?: --[a-z-]+)?: .*\n?", re.M)


def _run(command: str, cwd: Path, env: dict[str, str]) -> str:
    out = subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    return out.stdout + PROGRESS_LINE.sub("", out.stderr)


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHONPATH": str(ROOT)}


CLI = [t for t in transcripts() if t.command.startswith("skrull ")]
CURL = [t for t in transcripts() if t.command.startswith("curl ")]


def test_the_transcripts_found_are_the_ones_shown() -> None:
    assert len(CLI) >= 3 and len(CURL) >= 5
    assert {t.page.name for t in CURL} == {"service.md"}


@pytest.mark.parametrize("transcript", CLI, ids=lambda t: f"{t.page.name}:{t.line}")
def test_a_cli_transcript_prints_what_the_docs_show(transcript: Transcript, tmp_path: Path) -> None:
    if _needs_gpu(transcript) and _has_cuda():
        pytest.skip("the transcript shows the message of a machine without a CUDA GPU; this one has one")
    work = tmp_path / "work"
    shutil.copytree(ROOT / "examples", work / "examples")
    for name, doc in FIXTURES.items():
        (work / name).write_text(json.dumps(doc), encoding="utf-8")
    printed = _run(transcript.command, work, _env())
    assert masked(printed) == masked(transcript.expected), f"{transcript.page.name}:{transcript.line}\n{printed}"


def test_the_curl_walkthrough_names_the_plan_id_the_example_request_gets() -> None:
    # the id is the content address of the request with its profile inlined: a change to the bundled
    # profile (or to the request's canonical form) changes it, and every URL of the walk-through with it
    from skrull.api.schemas import canonical_request_json, job_id_for, request_from_document

    request = request_from_document(json.loads((ROOT / "examples/requests/contract-example.json").read_text()))
    plan_id = job_id_for(canonical_request_json(request))
    (post,) = [t for t in CURL if "contract-example.json" in t.command]
    shown = re.findall(r"/v1/plans/([0-9a-f]{32})", "".join(t.command + t.expected for t in CURL))
    assert shown and set(shown) == {plan_id}, (
        f"{post.page.name}:{post.line}: the walk-through shows {sorted(set(shown))}; the example request's id "
        f"is now {plan_id} (replace it in docs/service.md, with the ETags of the rank view)"
    )


def test_the_curl_walkthrough_answers_what_the_docs_show(tmp_path: Path) -> None:
    if shutil.which("curl") is None or shutil.which("jq") is None:
        pytest.skip("curl and jq are what the walk-through uses; this machine lacks one")
    from tests.api.conftest import LiveServer

    server = LiveServer(tmp_path / "skrull.db", log_dir=tmp_path).start()
    try:
        for t in CURL:
            command = t.command.replace("localhost:8000", f"127.0.0.1:{server.port}")
            printed = _run(command, ROOT, _env()).replace("\r\n", "\n")
            assert masked(printed) == masked(t.expected), f"{t.page.name}:{t.line}\n{printed}"
    finally:
        server.close()


def test_the_demo_table_in_the_docs_has_the_columns_and_rows_make_demo_prints() -> None:
    # the numbers are a measurement of one commit on one machine (the section says which); what the
    # command prints around them, its title, columns and planners in order, must be what it prints now
    (recipe,) = re.findall(r"^demo:.*\n\t(.*)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    command = recipe.replace("$(BIN)/", "")
    assert command.startswith("skrull compare ")
    text = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    section = text.split("## `make demo`", 1)[1]
    shown = BLOCK.search(section)
    assert shown is not None
    printed = _run(command, ROOT, _env())

    def shape(table: str) -> tuple[str, list[str], list[str], list[str]]:
        lines = [line for line in table.strip().splitlines() if line.strip()]
        rows = [line for line in lines if line.startswith("|")]
        header = [cell.strip() for cell in rows[0].strip("|").split("|")]
        solvers = [line.strip("|").split("|")[0].strip() for line in rows[2:]]
        legend = [line.split()[0] for line in lines[lines.index(rows[-1]) + 1 :]]  # what each column means
        return lines[0], header, solvers, legend

    assert shape(printed) == shape(shown.group(2)), printed
