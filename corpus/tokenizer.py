"""Token counts with a tokenizer the user has locally (nothing is downloaded).

- ``tokenizer.json`` (or a directory holding one): the Hugging Face ``tokenizers`` library; counts come
  from ``encode_batch`` (Rust, parallel over texts), special tokens of the post-processor included
  (``--no-special-tokens`` leaves them out).
- a tiktoken BPE file (``*.tiktoken``: base64 token and rank per line): ``tiktoken`` with the cl100k
  split pattern unless ``--tiktoken-pattern`` says otherwise; ``encode_ordinary_batch`` (no specials).

Counting in batches is what makes this fast: one call per few thousand texts, not one per text.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from skrull.solver.errors import RequestError

#: The pre-tokenizer split pattern of OpenAI's cl100k_base (a published regular expression).
CL100K_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)

Encoder = Callable[[Sequence[str]], list[list[int]]]


@dataclass(frozen=True, slots=True, kw_only=True)
class LocalTokenizer:
    """A loaded tokenizer: ``encode(texts)`` gives every text's token ids, ``count(texts)`` their numbers
    (one encoder behind both, so a planned length is always the length of the ids the loader trains on)."""

    kind: str
    path: str
    encode: Encoder

    def count(self, texts: Sequence[str]) -> list[int]:
        return [len(ids) for ids in self.encode(texts)]


def load_tokenizer(
    path: str | Path,
    *,
    add_special_tokens: bool = True,
    tiktoken_pattern: str | None = None,
    num_threads: int | None = None,
) -> LocalTokenizer:
    """Load ``path`` as a ``tokenizers`` JSON file (or a directory with ``tokenizer.json``) or a tiktoken file."""
    p = Path(path)
    if p.is_dir():
        p = p / "tokenizer.json"
    if not p.is_file():
        raise RequestError(
            "--tokenizer", str(path), "no such file (a tokenizer.json, a directory holding one, or a .tiktoken file)"
        )
    threads = num_threads or os.cpu_count() or 1
    if p.suffix == ".json":
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise RequestError(
                "--tokenizer", str(path), f"needs the tokenizers package (pip install 'skrull[data]'): {exc}"
            ) from None
        try:
            tok = Tokenizer.from_file(str(p))
        except Exception as exc:  # the library raises a bare Exception for malformed files
            raise RequestError("--tokenizer", str(path), f"not a tokenizers JSON file ({exc})") from None

        # encode_batch_fast skips the character offsets a count does not need (tokenizers >= 0.20).
        encode = getattr(tok, "encode_batch_fast", tok.encode_batch)

        def encode_hf(texts: Sequence[str]) -> list[list[int]]:
            return [e.ids for e in encode(list(texts), add_special_tokens=add_special_tokens)]

        return LocalTokenizer(kind="tokenizers", path=str(p), encode=encode_hf)
    try:
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe
    except ImportError as exc:
        raise RequestError(
            "--tokenizer", str(path), f"needs the tiktoken package (pip install 'skrull[data]'): {exc}"
        ) from None
    try:
        ranks = load_tiktoken_bpe(str(p))
    except Exception as exc:  # malformed lines raise ValueError / binascii.Error
        raise RequestError("--tokenizer", str(path), f"not a tiktoken BPE file ({exc})") from None
    enc = tiktoken.Encoding(
        name=p.stem, pat_str=tiktoken_pattern or CL100K_PATTERN, mergeable_ranks=ranks, special_tokens={}
    )

    def encode_tt(texts: Sequence[str]) -> list[list[int]]:
        return enc.encode_ordinary_batch(list(texts), num_threads=threads)

    return LocalTokenizer(kind="tiktoken", path=str(p), encode=encode_tt)
