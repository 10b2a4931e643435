"""Rebuild the percentile tables under distributions/ from the real length traces (CSV files named below).

The traces themselves never enter the project; only these tables (with their source) do.
Run: python bench/build_distributions.py DATA_DIR      (the folder holding the trace files)
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np

OUT = Path(__file__).resolve().parent.parent / "distributions"
GRID = [float(q) for q in range(0, 99)] + [round(99 + k / 10, 1) for k in range(0, 11)]

TRACES = {
    "sharegpt": (
        "sharegpt_llama2_lengths.csv",
        lambda r: int(r["num_total_tokens"]),
        "ShareGPT conversations, Llama-2 tokenizer, <= 8K (microsoft/sarathi-serve processed_traces, Apache-2.0)",
    ),
    "arxiv": (
        "arxiv_summarization_llama2_lengths.csv",
        lambda r: int(r["num_total_tokens"]),
        "arXiv summarization prompt + summary, Llama-2 tokenizer, <= 4K (microsoft/vidur processed_traces, MIT)",
    ),
    "azure-conv": (
        "azure2023_conversation_lengths.csv",
        lambda r: int(r["num_prefill_tokens"]) + int(r["num_decode_tokens"]),
        "Azure LLM inference trace 2023, conversation (microsoft/vidur, MIT; trace CC-BY)",
    ),
    "azure-code": (
        "azure2023_code_lengths.csv",
        lambda r: int(r["num_prefill_tokens"]) + int(r["num_decode_tokens"]),
        "Azure LLM inference trace 2023, code (microsoft/vidur, MIT; trace CC-BY)",
    ),
}


def _rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def table(name: str, lengths: np.ndarray, source: str) -> dict[str, object]:
    values = np.percentile(lengths, GRID)
    return {
        "name": name,
        "kind": "percentiles",
        "source": source,
        "count": int(lengths.size),
        "mean_tokens": round(float(lengths.mean()), 1),
        "percentiles": [[q, round(float(v), 1)] for q, v in zip(GRID, values, strict=True)],
    }


def dump(doc: dict[str, object]) -> str:
    """JSON with one percentile pair per line."""
    pairs = ",\n    ".join(json.dumps(p) for p in doc["percentiles"])  # type: ignore[union-attr]
    head = json.dumps({k: v for k, v in doc.items() if k != "percentiles"}, indent=2)[:-2]
    return f'{head},\n  "percentiles": [\n    {pairs}\n  ]\n}}\n'


def main(data_dir: Path) -> None:
    OUT.mkdir(exist_ok=True)
    docs = []
    for name, (file, get, source) in TRACES.items():
        lengths = np.array([get(r) for r in _rows(data_dir / file)], dtype=np.float64)
        docs.append(table(name, lengths, source))
    with open(data_dir / "mooncake_synthetic_trace.jsonl", encoding="utf-8") as fh:
        moon = [json.loads(line) for line in fh if line.strip()]
    lengths = np.array([r["input_length"] + r["output_length"] for r in moon], dtype=np.float64)
    docs.append(
        table(
            "mooncake",
            lengths,
            "Mooncake synthetic long-context trace, input + output (kvcache-ai/Mooncake FAST25-release, Apache-2.0)",
        )
    )
    for doc in docs:
        (OUT / f"{doc['name']}.json").write_text(dump(doc), encoding="utf-8")
        print(f"{doc['name']}: {doc['count']} samples, mean {doc['mean_tokens']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python bench/build_distributions.py DATA_DIR   (the folder holding the trace CSV files)")
    main(Path(sys.argv[1]))
