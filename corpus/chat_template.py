"""Chats rendered by the tokenizer's own chat template (``transformers``' ``apply_chat_template``).

A model's chat template is part of its tokenizer (``chat_template`` in ``tokenizer_config.json``, or
``chat_template.jinja`` beside it); rendering with it gives exactly the text the model is trained on,
role markers, BOS and generation prompt conventions included. The rendered text already holds the
special tokens the template writes, so it is counted without adding the tokenizer's own
(``add_special_tokens=False``, as ``apply_chat_template(..., tokenize=True)`` does).

Only a local tokenizer directory is read (``local_files_only``): nothing is downloaded.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from skrull.solver.errors import RequestError

Messages = Sequence[tuple[str, str]]
ChatRenderer = Callable[[Messages], str]


def tokenizer_chat_renderer(path: str | Path) -> ChatRenderer:
    """A function rendering ``[(role, content), ...]`` with the chat template of the tokenizer at ``path``."""
    directory = Path(path)
    if not directory.is_dir():
        raise RequestError(
            "--tokenizer",
            str(path),
            "the tokenizer's chat template needs a tokenizer directory (tokenizer.json with tokenizer_config.json "
            "or chat_template.jinja); give one, or --chat-template chatml|llama3|plain",
        )
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise RequestError(
            "--chat-template", "tokenizer", f"needs the transformers package (pip install 'skrull[data]'): {exc}"
        ) from None
    try:
        tokenizer: Any = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise RequestError("--tokenizer", str(path), f"not a loadable tokenizer directory ({exc})") from None
    if not getattr(tokenizer, "chat_template", None):
        raise RequestError(
            "--tokenizer",
            str(path),
            "has no chat template (chat_template in tokenizer_config.json or chat_template.jinja); "
            "give --chat-template chatml|llama3|plain",
        )

    def render(messages: Messages) -> str:
        conversation = [{"role": role, "content": content} for role, content in messages]
        text = tokenizer.apply_chat_template(conversation, tokenize=False)
        return str(text)

    return render
