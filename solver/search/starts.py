"""Constructive starts for ``auto``: every cheap planner of the project, run while the budget allows.

Each start predicts its own planning time as ``scale * (per_sequence_s * K + per_square_s * sum_b K_b^2)``
for K sequences in batches of K_b (``verl-kk``'s Karmarkar-Karp differencing is quadratic in a batch);
``scale`` starts at 1 and follows what this process measures (an exponential average of measured /
predicted), so a loaded or fast machine is learnt after a call or two. A start runs only when its
prediction, plus the time to cost its plan, fits the time left; any start predicted to take more than
``ISOLATE_ABOVE_S`` runs in a child process that is killed at the deadline, so a wrong prediction costs
that start, never the budget.

The starts whose time depends on the lengths (the peers: about 15-60 ms each for a 256-sequence batch,
as much as the start phase of a 0.1 s budget holds after the cheap starts) run in one forked child,
forked before the first (cheapest) start, while this process runs the cheap starts, in
``PEER_ORDER``: the peer whose plan most often beats the others first (``hydraulis``'s heterogeneous
replicas: on fresh draws it was the plan ``auto`` at 0.1 s was behind when it had not run), each plan sent
back as soon as it is made. The relied-on peers (``Start.relied``: ``hydraulis``, ``dynamic-cp``, planners a
user may ask for, which ``auto`` promises never to be behind) begin first whatever their prediction, and
``auto`` waits for their plans before its search spends the budget, until its deadline less pricing them
(``PendingPeers.wait_relied``); a prediction learnt in a load spike cannot keep them out. Of the others, a
peer predicted not to fit is passed over for the next (on 512 GPUs ``hydraulis`` packs 512 replicas and
takes 0.35 s for 256 sequences, 20-60 ms on 32 GPUs). A peer runs whenever its predicted time is within
``OVERRUN_FACTOR`` of what is left (the child has a core of its own), whatever budget it would need on its
own (that covers its worst case, e.g. ``hydraulis``'s stage-2 ILP; inside ``auto`` it gets the time left
and is killed at the deadline): ``auto`` must never be behind a planner the user could have asked for
with that planner's default budget (``bench/never_behind.py``).
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from skrull.solver.cp_modes import DEFAULT_CP_MODES
from skrull.solver.errors import SkrullError
from skrull.solver.ilp.backends import module_installed
from skrull.solver.ilp.runner import Child, Report, run_with_deadline, start_child
from skrull.solver.plan import Problem
from skrull.solver.planners.base import Planner, PlannerOutput
from skrull.solver.planners.baselines import DeepSpeedPlanner, PackedPlanner, SortedPlanner
from skrull.solver.planners.dynamic_cp import DynamicCpPlanner
from skrull.solver.planners.hydraulis import HydraulisPlanner
from skrull.solver.planners.minmax_ilp import COLD_IMPORT_S, CP_SAT_MODULE
from skrull.solver.planners.skrull import RoundRobinPlanner, SkrullPlanner
from skrull.solver.planners.verl_kk import VerlKkPlanner
from skrull.solver.planners.wlb import WlbPlanner
from skrull.solver.planners.xtuner import XtunerPlanner
from skrull.solver.search.construct import SpreadStart

#: Weight of the newest measurement in a start's time scale.
SCALE_SMOOTHING = 0.5
#: A start predicted to take longer than this runs in a killable child even if it is cheap per sequence
#: (a wrong prediction on a large batch must not break the budget).
ISOLATE_ABOVE_S = 0.05
#: Most a start run in this process is predicted over its prior (``predicted_s``).
IN_PROCESS_SCALE_CAP = 4.0
#: Factor a start's time scale moves toward 1 by each time it is passed over (``_passed_over``).
SKIP_DECAY = 0.5
#: How far past its prediction an isolated start may run (unless half the time left is more).
OVERRUN_FACTOR = 3.0
#: Time ``auto`` spends costing each start's plan (iteration times, work), per sequence.
EVALUATION_PER_SEQUENCE_S = 3e-6
#: The peers, most valuable first (module doc).
PEER_ORDER: tuple[str, ...] = ("hydraulis", "dynamic-cp", "wlb-keep", "wlb")
#: How often a wait for the relied-on peers looks whether they have answered (``PendingPeers.wait_relied``).
WAIT_SLICE_S = 0.001
#: Importing a start's solver module (CP-SAT: solver/planners/minmax_ilp.py).
IMPORT_S = COLD_IMPORT_S


@dataclass(frozen=True, slots=True, kw_only=True)
class Start:
    """A constructive start and its time model (seconds)."""

    name: str
    make: Callable[[], Planner]
    per_sequence_s: float
    per_square_s: float = 0.0
    fixed_s: float = 0.0
    #: Run in a child process killed at the deadline (starts whose time varies with the lengths).
    isolated: bool = False
    #: A module the start imports on its first run (its solver), which a forked child imports again
    #: unless this process already has it.
    imports: str | None = None
    #: Its plans may leave sequences pending (WLB-LLM's outlier queues): ``auto`` runs it only when it
    #: may return such a plan (``AutoPlanner(allow_pending=True)``).
    defers: bool = False
    #: A planner a user may ask for whose plan ``auto`` promises never to be behind (docs/auto.md:
    #: ``hydraulis``, ``dynamic-cp``): the peers' child begins it first, whatever its predicted time, and
    #: ``auto`` waits for its plan until the chunk's deadline (less pricing it) rather than killing it at the
    #: end of the start phase. Both plan the same at any budget they get there (``hydraulis``'s stage-2 ILP
    #: rarely moves within 0.1 s; ``dynamic-cp`` has no time limit), in 2-50 ms for 256 sequences: under load
    #: their predictions, learnt in a spike, had kept ``hydraulis`` out of the child (``wlb-keep`` ran
    #: instead), and ``auto`` at 0.1 s stayed 12.9% behind ``hydraulis`` run alone in 57-79 ms.
    #: Only where its prior (``unit_s``: the same on any machine, not the time learnt here) fits the time to the
    #: chunk's deadline (``relied_on``): ``hydraulis`` on 65,536 sequences takes seconds, and waiting for it
    #: would take the whole budget from the search.
    relied: bool = False
    #: Runs whatever the time left (in process; in a child with all the time left where it is predicted over
    #: ``ISOLATE_ABOVE_S``, the first one always in process): ``auto`` never returns a plan worse than these
    #: that finish, however little CPU it gets (``packed`` and ``skrull``;
    #: ``AutoPlanner.budget`` counts them in the smallest budget ``auto`` accepts).
    always: bool = False

    #: Per GPU (``hydraulis`` packs every replica; 0.35 s for 256 sequences on 512 GPUs, 20 ms on 32).
    per_gpu_s: float = 0.0
    #: Per sequence and GPU (``dynamic-cp``'s per-sequence group search).
    per_sequence_gpu_s: float = 0.0
    #: Per sequence and CP rank, making and pricing the plan (``deepspeed``, ``sorted``: every microbatch
    #: lists every rank of its group; 4,096 sequences at CP 1024 took 2 s where the per-sequence prior said
    #: 8 ms).
    per_slot_s: float = 0.0

    def unit_s(self, batch_sizes: Sequence[int], *, gpus: int = 1, cp: int = 1) -> float:
        num = sum(batch_sizes)
        return (
            self.fixed_s
            + self.per_sequence_s * num
            + self.per_square_s * sum(b * b for b in batch_sizes)
            + self.per_gpu_s * gpus
            + self.per_sequence_gpu_s * num * gpus
            + self.per_slot_s * num * cp
        )


#: In order of cost; the peers (flexible layouts: groups wider than CP, heterogeneous replicas,
#: per-sequence sharding, deferral of outliers) last. Priors measured on 256-sequence batches.
STARTS: tuple[Start, ...] = (
    Start(name="packed", make=PackedPlanner, per_sequence_s=1e-6, always=True),
    Start(name="spread", make=SpreadStart, per_sequence_s=3e-5),
    # 8 us a sequence on loose buckets, 10-13 us on tight ones (ShareGPT on Qwen2.5-7B's 13,000 tokens)
    # DACP scans the group's ranks for each sequence: 0.34 s for 4,096 sequences at CP 1024
    Start(name="skrull", make=SkrullPlanner, per_sequence_s=1.2e-5, per_slot_s=7e-8, always=True),
    Start(name="round-robin", make=RoundRobinPlanner, per_sequence_s=8e-6, per_slot_s=7e-8),
    Start(name="verl-kk", make=VerlKkPlanner, per_sequence_s=4e-6, per_square_s=3e-8),
    # XTuner's packs, every one Ulysses over the group: only where the request allows Ulysses
    Start(name="xtuner", make=XtunerPlanner, per_sequence_s=2e-6),
    Start(
        name="hydraulis",
        isolated=True,
        make=HydraulisPlanner,
        per_sequence_s=8e-5,
        per_gpu_s=6e-4,
        fixed_s=0.005,
        imports=CP_SAT_MODULE,
        relied=True,
    ),
    # WLB-LLM's packing writes a local list per CP rank of each microbatch: 45-62 ms for 256 sequences at
    # CP 16, 77-138 ms at CP 32 (Llama-2-7B TP 8 on H100; the per-sequence prior alone said 28 ms)
    Start(name="wlb", isolated=True, make=WlbPlanner, per_sequence_s=1e-4, per_slot_s=7e-6, fixed_s=0.002, defers=True),
    # WLB-LLM's packing and adaptive sharding without the outlier delay: a start that keeps every batch
    # (27-48 ms at CP 16, 58-126 ms at CP 32, where 15 ms was predicted)
    Start(
        name="wlb-keep",
        isolated=True,
        make=lambda: WlbPlanner(num_queues=0),
        per_sequence_s=5e-5,
        per_slot_s=6e-6,
        fixed_s=0.002,
    ),
    # 4-7 ms for 256 sequences on 32 and 64 GPUs, 6-17 ms for 320-512 (its step filling in heaps; 10-25 ms
    # before)
    Start(
        name="dynamic-cp",
        isolated=True,
        make=DynamicCpPlanner,
        per_sequence_s=3e-5,
        per_sequence_gpu_s=1e-7,
        fixed_s=0.002,
        relied=True,
    ),
    # the plain-CP baselines: never better than ``packed`` on the bundled distributions, run last
    Start(name="deepspeed", make=DeepSpeedPlanner, per_sequence_s=2e-6, per_slot_s=1e-6),
    Start(name="sorted", make=SortedPlanner, per_sequence_s=4e-6, per_slot_s=1e-6),
)

_scale: dict[str, float] = {}


def predicted_s(start: Start, batch_sizes: Sequence[int], *, gpus: int = 1, cp: int = 1) -> float:
    """Its learnt time, plus ``IMPORT_S`` while its solver module is not imported here (a forked child
    would import it again: a kill, and a learnt time that keeps it out of every later start phase). A start
    run in this process is predicted at most ``IN_PROCESS_SCALE_CAP`` times its prior: one measured in a
    load spike would otherwise be kept out of 0.1 s start phases though it takes a few ms (``skrull`` at a
    scale of 32 on a shared 2-core machine: ``auto`` then planned 2% behind ``skrull`` run alone); one
    predicted over ``ISOLATE_ABOVE_S`` runs in a killable child anyway."""
    cold = start.imports is not None and start.imports not in sys.modules
    scale = _scale.get(start.name, 1.0)
    if not start.isolated:
        scale = min(scale, IN_PROCESS_SCALE_CAP)
    return scale * start.unit_s(batch_sizes, gpus=gpus, cp=cp) + (IMPORT_S if cold else 0.0)


def _learn(start: Start, batch_sizes: Sequence[int], measured_s: float, *, gpus: int, cp: int = 1) -> None:
    ratio = measured_s / max(start.unit_s(batch_sizes, gpus=gpus, cp=cp), 1e-9)
    old = _scale.get(start.name, 1.0)
    _scale[start.name] = (1 - SCALE_SMOOTHING) * old + SCALE_SMOOTHING * ratio


def _passed_over(start: Start) -> None:
    """A start not run for its predicted time: its scale moves back toward 1 by ``SKIP_DECAY``. A start is
    only measured when it runs, so one load spike (a scale of 10-40 for a start of a few ms, on a shared
    2-core machine) would otherwise keep it out of every later 0.1 s start phase."""
    old = _scale.get(start.name, 1.0)
    if old > 1.0:
        _scale[start.name] = max(1.0, old * SKIP_DECAY)


@dataclass(slots=True, kw_only=True)
class PendingPeers:
    """The peers' child, still running after the cheap starts; ``collect`` takes the plans that arrive by
    ``end`` (the end of the start phase) and kills the child, or leaves a peer still running to finish
    (``keep_running``): a later ``collect`` takes its plan."""

    child: Child
    peers: list[Start]
    sizes: list[int]
    end: float
    gpus: int
    cp: int = 1
    #: the relied-on peers of this call (``relied_on``): begun first, never killed at the end of the start phase
    relied: frozenset[str] = frozenset()
    #: peers begun and not finished: (name, when it began, on the system-wide ``time.monotonic``)
    running: list[tuple[str, float]] = dataclasses.field(default_factory=list)
    got: dict[str, PlannerOutput] = dataclasses.field(default_factory=dict)
    taken: set[str] = dataclasses.field(default_factory=set)
    #: peers that reported (or ran until killed): the others were passed over by the child
    heard: set[str] = dataclasses.field(default_factory=set)
    closed: bool = False

    @property
    def busy(self) -> bool:
        """Whether the child is still running peers (their plans may come later)."""
        return not self.closed

    def collect(
        self, *, until: float | None = None, keep_until: float | None = None
    ) -> list[tuple[str, PlannerOutput]]:
        """The plans that arrived by ``until`` (default ``end``) and were not returned before, in ``STARTS``
        order. With ``keep_until`` the child is left running (it begins peers until ``launch_starts``'s
        ``late_s`` after the phase) unless the peer it runs is predicted to finish after ``keep_until`` (it
        holds a core meanwhile: one that cannot finish is not left running); a killed peer
        learns the time it had (a peer that just missed a phase is tried again in the next one of that
        length: on a loaded machine ``wlb`` needs 50-70 ms of a 0.1 s budget's 75 ms phase). While it
        waits, this process imports a peer's solver module when the wait holds twice ``IMPORT_S``."""
        if not self.closed:
            until = self.end if until is None else until
            for start in self.peers:  # idle until the peers answer: import a module for the later calls' children
                if (
                    start.imports is not None
                    and start.imports not in sys.modules
                    and until - time.monotonic() > 2 * IMPORT_S
                ):
                    importlib.import_module(start.imports)
            finished = self.child.read(until=until, on_report=self._receive) is not None
            by_name = {s.name: s for s in self.peers}
            finishing = keep_until is not None and all(
                name in self.relied
                or began + predicted_s(by_name[name], self.sizes, gpus=self.gpus, cp=self.cp) <= keep_until
                for name, began in self.running
            )
            if finished or not finishing:
                self.child.collect(deadline=time.monotonic(), grace_s=0.0, on_report=self._receive)
                self.closed = True
                for name, began in self.running:  # it ran at least this long (twice would keep it out for good)
                    ran = time.monotonic() - began
                    # a lower bound: learnt only above the prediction (below it, ``wlb-keep`` killed after 60 ms
                    # of a predicted 126 learnt a halved time, and began again where it could not finish)
                    if ran > predicted_s(by_name[name], self.sizes, gpus=self.gpus, cp=self.cp):
                        _learn(by_name[name], self.sizes, ran, gpus=self.gpus, cp=self.cp)
                    self.heard.add(name)
                self.running.clear()
                for start in self.peers:  # never begun: the child passed it over
                    if start.name not in self.heard:
                        _passed_over(start)
        new = [s.name for s in STARTS if s.name in self.got and s.name not in self.taken]
        self.taken.update(new)
        return [(name, self.got[name]) for name in new]

    @property
    def awaited(self) -> bool:
        """Whether a relied-on peer (``Start.relied``) has not reported yet while the child runs."""
        return not self.closed and any(name not in self.heard for name in self.relied)

    def wait_relied(self, *, until: float) -> None:
        """Wait until every relied-on peer has reported, or ``until``, leaving the child running (``collect``
        takes the plans). Read in slices of ``WAIT_SLICE_S``: the child goes on to the other peers after the
        relied ones, and this returns as soon as those have answered, not when the child ends."""
        while self.awaited and time.monotonic() < until:
            if self.child.read(until=min(until, time.monotonic() + WAIT_SLICE_S), on_report=self._receive):
                break

    def _receive(self, report: tuple[str, object, float]) -> None:
        name, output, seconds = report
        if name == "began":  # ``seconds`` is when it began: reports are read only here, long after
            self.running.append((str(output), seconds))
            return
        self.heard.add(name)
        self.running.clear()
        _learn(next(s for s in self.peers if s.name == name), self.sizes, seconds, gpus=self.gpus, cp=self.cp)
        if isinstance(output, PlannerOutput):
            self.got[name] = output


def launch_starts(
    problem: Problem,
    *,
    deadline: float,
    keep_s: float,
    names: Sequence[str] | None = None,
    isolate: bool = True,
    late_s: float = 0.0,
) -> tuple[list[tuple[str, PlannerOutput]], PendingPeers | None]:
    """The cheap starts' outputs (in ``STARTS`` order), run in this process, and the peers' child still
    running (``None`` when no peer fits): the caller may search while the peers run, then ``collect``.

    Starts run when their predicted time fits before ``deadline - keep_s``; the ``always`` ones (the
    cheapest first) run whatever the time left, in process.
    A start that fails (``SkrullError``) is skipped. ``isolate=False`` runs every start in process, in
    order (with an infinite deadline: every start, deterministically). The peers' child may begin a peer
    up to ``late_s`` after the start phase (a caller that searches meanwhile collects it late: ``PendingPeers``)."""
    sizes = [len(ids) for ids in problem.batch_ids]
    gpus, cp = problem.parallel.num_gpus, problem.parallel.cp
    chosen = [s for s in STARTS if (names is None or s.name in names) and plans_modes(s, problem) and importable(s)]
    end = deadline - keep_s
    evaluation_s = EVALUATION_PER_SEQUENCE_S * sum(sizes)
    out: dict[str, PlannerOutput] = {}
    peers: list[Start] = []
    relied: frozenset[str] = frozenset()
    child: Child | None = None
    for k, start in enumerate(chosen):
        # the peers, in a child, while this process runs the cheap starts: forked first, so the relied-on ones
        # (``Start.relied``) begin at once (forked after ``packed``, ``hydraulis`` began 20-30 ms into a 0.1 s
        # budget on a loaded machine and took 50-70 ms there)
        if k == 0 and isolate:
            peers = [s for s in chosen if s.isolated]
            relied = relied_on(peers, sizes, gpus=gpus, cp=cp, span_s=deadline - time.monotonic())
            peers_end = end - evaluation_s * len(peers)
            window = OVERRUN_FACTOR * (peers_end - time.monotonic())
            if relied or any(predicted_s(s, sizes, gpus=gpus, cp=cp) <= window for s in peers):
                child = _start_peers(peers, problem, sizes, peers_end + late_s, relied=relied)
            else:  # none fits: no fork, and no time kept for costing their plans
                peers = []
        if start in peers:
            continue
        left = end - time.monotonic() - evaluation_s * (len(out) + 1 + len(peers))
        predicted = predicted_s(start, sizes, gpus=gpus, cp=cp)
        if out and predicted > left and not start.always:
            _passed_over(start)
            continue
        began = time.monotonic()
        # an ``always`` start predicted over ISOLATE_ABOVE_S runs in a child too, with all the time left: its
        # time is not always linear (``skrull`` on 16,384 short sequences per DP rank in a tight bucket: GDS
        # tries 66 microbatch counts, 0.9 s against the 0.13 s its prior says), and the budget is a promise
        isolated = isolate and bool(out) and (start.isolated or predicted > ISOLATE_ABOVE_S)
        # an isolated start may overrun its prediction threefold, or use half the time left, not all of
        # it: a start that misjudges a batch must leave time for the next
        allowed = min(left, max(OVERRUN_FACTOR * predicted, left / 2)) if isolated and not start.always else left
        sub = dataclasses.replace(problem, time_budget_s=max(1e-3, left))
        output = _run_isolated(start, sub, time.monotonic() + max(0.0, allowed)) if isolated else _run(start, sub)
        # a start killed at the deadline took longer than measured: learn at least twice that
        _learn(start, sizes, (1 if output is not None else 2) * (time.monotonic() - began), gpus=gpus, cp=cp)
        if output is not None:
            out[start.name] = output
    outputs = [(s.name, out[s.name]) for s in STARTS if s.name in out]
    if child is None:
        return outputs, None
    return outputs, PendingPeers(
        child=child, peers=peers, sizes=sizes, end=end - evaluation_s * len(out), gpus=gpus, cp=cp, relied=relied
    )


def importable(start: Start) -> bool:
    """Whether this environment has the solver module ``start`` imports (solver/ilp/backends.py: a start
    whose package is missing is left out, never failed)."""
    return start.imports is None or module_installed(start.imports)


def plans_modes(start: Start, problem: Problem) -> bool:
    """Whether ``start`` plans a CP mode the request allows (``xtuner`` plans Ulysses only)."""
    return bool(set(getattr(start.make(), "cp_modes", DEFAULT_CP_MODES)) & set(problem.cp_modes))


def run_starts(
    problem: Problem,
    *,
    deadline: float,
    keep_s: float,
    names: Sequence[str] | None = None,
    isolate: bool = True,
) -> list[tuple[str, PlannerOutput]]:
    """Every start's output (in ``STARTS`` order): ``launch_starts``, then the peers collected."""
    outputs, pending = launch_starts(problem, deadline=deadline, keep_s=keep_s, names=names, isolate=isolate)
    if pending is None:
        return outputs
    got = dict(outputs) | dict(pending.collect())
    return [(s.name, got[s.name]) for s in STARTS if s.name in got]


def relied_on(peers: Sequence[Start], sizes: Sequence[int], *, gpus: int, cp: int, span_s: float) -> frozenset[str]:
    """The relied-on peers (``Start.relied``) whose prior fits ``span_s``, the time to the chunk's deadline."""
    return frozenset(s.name for s in peers if s.relied and s.unit_s(sizes, gpus=gpus, cp=cp) <= span_s)


def _start_peers(
    peers: Sequence[Start], problem: Problem, sizes: Sequence[int], end: float, *, relied: frozenset[str] = frozenset()
) -> Child:
    """A child that runs ``peers`` in ``PEER_ORDER`` (their times vary with the lengths, 10-60 ms on 256
    sequences and 32 GPUs), each told the time left: next, the first not yet run whose prediction fits the
    time left before ``end``, else the first within ``OVERRUN_FACTOR`` of it. This process searches
    meanwhile (``launch_starts``). It reports ``("began", name, t)`` before each (t: ``time.monotonic()``, one
    clock for every process on Linux) and ``(name, output, seconds)`` after it."""
    order = peer_order(peers)
    gpus, cp = problem.parallel.num_gpus, problem.parallel.cp

    def work(report: Report, _deadline: float) -> None:
        remaining = list(order)
        while remaining:
            left = end - time.monotonic()
            predicted = {s.name: predicted_s(s, sizes, gpus=gpus, cp=cp) for s in remaining}
            # the relied-on peers first, whatever their learnt prediction (``relied_on``): the parent waits for them
            # a peer that fits goes before one that may not (``wlb-keep`` predicted at twice the time left
            # began before ``dynamic-cp``, which fitted: killed, it cost ``dynamic-cp``'s plan, 0.005% better);
            # else optimistic: the child has a core of its own, so a peer predicted up to OVERRUN_FACTOR times
            # the time left is tried (its time varies with the lengths: hydraulis takes 2 s on one batch of
            # 65,536 and 13 s on another); one that does not finish is killed at the phase's end
            fits = [s for s in remaining if s.name in relied] or [s for s in remaining if predicted[s.name] <= left]
            start = next(iter(fits or [s for s in remaining if predicted[s.name] <= OVERRUN_FACTOR * left]), None)
            if start is None:
                return
            remaining.remove(start)
            if start.imports is not None:  # not timed: the parent imports it for the later calls
                importlib.import_module(start.imports)
            report(("began", start.name, time.monotonic()))  # the system-wide clock: the parent reads it
            began = time.monotonic()
            output = _run(start, dataclasses.replace(problem, time_budget_s=max(1e-3, end - began)))
            report((start.name, output, time.monotonic() - began))

    return start_child(work, deadline=end)


def launch_peer(name: str, problem: Problem, *, deadline: float) -> PendingPeers | None:
    """The start ``name`` alone in a child killed at ``deadline`` while the caller plans (``collect`` takes its
    plan); None where it cannot run here or its learnt time does not fit before ``deadline``."""
    start = next(s for s in STARTS if s.name == name)
    sizes = [len(ids) for ids in problem.batch_ids]
    gpus = problem.parallel.num_gpus
    if not (plans_modes(start, problem) and importable(start)):
        return None
    if predicted_s(start, sizes, gpus=gpus, cp=problem.parallel.cp) > deadline - time.monotonic():
        return None
    child = _start_peers([start], problem, sizes, deadline)
    return PendingPeers(child=child, peers=[start], sizes=sizes, end=deadline, gpus=gpus, cp=problem.parallel.cp)


def peer_order(peers: Sequence[Start]) -> list[Start]:
    """The peers in ``PEER_ORDER`` (others after them, in their given order)."""
    rank = {name: k for k, name in enumerate(PEER_ORDER)}
    return sorted(peers, key=lambda s: rank.get(s.name, len(rank)))


def _run(start: Start, problem: Problem) -> PlannerOutput | None:
    try:
        return start.make().plan(problem)
    except SkrullError:
        return None


def _run_isolated(start: Start, problem: Problem, deadline: float) -> PlannerOutput | None:
    """``start`` in a forked child, dropped if it has not answered by ``deadline``."""
    outcome = run_with_deadline(lambda _report, _deadline: _run(start, problem), deadline=deadline, grace_s=0.0)
    payload = outcome.payload
    return payload if isinstance(payload, PlannerOutput) else None
