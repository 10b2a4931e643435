"""Run by tests/worker/hf/test_integrations.py under ``torchrun`` (2 gloo processes): an own loop as the docs
write it, in the settings that trained silently wrong or crashed. The cases named on the command line run in
turn in one launch; each writes one line per outcome to ``<case>-report-<rank>.txt``: ``refused: <message>``,
``trained``, or ``<mode> <relative error>``."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from skrull.worker import grad_sync  # noqa: E402
from skrull.worker.dataloader import PlannedBatches  # noqa: E402
from skrull.worker.groups import IterationGroups  # noqa: E402
from skrull.worker.hf.model import build_model, read_model_config  # noqa: E402
from skrull.worker.hf.step import plain_step, relative_error, scheduled_step  # noqa: E402
from skrull.worker.kernels import select_kernel  # noqa: E402
from skrull.worker.loader_options import LoaderOptions  # noqa: E402
from tests.worker.hf.process_group import run_and_destroy_group  # noqa: E402

MODELS = ROOT / "tests" / "conformance" / "models"
DEVICE = torch.device("cpu")


def rows(n: int = 16, seed: int = 3) -> list[dict[str, list[int]]]:
    rng = random.Random(seed)
    return [{"input_ids": [rng.randrange(128) for _ in range(rng.choice([9, 30, 60]))]} for _ in range(n)]


def loader(mesh: Any, data: list[dict[str, list[int]]], **kw: Any) -> PlannedBatches:
    options: dict[str, Any] = {
        "global_batch_size": 8, "profile": "h100-80g/qwen2.5-0.5b", "bucket_tokens": 64, "prefetch": 0,
        "equal_microbatches": True, "vocab_size": 128, **kw,
    }  # fmt: skip
    return PlannedBatches(data, [len(r["input_ids"]) for r in data], LoaderOptions(**options), mesh=mesh, device=DEVICE)


#: The case running, which names the report file.
CASE = ""


def report(line: str) -> None:
    with open(f"{CASE}-report-{dist.get_rank()}.txt", "a", encoding="utf-8") as f:
        f.write(line.replace("\n", " ") + "\n")
    print(f"{dist.get_rank()} {line}", flush=True)


def attempt(fn: Any) -> None:
    try:
        said = fn()
    except ValueError as e:
        said = f"refused: {e}"
    report(said if isinstance(said, str) else "trained")


def autocast(mesh: Any, mode: str) -> str:
    """One step under ``torch.autocast`` (bfloat16) around ``scheduled_step``, several microbatches per rank
    (bucket 64 tokens, 8 rows of 9 to 60 tokens over 2 ranks), against the plain step under the same autocast."""
    config = read_model_config(str(MODELS / "qwen2.json"))
    data = rows()
    planned = loader(mesh, data, num_iterations=1)
    model = grad_sync.wrap(build_model(config, seed=0, device=DEVICE), mode)
    groups, kernel = IterationGroups(planned), select_kernel(DEVICE, torch.float32)
    counts = []
    for ready in planned:
        counts.append(len(ready.microbatches))
        with torch.autocast("cpu", dtype=torch.bfloat16):
            scheduled_step(model, ready.microbatches, registry=groups(ready), kernel=kernel, device=DEVICE)
        indices = ready.sample_indices
    planned.close()
    grads = grad_sync.full_gradients(model)
    reference = build_model(config, seed=0, attn_implementation="eager")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain_step(reference, [torch.tensor(data[i]["input_ids"]) for i in indices])
    worst = max(relative_error(grads[name], p.grad) for name, p in reference.named_parameters())
    return f"{mode} {counts[0]} microbatches {worst:.3e}"


def compiled_after_wrap(mesh: Any, mode: str) -> None:
    config = read_model_config(str(MODELS / "qwen2.json"))
    data = rows()
    planned = loader(mesh, data, num_iterations=1)
    model = torch.compile(grad_sync.wrap(build_model(config, seed=0, device=DEVICE), mode))
    groups, kernel = IterationGroups(planned), select_kernel(DEVICE, torch.float32)
    try:
        for ready in planned:
            scheduled_step(model, ready.microbatches, registry=groups(ready), kernel=kernel, device=DEVICE)
    finally:
        planned.close()


def router_loss(mesh: Any) -> None:
    """A mixture of experts from ``from_pretrained(..., attn_implementation=register())`` (here from_config:
    nothing downloaded) with its router loss on: nothing but scheduled_step sees the model."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from skrull.worker.hf.attention import register

    doc = json.loads((MODELS / "qwen2-moe.json").read_text())
    fields = {k: v for k, v in doc.items() if k not in ("model_type", "architectures")}
    hf_config = AutoConfig.for_model(doc["model_type"], **{**fields, "output_router_logits": True})
    model = grad_sync.wrap(AutoModelForCausalLM.from_config(hf_config, attn_implementation=register()), "ddp")
    data = rows()
    planned = loader(mesh, data, num_iterations=1)
    groups, kernel = IterationGroups(planned), select_kernel(DEVICE, torch.float32)
    try:
        for ready in planned:
            scheduled_step(model, ready.microbatches, registry=groups(ready), kernel=kernel, device=DEVICE)
    finally:
        planned.close()


def bad_row(mesh: Any) -> str:
    """A token id past the vocabulary in the third global batch: every rank trains two steps, then all stop
    with the line naming the row (found: the packing rank alone, the others with gloo's "Connection closed")."""
    config = read_model_config(str(MODELS / "qwen2.json"))
    data = rows(24)
    data[19]["input_ids"][2] = 128  # batch 2 of 3 (rows 16..23, shuffle off)
    planned = loader(mesh, data, shuffle=False)
    model = grad_sync.wrap(build_model(config, seed=0, device=DEVICE), "fsdp")
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    groups, kernel = IterationGroups(planned), select_kernel(DEVICE, torch.float32)
    steps = 0
    try:
        for ready in planned:
            optimizer.zero_grad()
            scheduled_step(model, ready.microbatches, registry=groups(ready), kernel=kernel, device=DEVICE)
            optimizer.step()
            steps += 1
    except ValueError as e:
        return f"after {steps} steps refused: {e}"
    finally:
        planned.close()
    return f"trained {steps} steps"


def main() -> int:
    global CASE
    dist.init_process_group("gloo")
    for CASE in sys.argv[1:]:
        run_case(CASE)
    return 0


def run_case(case: str) -> None:
    if case == "autocast":
        for dp, cp in ((1, 2), (2, 1)):
            mesh = init_device_mesh("cpu", (dp, cp), mesh_dim_names=("dp", "cp"))
            for mode in ("fsdp", "ddp"):
                report(f"DP{dp}xCP{cp} " + autocast(mesh, mode))
    elif case == "guards":
        mesh = init_device_mesh("cpu", (1, 2), mesh_dim_names=("dp", "cp"))
        for mode in ("ddp", "fsdp"):
            attempt(lambda mode=mode: compiled_after_wrap(mesh, mode))
        attempt(lambda: router_loss(mesh))
        attempt(lambda: bad_row(init_device_mesh("cpu", (2, 1), mesh_dim_names=("dp", "cp"))))
    else:
        raise SystemExit(f"unknown case {case!r}")


if __name__ == "__main__":
    raise SystemExit(run_and_destroy_group(main))
