"""Writes the quick start's sample data next to this file: ``train.jsonl`` (96 SFT records of varied lengths,
from a fixed seed) and ``tokenizer.json`` (a small byte-level BPE trained here on those records with the
``tokenizers`` library: built locally, nothing downloaded). The committed files are its output:

    python examples/data/make_sample.py

Only for trying ``skrull lengths`` as the README shows; real runs use the model's own tokenizer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORDS = tuple(
    " ".join(
        [
            "the a long context model sequence token batch plan rank group attention memory bucket schedule",
            "data parallel shard gradient step loss learning rate layer head query key value cache time budget",
            "search question answer explain why how when which document chapter summary table figure section",
            "result",
        ]
    ).split()
)


def records(seed: int = 0, count: int = 96) -> list[dict[str, str]]:
    """Short records mixed with a few long ones, as SFT data is (lengths in words: mostly 20-300, 1 in 12 long)."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        words = rng.randint(1500, 6000) if rng.random() < 1 / 12 else rng.randint(20, 300)
        out.append({"text": " ".join(rng.choice(WORDS) for _ in range(words))})
    return out


def main() -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    rows = records()
    (HERE / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<|endoftext|>"], show_progress=False)
    tokenizer.train_from_iterator((r["text"] for r in rows), trainer=trainer)
    tokenizer.save(str(HERE / "tokenizer.json"))


if __name__ == "__main__":
    main()
