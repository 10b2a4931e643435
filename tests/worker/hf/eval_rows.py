"""The rows of the evaluation tests (tests/worker/hf/test_evaluation.py and its torchrun script), in Hugging
Face's label convention: some rows with prompt tokens masked (-100), lengths 2 to 90 tokens so that with
``bucket_tokens=32`` the longest ones are sharded over their CP group."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
CONFIG = ROOT / "examples" / "models" / "llama-tiny.json"
EVAL_LENGTHS = (2, 7, 90, 13, 41, 5, 64, 3, 28, 77, 9)


def _row(i: int, n: int) -> dict[str, list[int]]:
    ids = [(11 * i + 5 * t + t * t) % 128 for t in range(n)]
    labels = list(ids)
    if i % 3 == 1:  # a masked prompt: no loss on the first third
        labels[: n // 3] = [-100] * (n // 3)
    return {"input_ids": ids, "labels": labels}


def eval_rows() -> list[dict[str, list[int]]]:
    return [_row(i, n) for i, n in enumerate(EVAL_LENGTHS)]


def train_rows() -> list[dict[str, list[int]]]:
    return [_row(100 + i, n) for i, n in enumerate((6, 30, 50, 12, 20, 8, 44, 3))]
