"""Output sizes, counted in JSON tokens: the values of a document (numbers, strings, ...), estimated from
its text as ``separators + 1`` (one comma between neighbouring values; exact for the id and range lists
that make up plans and rank views, and within a few per object otherwise).

A small request can ask for a large answer: every microbatch of a plan lists the ranks of its group, so
a few sequences on a 65,536-GPU context-parallel group make each rank view megabytes long. The service
bounds what it stores and serves per request, in these units (``SKRULL_MAX_PLAN_TOKENS`` for a whole
plan, ``SKRULL_MAX_ITERATION_TOKENS`` for one iteration, which is what a rank view is rendered from, and
``SKRULL_MAX_VIEW_TOKENS`` per answer). Light on purpose: solver processes import it.
"""

from __future__ import annotations

from skrull.solver.errors import RequestError

#: Default output bounds (settings SKRULL_MAX_*; docs/service-hardening.md): JSON tokens of a whole plan,
#: of one iteration (what rank views are rendered from), of one rank-view answer; cache memory in bytes.
DEFAULT_MAX_PLAN_TOKENS = 8_000_000
DEFAULT_MAX_ITERATION_TOKENS = 2_000_000
DEFAULT_MAX_VIEW_TOKENS = 262_144
DEFAULT_CACHE_BYTES = 128 * 2**20
#: Bytes of a whole stored plan (``SKRULL_MAX_PLAN_BYTES``): tokens alone do not bound bytes (an
#: ``equal_microbatches`` plan over 65,536 GPUs is mostly ``[]``, three bytes a token), and every reader of
#: an envelope not in the shared cache holds its own copy, so this bounds the memory one reader costs.
DEFAULT_MAX_PLAN_BYTES = 32 * 2**20


def json_tokens(text: str | bytes) -> int:
    """The JSON tokens of a document's text (``separators + 1``)."""
    if isinstance(text, bytes):
        return text.count(b",") + 1
    return text.count(",") + 1


def check_plan_tokens(text: str, limit: int, *, what: str, max_bytes: int = DEFAULT_MAX_PLAN_BYTES) -> None:
    """Refuse (a 422 stored with the job) a plan or iteration document of more than ``limit`` tokens or
    ``max_bytes`` bytes (an ASCII document: its length)."""
    if len(text) > max_bytes:
        raise RequestError(
            "plan",
            len(text),
            f"{what} has {len(text)} bytes; at most {max_bytes} are stored and served (SKRULL_MAX_PLAN_BYTES): plan "
            "fewer sequences or fewer GPUs per request",
        )
    tokens = json_tokens(text)
    if tokens > limit:
        setting = "SKRULL_MAX_PLAN_TOKENS" if what == "the plan" else "SKRULL_MAX_ITERATION_TOKENS"
        raise RequestError(
            "plan",
            tokens,
            f"{what} has {tokens} JSON tokens; at most {limit} are stored and served ({setting}): "
            "plan fewer sequences or fewer GPUs per request",
        )


#: The most bars (one per GPU per microbatch) a timeline picture draws (``SKRULL_MAX_PICTURE_BARS``): about
#: 150-300 bytes of SVG each, so a few MB at most.
DEFAULT_MAX_PICTURE_BARS = 20_000
