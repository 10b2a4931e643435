"""Planned batches for a PyTorch training loop: an iterator that yields each rank's ready microbatches.

In the spirit of Megatron's ``data_iterator_wrapper``: the loop asks for the next iteration and gets
this rank's microbatches (a varying number) already packed, with everything the attention and the
loss need. Behind it:

1. The loader's order (corpus/order.py, the same function ``skrull lengths`` uses): global batch ``b``
   is a fixed set of dataset indices from ``seed`` and ``epoch``.
2. Global batches are planned ``batches_per_plan`` at a time, ``plan_ahead`` iterations ahead of use: by
   default in a planner process of the node that the loader starts and owns (``ProcessPlans``,
   worker/planner/: one process per node, never in the training interpreter), or by a
   planning service (``client=PlanningClient(url)``), or in this process (``plans=LocalPlans()``). Every
   rank submits the same request, named by its content, and requests are ``deterministic`` by default,
   so the ranks share one plan without sending plans to each other (worker/plan_sources.py). Unless
   ``time_budget_s`` is given, each request's budget follows the measured step time
   (``PlanningBudget``: ``planning_share`` of a step per iteration, agreed over the job's store, or,
   without a ``torch.distributed`` group, through the node's planner process when the job is that node).
3. This rank's view of iteration ``i`` (the rank view document; from a service
   ``GET /v1/plans/{id}/ranks/{rank}?iteration=j``) is read, and its microbatches packed (4. below), in a
   background thread ``prefetch`` iterations ahead, while the loop trains on iteration ``i - prefetch``.
   The rank comes from a ``DeviceMesh`` with
   "dp" and "cp" dims, from ``torch.distributed`` under ``torchrun``, or is given (``resolve_rank``).
4. Sequences are read from the map-style dataset and packed (worker/inputs.py): local sequences whole,
   shard pieces sliced; position ids restart per local sequence and stay global in pieces.

With ``defer_max_sequences=k`` (``auto`` only) a plan may leave up to k sequences of a global batch
``pending`` (solver/defer.py): the loader prepends them to the next request's first batch (``"defer":
{"carried": n}``: they run in its first iteration and never wait twice), maps them back to their dataset
indices, and plans the last chunk of the data with no deferral, so every index is yielded exactly once
over the epoch. ``sample_indices`` of an iteration are then the indices it really runs. With
``defer_max_wait=w`` (default 1) a deferred sequence may wait up to w iterations (the request's
``defer.max_wait``): within a request of ``batches_per_plan`` batches it may run up to w batches later, and
the last w batches may leave sequences pending (one pending from batch b of n waits n - b).

``blocked_s`` of each yielded iteration is the whole time the loop spent in ``next()``: waiting for the
plan and its view, and packing the microbatches. It is ~0 when planning keeps up. ``state_dict()`` /
``load_state_dict()`` resume at the next iteration (an optimizer step) with the plans the uninterrupted
run had.

Dataset items are ``{"input_ids": ..., "labels": ...}`` (sequences of ints or 1-D tensors of equal
length, ``-100`` where no loss is taken) or a bare sequence of input ids (every next token a target).
Labels come in one of two conventions, named by ``label_convention``: ``"next_token"`` (the default: the
label at position t is the target of position t, the next token; what the packed buffer holds, so a
shard piece carries its own targets) or ``"hf"`` (Hugging Face's: the label at t is token t itself and
the model shifts; the loader shifts them here, once). Passing Hugging Face labels as ``"next_token"``
would train each position to predict itself: the convention is a choice, not a guess.
``len(input_ids)`` must equal ``lengths[index]``: the lengths the plan was made for.

Inputs are checked as torch's ``DataLoader`` users expect a training library to: token ids are integers
(a float, even 3.0, or a bool is refused naming the dataset index, never truncated), ``>= 0`` and below
``vocab_size`` when it is given; labels are integers, ``-100`` or token ids. At construction an empty
dataset is refused, and so is a row that no layout can hold (longer than ``cp * bucket_tokens``: the
error names its dataset index and the bucket or CP degree it would need), before any iteration runs.

Epochs, as torch's ``DataLoader`` with a ``DistributedSampler``: ``set_epoch(e)`` selects epoch ``e``'s
order (reshuffled deterministically from ``seed`` and ``e``); iterating the loader again after a whole
pass starts the next epoch. ``drop_last`` (default False, as torch's) drops the last global batch when it
is partial; kept, it is planned like any other (a smaller global batch, the same loss rule).

Evaluation sets: ``for_evaluation(dataset, lengths)`` is a loader over them with this one's mesh, profile,
bucket, solver and plan source, in dataset order with nothing dropped (worker/hf/evaluation.py scores it).
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from skrull.corpus.order import global_batches
from skrull.solver.cp_modes import DEFAULT_CP_MODES, ULYSSES, read_cp_modes
from skrull.solver.errors import RequestError
from skrull.solver.io import check_cp_modes_profile
from skrull.solver.profile import Profile, load_profile, profile_from_dict
from skrull.solver.types import Parallel, Plan
from skrull.worker.calibration import CalibrationReport, LoaderCalibration
from skrull.worker.inputs import pack
from skrull.worker.layout import MicrobatchLayout, layouts_from_view_dict
from skrull.worker.loader_options import LoaderOptions, options_from_keywords
from skrull.worker.loader_requests import chunk_lengths, request_document
from skrull.worker.loss import IGNORE_INDEX
from skrull.worker.plan_sources import PlanSource, ServicePlans, plan_key
from skrull.worker.planner.budget import PlanningBudget, unagreed_budget_s
from skrull.worker.planner.client import ProcessPlans

if TYPE_CHECKING:  # the client (httpx, the api extra) is the caller's: a [worker] install imports this module
    from torch.distributed.device_mesh import DeviceMesh

    from skrull.api.client import PlanningClient

#: Plan submissions in flight: the chunk being trained on and the next one (submitted ahead).
PLANS_IN_FLIGHT = 2
#: Iterations ahead of the loop that requests are submitted by default (1 with ``calibrate``).
PLAN_AHEAD = 4
#: Loaders created in this process per job key (budget keys: the n-th loader of a job on every rank agree).
_INSTANCES: dict[str, int] = {}
_INSTANCES_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadyMicrobatch:
    """One microbatch of this rank, packed: tensors of ``num_tokens`` rows and the layout for DACP."""

    step: int
    layout: MicrobatchLayout
    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    max_seqlen: int
    #: The iteration's input tokens (or ``supervised_tokens``); the Hugging Face step counts target
    #: labels over the world instead (worker/hf/step.py, docs/finetune.md).
    loss_normalizer: int
    #: False when the iteration was planned without equal microbatch counts per rank (the loader's
    #: ``equal_microbatches=False``): DDP and FSDP2 refuse such a plan at the first step (worker/grad_sync.py)
    equal_counts: bool = True
    #: ``(attention, kv)`` heads of the profile the plan was made with, where the request allows Ulysses (its
    #: groups divide them, its K/V copies are priced by them): ``scheduled_step`` refuses a model with other
    #: heads on every rank alike before the first forward, in a loop that never called ``check_model_heads``
    plan_heads: tuple[int, int] | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True, slots=True, kw_only=True)
class ReadyIteration:
    iteration: int
    plan_id: str
    microbatches: tuple[ReadyMicrobatch, ...]
    sample_indices: tuple[int, ...]
    loss_normalizer: int
    blocked_s: float


def refuse_other_heads(
    heads: tuple[int, int], plan_heads: tuple[int, int], *, cp_modes: Sequence[str] | None = None
) -> None:
    """A ``RequestError`` naming ``profile.heads`` when the model's ``(attention, kv)`` heads are not those the
    plans were made for (``PlannedBatches.check_model_heads``)."""
    if tuple(heads) != tuple(plan_heads):
        raise RequestError(
            "profile.heads",
            {"attention": plan_heads[0], "kv": plan_heads[1]},
            f"the model has num_attention_heads = {heads[0]}, num_key_value_heads = {heads[1]}; with cp_modes "
            f"{list(cp_modes) if cp_modes is not None else 'allowing ulysses'} plan with the model's own profile "
            "(skrull derive-profile --hf-config)",
        )


def ready_microbatch(
    layout: MicrobatchLayout,
    fetch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    *,
    loss_normalizer: int,
    device: torch.device,
    equal_counts: bool = True,
    plan_heads: tuple[int, int] | None = None,
) -> ReadyMicrobatch:
    """Pack one microbatch: ``fetch(seq_id)`` gives a whole sequence's ``(input_ids, labels)``, aligned.

    Labels are sliced with their tokens, so a shard piece keeps the targets of its own rows (the label of
    a piece's last row is the next token of the sequence, held by another piece or another GPU).
    """
    if layout.num_tokens:
        ids = pack(layout, lambda i: fetch(i)[0])
        labels = pack(layout, lambda i: fetch(i)[1])
    else:
        ids = labels = torch.zeros(0, dtype=torch.long)
    return ReadyMicrobatch(
        step=layout.step,
        layout=layout,
        input_ids=ids.to(device),
        labels=labels.to(device),
        position_ids=torch.tensor(layout.position_ids, dtype=torch.long, device=device),
        cu_seqlens=torch.tensor(layout.cu_seqlens, dtype=torch.int32, device=device),
        max_seqlen=layout.max_seqlen,
        loss_normalizer=loss_normalizer,
        equal_counts=equal_counts,
        plan_heads=plan_heads,
    )


def _as_tensor(value: Any, field: str, index: int, name: str = "dataset") -> torch.Tensor:
    """One row's ``input_ids`` or ``labels`` as int64, refusing what ``.long()`` would silently change:
    floats (3.7 would become 3), bools (True would become token 1) and anything not one-dimensional."""
    if isinstance(value, torch.Tensor):
        t = value
    else:
        items = list(value) if isinstance(value, list | tuple) else None
        if items is not None and any(isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in items):
            bad = next(x for x in items if isinstance(x, bool) or not isinstance(x, numbers.Integral))
            raise RequestError(f"{name}[{index}].{field}", bad, "token ids and labels must be integers")
        t = torch.as_tensor(value if items is None else items, dtype=torch.long if items is not None else None)
    if t.dim() != 1:
        raise RequestError(f"{name}[{index}].{field}", list(t.shape), "must be one-dimensional")
    if t.dtype == torch.bool or t.is_floating_point() or t.is_complex():
        raise RequestError(f"{name}[{index}].{field}", str(t.dtype), "token ids and labels must be integers")
    return t.long()


def _is_arrow_table(value: Any) -> bool:
    """A ``pyarrow.Table``, recognised by type name: a [worker] install without pyarrow imports nothing."""
    return type(value).__module__.startswith("pyarrow") and type(value).__name__ == "Table"


class ArrowRows:
    """A ``pyarrow.Table`` read as a map-style dataset of rows (``table[i]`` is its i-th column, not row)."""

    def __init__(self, table: Any) -> None:
        self.table = table

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row: dict[str, Any] = self.table.slice(index, 1).to_pylist()[0]
        return row


def arrow_columns(dataset: Any) -> Any:
    """The Arrow table holding a columnar dataset's rows in its own order: a ``pyarrow.Table``, or a
    ``datasets.Dataset`` without an indices mapping (after ``select`` / ``shuffle`` its table is in another
    order; its rows are then checked as read, with every other dataset). None otherwise, or without an
    ``input_ids`` column."""
    table = dataset.table if isinstance(dataset, ArrowRows) else dataset if _is_arrow_table(dataset) else None
    if table is None and hasattr(dataset, "column_names") and getattr(dataset, "_indices", True) is None:
        inner = getattr(getattr(dataset, "data", None), "table", None)
        table = inner if _is_arrow_table(inner) else None
    if table is None or "input_ids" not in table.column_names:
        return None
    return table


#: Arrow's integer types by name (``pyarrow.DataType.__str__``)
_ARROW_INTEGERS = frozenset(f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64))


def check_columnar_rows(table: Any, lengths: Sequence[int], *, vocab_size: int | None, name: str = "dataset") -> None:
    """Every row's ``input_ids`` (and ``labels``, when a column) checked in one vectorised pass over the Arrow
    columns: integer ids, ``>= 0``, below ``vocab_size`` when given, as many as ``lengths`` says, labels as many
    as the ids and each ``-100`` or ``>= 0``. The first bad row is named as ``dataset[i]``, the same line the
    row would give when read (``PlannedBatches._sample``), but before any step."""
    import numpy as np

    def flat(column: str) -> tuple[Any, Any]:
        lists = table.column(column).combine_chunks()  # a ListArray: offsets into one flat array of values
        value_type = getattr(lists.type, "value_type", None)
        if value_type is None:
            raise RequestError(f"{name}.{column}", str(lists.type), "must be a column of lists of token ids")
        if str(value_type) not in _ARROW_INTEGERS:
            raise RequestError(f"{name}[0].{column}", str(value_type), "token ids must be integers (lists of ints)")
        sizes = lists.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
        return lists.flatten().to_numpy(zero_copy_only=False).astype(np.int64), sizes

    ids, sizes = flat("input_ids")
    want = np.asarray(lengths, dtype=np.int64)
    wrong = np.flatnonzero(sizes != want)
    if wrong.size:
        i = int(wrong[0])
        raise RequestError(
            f"{name}[{i}].input_ids",
            int(sizes[i]),
            f"tokens: a length other than lengths[{i}] = {int(want[i])}, which the plan was made for",
        )
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])

    def first_row(bad: Any) -> tuple[int, int]:
        position = int(np.flatnonzero(bad)[0])
        return int(np.searchsorted(starts, position, side="right") - 1), position

    if ids.size and bool((ids < 0).any()):
        row, at = first_row(ids < 0)
        raise RequestError(f"{name}[{row}].input_ids", int(ids[at]), "token ids must be >= 0")
    if vocab_size is not None and ids.size and bool((ids >= vocab_size).any()):
        row, at = first_row(ids >= vocab_size)
        raise RequestError(
            f"{name}[{row}].input_ids", int(ids[at]), f"is out of the vocabulary (vocab_size={vocab_size})"
        )
    if "labels" in table.column_names:
        labels, label_sizes = flat("labels")
        wrong = np.flatnonzero(label_sizes != sizes)
        if wrong.size:
            i = int(wrong[0])
            raise RequestError(
                f"{name}[{i}].labels", int(label_sizes[i]), f"labels for {int(sizes[i])} input_ids: one per token"
            )
        bad = (labels < 0) & (labels != IGNORE_INDEX)
        if labels.size and bool(bad.any()):
            row, at = first_row(bad)
            raise RequestError(f"{name}[{row}].labels", int(labels[at]), f"labels are token ids or {IGNORE_INDEX}")


def parse_profile(profile: str | Mapping[str, Any]) -> Profile:
    """``profile``, a bundled name or a profile document, read (once per loader)."""
    return load_profile(profile) if isinstance(profile, str) else profile_from_dict(dict(profile))


def resolve_rank(*, rank: int | None, dp: int | None, cp: int | None, mesh: DeviceMesh | None) -> tuple[int, int, int]:
    """This process's rank in the plan and the plan's DP x CP layout.

    From a ``DeviceMesh`` with dims named "dp" and "cp" (rank ``dp_rank * cp + cp_rank``; a "tp" dim, when
    present, gives its ranks the same view); else from ``torch.distributed`` (initialized, as under
    ``torchrun`` with env://) or the ``RANK`` / ``WORLD_SIZE`` variables ``torchrun`` sets, with ``cp``
    given and ``dp = world / cp``; else as given.
    """
    if mesh is not None:
        names = tuple(mesh.mesh_dim_names or ())
        if "dp" not in names or "cp" not in names or not set(names) <= {"dp", "cp", "tp"}:
            raise RequestError("mesh", list(names), 'needs dims named "dp" and "cp" (and "tp", if any)')
        dp_size, cp_size = mesh.size(names.index("dp")), mesh.size(names.index("cp"))
        if (dp, cp) != (None, None) and (dp, cp) != (dp_size, cp_size):
            raise RequestError("dp, cp", [dp, cp], f"disagree with the mesh (dp={dp_size}, cp={cp_size})")
        return mesh.get_local_rank("dp") * cp_size + mesh.get_local_rank("cp"), dp_size, cp_size
    if rank is None:
        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(), dist.get_world_size()
        elif "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        else:
            raise RequestError("rank", None, "give rank, a DeviceMesh, or run under torchrun (torch.distributed)")
        if cp is None:
            raise RequestError(
                "cp", None, f"is needed under torch.distributed (world size {world}): LoaderOptions(cp=...) or a mesh"
            )
        if cp < 1 or world % cp:
            raise RequestError("cp", cp, f"must divide the world size {world}")
        if dp is None:
            dp = world // cp
        if dp * cp != world:
            raise RequestError("dp", dp, f"dp * cp must be the world size {world}")
    if dp is None or cp is None:
        raise RequestError("dp" if dp is None else "cp", None, "needed with an explicit rank")
    if not 0 <= rank < dp * cp:
        raise RequestError("rank", rank, f"must be in 0..{dp * cp - 1}")
    return rank, dp, cp


class PlannedBatches:
    """Iterate ``ReadyIteration`` objects for ``rank`` (see the module docstring)."""

    def __init__(
        self,
        dataset: Any,
        lengths: Sequence[int],
        options: LoaderOptions | None = None,
        *,
        client: PlanningClient | None = None,
        plans: PlanSource | None = None,
        mesh: DeviceMesh | None = None,
        device: torch.device | None = None,
        supervised_tokens: Callable[[int], int] | None = None,
        **settings: Any,
    ) -> None:
        """``options`` say what to plan and how to read rows; the keywords wire in live objects: where plans come
        from (``client``, a planning service, or ``plans``, a ``PlanSource``; neither: the node's planner
        process), the ``mesh``, the ``device`` tensors land on and ``supervised_tokens(index)``, a row's
        supervised token count when the loss is normalised by those. ``settings``: the keyword form of the
        options from before ``LoaderOptions``, mapped onto one with a ``DeprecationWarning``."""
        options = options_from_keywords(options, settings)
        #: the settings this loader was made with (``for_evaluation`` derives its loader's from them)
        self.options = options
        rank, dp, cp = resolve_rank(rank=options.rank, dp=options.dp, cp=options.cp, mesh=mesh)
        #: what errors call the dataset (``eval_dataset`` for ``for_evaluation``'s loader)
        self.dataset_name = name = options.dataset_name
        if len(dataset) == 0:
            raise RequestError(name, 0, "is empty: nothing to train on")
        #: how the plans may run sharded attention (the request's ``cp_modes``: all-gather, Ulysses or both, per
        #: microbatch); the worker runs each microbatch in its plan's mode
        modes = options.cp_modes
        self.cp_modes = read_cp_modes(modes if modes is None or isinstance(modes, str) else list(modes))
        parsed = parse_profile(options.profile)
        check_cp_modes_profile(self.cp_modes, parsed)
        #: the profile's head counts, which the plans' Ulysses groups divide (``check_model_heads``)
        self.profile_heads = parsed.heads
        if _is_arrow_table(dataset):  # rows by index, as every other dataset
            dataset = ArrowRows(dataset)
        if len(dataset) != len(lengths):
            raise RequestError("lengths", len(lengths), f"must have one entry per dataset sample ({len(dataset)})")
        if client is not None and plans is not None:
            raise RequestError("plans", type(plans).__name__, "give a client (a service) or plans, not both")
        self.dataset = dataset
        self.lengths = list(lengths)
        self._check_lengths(self.lengths, cp=cp, bucket_tokens=options.bucket_tokens or parsed.bucket_tokens, name=name)
        #: what every rank's loader shares: names the node's planner process and the job's budget keys
        self.job_key = plan_key(
            {"lengths": self.lengths, "batch": options.global_batch_size, "seed": options.seed,
             "epoch": options.epoch, "shuffle": options.shuffle, "dp": dp, "cp": cp, "profile": options.profile,
             "solver": options.solver, "per_plan": options.batches_per_plan, "iterations": options.num_iterations}
        )  # fmt: skip
        #: where plans come from: the service behind ``client``, else the node's planner process
        #: (worker/planner/), or the source given (``LocalPlans()``: a thread of this process)
        self.plans: PlanSource = (
            plans if plans is not None else ServicePlans(client) if client else ProcessPlans(job_key=self.job_key)
        )
        self._owns_plans = plans is None and client is None
        #: how many iterations ahead of the loop requests are submitted (calibrating: close to use, so the
        #: latest fit reaches the plans soon)
        default_ahead = 1 if options.calibrate else PLAN_AHEAD
        self.plan_ahead: int = default_ahead if options.plan_ahead is None else options.plan_ahead
        self.budget = PlanningBudget(share=options.planning_share)
        self.rank = rank
        self.dp, self.cp = dp, cp
        # the settings the loop reads, as attributes (LoaderOptions documents each); ``epoch`` moves with
        # ``set_epoch`` and ``vocab_size`` with its setter, so these are the loader's state from here on
        self.profile, self.solver, self.bucket_tokens = options.profile, options.solver, options.bucket_tokens
        self.time_budget_s, self.timeout_s = options.time_budget_s, options.timeout_s
        self.equal_microbatches, self.deterministic = options.equal_microbatches, options.deterministic
        self.label_convention = options.label_convention
        self.defer_max_sequences, self.defer_max_wait = options.defer_max_sequences, options.defer_max_wait
        self.batches_per_plan, self.prefetch = options.batches_per_plan, options.prefetch
        self.seed, self.epoch, self.shuffle = options.seed, options.epoch, options.shuffle
        self.global_batch_size, self.drop_last = options.global_batch_size, options.drop_last
        self.num_iterations = options.num_iterations
        self.supervised_tokens = supervised_tokens
        self.device = device or torch.device("cpu")
        #: the dataset's columns when it is columnar (a ``datasets.Dataset`` or a ``pyarrow.Table``):
        #: checked in one vectorised pass at construction (``check_columnar_rows``)
        self._columns = arrow_columns(dataset)
        #: token ids must be below it when given (the model's ``config.vocab_size``)
        self.vocab_size = options.vocab_size
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=PLANS_IN_FLIGHT, thread_name_prefix="skrull-plans")
        self._start_epoch(options.epoch)
        if not self.batches:
            raise RequestError(
                "global_batch_size",
                options.global_batch_size,
                f"leaves no global batch of the {len(lengths)} rows (drop_last={options.drop_last}, num_iterations="
                f"{options.num_iterations})",
            )
        with _INSTANCES_LOCK:  # the n-th loader of a job in every process: the keys its ranks agree under
            self.instance = _INSTANCES.get(self.job_key, 0)
            _INSTANCES[self.job_key] = self.instance + 1
        self._budget_store, self._budget_key = self._agreement()
        #: calibration from the run (``record_timings``; worker/calibration.py): None when off
        self.calibration: LoaderCalibration | None = None
        if options.calibrate:
            self.calibration = LoaderCalibration(self, store=self._calibration_store())

    @property
    def vocab_size(self) -> int | None:
        """Token ids must be below it when given; a columnar dataset is checked whenever it is set (the
        SkrullTrainer sets the model's after construction)."""
        return self._vocab_size

    @vocab_size.setter
    def vocab_size(self, value: int | None) -> None:
        self._vocab_size = value
        if self._columns is not None:
            check_columnar_rows(self._columns, self.lengths, vocab_size=value, name=self.dataset_name)

    def __getitem__(self, index: Any) -> Any:
        """Refused: ``torch.utils.data.DataLoader(planned, ...)`` treats a loader with ``__len__`` as a map-style
        dataset and asks it for items (found: ``TypeError: 'PlannedBatches' object is not subscriptable``, or a
        worker process per ``num_workers`` each packing every rank's rows again). It is the loader itself:
        threads of this process pack ``prefetch`` iterations ahead and the node's planner process makes each
        plan once, so it needs no DataLoader or worker processes around it."""
        raise TypeError(
            "PlannedBatches is the data loader itself, not a dataset: iterate it directly (for ready in planned: "
            "...); it packs ahead on threads (prefetch) and plans once per node, so torch.utils.data.DataLoader "
            "and its num_workers are not used around it"
        )

    def _agreement(self) -> tuple[Any, str | None]:
        """Where the ranks agree on each request's budget: the job's ``torch.distributed`` store (None: this
        process alone). The key is None when no budget is derived (given, or nothing to agree with)."""
        if self.time_budget_s is not None:
            return None, None
        if dist.is_available() and dist.is_initialized():
            from torch.distributed.distributed_c10d import _get_default_store

            return _get_default_store(), f"skrull/plan-budget/{self.job_key}/{self.instance}"
        if isinstance(self.plans, ProcessPlans) and self.plans.serves_whole_job(self.dp * self.cp):
            # no group, but every rank of the job asks the node's one planner process: agree through it
            return self.plans, f"skrull/plan-budget/{self.job_key}/{self.instance}"
        if self.dp * self.cp == 1:
            return None, "local"
        return None, None

    def _calibration_store(self) -> Any:
        """The job's store, where the ranks agree on the profile of each request (None: this process alone)."""
        if dist.is_available() and dist.is_initialized():
            from torch.distributed.distributed_c10d import _get_default_store

            return _get_default_store()
        if self.dp * self.cp > 1:
            raise RequestError(
                "calibrate", True, "needs torch.distributed (initialized) to gather timings and agree on profiles"
            )
        return None

    def record_timings(self, ready: ReadyIteration, microbatch_ms: Sequence[float]) -> CalibrationReport:
        """After a step: this rank's microbatch times of ``ready`` (``scheduled_step(microbatch_ms=...)``).
        Collective: every rank calls it once per iteration. Returns the iteration's report (estimated vs
        measured, median per-microbatch error) and feeds the planner's refit (worker/calibration.py)."""
        if self.calibration is None:
            raise RequestError("calibrate", False, "record_timings needs LoaderOptions(calibrate=True)")
        return self.calibration.record(ready, microbatch_ms)

    @staticmethod
    def _check_lengths(lengths: Sequence[int], *, cp: int, bucket_tokens: int, name: str = "dataset") -> None:
        """Every row fits some layout: whole in one bucket, or sharded over at most ``cp`` GPUs' buckets."""
        limit = cp * bucket_tokens
        for index, n in enumerate(lengths):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise RequestError(f"lengths[{index}]", n, "must be an integer >= 1 (the row's token count)")
            if n > limit:
                raise RequestError(
                    f"{name}[{index}]",
                    n,
                    f"tokens: no layout holds it (cp={cp} x bucket_tokens={bucket_tokens} = {limit}); it needs "
                    f"bucket_tokens >= {-(-n // cp)} at cp={cp}, or cp >= {-(-n // bucket_tokens)} at this bucket, "
                    "or drop / truncate the row",
                )

    def for_evaluation(
        self, dataset: Any, lengths: Sequence[int], *, label_convention: str | None = None
    ) -> PlannedBatches:
        """A loader over an evaluation set with this one's options (mesh, profile, bucket, solver, CP modes)
        and plan source, changed only where evaluation differs: every row exactly once, in dataset order (no
        shuffling, nothing dropped, nothing deferred, no calibration), each global batch planned alone
        (``batches_per_plan=1``, so a microbatch's sequence id ``k`` is the iteration's
        ``sample_indices[k]``) and every rank running the same number of microbatches, which a sharded
        model's forwards need. Rows that no layout holds are refused here, naming their index."""
        options = dataclasses.replace(
            self.options,
            rank=self.rank,  # resolved here: the evaluation loader needs no mesh
            dp=self.dp,
            cp=self.cp,
            epoch=0,
            shuffle=False,
            batches_per_plan=1,
            num_iterations=None,
            equal_microbatches=True,
            defer_max_sequences=0,
            defer_max_wait=1,
            label_convention=self.label_convention if label_convention is None else label_convention,
            drop_last=False,
            vocab_size=self.vocab_size,
            calibrate=False,
            dataset_name="eval_dataset",
        )
        # the same plans and cache: IterationGroups reads the whole plan from it
        return PlannedBatches(dataset, lengths, options, plans=self.plans, device=self.device)

    # -- epochs --------------------------------------------------------------------------------------

    def _start_epoch(self, epoch: int) -> None:
        """Epoch ``epoch``'s global batches (its own deterministic order), from its first iteration."""
        batches = global_batches(
            len(self.lengths),
            global_batch_size=self.global_batch_size,
            seed=self.seed,
            epoch=epoch,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
        )
        if self.num_iterations is not None:
            batches = batches[: self.num_iterations]
        with self._lock:
            self.epoch = epoch
            self.batches = batches
            #: the next iteration ``__iter__`` yields (``state_dict`` / ``load_state_dict``)
            self.next_iteration = 0
            self._plans: dict[int, Future[str]] = {}
            #: dataset indices carried into each chunk's request (deferred by the chunk before it)
            self._carried: dict[int, tuple[int, ...]] = {0: ()}
            #: this loader yielded the epoch's last iteration: its next pass is the next epoch
            self._finished_pass = False

    def set_epoch(self, epoch: int) -> None:
        """Train epoch ``epoch`` next (torch's ``DistributedSampler.set_epoch``): its order is reshuffled from
        ``seed`` and ``epoch``; the same epoch again keeps where the loop is."""
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise RequestError("epoch", epoch, "must be an integer >= 0")
        if epoch != self.epoch or self._finished_pass:
            self._start_epoch(epoch)

    # -- resuming ------------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the loop is: the next iteration to train, what defines the order it indexes, and (with
        deferral) the dataset indices carried into the plan of the next iteration."""
        chunk = self.next_iteration // self.batches_per_plan
        carried = self._carried_into(chunk) if self.defer_max_sequences and chunk < self._num_chunks else ()
        return {
            "next_iteration": self.next_iteration,
            "seed": self.seed,
            "epoch": self.epoch,
            "shuffle": self.shuffle,
            "global_batch_size": self.global_batch_size,
            "num_samples": len(self.lengths),
            "dp": self.dp,
            "cp": self.cp,
            "defer_max_sequences": self.defer_max_sequences,
            "defer_max_wait": self.defer_max_wait,
            "cp_modes": list(self.cp_modes),
            "carried": list(carried),
            "budgets": self.budget.state_dict(epoch=self.epoch, from_chunk=chunk),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state["next_iteration"]``: the next ``__iter__`` starts there, with the plans the
        uninterrupted run would have had (deterministic plans of the same requests)."""
        mine = self.state_dict()
        defaults = {"defer_max_sequences": 0, "defer_max_wait": 1, "cp_modes": list(DEFAULT_CP_MODES)}  # older states
        for key, value in mine.items():
            if (
                key not in ("next_iteration", "carried", "epoch", "budgets")
                and state.get(key, defaults.get(key)) != value
            ):
                raise RequestError(
                    f"state_dict.{key}", state.get(key), f"was saved by a loader with {key}={value!r} here"
                )
        epoch = state.get("epoch", self.epoch)
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            raise RequestError("state_dict.epoch", epoch, "must be an integer >= 0")
        if epoch != self.epoch:
            self._start_epoch(epoch)
        start = state.get("next_iteration")
        if not isinstance(start, int) or not 0 <= start <= len(self.batches):
            raise RequestError("state_dict.next_iteration", start, f"must be in 0..{len(self.batches)}")
        chunk = start // self.batches_per_plan
        carried = self._read_carried(state.get("carried", []), chunk)
        with self._lock:
            self._carried[chunk] = carried
        budgets = state.get("budgets", {})
        if not isinstance(budgets, Mapping) or not all(
            re.fullmatch(r"\d+/\d+", str(k)) and isinstance(v, int | float) and v > 0 for k, v in budgets.items()
        ):
            raise RequestError("state_dict.budgets", budgets, 'must map requests ("epoch/chunk") to budgets in seconds')
        self.budget.load_state_dict(budgets)
        self.next_iteration = start

    @property
    def _carry_window(self) -> int:
        """How many global batches before a request may have sequences carried into it: those within
        ``defer_max_wait`` iterations of its first (the previous request's last ones)."""
        return min(self.defer_max_wait, self.batches_per_plan)

    def _read_carried(self, value: Any, chunk: int) -> tuple[int, ...]:
        """Saved carried indices: distinct dataset indices of the global batches just before ``chunk``
        (within ``defer_max_wait`` of it), at most ``defer_max_sequences`` from each."""
        if not isinstance(value, list | tuple) or any(isinstance(i, bool) or not isinstance(i, int) for i in value):
            raise RequestError("state_dict.carried", value, "must be a list of dataset indices")
        start = chunk * self.batches_per_plan
        window = self.batches[max(0, start - self._carry_window) : start]
        taken = [sum(i in set(batch) for i in value) for batch in window]
        if (
            len(set(value)) != len(value)
            or sum(taken) != len(value)
            or any(n > self.defer_max_sequences for n in taken)
        ):
            raise RequestError(
                "state_dict.carried",
                value,
                f"must be distinct indices of the {len(window)} global batch{'es' if len(window) != 1 else ''} "
                f"before this chunk, at most {self.defer_max_sequences} of each",
            )
        return tuple(value)

    def __len__(self) -> int:
        return len(self.batches)

    # -- planning ------------------------------------------------------------------------------------

    @property
    def _num_chunks(self) -> int:
        return -(-len(self.batches) // self.batches_per_plan)

    def _carried_into(self, chunk: int) -> tuple[int, ...]:
        """Dataset indices the plan of ``chunk - 1`` left pending, carried into ``chunk``'s request (waits
        for that plan; the loader asks only once it is solved, after reading one of its views)."""
        with self._lock:
            known = self._carried.get(chunk)
        if known is not None:
            return known
        previous = self._plan_id(chunk - 1)
        plan = self.plans.plan(previous, timeout_s=self.timeout_s)
        table = self._request_indices(chunk - 1)
        carried = tuple(table[i] for i in plan.pending)
        with self._lock:
            self._carried[chunk] = carried
        return carried

    def _request_indices(self, chunk: int) -> list[int]:
        """Dataset index of every sequence id of ``chunk``'s request: the carried ones, then its batches."""
        first = chunk * self.batches_per_plan
        carried = self._carried_into(chunk) if self.defer_max_sequences else ()
        return [*carried, *(i for b in self.batches[first : first + self.batches_per_plan] for i in b)]

    def check_model_heads(self, heads: tuple[int, int] | None) -> None:
        """With Ulysses allowed, the model's ``(attention, kv)`` heads must be the profile's: the plans choose
        Ulysses groups that divide the profile's attention heads and price the K/V copies by its kv heads, so
        a model with other heads fails inside the first Ulysses microbatch, or runs plans priced for another
        model. Refused naming ``profile.heads`` before the first step (the trainers call it at setup)."""
        if ULYSSES not in self.cp_modes or heads is None or self.profile_heads is None:
            return
        refuse_other_heads(heads, (self.profile_heads.attention, self.profile_heads.kv), cp_modes=self.cp_modes)

    def plan_of(self, iteration: int) -> Plan:
        """The whole plan iteration ``iteration`` of this epoch runs in (its request's iteration ``iteration %
        batches_per_plan``): what was planned for it, each microbatch's group, mode and estimate. Waits for it."""
        if isinstance(iteration, bool) or not isinstance(iteration, int) or not 0 <= iteration < len(self.batches):
            raise RequestError("iteration", iteration, f"must be in 0..{len(self.batches) - 1}")
        return self.plans.plan(self._plan_id(iteration // self.batches_per_plan), timeout_s=self.timeout_s)

    def sharding_modes(self, iteration: int) -> tuple[str, ...]:
        """The modes iteration ``iteration``'s microbatches that shard over two or more GPUs run in (sorted;
        empty when none shards): what a run on ``cp_modes=["allgather", "ulysses"]`` really mixed."""
        plan = self.plan_of(iteration)
        microbatches = plan.iterations[iteration % self.batches_per_plan].microbatches
        return tuple(sorted({mb.mode for mb in microbatches if mb.sharded and len(mb.ranks) > 1}))

    def request_document(self, chunk: int) -> dict[str, Any]:
        """The request of global batches ``chunk * batches_per_plan ..`` (docs/formats.md "Request"); with
        deferral, the indices the previous plan left pending go first, and the last chunk defers nothing."""
        first = chunk * self.batches_per_plan
        carried = self._carried_into(chunk) if self.defer_max_sequences else ()
        key = f"{self.epoch}/{chunk}"
        return request_document(
            self.options,
            batches=chunk_lengths(self.lengths, self.batches[first : first + self.batches_per_plan], carried),
            dp=self.dp,
            cp=self.cp,
            cp_modes=self.cp_modes,
            profile=self.profile if self.calibration is None else self.calibration.profile_for(key),
            last=chunk == self._num_chunks - 1,
            carried=len(carried),
            budget_s=lambda sizes, deferring: self._budget_s(key, sizes, deferring),
        )

    def _budget_s(self, key: str, batch_sizes: list[int], deferring: bool) -> float | None:
        """A request's budget when ``time_budget_s`` is not given: the step-derived one the ranks agree on
        (``PlanningBudget.decide``), or, with nothing to agree it through (ranks given explicitly, no
        ``torch.distributed`` group, no planner process shared by the whole job: ``_agreement``), the
        planner's minimum for the request, which every rank computes alike from the request itself and which
        keeps planning ahead of a fast step (the planner's 1 s default made such a loop wait 575 ms per
        iteration). Ranks asking with different budgets would get different plans."""
        parallel = Parallel(dp=self.dp, cp=self.cp)
        if self._budget_key is None:
            return unagreed_budget_s(self.solver, batch_sizes, parallel, deferring=deferring)
        return self.budget.decide(
            key,
            solver=self.solver,
            batch_sizes=batch_sizes,
            parallel=parallel,
            store=self._budget_store,
            key=self._budget_key,
            deferring=deferring,
        )

    def _plan_id(self, chunk: int) -> str:
        return self._plan_future(chunk).result()

    def _plan_future(self, chunk: int) -> Future[str]:
        """The submission of ``chunk``'s request. Its document is built outside the lock: with deferral it
        waits for the previous plan's ``pending``."""
        with self._lock:
            future = self._plans.get(chunk)
        if future is not None:
            return future
        doc = self.request_document(chunk)
        with self._lock:
            future = self._plans.get(chunk)
            if future is None:
                if isinstance(self.plans, ProcessPlans):  # solved in request order, however submissions race
                    future = self._pool.submit(self.plans.submit, doc, order=chunk)
                else:
                    future = self._pool.submit(self.plans.submit, doc)
                self._plans[chunk] = future
        return future

    def _view(self, iteration: int) -> tuple[str, dict[str, Any]]:
        chunk, offset = divmod(iteration, self.batches_per_plan)
        plan_id = self._plan_id(chunk)
        following = offset == 0 and chunk + 1 < self._num_chunks
        if not self.defer_max_sequences:  # submit the plans up to ``plan_ahead`` iterations ahead
            last = min(self._num_chunks - 1, (iteration + max(self.plan_ahead, 1)) // self.batches_per_plan)
            for ahead in range(chunk + 1, last + 1):
                self._plan_id_async(ahead)
        if isinstance(self.plans, ProcessPlans):
            asked = time.perf_counter()
            view, solved = self.plans.rank_view_and_solve(plan_id, self.rank, offset, timeout_s=self.timeout_s)
            if offset == 0:
                self.budget.record_solve(solved)
                self.budget.record_wait(time.perf_counter() - asked)
        else:
            view = self.plans.rank_view(plan_id, self.rank, offset, timeout_s=self.timeout_s)
        if following and self.defer_max_sequences:
            self._plan_id_async(chunk + 1)  # its request needs this plan's pending: solved now
        return plan_id, view

    def _plan_id_async(self, chunk: int) -> None:
        self._plan_future(chunk)

    # -- packing -------------------------------------------------------------------------------------

    def _sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        name = self.dataset_name
        item = self.dataset[index]
        if isinstance(item, Mapping):
            ids = _as_tensor(item["input_ids"], "input_ids", index, name)
            labels = _as_tensor(item["labels"], "labels", index, name) if "labels" in item else None
        else:
            ids, labels = _as_tensor(item, "input_ids", index, name), None
        if ids.shape[0] != self.lengths[index]:
            raise RequestError(
                f"{name}[{index}].input_ids",
                int(ids.shape[0]),
                f"tokens: a length other than lengths[{index}] = {self.lengths[index]}, which the plan was made for",
            )
        if labels is not None and labels.shape[0] != ids.shape[0]:
            raise RequestError(
                f"{name}[{index}].labels", int(labels.shape[0]), f"labels for {ids.shape[0]} input_ids: one per token"
            )
        if labels is None:
            labels = torch.cat([ids[1:], torch.tensor([IGNORE_INDEX], dtype=torch.long)])
        else:
            self._check_convention(ids, labels, index)
            if self.label_convention == "hf":  # the label of position t + 1 is the target of position t
                labels = torch.cat([labels[1:], torch.tensor([IGNORE_INDEX], dtype=torch.long, device=labels.device)])
        if ids.numel() and int(ids.min()) < 0:
            raise RequestError(f"{name}[{index}].input_ids", int(ids.min()), "token ids must be >= 0")
        if self.vocab_size is not None and ids.numel() and int(ids.max()) >= self.vocab_size:
            raise RequestError(
                f"{name}[{index}].input_ids",
                int(ids.max()),
                f"is out of the vocabulary (vocab_size={self.vocab_size})",
            )  # fmt: skip
        bad = (labels < 0) & (labels != IGNORE_INDEX)
        if bool(bad.any()):
            first_bad = int(labels[bad][0])
            raise RequestError(f"{name}[{index}].labels", first_bad, f"labels are token ids or {IGNORE_INDEX}")
        return ids, labels

    def _check_convention(self, ids: torch.Tensor, labels: torch.Tensor, index: int) -> None:
        """Refuse labels written in the other convention than ``label_convention`` says, where the row tells:
        every supervised label equal to its own position's token is Hugging Face's convention (as
        ``"next_token"`` it would train each position to predict itself; found: relative error 9.3), every
        one equal to the next position's token is the next-token convention (as ``"hf"`` it would be shifted
        twice). A row only tells when those two readings differ somewhere it is supervised (a run of one
        repeated token reads both ways), so such rows are let through."""
        n = ids.shape[0]
        if n < 2:
            return
        supervised = labels[:-1] != IGNORE_INDEX  # positions 0..n-2, each with a next token
        differ = supervised & (ids[:-1] != ids[1:])
        if not bool(differ.any()):
            return
        own = bool((labels[:-1][supervised] == ids[:-1][supervised]).all()) and (
            labels[-1] == IGNORE_INDEX or labels[-1] == ids[-1]
        )
        nxt = bool((labels[:-1][supervised] == ids[1:][supervised]).all()) and labels[-1] == IGNORE_INDEX
        if self.label_convention == "next_token" and own:
            raise RequestError(
                "label_convention",
                self.label_convention,
                f"{self.dataset_name}[{index}].labels equal its input_ids wherever they are supervised: Hugging "
                "Face's convention (the model shifts); pass LoaderOptions(label_convention='hf'), or labels "
                "that are each position's next token",
            )
        if self.label_convention == "hf" and nxt:
            raise RequestError(
                "label_convention",
                self.label_convention,
                f"{self.dataset_name}[{index}].labels are each position's next token (already shifted): "
                "the 'next_token' convention; pass LoaderOptions(label_convention='next_token')",
            )

    def _runs(self, iteration: int, plan_id: str) -> tuple[list[int], dict[int, int]]:
        """With deferral: the dataset indices ``iteration`` runs (request order), and the dataset index of
        each of its sequence ids, from the whole plan."""
        chunk, offset = divmod(iteration, self.batches_per_plan)
        table = self._request_indices(chunk)
        plan = self.plans.plan(plan_id, timeout_s=self.timeout_s)
        ids = sorted(i for mb in plan.iterations[offset].microbatches for i in mb.seq_ids)
        return [table[i] for i in ids], {i: table[i] for i in ids}

    def _ready(self, iteration: int, plan_id: str, view: dict[str, Any], blocked_s: float) -> ReadyIteration:
        num_tokens, layouts = layouts_from_view_dict(view)
        if self.defer_max_sequences:
            samples, index_of = self._runs(iteration, plan_id)
        else:
            samples = self.batches[iteration]
            first = self._first_id(iteration)
            index_of = {first + k: i for k, i in enumerate(samples)}
        batch_tokens = sum(self.lengths[i] for i in samples)
        if num_tokens != batch_tokens:
            # A planner that defers sequences (WLB-LLM's outlier delay) moves them out of their global batch;
            # this loader trains every global batch in its own iteration, so it refuses such a plan rather
            # than silently leave sequences untrained.
            raise RequestError(
                "solver",
                self.solver,
                f"plan {plan_id} iteration {iteration} holds {num_tokens} tokens, its global batch {batch_tokens}: "
                "the planner deferred sequences to other iterations, which PlannedBatches does not train; "
                "use a planner that keeps each batch in its iteration (auto, skrull, hydraulis, ...)",
            )
        if self.supervised_tokens is not None:
            normalizer = sum(self.supervised_tokens(i) for i in samples)
        else:
            normalizer = num_tokens
        # every row of the global batch is read and checked on every rank, in the same order, not only the rows
        # this rank packs: a bad row then stops every rank at this iteration with the same line naming
        # dataset[i], before the step that would use it (found: the packing rank stopped alone and the others
        # died in their next collective with gloo's "Connection closed by peer")
        # (a columnar dataset without labels had every row's ids checked at construction, vectorised: each rank
        # then reads its own rows only; labels keep the pass, the convention check being per row)
        checked = self._columns is not None and "labels" not in self._columns.column_names
        rows = {} if checked else {i: self._sample(i) for i in samples}

        def fetch(seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
            index = index_of[seq_id]
            if index not in rows:
                rows[index] = self._sample(index)
            return rows[index]

        equal_counts = self.equal_microbatches or self.dp == 1  # one DP rank: its CP group runs one count
        heads = self.profile_heads
        plan_heads = (heads.attention, heads.kv) if heads is not None and ULYSSES in self.cp_modes else None
        ready = tuple(
            ready_microbatch(
                layout,
                fetch,
                loss_normalizer=normalizer,
                device=self.device,
                equal_counts=equal_counts,
                plan_heads=plan_heads,
            )
            for layout in layouts
        )
        return ReadyIteration(
            iteration=iteration,
            plan_id=plan_id,
            microbatches=ready,
            sample_indices=tuple(samples),
            loss_normalizer=normalizer,
            blocked_s=blocked_s,
        )

    def _first_id(self, iteration: int) -> int:
        """Global sequence id of the first sample of ``iteration`` within its plan's request."""
        chunk_first = (iteration // self.batches_per_plan) * self.batches_per_plan
        return sum(len(self.batches[b]) for b in range(chunk_first, iteration))

    # -- iteration -----------------------------------------------------------------------------------

    def _prepared(self, iteration: int) -> ReadyIteration:
        """``iteration`` with its view read and its microbatches packed (on a prefetch thread: ``next()``
        then only hands it over)."""
        plan_id, view = self._view(iteration)
        return self._ready(iteration, plan_id, view, 0.0)

    def __iter__(self) -> Iterator[ReadyIteration]:
        if torch.utils.data.get_worker_info() is not None:  # a DataLoader worker process iterating it
            self.__getitem__(0)
        if self._finished_pass:  # the last pass ran to the epoch's end: this one is the next epoch
            self._start_epoch(self.epoch + 1)
        todo = deque(range(self.next_iteration, len(self.batches)))
        pool = ThreadPoolExecutor(max_workers=self.prefetch + 1, thread_name_prefix="skrull-views")
        in_flight: deque[tuple[int, Future[ReadyIteration]]] = deque()
        returned: float | None = None
        try:
            while todo or in_flight:
                while todo and len(in_flight) < self.prefetch + 1:
                    i = todo.popleft()
                    in_flight.append((i, pool.submit(self._prepared, i)))
                i, future = in_flight.popleft()
                start = time.perf_counter()
                if returned is not None:  # the loop's step: from the last ``next()``'s return to this call
                    self.budget.record_step(start - returned)
                ready = future.result()
                self.next_iteration = i + 1
                self._finished_pass = self.next_iteration >= len(self.batches)
                returned = time.perf_counter()
                yield dataclasses.replace(ready, blocked_s=returned - start)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._owns_plans:
            self.plans.close()
