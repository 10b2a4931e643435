"""A ``[worker]`` install (torch, no service extra) imports every worker module: the planned loader and the
Hugging Face fine-tune take the planning client from the caller and never import httpx themselves."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.docs.test_links import ROOT

WORKER_MODULES = [
    "skrull.worker.dataloader",
    "skrull.worker.hf.finetune",
    "skrull.worker.layer_check",
    "skrull.worker.train",
]


@pytest.mark.parametrize("module", WORKER_MODULES)
def test_a_worker_module_imports_without_the_service_extra(module: str) -> None:
    # httpx, fastapi and uvicorn made unimportable, as in an environment without the api extra
    code = (
        "import sys\n"
        "for name in ('httpx', 'fastapi', 'uvicorn', 'starlette', 'pydantic'):\n"
        "    sys.modules[name] = None\n"
        f"import {module}\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
