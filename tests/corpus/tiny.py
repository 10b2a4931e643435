"""Builders of a tiny byte-level BPE tokenizer and a tiny tiktoken file, built here (nothing is downloaded)."""

from __future__ import annotations

import base64
from pathlib import Path

WORDS = [
    *["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog"],
    *["while", "planners", "balance", "long", "and", "short", "sequences"],
]


def sample_texts(n: int, *, seed: int = 0) -> list[str]:
    """Deterministic texts of varied length (1..~400 words)."""
    out = []
    state = seed * 7919 + 1
    for k in range(n):
        state = (state * 1103515245 + 12345) % 2**31
        words = [WORDS[(state >> (j % 13)) % len(WORDS)] for j in range(1 + state % (40 + 10 * (k % 9)))]
        out.append(" ".join(words))
    return out


def build_bpe_tokenizer(path: Path) -> Path:
    """Train a byte-level BPE of 300 tokens on ``sample_texts`` in-process; save it as ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sample_texts(200), trainer=trainer)
    tok.save(str(path))
    return path


def build_tiktoken_file(path: Path) -> Path:
    """The 256 single bytes and a few merges, in tiktoken's file format (base64 token, rank)."""
    tokens = [bytes([b]) for b in range(256)] + [b"th", b"the", b" the", b"qu", b"ck", b"ick"]
    path.write_text("".join(f"{base64.b64encode(t).decode()} {rank}\n" for rank, t in enumerate(tokens)))
    return path


#: A chat template in the Jinja form tokenizers carry (``chat_template`` of ``tokenizer_config.json``),
#: written here: a BOS, then each message between role markers.
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }} [/{{ m['role'] }}]\n{% endfor %}"
)


def build_chat_tokenizer_dir(directory: Path) -> Path:
    """A tokenizer directory as models ship them: ``tokenizer.json`` (the tiny BPE) and a
    ``tokenizer_config.json`` naming its class, BOS token and chat template."""
    import json

    directory.mkdir(parents=True, exist_ok=True)
    build_bpe_tokenizer(directory / "tokenizer.json")
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "chat_template": CHAT_TEMPLATE}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory
