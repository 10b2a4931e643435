"""Profile derivation: a profile from a model's shape and a GPU's datasheet figures.

``derive`` turns a model (``ModelConfig``) and a GPU (``gpus.GpuSpec``) into the cost model's figures
(FLOPs per token, link times, memory bucket); ``hf_config`` reads a Hugging Face ``config.json`` into a
``ModelConfig``; ``gpus`` holds the bundled GPUs with their sources. The ``Profile`` type itself, and the
bundled profiles' lookup, stay in ``skrull.solver.profile``: the cost model reads them, derivation only writes
them.
"""
