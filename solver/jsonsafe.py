"""Reading JSON that may be hostile: every value bounded and finite, nesting bounded, keys unique.

Python's parser accepts ``NaN`` and ``Infinity``, converts integer literals of any length (10^400 then
overflows the first ``float()``; 10^5000 raises), recurses once per nesting level and keeps the last of
duplicate keys. ``loads_json`` marks all of these while parsing and ``check_bounded`` refuses them with
one ``RequestError`` naming the JSON path (``profile.compute.fixed_ms``), before any arithmetic:

* nesting deeper than ``MAX_JSON_DEPTH``;
* ``NaN``, ``Infinity``, ``-Infinity``, and float literals that overflow (``1e400``);
* integers beyond ``MAX_JSON_INT`` (2^53, exact as floats); literals longer than ``MAX_INT_DIGITS``
  digits are never converted at all;
* an object key given twice;
* a string (a value or a key) holding NUL or a lone UTF-16 surrogate (``"\ud800"``): JSON's escapes allow
  both, but neither is text: a surrogate cannot be encoded as UTF-8 (writing it to a file, a terminal or
  SQLite fails) and PostgreSQL refuses NUL in text. ``check_text`` is the same check for strings that
  arrive elsewhere (URL path segments, headers).

``check_bounded`` also runs on documents built in code (it is what request and profile parsing call), and
walks with an explicit stack, so no document can exhaust the interpreter's recursion.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from skrull.solver.errors import RequestError

#: Deepest nesting of objects and lists a document may have (a request needs 3, a profile a few more).
MAX_JSON_DEPTH = 64
#: Largest magnitude of an integer anywhere in a document: 2^53, so every integer is exact as a float too.
MAX_JSON_INT = 2**53
#: Integer literals longer than this are refused unconverted (converting 10^4000 costs time; more raises).
MAX_INT_DIGITS = 40


class _HugeInt(str):
    """An integer literal with more than ``MAX_INT_DIGITS`` digits, kept as its text (never converted)."""


class _NonFinite(str):
    """``NaN``, ``Infinity`` or ``-Infinity``: not JSON, accepted by Python's parser, refused by ``loads_json``."""


class _DuplicateKeys(dict):  # type: ignore[type-arg]
    """An object with a key given twice; ``duplicate`` is the first repeated key."""

    duplicate: str = ""


def _int_literal(text: str) -> int | _HugeInt:
    return _HugeInt(text) if len(text.lstrip("-")) > MAX_INT_DIGITS else int(text)


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        dup = _DuplicateKeys(out)
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                dup.duplicate = key
                break
            seen.add(key)
        return dup
    return out


