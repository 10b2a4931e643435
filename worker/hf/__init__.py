"""Hugging Face ``transformers`` models trained under plans (the ``hf`` extra).

- attention.py: DACP as a ``transformers`` attention implementation (``attn_implementation="skrull_dacp"``);
- inputs.py: a planned microbatch as the model's inputs (packed ``input_ids``, ``position_ids``, labels), for
  the DACP attention or, whole sequences only, for the model's own attention;
- model.py: a causal LM from a ``config.json`` with seeded random weights (no download);
- step.py: one optimizer step's gradients under a plan, and the plain single-process step it must equal;
- finetune.py: ``skrull finetune``: N steps on W processes, checked against the plain step;
- trainer.py: ``SkrullTrainer``, the Hugging Face ``Trainer`` training one plan iteration per step;
- trl.py: ``SkrullSFTTrainer``, TRL's ``SFTTrainer`` the same way (the ``trl`` extra).

The loss rule (docs/finetune.md): the loss of a step is the mean cross-entropy over every target token
of the global batch, whatever the plan does; each GPU divides its own sum by the global target count
and gradients are summed, never averaged, over the world.
"""
