"""The conformance matrix: architectures x layouts x integrations, each cell a real ``torchrun`` run (4 gloo
processes, CPU, float32) whose first optimizer step is compared with the plain single-process step.

    python tests/conformance/matrix.py [--arch NAME ...] [--layout DPxCP ...] [--integration NAME ...] [--out FILE]
        [--checkpointing] [--lora] [--router-aux-loss]

A cell passes when the largest relative error of the loss and every gradient is at most 1e-4 (the
examples' ``--check``), or when it is refused before the first step with one line naming the setting.
Anything else (a crash, a hang past the timeout, a larger error) fails. The runs go through the documented
scripts (examples/hf_trainer.py, examples/trl_sft.py, examples/torchrun_train.py with ``--grad-sync ddp``
and ``fsdp``), as a user follows the integration pages. ``make conformance`` runs the whole matrix;
tests/conformance/test_conformance.py runs a representative subset in ``make test``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # run as a script (``make conformance``): tests.launch from this checkout
    sys.path.insert(0, str(ROOT))
from tests.launch import torchrun_command, torchrun_env  # noqa: E402

MODELS = Path(__file__).resolve().parent / "models"
ARCHS = (
    "llama-1kv-tied", "qwen2", "mistral-window", "phi3", "gemma2-softcap", "olmo2", "gemma3-window",
    "qwen2-moe", "mixtral", "qwen3-moe", "qwen2-moe-router-aux",
)  # fmt: skip
#: configs in the cells of an option only (``--router-aux-loss``), not in the default product
OPTION_ARCHS = ("mixtral-router-aux",)
LAYOUTS = ((1, 4), (2, 2), (4, 1))
INTEGRATIONS = ("trainer", "trl", "ddp", "fsdp")
TOLERANCE = 1e-4
#: cp x bucket = 128 tokens: the longest row (120) always fits, and shards whenever cp > 1
BUCKET_TIMES_CP = 128
#: the adapters' rank of a ``--lora`` cell
LORA_RANK = 4
#: the integrations whose scripts take ``--lora`` (TRL's example does not)
LORA_INTEGRATIONS = ("trainer", "ddp", "fsdp")
#: the integrations whose script takes ``--router-aux-loss per-microbatch`` (all four)
ROUTER_AUX_INTEGRATIONS = ("trainer", "trl", "ddp", "fsdp")


@dataclass(frozen=True)
class Cell:
    arch: str
    dp: int
    cp: int
    integration: str
    outcome: str  # "pass", "refused", "fail"
    detail: str
    #: run with activation checkpointing (``--activation-checkpointing`` of the scripts: every layer recomputed)
    checkpointing: bool = False
    #: train PEFT LoRA adapters of rank ``LORA_RANK`` (``--lora`` of the Trainer and own-loop scripts)
    lora: bool = False
    #: the router's auxiliary loss per microbatch of the plan (``--router-aux-loss per-microbatch``), checked
    #: against a plain step that adds it over the same microbatches
    router_aux: bool = False


def write_rows(path: Path, *, n: int = 32, seed: int = 3, vocab: int = 128) -> Path:
    rng = random.Random(seed)
    rows = [{"input_ids": [rng.randrange(vocab) for _ in range(rng.choice([3, 9, 17, 30, 60, 120]))]} for _ in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def command(
    arch: str,
    dp: int,
    cp: int,
    integration: str,
    tmp: Path,
    *,
    checkpointing: bool = False,
    lora: bool = False,
    router_aux: bool = False,
) -> list[str]:
    common = [
        "--model-config", str(MODELS / f"{arch}.json"), "--dp", str(dp), "--cp", str(cp),
        "--bucket-tokens", str(BUCKET_TIMES_CP // cp), "--check",
        *(["--activation-checkpointing"] if checkpointing else []),
        *(["--lora", str(LORA_RANK)] if lora else []),
        *(["--router-aux-loss", "per-microbatch"] if router_aux else []),
    ]  # fmt: skip
    if integration == "trainer":
        data = write_rows(tmp / "train.jsonl")
        args = [*common, "--data", str(data), "--global-batch-size", "8", "--max-steps", "1",
                "--output-dir", str(tmp / "out")]  # fmt: skip
        return torchrun_command(ROOT / "examples" / "hf_trainer.py", args, nproc=dp * cp)
    if integration == "trl":
        data = tmp / "chats.jsonl"
        subprocess.run(
            [sys.executable, str(ROOT / "examples" / "trl_sft.py"), "--write-demo-data", "--data", str(data),
             "--model-config", str(MODELS / f"{arch}.json")],
            check=True, capture_output=True, cwd=tmp,
        )  # fmt: skip
        args = [*common, "--data", str(data), "--global-batch-size", "8", "--max-steps", "1",
                "--output-dir", str(tmp / "out")]  # fmt: skip
        return torchrun_command(ROOT / "examples" / "trl_sft.py", args, nproc=dp * cp)
    data = write_rows(tmp / "train.jsonl")
    return torchrun_command(ROOT / "examples" / "torchrun_train.py", [*common, "--data", str(data),
            "--global-batch-size", "8", "--steps", "1", "--grad-sync", integration], nproc=dp * cp)  # fmt: skip


def run_cell(
    arch: str,
    dp: int,
    cp: int,
    integration: str,
    *,
    timeout_s: float = 600,
    checkpointing: bool = False,
    lora: bool = False,
    router_aux: bool = False,
) -> Cell:
    if lora and integration not in LORA_INTEGRATIONS:
        raise ValueError(f"lora: the {integration} script takes no --lora; one of {LORA_INTEGRATIONS}")
    if router_aux and integration not in ROUTER_AUX_INTEGRATIONS:
        raise ValueError(f"router_aux: the {integration} script takes no --router-aux-loss; {ROUTER_AUX_INTEGRATIONS}")
    with tempfile.TemporaryDirectory(prefix="skrull-conformance-") as name:
        tmp = Path(name)
        command_line = command(
            arch, dp, cp, integration, tmp, checkpointing=checkpointing, lora=lora, router_aux=router_aux
        )
        try:
            out = subprocess.run(
                command_line, capture_output=True, text=True, timeout=timeout_s, cwd=tmp, env=torchrun_env()
            )
        except subprocess.TimeoutExpired:
            return Cell(arch, dp, cp, integration, "fail", f"no result in {timeout_s:.0f} s (a hang?)")
    cell = dataclasses.replace(
        judge(arch, dp, cp, integration, out.returncode, out.stdout, out.stderr),
        checkpointing=checkpointing,
        lora=lora,
        router_aux=router_aux,
    )
    if cell.outcome == "fail":  # the whole output stays for a look: a failed cell is never only a last line
        suffix = ("-checkpointing" if checkpointing else "") + ("-lora" if lora else "")
        suffix += "-router-aux" if router_aux else ""
        log = Path(tempfile.gettempdir()) / f"skrull-conformance-{arch}-DP{dp}xCP{cp}-{integration}{suffix}.log"
        log.write_text(f"$ {' '.join(command_line)}\nexit {out.returncode}\n{out.stdout}\n{out.stderr}")
        cell = dataclasses.replace(cell, detail=f"{cell.detail} (output: {log})")
    return cell


def judge(arch: str, dp: int, cp: int, integration: str, returncode: int, stdout: str, stderr: str) -> Cell:
    """A cell's outcome from its run's exit status and output: the check's figure, a refusal (the one line a
    ``ValueError`` or ``RequestError`` printed before the first step), or a fail
    with the last line of output."""
    match = re.search(r"largest relative error: (\S+)", stdout)
    if match and returncode == 0 and float(match.group(1)) <= TOLERANCE:
        return Cell(arch, dp, cp, integration, "pass", match.group(1))
    refused = re.findall(r"(?:ValueError|RequestError): (.+)", stderr)
    if refused and not match and returncode != 0:
        return Cell(arch, dp, cp, integration, "refused", refused[-1][:200])
    tail = (stdout + stderr).strip().splitlines()[-1:] or ["no output"]
    return Cell(arch, dp, cp, integration, "fail", (match.group(1) if match else tail[0])[:200])


def table(cells: list[Cell]) -> str:
    lines = ["| architecture | layout | integration | outcome | figure / refusal |", "|---|---|---|---|---|"]
    for c in cells:
        integration = c.integration + (" + checkpointing" if c.checkpointing else "") + (" + LoRA" if c.lora else "")
        integration += " + router aux per-microbatch" if c.router_aux else ""
        lines.append(f"| {c.arch} | DP{c.dp}xCP{c.cp} | {integration} | {c.outcome} | {c.detail} |")
    return "\n".join(lines) + "\n"


def parse_cell(text: str) -> tuple[str, int, int, str]:
    """``ARCH:DPxCP:INTEGRATION`` as (arch, dp, cp, integration), each checked."""
    arch, layout, integration = text.split(":")
    dp, cp = (int(x) for x in layout.upper().removeprefix("DP").split("XCP" if "XCP" in layout.upper() else "X"))
    if arch not in ARCHS + OPTION_ARCHS or integration not in INTEGRATIONS or (dp, cp) not in LAYOUTS:
        raise SystemExit(f"--cell {text}: one of {ARCHS} : DPxCP of {LAYOUTS} : one of {INTEGRATIONS}")
    return arch, dp, cp, integration


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch", action="append", choices=ARCHS + OPTION_ARCHS)
    p.add_argument("--layout", action="append", help="DPxCP, e.g. 2x2")
    p.add_argument("--integration", action="append", choices=INTEGRATIONS)
    p.add_argument("--cell", action="append", help="one cell, ARCH:DPxCP:INTEGRATION (instead of the product)")
    p.add_argument("--out", default=None, help="write the markdown table here too")
    p.add_argument("--checkpointing", action="store_true", help="every cell with activation checkpointing on")
    p.add_argument("--lora", action="store_true", help="every cell trains PEFT LoRA adapters (TRL cells left out)")
    p.add_argument(
        "--router-aux-loss",
        action="store_true",
        help="every cell trains the router aux loss per microbatch (the -router-aux archs)",
    )
    args = p.parse_args(argv)
    layouts = [tuple(int(x) for x in s.split("x")) for s in args.layout] if args.layout else list(LAYOUTS)
    todo = [
        (arch, dp, cp, integration)
        for arch in args.arch or ARCHS
        for dp, cp in layouts
        for integration in args.integration or INTEGRATIONS
    ]
    if args.cell:
        todo = [parse_cell(text) for text in args.cell]
    if args.lora:
        todo = [cell for cell in todo if cell[3] in LORA_INTEGRATIONS]
    if args.router_aux_loss:
        todo = [cell for cell in todo if cell[3] in ROUTER_AUX_INTEGRATIONS]
    cells = []
    for arch, dp, cp, integration in todo:
        cell = run_cell(
            arch, dp, cp, integration, checkpointing=args.checkpointing, lora=args.lora,
            router_aux=args.router_aux_loss,
        )  # fmt: skip
        with_ = (" + checkpointing" if args.checkpointing else "") + (" + LoRA" if args.lora else "")
        with_ += " + router aux per-microbatch" if args.router_aux_loss else ""
        print(f"{arch} DP{dp}xCP{cp} {integration}{with_}: {cell.outcome} {cell.detail}", flush=True)
        cells.append(cell)
    text = table(cells)
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0 if all(c.outcome != "fail" for c in cells) else 1


if __name__ == "__main__":
    raise SystemExit(main())
