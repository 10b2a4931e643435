"""Planned batches for a PyTorch training loop: an iterator that yields each rank's ready microbatches.

In the spirit of Megatron's ``data_iterator_wrapper``: the loop asks for the next iteration and gets
this rank's microbatches (a varying number) already packed, with everything the attention and the
loss need. Behind it:

1. The loader's order (corpus/order.py, the same function ``skrull lengths`` uses): global batch ``b``
   is a fixed set of dataset indices from ``seed`` and ``epoch``.
2. Global batches are submitted to the planning service ``batches_per_plan`` at a time, ahead of use.
   Every rank submits the same request; the service names a plan by the content of its request, so
   the ranks share one plan without talking to each other.
3. This rank's view of iteration ``i`` (``GET /v1/plans/{id}/ranks/{rank}?iteration=j``) is fetched in a
   background thread ``prefetch`` iterations ahead, while the loop trains on iteration ``i - prefetch``.
4. Sequences are read from the map-style dataset and packed (worker/inputs.py): local sequences whole,
   shard pieces sliced; position ids restart per local sequence and stay global in pieces.

``blocked_s`` of each yielded iteration is the time ``next()`` waited for the planner: with prefetching
one iteration ahead it is ~0 when planning an iteration takes less than training one.

Dataset items are ``{"input_ids": ..., "labels": ...}`` (sequences of ints or 1-D tensors of equal
length, labels already aligned with inputs, ``-100`` where no loss is taken) or a bare sequence of
input ids (labels then are the next token, ``-100`` at the end). ``len(input_ids)`` must equal
``lengths[index]``: the lengths the plan was made for.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from skrull.corpus.order import global_batches
from skrull.solver.errors import RequestError
from skrull.worker.inputs import pack
from skrull.worker.layout import MicrobatchLayout, layouts_from_view_dict
from skrull.worker.loss import IGNORE_INDEX

if TYPE_CHECKING:  # the client (httpx, the api extra) is the caller's: a [worker] install imports this module
    from skrull.api.client import PlanningClient

#: Plan submissions in flight: the chunk being trained on and the next one (submitted ahead).
PLANS_IN_FLIGHT = 2


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


def ready_microbatch(
    layout: MicrobatchLayout,
    fetch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    *,
    loss_normalizer: int,
    device: torch.device,
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
    )


def _as_tensor(value: Any, field: str, index: int) -> torch.Tensor:
    t = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if t.dim() != 1:
        raise RequestError(f"dataset[{index}].{field}", list(t.shape), "must be one-dimensional")
    return t.long()


class PlannedBatches:
    """Iterate ``ReadyIteration`` objects for ``rank`` (see the module docstring)."""

    def __init__(
        self,
        dataset: Any,
        lengths: Sequence[int],
        *,
        client: PlanningClient,
        rank: int,
        dp: int,
        cp: int,
        global_batch_size: int,
        profile: str | Mapping[str, Any],
        seed: int = 0,
        epoch: int = 0,
        shuffle: bool = True,
        solver: str = "auto",
        batches_per_plan: int = 1,
        prefetch: int = 1,
        num_iterations: int | None = None,
        bucket_tokens: int | None = None,
        time_budget_s: float | None = None,
        timeout_s: float = 300.0,
        supervised_tokens: Callable[[int], int] | None = None,
        device: torch.device | None = None,
        equal_microbatches: bool = False,
    ) -> None:
        if not 0 <= rank < dp * cp:
            raise RequestError("rank", rank, f"must be in 0..{dp * cp - 1}")
        if batches_per_plan < 1:
            raise RequestError("batches_per_plan", batches_per_plan, "must be an integer >= 1")
        if prefetch < 0:
            raise RequestError("prefetch", prefetch, "must be an integer >= 0")
        if len(dataset) != len(lengths):
            raise RequestError("lengths", len(lengths), f"must have one entry per dataset sample ({len(dataset)})")
        self.dataset = dataset
        self.lengths = list(lengths)
        self.client = client
        self.rank = rank
        self.dp, self.cp = dp, cp
        self.profile = profile
        self.solver = solver
        self.bucket_tokens = bucket_tokens
        #: The planner's budget per request (None: the service's default). Plans are prefetched while the
        #: previous iterations train, so a budget below one step's time costs the loop no waiting.
        self.time_budget_s = time_budget_s
        #: every rank the same number of microbatches per iteration (some empty): ask for it when the model is
        #: sharded (FSDP2 ``fully_shard``, ZeRO-3), whose every forward gathers parameters over all ranks
        self.equal_microbatches = equal_microbatches
        self.batches_per_plan = batches_per_plan
        self.prefetch = prefetch
        self.timeout_s = timeout_s
        self.supervised_tokens = supervised_tokens
        self.device = device or torch.device("cpu")
        self.batches = global_batches(
            len(lengths), global_batch_size=global_batch_size, seed=seed, epoch=epoch, shuffle=shuffle
        )
        if num_iterations is not None:
            self.batches = self.batches[:num_iterations]
        self._plans: dict[int, Future[str]] = {}
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=PLANS_IN_FLIGHT, thread_name_prefix="skrull-plans")

    def __len__(self) -> int:
        return len(self.batches)

    # -- planning ------------------------------------------------------------------------------------

    def request_document(self, chunk: int) -> dict[str, Any]:
        """The request of global batches ``chunk * batches_per_plan ..`` (docs/formats.md "Request")."""
        first = chunk * self.batches_per_plan
        doc: dict[str, Any] = {
            "batches": [[self.lengths[i] for i in b] for b in self.batches[first : first + self.batches_per_plan]],
            "parallel": {"dp": self.dp, "cp": self.cp},
            "profile": self.profile,
            "solver": self.solver,
        }
        if self.bucket_tokens is not None:
            doc["bucket_tokens"] = self.bucket_tokens
        if self.time_budget_s is not None:
            doc["time_budget_s"] = self.time_budget_s
        if self.equal_microbatches:
            doc["equal_microbatches"] = True
        return doc

    def _plan_id(self, chunk: int) -> str:
        with self._lock:
            future = self._plans.get(chunk)
            if future is None:
                future = self._pool.submit(self.client.submit, self.request_document(chunk))
                self._plans[chunk] = future
        return future.result()

    def _view(self, iteration: int) -> tuple[str, dict[str, Any]]:
        chunk, offset = divmod(iteration, self.batches_per_plan)
        plan_id = self._plan_id(chunk)
        if offset == 0 and (chunk + 1) * self.batches_per_plan < len(self.batches):
            self._plan_id_async(chunk + 1)  # submit the next plan while this one's views are read
        return plan_id, self.client.rank_view(plan_id, self.rank, offset, timeout_s=self.timeout_s)

    def _plan_id_async(self, chunk: int) -> None:
        with self._lock:
            if chunk not in self._plans:
                self._plans[chunk] = self._pool.submit(self.client.submit, self.request_document(chunk))

    # -- packing -------------------------------------------------------------------------------------

    def _sample(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        item = self.dataset[index]
        if isinstance(item, Mapping):
            ids = _as_tensor(item["input_ids"], "input_ids", index)
            labels = _as_tensor(item["labels"], "labels", index) if "labels" in item else None
        else:
            ids, labels = _as_tensor(item, "input_ids", index), None
        if labels is None:
            labels = torch.cat([ids[1:], torch.tensor([IGNORE_INDEX], dtype=torch.long)])
        if ids.shape[0] != self.lengths[index] or labels.shape[0] != ids.shape[0]:
            raise RequestError(
                f"dataset[{index}]",
                int(ids.shape[0]),
                f"has a length other than lengths[{index}] = {self.lengths[index]}",
            )
        return ids, labels

    def _ready(self, iteration: int, plan_id: str, view: dict[str, Any], blocked_s: float) -> ReadyIteration:
        samples = self.batches[iteration]
        num_tokens, layouts = layouts_from_view_dict(view)
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
        cache: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def fetch(seq_id: int) -> tuple[torch.Tensor, torch.Tensor]:
            if seq_id not in cache:
                cache[seq_id] = self._sample(samples[seq_id - self._first_id(iteration)])
            return cache[seq_id]

        ready = tuple(
            ready_microbatch(layout, fetch, loss_normalizer=normalizer, device=self.device) for layout in layouts
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

    def __iter__(self) -> Iterator[ReadyIteration]:
        todo = deque(range(len(self.batches)))
        pool = ThreadPoolExecutor(max_workers=self.prefetch + 1, thread_name_prefix="skrull-views")
        in_flight: deque[tuple[int, Future[tuple[str, dict[str, Any]]]]] = deque()
        try:
            while todo or in_flight:
                while todo and len(in_flight) < self.prefetch + 1:
                    i = todo.popleft()
                    in_flight.append((i, pool.submit(self._view, i)))
                i, future = in_flight.popleft()
                start = time.perf_counter()
                plan_id, view = future.result()
                blocked = time.perf_counter() - start
                yield self._ready(i, plan_id, view, blocked)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
