"""The plan page in a real browser: headless Chromium loads ``/v1/plans/{id}/view`` from ``skrull serve`` on
127.0.0.1, dumps the DOM it built (one lane per GPU) and takes a screenshot (a PNG of the window's size,
not blank)."""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from skrull.api.client import PlanningClient
from tests.api.conftest import LiveServer
from tests.api.test_live_server import dataset_request

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no chromium on PATH (.ci/run installs Debian's chromium: apt-get install -y chromium)"
)
WINDOW = (1100, 900)


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--hide-scrollbars",
        f"--user-data-dir={tmp_path / 'profile'}",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, check=False)


def png_rows(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and the decompressed image data (filter bytes included) of a PNG."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    pos, idat = 8, b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        if kind == b"IDAT":
            idat += data[pos + 8 : pos + 8 + length]
        pos += 12 + length
    return int(width), int(height), zlib.decompress(idat)


def test_plan_page_renders_in_chromium(live_server: LiveServer, tmp_path: Path) -> None:
    doc = dataset_request(seed=5, batches=1, dp=2, cp=4, per_rank=16)
    with PlanningClient(live_server.url) as client:
        plan_id = client.submit(doc)
        client.wait(plan_id, timeout_s=60)
    url = f"{live_server.url}/v1/plans/{plan_id}/view"

    dom = chromium(tmp_path, "--dump-dom", url)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert f"Plan <code>{plan_id}</code>" in dom.stdout
    assert sorted(int(g) for g in re.findall(r'class="lane" data-gpu="(\d+)"', dom.stdout)) == list(range(8))

    shot = tmp_path / "view.png"
    out = chromium(tmp_path, f"--screenshot={shot}", f"--window-size={WINDOW[0]},{WINDOW[1]}", url)
    assert out.returncode == 0 and shot.exists(), out.stderr[-2000:]
    width, height, pixels = png_rows(shot.read_bytes())
    assert (width, height) == WINDOW
    # a page of text and coloured bars, not a blank window: many distinct byte values in the image data
    assert len(set(pixels)) > 64
