"""The end of a torchrun test script: its ``main``, then the process group destroyed before the interpreter
exits, as examples/hf_trainer.py does. The Trainer never destroys it, and a rank leaving with it alive was seen
to abort at exit ("terminate called without an active exception") after its work was done, which failed the
run on a loaded machine."""

from __future__ import annotations

from collections.abc import Callable

import torch.distributed as dist


def run_and_destroy_group(main: Callable[[], int]) -> int:
    try:
        return main()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
