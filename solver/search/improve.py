"""Local search over one iteration's microbatches, on any layout the specification allows.

A microbatch is a group of GPUs (``ranks``: a contiguous aligned block whose size divides dp*cp, the
static CP groups included) with a placement (local per GPU, sharded). The objective is the specification's
iteration time, ``max over GPUs of the summed time of their microbatches`` (eq. 8); ties are broken by
the sum of squared GPU loads, so a move that unloads the slowest GPU without slowing anyone past it
is kept even when another GPU is as slow. Each candidate is evaluated incrementally: only the (at most
two) microbatches it changes are re-costed, and only their GPUs' loads move.

Moves, all starting from a microbatch of the slowest GPU (first improvement, until no move helps or the
deadline passes):

* move: one sequence into another microbatch (not on the slowest GPU) or into a new microbatch on the
  least-loaded block of size 1 or of the source's size;
* merge: two microbatches on the same group, or a GPU's own microbatch into a wider one it takes part
  in (one microbatch overhead less);
* swap: a sequence with a shorter one of another microbatch;
* regroup: the whole microbatch onto the least-loaded block of half, the same or twice its size;
* absorb: a wide microbatch takes in the narrower microbatches of its GPUs.

``search_iteration`` runs this from several starts, then as an iterated local search (random kicks of
the slowest GPU's sequences, then the descent again; the best plan seen is kept) until the deadline.

Every changed microbatch is re-placed (which sequences are sharded, which stay whole where: reshard)
by ``placement.Placer``, which checks the bucket (eq. 7) before costing.
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from dataclasses import dataclass

from skrull.solver.cost import CostModel
from skrull.solver.ilp.builder import GroupMicrobatch
from skrull.solver.plan import DEFAULT_SHARDING, MicrobatchSpec
from skrull.solver.planners.base import make_spec
from skrull.solver.profile import INTER_NODE
from skrull.solver.search.clock import Clock
from skrull.solver.search.placement import Placer, mb_ids

EPS_MS = 1e-9
#: Candidate destination microbatches tried per move (the least-loaded ones).
MAX_DESTINATIONS = 12
#: Longest sequences of a source microbatch tried per move / swap.
MAX_MOVERS = 8
#: Starts of one iteration the local search descends from (the fastest ones).
MAX_ALTERNATIVES = 4
#: The iterated local search stops after this many perturbations in a row found nothing better.
MAX_STALE_KICKS = 200
#: Most random moves of one perturbation of the iterated local search.
KICK_MOVES = 3


@dataclass(slots=True)
class Entry:
    """One microbatch of the working plan; ``alive`` is False once merged away or emptied."""

    ranks: tuple[int, ...]
    mb: GroupMicrobatch
    time_ms: float
    order: float
    sharding: str = DEFAULT_SHARDING
    alive: bool = True


def blocks_by_size(num_gpus: int) -> dict[int, list[tuple[int, ...]]]:
    """Aligned contiguous blocks of every size that divides ``num_gpus``."""
    return {
        d: [tuple(range(s, s + d)) for s in range(0, num_gpus, d)] for d in range(1, num_gpus + 1) if num_gpus % d == 0
    }


class LayoutSearch:
    """Improves one iteration in place; ``specs()`` gives the result."""

    def __init__(
        self,
        specs: Sequence[MicrobatchSpec],
        *,
        lengths: Sequence[int],
        cost: CostModel,
        num_gpus: int,
        clock: Clock = time.monotonic,
    ) -> None:
        self.clock = clock
        self.lengths = lengths
        self.cost = cost
        self.num_gpus = num_gpus
        self.blocks = blocks_by_size(num_gpus)
        self._placers: dict[tuple[int, str | None], Placer] = {}
        self.entries: list[Entry] = []
        self.deadline = float("inf")
        self.load = [0.0] * num_gpus
        for spec in sorted(specs, key=lambda s: s.step):
            mb = (spec.local, spec.sharded)
            self._add(Entry(spec.ranks, mb, self.placer(spec.ranks).time(mb), spec.step, spec.sharding))

    def placer(self, ranks: Sequence[int]) -> Placer:
        """The placer of a group on these ranks: one per group size and link (with topology a group
        across nodes prices its communication on ``inter_node``)."""
        n = len(ranks)
        link = self.cost.link_of(ranks) if n > 1 else None
        found = self._placers.get((n, link))
        if found is None:
            found = self._placers[n, link] = Placer(self.lengths, self.cost, n, clock=self.clock, link=link)
        found.deadline = self.deadline  # a placement gives up at the search's deadline (search/placement.py)
        return found

    def _add(self, entry: Entry) -> None:
        self.entries.append(entry)
        for g in entry.ranks:
            self.load[g] += entry.time_ms

    @property
    def objective_ms(self) -> float:
        return max(self.load, default=0.0)

    # --- evaluation --------------------------------------------------------------------------------
    def _hopeless(self, ranks: tuple[int, ...], old_ms: float, new_lower_ms: float) -> bool:
        """Whether a microbatch on ``ranks`` going from ``old_ms`` to at least ``new_lower_ms`` already
        lifts one of its GPUs to the current maximum (then no move ending there can be accepted)."""
        top = max(self.load)
        rise = new_lower_ms - old_ms
        return any(self.load[g] + rise >= top for g in ranks)

    def _accepts(self, changes: Sequence[tuple[tuple[int, ...], float]]) -> bool:
        """Whether adding ``delta`` ms to each group in ``changes`` lowers (max load, sum of squares)."""
        delta: dict[int, float] = {}
        for ranks, d in changes:
            for g in ranks:
                delta[g] = delta.get(g, 0.0) + d
        load = self.load
        old_max = max(load)
        new_max = max(load[g] + delta.get(g, 0.0) for g in range(self.num_gpus))
        if new_max < old_max - EPS_MS:
            return True
        if new_max > old_max:
            return False
        squares = sum((load[g] + d) ** 2 - load[g] ** 2 for g, d in delta.items())
        return squares < -1e-6

    def _replace(self, entry: Entry, found: tuple[GroupMicrobatch, float] | None) -> None:
        for g in entry.ranks:
            self.load[g] -= entry.time_ms
        if found is None:
            entry.alive = False
            return
        entry.mb, entry.time_ms = found
        entry.sharding = DEFAULT_SHARDING
        for g in entry.ranks:
            self.load[g] += entry.time_ms

    def _new(self, ranks: tuple[int, ...], found: tuple[GroupMicrobatch, float], order: float) -> None:
        self._add(Entry(ranks, found[0], found[1], order))

    def _least_loaded_block(self, size: int, avoid: int) -> tuple[int, ...] | None:
        best = None
        for block in self.blocks.get(size, []):
            if avoid in block:
                continue
            # the least-loaded block; of equally loaded ones, one inside a node (its link is the cheaper)
            worst = (max(self.load[g] for g in block), self.cost.link_of(block) == INTER_NODE)
            if best is None or worst < best[0]:
                best = (worst, block)
        return None if best is None else best[1]

    # --- the search --------------------------------------------------------------------------------
    def run(self, deadline: float) -> None:
        """Re-place every microbatch, then apply improving moves until none helps or ``deadline``."""
        self.deadline = deadline
        longest = 0.0  # the longest re-placing so far: one is not begun unless that much is left (at CP 1024
        # one microbatch of 2,048 sequences took 90 ms to re-place under a profiler; begun at the deadline, it
        # overran it)
        for e in self.entries:
            began = self.clock()
            if began + longest >= deadline:
                return
            found = self.placer(e.ranks).best(mb_ids(e.mb))
            longest = max(longest, self.clock() - began)
            if found is not None and found[1] < e.time_ms - EPS_MS:
                self._replace(e, found)
        while self.clock() < deadline:
            if not self._step(deadline):
                return

    def _step(self, deadline: float) -> bool:
        crit = max(range(self.num_gpus), key=self.load.__getitem__)
        sources = sorted((e for e in self.entries if e.alive and crit in e.ranks), key=lambda e: -e.time_ms)
        dests = sorted(
            (e for e in self.entries if e.alive and crit not in e.ranks),
            key=lambda e: max(self.load[g] for g in e.ranks),
        )[:MAX_DESTINATIONS]
        for move in (self._move, self._merge, self._swap, self._regroup):
            for src in sources:
                if self.clock() >= deadline:
                    return False
                if move(src, sources, dests, crit):
                    return True
        alive = [e for e in self.entries if e.alive]
        if len({len(e.ranks) for e in alive}) < 2:
            return False  # every group of one size: nothing is narrower than anything
        return any(self._absorb(wide, alive) for wide in alive if len(wide.ranks) > 1)

    def _absorb(self, wide: Entry, alive: list[Entry]) -> bool:
        """Merge into ``wide`` the narrower microbatches of its GPUs (all of them, else each GPU's
        shortest): each of those GPUs saves a microbatch overhead at once, which no single merge can
        do when the wide microbatch's time is shared by all of them."""
        if self.clock() >= self.deadline or not wide.alive:
            return False
        inside = set(wide.ranks)
        narrow = [e for e in alive if e.alive and len(e.ranks) < len(inside) and inside.issuperset(e.ranks)]
        if not narrow:
            return False
        shortest: dict[int, Entry] = {}
        for e in narrow:
            for g in e.ranks:
                if g not in shortest or e.time_ms < shortest[g].time_ms:
                    shortest[g] = e
        for chosen in (narrow, list({id(e): e for e in shortest.values()}.values())):
            ids = mb_ids(wide.mb) + [i for e in chosen for i in mb_ids(e.mb)]
            both = self.placer(wide.ranks).best(ids)
            changes = [(wide.ranks, (both[1] if both else 0.0) - wide.time_ms)]
            changes += [(e.ranks, -e.time_ms) for e in chosen]
            if both is not None and self._accepts(changes):
                self._replace(wide, both)
                for e in chosen:
                    self._replace(e, None)
                return True
        return False

    def _move(self, src: Entry, _sources: list[Entry], dests: list[Entry], crit: int) -> bool:
        ids = mb_ids(src.mb)
        ls = self.lengths
        for i in sorted(ids, key=lambda k: -ls[k])[:MAX_MOVERS]:
            if self.clock() >= self.deadline:
                return False
            rest = [k for k in ids if k != i]
            left = self.placer(src.ranks).best(rest) if rest else None
            if rest and left is None:
                continue
            left_ms = left[1] if left is not None else 0.0
            for dst in dests:
                if self.clock() >= self.deadline:
                    return False
                placer = self.placer(dst.ranks)
                target = [*mb_ids(dst.mb), i]
                if self._hopeless(dst.ranks, dst.time_ms, placer.lower_ms(target)):
                    continue
                put = placer.best(target)
                if put is not None and self._accepts(
                    [(src.ranks, left_ms - src.time_ms), (dst.ranks, put[1] - dst.time_ms)]
                ):
                    self._replace(src, left)
                    self._replace(dst, put)
                    return True
            for size in dict.fromkeys((1, len(src.ranks))):
                block = self._least_loaded_block(size, crit)
                put = None if block is None else self.placer(block).best([i])
                if (
                    block is not None
                    and put is not None
                    and self._accepts([(src.ranks, left_ms - src.time_ms), (block, put[1])])
                ):
                    self._replace(src, left)
                    self._new(block, put, src.order + 0.5)
                    return True
        return False

    def _merge(self, src: Entry, sources: list[Entry], _dests: list[Entry], _crit: int) -> bool:
        """Merge ``src`` with another microbatch of the slowest GPU on the same group, or on a group
        that contains the other's (a GPU's own microbatch into a wider one it takes part in)."""
        for other in sources:
            if other is src or not other.alive or not src.alive:
                continue
            wide, narrow = (src, other) if len(src.ranks) >= len(other.ranks) else (other, src)
            if not set(narrow.ranks) <= set(wide.ranks):
                continue
            if self.clock() >= self.deadline:
                return False
            both = self.placer(wide.ranks).best(mb_ids(src.mb) + mb_ids(other.mb))
            if both is not None and self._accepts(
                [(wide.ranks, both[1] - wide.time_ms), (narrow.ranks, -narrow.time_ms)]
            ):
                self._replace(wide, both)
                self._replace(narrow, None)
                return True
        return False

    def _swap(self, src: Entry, _sources: list[Entry], dests: list[Entry], _crit: int) -> bool:
        ids = mb_ids(src.mb)
        ls = self.lengths
        for i in sorted(ids, key=lambda k: -ls[k])[: MAX_MOVERS // 2]:
            rest = [k for k in ids if k != i]
            for dst in dests[: MAX_DESTINATIONS // 2]:
                if self.clock() >= self.deadline:
                    return False
                other = mb_ids(dst.mb)
                for j in other:
                    if ls[j] >= ls[i]:
                        continue
                    if self.clock() >= self.deadline:
                        return False
                    placer = self.placer(dst.ranks)
                    target = [*(k for k in other if k != j), i]
                    if self._hopeless(dst.ranks, dst.time_ms, placer.lower_ms(target)):
                        continue
                    a = self.placer(src.ranks).best([*rest, j])
                    if a is None:
                        continue
                    b = placer.best(target)
                    if b is not None and self._accepts(
                        [(src.ranks, a[1] - src.time_ms), (dst.ranks, b[1] - dst.time_ms)]
                    ):
                        self._replace(src, a)
                        self._replace(dst, b)
                        return True
        return False

    def _regroup(self, src: Entry, _sources: list[Entry], _dests: list[Entry], crit: int) -> bool:
        n = len(src.ranks)
        ids = mb_ids(src.mb)
        for size in (2 * n, n, n // 2):
            if size not in self.blocks or self.clock() >= self.deadline:
                continue
            block = self._least_loaded_block(size, crit if size <= n else -1)
            if block is None or block == src.ranks:
                continue
            top = max(self.load)
            lower = self.placer(block).lower_ms(ids)
            if any(self.load[g] + lower >= top for g in block if g not in src.ranks):
                continue
            put = self.placer(block).best(ids)
            if put is not None and self._accepts([(src.ranks, -src.time_ms), (block, put[1])]):
                self._replace(src, None)
                self._new(block, put, src.order)
                return True
        return False

    # --- the result --------------------------------------------------------------------------------
    def specs(self) -> list[MicrobatchSpec]:
        """Alive microbatches with steps: each takes the first step free on all of its GPUs."""
        next_step = [0] * self.num_gpus
        out = []
        for e in sorted((e for e in self.entries if e.alive), key=lambda e: (e.order, e.ranks[0])):
            step = max(next_step[g] for g in e.ranks)
            for g in e.ranks:
                next_step[g] = step + 1
            local, sharded = e.mb
            out.append(make_spec(step=step, ranks=e.ranks, local=local, sharded=sharded, sharding=e.sharding))
        return out

    def kick(self, rng: random.Random, moves: int) -> None:
        """Perturb: move ``moves`` random sequences of the slowest GPU's microbatches elsewhere, kept
        whatever they cost (iterated local search, Lourenco et al. 2003)."""
        for _ in range(moves):
            if self.clock() >= self.deadline:
                return
            crit = max(range(self.num_gpus), key=self.load.__getitem__)
            sources = [e for e in self.entries if e.alive and crit in e.ranks]
            targets = [e for e in self.entries if e.alive and crit not in e.ranks]
            if not sources or not targets:
                return
            src, dst = rng.choice(sources), rng.choice(targets)
            ids = mb_ids(src.mb)
            i = rng.choice(ids)
            rest = [k for k in ids if k != i]
            left = self.placer(src.ranks).best(rest) if rest else None
            put = self.placer(dst.ranks).best([*mb_ids(dst.mb), i])
            if put is None or (rest and left is None):
                continue
            self._replace(src, left)
            self._replace(dst, put)


def iteration_ms(specs: Sequence[MicrobatchSpec], lengths: Sequence[int], cost: CostModel, num_gpus: int) -> float:
    """The specification's iteration time of ``specs`` (eq. 8), from scratch."""
    return cost.iteration_time_ms(((s.ranks, cost.spec_time_ms(s, lengths)) for s in specs), num_gpus)


def search_iteration(
    alternatives: Sequence[Sequence[MicrobatchSpec]],
    *,
    lengths: Sequence[int],
    cost: CostModel,
    num_gpus: int,
    deadline: float,
    seed: int = 0,
    clock: Clock = time.monotonic,
) -> list[MicrobatchSpec]:
    """Local search from each of the best ``MAX_ALTERNATIVES`` starts (fastest first, each with an equal
    share of the time left; a descent that ends early leaves its time to the next), then iterated local
    search from the best plan found. Never slower than ``alternatives[0]``."""
    best = list(alternatives[0])
    best_ms = iteration_ms(best, lengths, cost, num_gpus)
    tried = list(alternatives[:MAX_ALTERNATIVES])
    # setting a descent up and reading its result cost O(sequences) outside the deadline checks (about
    # 0.3 s for one batch of 65,536 sequences): a descent starts only when the time left holds that much
    overhead = 0.0
    for k, alt in enumerate(tried):
        now = clock()
        if deadline - now <= overhead:
            break
        search = LayoutSearch(alt, lengths=lengths, cost=cost, num_gpus=num_gpus, clock=clock)
        set_up = clock() - now
        search.run(now + (deadline - now) / (len(tried) - k))
        done = clock()
        found = search.specs()
        found_ms = iteration_ms(found, lengths, cost, num_gpus)
        overhead = max(overhead, set_up + clock() - done)
        if found_ms < best_ms - EPS_MS:
            best, best_ms = found, found_ms
    rng = random.Random(seed)
    stale = 0
    while deadline - clock() > overhead and stale < MAX_STALE_KICKS:
        stale += 1
        now = clock()
        search = LayoutSearch(best, lengths=lengths, cost=cost, num_gpus=num_gpus, clock=clock)
        set_up = clock() - now
        search.deadline = deadline
        search.kick(rng, rng.randint(1, KICK_MOVES))
        search.run(deadline)
        done = clock()
        found = search.specs()
        found_ms = iteration_ms(found, lengths, cost, num_gpus)
        overhead = max(overhead, set_up + clock() - done)
        if found_ms < best_ms - EPS_MS:
            best, best_ms = found, found_ms
            stale = 0
    return best
