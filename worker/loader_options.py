"""The planned loader's settings: one frozen, keyword-only dataclass beside its owner (worker/dataloader.py).

``PlannedBatches(dataset, lengths, LoaderOptions(global_batch_size=32, profile="h100-80g/qwen2.5-0.5b"))``:
the settings are data (what to plan, how far ahead, how rows are read), the loader's other arguments are the
live objects it wires together (a plan source or client, a ``DeviceMesh``, a device, a callable). Keeping
them in one value lets a derived loader say only what differs (``for_evaluation`` is
``dataclasses.replace(options, shuffle=False, ...)``) and lets a run's configuration be written and compared
as one object, as torchtitan's config dataclasses are.

Each field is checked here, when the options are made, with one ``RequestError`` naming the field and the
value; what needs the dataset or the profile (row lengths, ``cp_modes`` against the profile's heads) is
checked by the loader. The keyword arguments ``PlannedBatches`` took before these options existed still
work: ``options_from_keywords`` maps them here with a ``DeprecationWarning`` naming the new form.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from skrull.solver.errors import RequestError
from skrull.solver.io import DEFER_SOLVERS, MAX_DEFER

#: How a dataset's labels are aligned (worker/dataloader.py's module doc).
LABEL_CONVENTIONS = ("next_token", "hf")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderOptions:
    """What ``PlannedBatches`` plans and how it reads rows (worker/dataloader.py's module doc for each)."""

    #: rows per global batch (one optimizer step)
    global_batch_size: int
    #: a bundled profile name or a profile document, the cost model every plan is priced with
    profile: str | Mapping[str, Any]
    #: this process's rank in the plan and the plan's layout, when no ``DeviceMesh`` or ``torch.distributed``
    #: group says it (``resolve_rank``)
    rank: int | None = None
    dp: int | None = None
    cp: int | None = None
    #: the order's seed and epoch (corpus/order.py), and whether rows are shuffled at all
    seed: int = 0
    epoch: int = 0
    shuffle: bool = True
    #: the planner every request names
    solver: str = "auto"
    #: global batches per request: more amortises the planner's per-request cost, fewer plans sooner
    batches_per_plan: int = 1
    #: iterations read and packed ahead of the loop, on threads
    prefetch: int = 1
    #: stop after this many iterations of an epoch (None: the whole epoch)
    num_iterations: int | None = None
    #: the per-GPU bucket in tokens (None: the profile's)
    bucket_tokens: int | None = None
    #: the planner's budget per request in seconds (None: derived from the measured step time)
    time_budget_s: float | None = None
    #: how long the loop waits for a plan or a view before giving up, in seconds
    timeout_s: float = 300.0
    #: every rank the same number of microbatches per iteration (sharded models: FSDP2, ZeRO-3)
    equal_microbatches: bool = False
    #: the same request gives the same plan on every machine, so ranks share plans without a broadcast
    deterministic: bool = True
    #: sequences a plan may defer to a later iteration per global batch (``auto`` only), and how many
    #: iterations one may wait
    defer_max_sequences: int = 0
    defer_max_wait: int = 1
    #: how sharded attention may run (solver/cp_modes.py; None: the request's default)
    cp_modes: Sequence[str] | None = None
    #: ``"next_token"`` or ``"hf"`` (``LABEL_CONVENTIONS``)
    label_convention: str = "next_token"
    #: drop the last global batch of an epoch when it is partial (torch's default: keep it)
    drop_last: bool = False
    #: token ids must be below it when given (the model's ``config.vocab_size``)
    vocab_size: int | None = None
    #: iterations ahead of the loop that requests are submitted (None: 1 with ``calibrate``, else 4)
    plan_ahead: int | None = None
    #: the share of a measured step each request's derived budget may take (worker/planner/budget.py)
    planning_share: float = 0.5
    #: time every microbatch and refit the profile from the run (worker/calibration.py)
    calibrate: bool = False
    #: what errors call the dataset (``eval_dataset`` for ``for_evaluation``'s loader)
    dataset_name: str = "dataset"

    def __post_init__(self) -> None:
        self._check_sizes()
        if not isinstance(self.drop_last, bool):
            raise RequestError("drop_last", self.drop_last, "must be True or False")
        if self.vocab_size is not None and (not _is_int(self.vocab_size) or self.vocab_size < 1):
            raise RequestError("vocab_size", self.vocab_size, "must be an integer >= 1 (the model's vocabulary)")
        if self.batches_per_plan < 1:
            raise RequestError("batches_per_plan", self.batches_per_plan, "must be an integer >= 1")
        if self.prefetch < 0:
            raise RequestError("prefetch", self.prefetch, "must be an integer >= 0")
        if self.plan_ahead is not None and (not _is_int(self.plan_ahead) or self.plan_ahead < 0):
            raise RequestError("plan_ahead", self.plan_ahead, "must be an integer >= 0 (iterations)")
        self._check_deferral()
        if self.label_convention not in LABEL_CONVENTIONS:
            raise RequestError(
                "label_convention",
                self.label_convention,
                f"must be one of {', '.join(LABEL_CONVENTIONS)} (worker/loader_options.py and docs/worker.md)",
            )

    def _check_sizes(self) -> None:
        """The counts and sizes, each named as the field it is (a later error would name the request's)."""
        if not _is_int(self.global_batch_size) or self.global_batch_size < 1:
            raise RequestError("global_batch_size", self.global_batch_size, "must be an integer >= 1 (rows per step)")
        if self.profile is None or self.profile == "":
            raise RequestError("profile", self.profile, "must be a bundled profile's name or a profile document")
        for name in ("rank", "dp", "cp", "num_iterations", "bucket_tokens"):
            value = getattr(self, name)
            least = 0 if name == "rank" else 1
            if value is not None and (not _is_int(value) or value < least):
                raise RequestError(name, value, f"must be an integer >= {least}, or None")
        for name in ("seed", "epoch", "batches_per_plan", "prefetch"):
            value = getattr(self, name)
            if not _is_int(value):
                raise RequestError(name, value, "must be an integer")
        if self.time_budget_s is not None and not (
            isinstance(self.time_budget_s, (int, float))
            and self.time_budget_s > 0
            and math.isfinite(self.time_budget_s)
        ):
            raise RequestError("time_budget_s", self.time_budget_s, "must be a number of seconds > 0, or None")

    def _check_deferral(self) -> None:
        """``defer_max_sequences`` only where the planner defers (solver/defer.py), ``defer_max_wait`` only with it."""
        wanted, wait = self.defer_max_sequences, self.defer_max_wait
        if not _is_int(wanted) or wanted < 0:
            raise RequestError("defer_max_sequences", wanted, "must be an integer >= 0")
        if wanted and self.solver not in DEFER_SOLVERS:
            raise RequestError(
                "defer_max_sequences",
                wanted,
                f"only solver {' or '.join(map(repr, DEFER_SOLVERS))} defers on request, not {self.solver!r}",
            )
        if not _is_int(wait) or not 1 <= wait <= MAX_DEFER:
            raise RequestError("defer_max_wait", wait, f"must be an integer in 1..{MAX_DEFER} (iterations)")
        if wait != 1 and not wanted:
            raise RequestError(
                "defer_max_wait", wait, "bounds how long a deferred sequence waits: give defer_max_sequences > 0"
            )


#: The option names, in declaration order (the keywords ``PlannedBatches`` took before ``LoaderOptions``).
OPTION_NAMES = tuple(field.name for field in dataclasses.fields(LoaderOptions))


def options_from_keywords(options: LoaderOptions | None, keywords: Mapping[str, Any]) -> LoaderOptions:
    """The loader's options: ``options`` as given, or the old keyword arguments mapped onto a ``LoaderOptions``
    with a ``DeprecationWarning`` that shows the new form. An unknown keyword is a ``TypeError``, as Python's
    own for a call; options and keywords together, or neither, a ``RequestError`` naming ``options``."""
    unknown = sorted(set(keywords) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(f"PlannedBatches() got an unexpected keyword argument {unknown[0]!r}")
    if options is not None and keywords:
        raise RequestError(
            "options", ", ".join(sorted(keywords)), "give the settings in LoaderOptions or as keywords, not both"
        )
    if options is not None:
        if not isinstance(options, LoaderOptions):
            raise RequestError("options", type(options).__name__, "must be a LoaderOptions")
        return options
    if not keywords:
        raise RequestError(
            "options",
            None,
            "needed: PlannedBatches(dataset, lengths, LoaderOptions(global_batch_size=..., profile=...))",
        )
    named = ", ".join(f"{name}=..." for name in OPTION_NAMES if name in keywords)
    warnings.warn(
        f"PlannedBatches(dataset, lengths, {named}) is deprecated: pass the settings as one value, "
        f"PlannedBatches(dataset, lengths, LoaderOptions({named})) (from skrull.worker.loader_options)",
        DeprecationWarning,
        stacklevel=3,
    )
    return LoaderOptions(**keywords)
