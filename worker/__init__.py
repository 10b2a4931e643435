"""The GPU worker: runs a plan's microbatches with varlen attention and DACP context parallelism.

Needs torch (the ``worker`` extra). The planning library (solver/) never imports this package.

- layout.py: one GPU's packed buffer and the group's shard layout (pure Python);
- kernels.py: one varlen attention adapter (flash-attn, PyTorch varlen, SDPA, CPU reference);
- collectives.py: process groups for a plan's groups and the fixed-size collectives;
- dacp.py: DACP attention (all-gather or Ulysses context parallelism, overlapped with local attention);
- inputs.py, model.py, loss.py: packed inputs, a Llama-shaped decoder, per-token loss normalization;
- launch.py, layer_check.py, train.py: multi-process runs, the ``skrull execute`` check (a plan through one
  attention layer against each sequence alone), a training step;
- dataloader.py, loader_options.py, loader_requests.py: the planned loader, its settings, the requests it
  submits; planner/: the node's planner process (server, client, budget);
- profiling/: ``skrull profile`` (measure on a GPU, fit the cost model, check predictions).
"""
