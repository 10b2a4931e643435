"""``skrull lengths`` end to end: a tiny dataset and tokenizer made here, the loader's batches as a request,
submitted to a real ``skrull serve``; user mistakes are one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skrull.api.client import PlanningClient
from skrull.corpus.order import global_batches
from skrull.solver.io import request_from_dict
from tests.api.conftest import LiveServer
from tests.cli.test_main import skrull
from tests.corpus.tiny import build_bpe_tokenizer, build_chat_tokenizer_dir, sample_texts


@pytest.fixture(scope="module")
def bpe_tokenizer_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bpe_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_request_holds_the_token_counts_of_the_seeded_batches(tmp_path: Path, bpe_tokenizer_json: Path) -> None:
    from tokenizers import Tokenizer

    texts = sample_texts(37, seed=9)
    data = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": t[:20], "response": t} for t in texts])
    out = skrull(
        "lengths", str(data), "--tokenizer", str(bpe_tokenizer_json), "--field", "prompt", "--field", "response",
        "--global-batch-size", "8", "--seed", "42", "--dp", "2", "--cp", "2", "-o", str(tmp_path / "req.json"),
        "--lengths-out", str(tmp_path / "lengths.json"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads((tmp_path / "req.json").read_text())
    tok = Tokenizer.from_file(str(bpe_tokenizer_json))
    counts = [len(tok.encode(t[:20] + "\n" + t).ids) for t in texts]
    assert json.loads((tmp_path / "lengths.json").read_text()) == counts
    expected = [[counts[i] for i in b] for b in global_batches(37, global_batch_size=8, seed=42)]
    assert doc["batches"] == expected and len(expected) == 4  # 37 rows: the last 5 are dropped
    assert doc["parallel"] == {"dp": 2, "cp": 2}
    request_from_dict(doc)
    assert "4 global batches of 8" in out.stderr
    assert "counting tokens" not in out.stderr  # no progress bar when stderr is not a terminal


def test_progress_shows_rows_and_tokens_counted_when_asked(tmp_path: Path, bpe_tokenizer_json: Path) -> None:
    texts = sample_texts(37, seed=9)
    data = write_jsonl(tmp_path / "sft.jsonl", [{"text": t} for t in texts])
    out = skrull(
        "lengths", str(data), "--tokenizer", str(bpe_tokenizer_json), "--global-batch-size", "8", "--dp", "2",
        "--cp", "2", "-o", str(tmp_path / "req.json"), "--lengths-out", str(tmp_path / "lengths.json"), "--progress",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    total = sum(json.loads((tmp_path / "lengths.json").read_text()))
    final = out.stderr.replace("\r", "\n").splitlines()
    (line,) = [x for x in final if "counting tokens: 100%" in x][-1:]
    assert "rows=37" in line and f"tokens={total}" in line


def test_parquet_chats_with_a_template_and_truncation(tmp_path: Path, bpe_tokenizer_json: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [
        {"messages": [{"role": "user", "content": t}, {"role": "assistant", "content": t}]} for t in sample_texts(20)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chats.parquet")
    out = skrull(
        "lengths", str(tmp_path / "chats.parquet"), "-t", str(bpe_tokenizer_json), "--chat-template", "chatml",
        "-b", "5", "--max-length", "100", "--no-shuffle",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert len(doc["batches"]) == 4 and max(max(b) for b in doc["batches"]) <= 100


def test_submits_to_a_live_service(tmp_path: Path, bpe_tokenizer_json: Path) -> None:
    data = write_jsonl(tmp_path / "sft.jsonl", [{"text": t} for t in sample_texts(24)])
    server = LiveServer(tmp_path / "skrull.db").start()
    try:
        out = skrull(
            "lengths", str(data), "-t", str(bpe_tokenizer_json), "-b", "12", "--dp", "2", "--cp", "2",
            "--submit", server.url,
        )  # fmt: skip
        assert out.returncode == 0, out.stderr
        plan_id = out.stdout.strip()
        with PlanningClient(server.url) as client:
            envelope = client.wait(plan_id, timeout_s=60)
        assert len(envelope["plan"]["iterations"]) == 2
    finally:
        server.close()


def test_rejects_a_row_longer_than_the_group_naming_the_row(tmp_path: Path, bpe_tokenizer_json: Path) -> None:
    data = write_jsonl(tmp_path / "sft.jsonl", [{"text": "short"}, {"text": " the lazy dog" * 5000}])
    out = skrull("lengths", str(data), "-t", str(bpe_tokenizer_json), "-b", "2", "--bucket-tokens", "1000")
    assert out.returncode == 2
    (line,) = out.stderr.strip().splitlines()[-1:]
    assert line.startswith("skrull: error: row 1: ") and "--max-length" in line


def test_rejects_a_missing_field_naming_row_and_field(tmp_path: Path, bpe_tokenizer_json: Path) -> None:
    data = write_jsonl(tmp_path / "sft.jsonl", [{"text": "a"}])
    out = skrull("lengths", str(data), "-t", str(bpe_tokenizer_json), "-b", "1", "--field", "prompt")
    assert out.returncode == 2
    assert out.stderr.startswith("skrull: error: row 0.prompt: null: must be a string (row fields: text)")


def test_chat_rows_are_counted_with_the_tokenizers_own_template(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer_dir = build_chat_tokenizer_dir(tmp_path / "tok")
    conversations = [
        [{"role": "user", "content": t[:25]}, {"role": "assistant", "content": t}] for t in sample_texts(18, seed=5)
    ]
    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": c} for c in conversations])
    out = skrull(
        "lengths", str(data), "-t", str(tokenizer_dir), "-b", "6", "--no-shuffle",
        "--lengths-out", str(tmp_path / "lengths.json"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    reference = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    expected = [len(reference.apply_chat_template(c, tokenize=True, return_dict=False)) for c in conversations]
    assert json.loads((tmp_path / "lengths.json").read_text()) == expected
    assert json.loads(out.stdout)["batches"] == [expected[0:6], expected[6:12], expected[12:18]]


def test_a_local_dataset_gives_the_same_request_as_its_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")  # inherited by the command: nothing may be downloaded
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    tokenizer_dir = build_chat_tokenizer_dir(tmp_path / "tok")
    dataset = tmp_path / "sft"
    dataset.mkdir()
    data = write_jsonl(dataset / "train.jsonl", [{"text": t} for t in sample_texts(30, seed=2)])
    common = ("-t", str(tokenizer_dir), "-b", "8", "--seed", "3", "--dp", "2")
    from_files = skrull("lengths", str(data), *common)
    from_dataset = skrull("lengths", "--hub-dataset", str(dataset), "--split", "train", *common)
    assert from_files.returncode == 0 and from_dataset.returncode == 0, from_dataset.stderr
    assert json.loads(from_dataset.stdout) == json.loads(from_files.stdout)
    # the old spelling still works, with a note
    old = skrull("lengths", "--dataset", str(dataset), "--split", "train", *common)
    assert old.returncode == 0 and json.loads(old.stdout) == json.loads(from_files.stdout)
    assert "--hub-dataset" in old.stderr
    both = skrull("lengths", str(data), "--hub-dataset", str(dataset), *common)
    assert both.returncode == 2 and both.stderr.strip().startswith("skrull: error: DATA:")
    bad_split = skrull("lengths", "--hub-dataset", str(dataset), "--split", "nope", *common)
    assert bad_split.returncode == 2 and "--split: 'nope'" in bad_split.stderr
    assert len(bad_split.stderr.strip().splitlines()) == 1


def test_chat_rows_with_a_bare_tokenizer_file_ask_for_a_layout(tmp_path: Path, bpe_tokenizer_json: Path) -> None:
    data = write_jsonl(tmp_path / "chats.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}] * 4)
    out = skrull("lengths", str(data), "-t", str(bpe_tokenizer_json), "-b", "2")
    assert out.returncode == 2 and "--chat-template chatml" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_bundled_distributions_name_is_refused_at_once_not_looked_up_on_the_hub(tmp_path: Path) -> None:
    # `skrull plan --dataset sharegpt` samples a bundled distribution; `lengths` counts real data
    out = skrull("lengths", "--dataset", "sharegpt", "-t", str(tmp_path / "tok.json"), "-b", "8")
    assert out.returncode == 2
    assert "--dataset: 'sharegpt'" in out.stderr and "bundled length distribution" in out.stderr
    assert "--hub-dataset" in out.stderr
