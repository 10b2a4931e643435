"""Tokenizing throughput of ``skrull lengths``: MB of text per second per core with a byte-level BPE.

Builds a byte-level BPE tokenizer (vocabulary 8192, trained in-process on the generated text) and a
JSONL file of SFT-like rows, then times ``skrull.corpus.lengths.count_lengths`` (read + extract + batch encode)
with the tokenizer library limited to one thread (``RAYON_NUM_THREADS=1``, so the figure is per core)
and with every core. Prints a table; run ``python bench/lengths.py [--mb 40]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_corpus(path: Path, *, mb: float, seed: int = 0) -> None:
    rng = random.Random(seed)
    syllables = ["ka", "lo", "mi", "ne", "tor", "sha", "vel", "qui", "ran", "dop", "es", "ith", "ung", "ber"]
    words = ["".join(rng.choice(syllables) for _ in range(rng.randint(1, 4))) for _ in range(5000)]
    punct = [".", ",", "?", "!", ":", ";", "\n"]
    target = int(mb * 2**20)
    written = 0
    with path.open("w") as fh:
        while written < target:
            n = int(rng.lognormvariate(5.5, 1.2)) + 1  # word counts of SFT samples: long-tailed
            text = " ".join(rng.choice(words) + (rng.choice(punct) if rng.random() < 0.1 else "") for _ in range(n))
            line = json.dumps({"text": text}) + "\n"
            fh.write(line)
            written += len(text.encode())


def train_tokenizer(corpus: Path, out: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=8192, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    with corpus.open() as fh:
        tok.train_from_iterator((json.loads(line)["text"] for _, line in zip(range(20000), fh, strict=False)), trainer)
    tok.save(str(out))


def run_once(corpus: Path, tokenizer: Path, threads: int | None) -> tuple[float, int, int]:
    """``(seconds, text bytes, tokens)`` in a fresh process (the thread limit is read at start)."""
    env = dict(os.environ)
    if threads is not None:
        env["RAYON_NUM_THREADS"] = str(threads)
    code = f"""
import json, time
from pathlib import Path
from skrull.corpus.lengths import count_lengths
from skrull.corpus.text import text_extractor
from skrull.corpus.tokenizer import load_tokenizer
tok = load_tokenizer({str(tokenizer)!r}, num_threads={threads or 0} or None)
ex = text_extractor(fields=None, chat_template=None)
t = time.perf_counter()
n = count_lengths([Path({str(corpus)!r})], tokenizer=tok, extract=ex)
print(json.dumps([time.perf_counter() - t, sum(n)]))
"""
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True, text=True, check=True)
    seconds, tokens = json.loads(out.stdout)
    text_bytes = sum(len(json.loads(line)["text"].encode()) for line in corpus.open())
    return float(seconds), text_bytes, int(tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mb", type=float, default=40.0, help="MB of text to tokenize (default 40)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        corpus, tokenizer = Path(tmp) / "sft.jsonl", Path(tmp) / "tokenizer.json"
        make_corpus(corpus, mb=args.mb)
        train_tokenizer(corpus, tokenizer)
        print(f"byte-level BPE (8192 tokens), {args.mb:.0f} MB of text in JSONL, {cores} cores\n")
        print("| threads | seconds | MB/s | MB/s per core | tokens/s |")
        print("|--------:|--------:|-----:|--------------:|---------:|")
        for threads in (1, cores):
            best = min((run_once(corpus, tokenizer, threads) for _ in range(2)), key=lambda r: r[0])
            seconds, text_bytes, tokens = best
            mbs = text_bytes / 2**20 / seconds
            print(f"| {threads} | {seconds:.2f} | {mbs:.1f} | {mbs / threads:.1f} | {tokens / seconds:,.0f} |")


if __name__ == "__main__":
    main()