_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def join_path(path: str, key: str | int) -> str:
    """``path.key`` or ``path[3]``; a key that is not a plain name is written as a JSON string
    (``path["a b"]``), so a path is always one line of ASCII."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    if not _PLAIN_KEY.fullmatch(key):
        return f"{path}[{json.dumps(key[:64])}]"
    return f"{path}.{key}" if path else key


def _ints_in_range(values: list[Any]) -> bool:
    """Fast path for long lists of plain integers (token lengths): every one within ``MAX_JSON_INT``."""
    return set(map(type, values)) == {int} and min(values) >= -MAX_JSON_INT and max(values) <= MAX_JSON_INT


_NOT_TEXT = re.compile("[\x00\ud800-\udfff]")


def check_text(value: str, field: str) -> None:
    """Refuse a string holding NUL or a lone surrogate, naming the field (the module doc says why)."""
    found = _NOT_TEXT.search(value)
    if found is not None:
        char = found.group()
        what = "NUL (\\u0000)" if char == "\x00" else f"a lone surrogate (\\u{ord(char):04x})"
        shown = value[:64].encode("ascii", "backslashreplace").decode("ascii")
        raise RequestError(field, shown, f"holds {what}, which is not text; send valid Unicode without NUL")


def check_bounded(doc: Any, *, field: str = "", root: str = "body") -> None:
    """Refuse what ``loads_json`` marks, and nesting deeper than ``MAX_JSON_DEPTH``, naming the JSON path.

    Iterative (an explicit stack), so no document can exhaust the interpreter's recursion."""
    stack: list[tuple[Any, str, int]] = [(doc, field, 0)]
    while stack:
        value, path, depth = stack.pop()
        where = path or root
        if isinstance(value, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                shown = where if len(where) <= 60 else where[:57] + "..."
                raise RequestError(shown, "...", f"nested deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(value, _DuplicateKeys):
                raise RequestError(join_path(path, value.duplicate), value.duplicate, "key given more than once")
            if isinstance(value, dict):
                for k in value:
                    if isinstance(k, str) and _NOT_TEXT.search(k):
                        check_text(k, join_path(path, k))
                stack.extend((v, join_path(path, str(k)), depth + 1) for k, v in value.items())
            elif value and not _ints_in_range(value):
                stack.extend((v, join_path(path, k), depth + 1) for k, v in enumerate(value))
        elif isinstance(value, str) and not isinstance(value, (_HugeInt, _NonFinite)):
            check_text(value, where)
        elif isinstance(value, _HugeInt):
            raise RequestError(
                where, value[:12] + "...", f"an integer literal of {len(value)} digits; integers are at most 2^53"
            )
        elif isinstance(value, _NonFinite):
            raise RequestError(where, str(value), "NaN and Infinity are not JSON numbers; give a finite number")
        elif isinstance(value, float) and math.isnan(value):
            raise RequestError(where, str(value), "not a number; give a finite number")
        elif isinstance(value, float) and not math.isfinite(value):
            raise RequestError(where, str(value), "the number overflows; give a finite number")
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_JSON_INT:
            raise RequestError(where, value, "out of range; integers are at most 2^53 in magnitude")


class MalformedJsonError(RequestError):
    """The text is not JSON at all (a syntax error, or bytes that are not UTF-8)."""


def loads_json(text: str | bytes, *, field: str = "body") -> Any:
    """Parse JSON text, refusing hostile values (see the module docstring) with a ``RequestError``."""
    try:
        doc = json.loads(text, parse_int=_int_literal, parse_constant=_NonFinite, object_pairs_hook=_object)
    except RecursionError:
        raise RequestError(field, "...", f"nested deeper than {MAX_JSON_DEPTH} levels") from None
    except json.JSONDecodeError as exc:
        raise MalformedJsonError(
            field, None, f"malformed JSON at line {exc.lineno} column {exc.colno} (position {exc.pos}): {exc.msg}"
        ) from None
    except UnicodeDecodeError as exc:
        raise MalformedJsonError(field, None, f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    check_bounded(doc, root=field)
    return doc


def read_object(value: Any, field: str, *, shape: str = "a JSON object") -> dict[str, Any]:
    """An object field of a parsed document; the refusal says ``must be <shape>``."""
    if not isinstance(value, dict):
        raise RequestError(field, value, f"must be {shape}")
    return value


def read_list(value: Any, field: str, *, of: str) -> list[Any]:
    """A list field of a parsed document; the refusal says ``must be a list of <of>``."""
    if not isinstance(value, list):
        raise RequestError(field, value, f"must be a list of {of}")
    return value


def read_int(value: Any, field: str, *, minimum: int, maximum: int = MAX_JSON_INT) -> int:
    """An integer field of a parsed document in ``minimum..maximum`` (booleans are not integers)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(field, value, f"must be an integer >= {minimum}")
    if value < minimum:
        raise RequestError(field, value, f"must be an integer >= {minimum}")
    if value > maximum:
        raise RequestError(field, value, f"must be an integer <= {maximum}")
    return value


def read_ints(value: Any, field: str, *, what: str = "sequence ids") -> tuple[int, ...]:
    """A list of integers >= 0 (ids, offsets), each bounded like ``read_int``."""
    if not isinstance(value, list):
        raise RequestError(field, value, f"must be a list of {what}")
    # fast path (a group's ranks at CP 16,384 are 16,384 of them): all plain ints in range; else the
    # element-wise reader names the first bad one
    if all(type(v) is int for v in value) and (not value or (min(value) >= 0 and max(value) <= MAX_JSON_INT)):
        return tuple(value)
    return tuple(read_int(v, f"{field}[{k}]", minimum=0) for k, v in enumerate(value))
