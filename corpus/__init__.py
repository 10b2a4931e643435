"""Reading SFT corpora for planning: rows from JSONL / JSON / Parquet files (streamed), their token counts
with a local tokenizer, and the seeded order in which a training loader takes them into global batches.

Pure Python plus the optional ``data`` extra (tokenizers, tiktoken, pyarrow); no torch, no network.
"""
