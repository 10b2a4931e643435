"""What of a row is tokenized: one or more text fields, or a chat rendered with a template.

``tokenizer`` (the default for chat rows) renders a chat with the tokenizer's own chat template through
``transformers``' ``apply_chat_template`` (corpus/chat_template.py): exactly what the model is trained
on. For a bare ``tokenizer.json`` (or a tiktoken file), which carries no template, one of these fixed
layouts gives a close count (the published prompt formats; only the text layout matters for counting):

- ``chatml``  (Qwen, many SFT sets): ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message;
- ``llama3``: ``<|begin_of_text|>`` then ``<|start_header_id|>{role}<|end_header_id|>\\n\\n{content}<|eot_id|>``
  per message;
- ``plain``: ``{role}: {content}\\n`` per message (a template-free count).

Messages are a list of ``{"role", "content"}`` objects (the OpenAI / Hugging Face chat spelling); the
ShareGPT spelling ``{"from", "value"}`` is accepted too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from skrull.solver.errors import RequestError

#: ``tokenizer``: the tokenizer's own template; the others: fixed layouts, for tokenizers without one.
TOKENIZER_TEMPLATE = "tokenizer"
TEMPLATES: tuple[str, ...] = (TOKENIZER_TEMPLATE, "chatml", "llama3", "plain")


def _messages(row: Mapping[str, Any], field: str, where: str) -> list[tuple[str, str]]:
    value = row.get(field)
    if not isinstance(value, list):
        raise RequestError(f"{where}.{field}", value, "must be a list of chat messages")
    out = []
    for k, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise RequestError(f"{where}.{field}[{k}]", m, "must be a message object")
        role = m.get("role", m.get("from"))
        content = m.get("content", m.get("value"))
        if not isinstance(role, str) or not isinstance(content, str):
            raise RequestError(f"{where}.{field}[{k}]", dict(m), "needs string role/content (or from/value)")
        out.append((role, content))
    return out


def render_chat(messages: Sequence[tuple[str, str]], template: str) -> str:
    if template == "chatml":
        return "".join(f"<|im_start|>{r}\n{c}<|im_end|>\n" for r, c in messages)
    if template == "llama3":
        return "<|begin_of_text|>" + "".join(
            f"<|start_header_id|>{r}<|end_header_id|>\n\n{c}<|eot_id|>" for r, c in messages
        )
    if template == "plain":
        return "".join(f"{r}: {c}\n" for r, c in messages)
    raise RequestError("--chat-template", template, f"must be one of {', '.join(TEMPLATES)}")


def text_extractor(
    *,
    fields: Sequence[str] | None,
    chat_template: str | None,
    messages_field: str = "messages",
    chat_renderer: Callable[[Sequence[tuple[str, str]]], str] | None = None,
) -> Callable[[Any, int], str]:
    """A function ``(row, row_number) -> text``; fields are joined with a newline. ``chat_renderer`` renders
    chats for ``chat_template="tokenizer"`` (``corpus.chat_template.tokenizer_chat_renderer``)."""
    if chat_template is not None:
        if fields:
            raise RequestError("--field", list(fields), "give either --field or --chat-template, not both")
        if chat_template == TOKENIZER_TEMPLATE:
            if chat_renderer is None:
                raise RequestError("--chat-template", chat_template, "needs the tokenizer's chat renderer")
            renderer = chat_renderer
        else:
            render_chat([], chat_template)  # refuse an unknown template up front
            template = chat_template

            def renderer(messages: Sequence[tuple[str, str]]) -> str:
                return render_chat(messages, template)

        def chat(row: Any, number: int) -> str:
            where = f"row {number}"
            if not isinstance(row, Mapping):
                raise RequestError(where, row, "must be an object")
            return renderer(_messages(row, messages_field, where))

        return chat
    names = list(fields or ["text"])

    def join(row: Any, number: int) -> str:
        if isinstance(row, str) and names == ["text"]:
            return row
        if not isinstance(row, Mapping):
            raise RequestError(f"row {number}", row, "must be an object")
        parts = []
        for name in names:
            value = row.get(name)
            if not isinstance(value, str):
                shown = sorted(row)[:8]
                raise RequestError(f"row {number}.{name}", value, f"must be a string (row fields: {', '.join(shown)})")
            parts.append(value)
        return "\n".join(parts)

    return join
