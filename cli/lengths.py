"""``skrull lengths``: token lengths of SFT data, in the loader's global batches, as a planning request.

    skrull lengths train.jsonl --tokenizer tokenizer.json --field prompt --field response \\
        --global-batch-size 256 --seed 1234 --dp 4 --cp 8 -o request.json
    skrull lengths chats.parquet --tokenizer ./qwen --global-batch-size 64 --submit http://planner:8000
    skrull lengths --hub-dataset ./my-sft-dir --split train --tokenizer ./qwen --global-batch-size 64

Rows with a chat (``messages``) and no ``--field`` are rendered with the tokenizer's own chat template
(``apply_chat_template``) unless ``--chat-template`` names a fixed layout. ``--hub-dataset`` reads a Hugging
Face dataset by name or local path (``datasets``) instead of files. It was ``--dataset``, which still works
with a deprecation note: in ``plan``, ``compare`` and ``request``, ``--dataset`` names one of the bundled
length distributions instead, and such a name given here is refused at once (it would otherwise be looked
up on the Hub, retrying for half a minute offline).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from skrull.cli.flags import add_progress_flag
from skrull.corpus.lengths import BATCH_ROWS, count_rows, lengths_request
from skrull.corpus.progress import Progress
from skrull.corpus.readers import FORMATS
from skrull.corpus.source import open_text_source
from skrull.corpus.text import TEMPLATES
from skrull.solver.errors import RequestError
from skrull.solver.io import (
    DEFAULT_CP,
    DEFAULT_DP,
    DEFAULT_PROFILE,
    DEFAULT_SOLVER,
    dumps,
    parse_profile,
    read_json,
    request_from_dict,
)


def add_parser(sub: Any) -> None:
    p = sub.add_parser("lengths", help="token lengths of SFT data as a planning request")
    p.add_argument("data", nargs="*", metavar="DATA", help="JSONL / JSON / Parquet files (read in order)")
    p.add_argument(
        "--hub-dataset",
        metavar="NAME_OR_PATH",
        help="a Hugging Face dataset (name or local path) instead of DATA files",
    )
    p.add_argument(
        "--dataset",
        dest="legacy_dataset",
        metavar="NAME_OR_PATH",
        help="deprecated spelling of --hub-dataset (elsewhere --dataset names a bundled length distribution)",
    )
    p.add_argument("--split", default="train", help="the dataset's split (default train)")
    p.add_argument("--dataset-config", metavar="NAME", help="the dataset's configuration, where it has several")
    p.add_argument(
        "--tokenizer", "-t", required=True, help="tokenizer.json, a directory holding one, or a .tiktoken file"
    )
    text = p.add_argument_group("what is tokenized (default: the 'text' field)")
    text.add_argument("--field", "-f", action="append", help="text field (repeat to join several with a newline)")
    text.add_argument(
        "--chat-template",
        choices=TEMPLATES,
        help="render a chat (--messages-field): the tokenizer's own template (default for chat rows: "
        "apply_chat_template on a tokenizer directory) or a fixed layout",
    )
    text.add_argument("--messages-field", default="messages", help="the chat's field (default messages)")
    text.add_argument("--no-special-tokens", action="store_true", help="leave out the tokenizer's special tokens")
    text.add_argument("--tiktoken-pattern", help="split regex of a tiktoken file (default cl100k's)")
    text.add_argument("--max-length", type=int, help="truncate every sequence to this many tokens (the loader's limit)")
    text.add_argument("--format", choices=FORMATS, help="file format (default: by extension)")
    loader = p.add_argument_group("the loader's order")
    loader.add_argument("--global-batch-size", "-b", type=int, required=True, help="sequences per global batch")
    loader.add_argument("--seed", type=int, default=0, help="the loader's shuffle seed (default 0)")
    loader.add_argument("--epoch", type=int, default=0, help="epoch whose order to plan (default 0)")
    loader.add_argument("--no-shuffle", action="store_true", help="batches in file order")
    loader.add_argument("--keep-last", action="store_true", help="keep the last incomplete batch")
    loader.add_argument("--max-batches", type=int, help="plan only the first N global batches")
    req = p.add_argument_group("the request")
    req.add_argument("--dp", type=int, default=DEFAULT_DP, help=f"data-parallel degree (default {DEFAULT_DP})")
    req.add_argument("--cp", type=int, default=DEFAULT_CP, help=f"context-parallel degree (default {DEFAULT_CP})")
    req.add_argument(
        "--profile", default=DEFAULT_PROFILE, help=f"bundled profile or JSON file (default {DEFAULT_PROFILE})"
    )
    req.add_argument("--bucket-tokens", type=int, help="override the profile's memory bucket")
    req.add_argument("--solver", "-s", default=DEFAULT_SOLVER, help=f"planner (default {DEFAULT_SOLVER})")
    out = p.add_argument_group("output")
    out.add_argument("--output", "-o", metavar="FILE", help="write the request here (default: stdout)")
    out.add_argument("--submit", metavar="URL", help="submit the request to a planning service; print the plan id")
    out.add_argument("--lengths-out", metavar="FILE", help="also write every row's token count (JSON list)")
    out.add_argument("--batch-rows", type=int, default=BATCH_ROWS, help=argparse.SUPPRESS)
    add_progress_flag(out)
    p.set_defaults(func=cmd_lengths)


def _positive(flag: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise RequestError(flag, value, "must be an integer >= 1")


def _submit(url: str, doc: dict[str, Any]) -> str:
    """POST the request to the planning service at ``url``; its plan id. Failures name ``--submit``."""
    import httpx

    from skrull.api.client import PlanningClient, ServiceError

    try:
        with PlanningClient(url, retries=2) as client:
            return client.submit(doc)
    except ServiceError as exc:
        raise RequestError("--submit", url, f"the service refused the request ({exc})") from None
    except (OSError, httpx.HTTPError, ValueError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise RequestError("--submit", url, f"cannot reach the service ({reason})") from None


def hub_dataset(args: argparse.Namespace) -> str | None:
    """``--hub-dataset``, or the deprecated ``--dataset`` with a note on stderr; a bundled distribution's
    name (what ``--dataset`` means for ``plan``, ``compare`` and ``request``) is refused, naming the flag."""
    from skrull.solver.lengths.datasets import distribution_names

    name: str | None = args.hub_dataset
    flag = "--hub-dataset"
    if args.legacy_dataset is not None:
        if name is not None:
            raise RequestError("--dataset", args.legacy_dataset, "give --hub-dataset only (--dataset is its old name)")
        name, flag = args.legacy_dataset, "--dataset"
        print("skrull: note: `skrull lengths --dataset` is now --hub-dataset; --dataset still works", file=sys.stderr)
    if name is not None and name in distribution_names() and not Path(name).exists():
        raise RequestError(
            flag,
            name,
            "is a bundled length distribution (skrull request/plan/compare --dataset NAME samples it); "
            "skrull lengths counts tokens of real data: DATA files or --hub-dataset NAME_OR_PATH",
        )
    return name


def cmd_lengths(args: argparse.Namespace) -> int:
    for flag, value in (
        ("--global-batch-size", args.global_batch_size),
        ("--dp", args.dp),
        ("--cp", args.cp),
        ("--max-length", args.max_length),
        ("--max-batches", args.max_batches),
        ("--bucket-tokens", args.bucket_tokens),
        ("--batch-rows", args.batch_rows),
    ):
        _positive(flag, value)
    profile_doc: Any = args.profile
    if args.profile.endswith(".json") or Path(args.profile).is_file():
        profile_doc = read_json(args.profile, field="--profile")
    profile = parse_profile(profile_doc, field="--profile")
    source = open_text_source(
        tokenizer=args.tokenizer,
        files=args.data,
        dataset=hub_dataset(args),
        split=args.split,
        dataset_config=args.dataset_config,
        fmt=args.format,
        fields=args.field,
        chat_template=args.chat_template,
        messages_field=args.messages_field,
        add_special_tokens=not args.no_special_tokens,
        tiktoken_pattern=args.tiktoken_pattern,
    )
    lengths = count_rows(
        source.rows(),
        tokenizer=source.tokenizer,
        extract=source.extract,
        max_length=args.max_length,
        batch_rows=args.batch_rows,
        progress=Progress(total=source.total_bytes, unit=source.progress_unit, enabled=args.progress),
    )
    bucket = args.bucket_tokens or profile.bucket_tokens
    doc = lengths_request(
        lengths,
        global_batch_size=args.global_batch_size,
        seed=args.seed,
        dp=args.dp,
        cp=args.cp,
        profile=profile_doc,
        solver=args.solver,
        epoch=args.epoch,
        shuffle=not args.no_shuffle,
        drop_last=not args.keep_last,
        max_batches=args.max_batches,
        bucket_tokens=args.bucket_tokens,
        group_capacity_tokens=args.cp * bucket,
    )
    request_from_dict(doc)  # the same checks the planners and the service apply
    if args.lengths_out:
        Path(args.lengths_out).write_text(json.dumps(lengths) + "\n", encoding="utf-8")
    in_batches = sum(len(b) for b in doc["batches"])
    print(
        f"{len(lengths)} rows, {sum(lengths)} tokens (longest {max(lengths)}); {len(doc['batches'])} global batches of "
        f"{args.global_batch_size} ({in_batches} rows, seed {args.seed}, epoch {args.epoch})",
        file=sys.stderr,
    )
    if args.submit:
        print(_submit(args.submit, doc))
        if args.output:
            Path(args.output).write_text(dumps(doc, compact=True) + "\n", encoding="utf-8")
        return 0
    text = dumps(doc, compact=True)
    if args.output:
        Path(args.output).write_text(text + "\n", encoding="utf-8")
    else:
        sys.stdout.write(text + "\n")
    return 0
