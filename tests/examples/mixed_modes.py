"""What the examples' mixed-modes cases share: a profile that makes plans mix all-gather and Ulysses on the
tiny models, rows that need both, and the torchrun run and its check."""

from __future__ import annotations

import json
import random
from pathlib import Path

from tests.docs.test_links import ROOT
from tests.launch import run_torchrun

#: The bundled Qwen2.5-0.5B profile made to mix the modes on a tiny model: its heads (4, 2 K/V, so a
#: group of 4 sends each K/V head twice), an all-gather at 0.05 ms per sharded token + 1 ms and an
#: all-to-all at 0.05 ms per token of T/N (1.125x with the copies) + 5 ms. Sharded microbatches of
#: 70-140 tokens then run all-gather, those holding a 250-token sequence over 4 GPUs run Ulysses.
MIXED_PROFILE = "test/tiny-mixed"


def mixed_profile() -> dict[str, object]:
    from skrull.solver.profile import load_profile

    doc = load_profile("h100-80g/qwen2.5-0.5b").to_dict()
    # one bandwidth per collective (a topology's links would price the groups instead), the contract's
    # overlap and memory rule: the figures below are then exactly what decides the modes
    for section in ("topology", "overlap"):
        doc.pop(section, None)
    for key in ("kv_bytes_per_token", "gathered_kv"):
        doc["memory"].pop(key, None)
    doc.update(name=MIXED_PROFILE, heads={"attention": 4, "kv": 2})
    doc["comm"].update(ms_per_mib=2.1333, fixed_ms=1.0)
    doc["comm_a2a"].update(ms_per_mib=0.26667, fixed_ms=5.0)
    return doc


def write_mixed_rows(path: Path) -> Path:
    """64 rows of 3-250 tokens: in buckets of 64 on CP 4 the first global batch of 16 needs both modes."""
    rng = random.Random(5)
    lengths = [3, 5, 9, 17, 30, 70, 250]
    rows = [{"input_ids": [rng.randrange(128) for _ in range(rng.choice(lengths))]} for _ in range(64)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def run_mixed(script: str, args: list[str], tmp_path: Path, env: dict[str, str] | None = None) -> None:
    """``script`` under ``torchrun`` on 4 processes (DP1 x CP4), planned with both modes on the mixed
    profile: its first step ran both modes and equals the plain step (<= 1e-4)."""
    from skrull.solver.profile import profile_file_name

    profiles = tmp_path / "profiles"
    profiles.mkdir(parents=True, exist_ok=True)
    (profiles / profile_file_name(MIXED_PROFILE)).write_text(json.dumps(mixed_profile()))
    argv = [
        "--model-config", str(ROOT / "examples" / "models" / "qwen2-tiny.json"), "--dp", "1", "--cp", "4",
        "--profile", MIXED_PROFILE, "--cp-modes", "allgather,ulysses", "--check", *args,
    ]  # fmt: skip
    env = {**(env or {}), "SKRULL_PROFILES_DIR": str(profiles)}
    out = run_torchrun(ROOT / "examples" / script, argv, nproc=4, cwd=tmp_path, timeout_s=600, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    (modes,) = [line.split()[2:] for line in out.stdout.splitlines() if line.startswith("cp modes: ")]
    assert modes[0] == "allgather+ulysses", modes  # the step the check compares ran both modes
    largest = [line for line in out.stdout.splitlines() if line.startswith("largest relative error: ")]
    assert len(largest) == 1 and float(largest[0].split()[3]) <= 1e-4
    assert out.stdout.rstrip().endswith("check passed")
