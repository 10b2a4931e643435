"""Pictures of plans: an iteration as a per-GPU timeline, written as plain SVG text (no plotting library).

One lane per GPU (global rank). Each microbatch the GPU takes part in is a slot whose width is the
microbatch's ``estimated_ms``; inside it, this GPU's part of the DACP time (docs/formats.md, Skrull eqs. 1-5)
is split into stacked segments

    overhead  = microbatch_ms
    overlap   = max(T_comm(sum sharded S), T_comp(sum_{local[j]} FLOPs(S)))      (eq. 2: comm || local)
              = whole-sequence compute T_comp(local)  +  exchange not hidden max(0, T_comm - T_comp(local))
    sharded   = T_comp(sum_{sharded} FLOPs(S) / N)                               (eq. 3)

(the overlap is drawn as its two parts: a GPU holding only shards computes no whole sequence while the
shards are exchanged, so all of its overlap is exchange) and the rest of the slot (the group waits for its
slowest member, eq. 4) is drawn as waiting. Under each slot a strip shows the GPU's bucket use (eq. 7): local
tokens and its share of the sharded tokens, the full strip (the slot's width) being ``bucket_tokens``
(the legend draws the scale).

Each panel names the iteration's bounds as ``skrull compare`` does (solver/reports/compare.py), one per meaning: no
plan of the iteration's sequences beats the any-layout bound (``search.bound.sharding_floor_ms``, at least
the plan's ``lower_bound_ms``), and no plan made of whole CP groups beats the static one (at least that).

What a reader needs without tooltips (a PNG keeps none): the legend, in plain words, above the panels (and
again below a tall picture); a dark bracket at the start of each slot joining the lanes of the GPUs that
form its group; and, in every bar wide enough for it, a label naming the microbatch, its GPUs and the
sequence ids it runs (sharded over the group, and whole on this GPU), shortened to what fits.

Microbatches start when every GPU of their group is free (a replay in step order, as
``solver.metrics.synchronized_iteration_ms``); for static DP x CP plans that is exactly eq. 8.
Without the request's lengths the split cannot be computed: slots are then drawn whole.

The SVG carries its structure as attributes (``class="lane"`` with ``data-gpu``, ``class="microbatch"``
with ``data-step`` / ``data-estimated-ms`` / ``data-width``) so tests and tools can read it back.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from skrull.solver.cost import CostModel
from skrull.solver.errors import RequestError
from skrull.solver.search.bound import sharding_floor_ms
from skrull.solver.sharding import position_token_counts
from skrull.solver.types import Parallel, Plan

#: Fill colours of the segments and strips (colour-blind-safe Tableau 10 picks).
COLOURS: dict[str, str] = {
    "overhead": "#bab0ac",
    "overlap": "#4e79a7",
    "sharded": "#f28e2b",
    "exchange": "#9c755f",
    "estimated": "#76b7b2",
    "local_tokens": "#59a14f",
    "sharded_tokens": "#b07aa1",
    "bucket_free": "#eeeeee",
    "waiting": "#ffffff",
    "group": "#333333",
}
#: The legend in plain words: what each colour of a bar and of the strip under it stands for.
LEGEND: tuple[tuple[str, str], ...] = (
    ("overhead", "fixed cost of a microbatch"),
    ("overlap", "whole sequences on this GPU, computed while shards are exchanged"),
    ("exchange", "exchanging shards, not hidden behind whole-sequence work"),
    ("sharded", "this GPU's share of the sharded sequences"),
    ("waiting", "waiting for the slowest GPU of the group"),
    ("group", "GPUs of one group (bracket)"),
    ("local_tokens", "memory: whole sequences"),
    ("sharded_tokens", "memory: share of sharded ones"),
)
#: How a bar's label reads (the last line of the legend, next to a sample of the label's box).
LABEL_KEY = "label: #microbatch, its GPUs, sharded sequence ids, whole sequence ids on this GPU"
#: The label's box: pale yellow with a border, unlike the white of waiting time.
LABEL_BOX = "#fff6d5"
LABEL_BORDER = "#c9b458"
#: Width of the memory strip's scale in the legend.
SCALE_PX = 120.0

AXIS_PX = 900.0
LABEL_PX = 80.0
RIGHT_PX = 20.0
BAR_PX = 18.0
STRIP_PX = 5.0
LANE_PX = BAR_PX + STRIP_PX + 7.0
TITLE_PX = 40.0
AXIS_LABEL_PX = 22.0
PANEL_GAP_PX = 18.0
LEGEND_ROW_PX = 18.0
#: Width of one character of the 9 px label font and of the 11 px legend font (sans-serif, generous).
LABEL_CHAR_PX = 5.4
LEGEND_CHAR_PX = 6.2
#: Pictures taller than this repeat the legend below the last panel.
TALL_PX = 900.0


@dataclass(frozen=True, slots=True, kw_only=True)
class LaneBar:
    """One GPU's part of one microbatch on the timeline (times in ms from the start of the iteration)."""

    gpu: int
    index: int
    step: int
    start_ms: float
    estimated_ms: float
    overhead_ms: float | None
    overlap_ms: float | None
    sharded_ms: float | None
    local_ids: tuple[int, ...]
    sharded_ids: tuple[int, ...]
    local_tokens: int | None
    sharded_share_tokens: float | None
    bucket_tokens: int
    #: the GPUs of the microbatch's group, in plan position order
    ranks: tuple[int, ...] = ()
    #: the overlap's parts: this GPU's whole-sequence compute and the exchange time not hidden behind it
    local_ms: float | None = None
    exposed_comm_ms: float | None = None

    @property
    def busy_ms(self) -> float | None:
        """This GPU's own time in the slot: overhead + overlap + sharded (eq. 2-3 for position j)."""
        if self.overhead_ms is None or self.overlap_ms is None or self.sharded_ms is None:
            return None
        return self.overhead_ms + self.overlap_ms + self.sharded_ms

    @property
    def bucket_use(self) -> float | None:
        """``(sum local S + this GPU's pieces of the sharded S) / bucket_tokens`` (eq. 7, real tokens)."""
        if self.local_tokens is None or self.sharded_share_tokens is None:
            return None
        return (self.local_tokens + self.sharded_share_tokens) / self.bucket_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """One iteration of one plan, ready to draw."""

    title: str
    num_gpus: int
    iteration: int
    bars: tuple[LaneBar, ...]
    num_microbatches: int
    estimated_ms: float
    #: no plan of the iteration's sequences, with any groups, beats it
    lower_bound_ms: float
    #: no plan in Skrull's static layout (one CP group per microbatch) beats it; None when not given
    static_bound_ms: float | None = None
    #: whether this plan's iteration is in the static layout (every microbatch on one DP rank's CP group)
    static_layout: bool = True

    @property
    def makespan_ms(self) -> float:
        return max((b.start_ms + b.estimated_ms for b in self.bars), default=0.0)


def iteration_timeline(
    plan: Plan,
    *,
    iteration: int,
    lengths: Sequence[int] | None = None,
    model: CostModel | None = None,
    title: str | None = None,
) -> Timeline:
    """The bars of ``plan``'s iteration ``iteration``; with ``lengths`` and ``model`` the DACP split too."""
    if not 0 <= iteration < len(plan.iterations):
        raise RequestError("--iteration", iteration, f"must be in 0..{len(plan.iterations) - 1}")
    it = plan.iterations[iteration]
    split = lengths is not None and model is not None
    if lengths is not None:
        needed = max((i for mb in it.microbatches for i in mb.seq_ids), default=-1)
        if needed >= len(lengths):
            raise RequestError("--request", len(lengths), f"has too few sequences for this plan (id {needed})")
    free_at = [0.0] * plan.parallel.num_gpus
    bars: list[LaneBar] = []
    for index, mb in sorted(enumerate(it.microbatches), key=lambda im: im[1].step):
        start = max(free_at[g] for g in mb.ranks)
        n = len(mb.ranks)
        sharded_lengths = [lengths[i] for i in mb.sharded] if lengths is not None else []
        pieces = position_token_counts(mb.sharding, sharded_lengths, n) if lengths is not None else ()
        for j, gpu in enumerate(mb.ranks):
            overhead = overlap = sharded = local_ms = exposed = None
            local_tokens: int | None = None
            share: float | None = None
            if lengths is not None:
                local_tokens = sum(lengths[i] for i in mb.local[j])
                share = pieces[j]
            if split:
                assert model is not None and lengths is not None
                comm = model.comm_ms(sum(sharded_lengths), n, mb.mode, link=model.link_of(mb.ranks)) if n > 1 else 0.0
                local = model.t_comp_ms(sum(model.flops(lengths[i]) for i in mb.local[j]))
                dist = model.t_comp_ms(sum(model.flops(s) for s in sharded_lengths) / n)
                overhead, overlap, sharded = model.microbatch_overhead_ms, max(comm, local), dist
                local_ms, exposed = local, max(0.0, comm - local)
                busy = overhead + overlap + sharded
                if busy > mb.estimated_ms > 0:  # a plan priced by a richer model: keep the split's proportions
                    scale = mb.estimated_ms / busy
                    overhead, overlap, sharded = overhead * scale, overlap * scale, sharded * scale
                    local_ms, exposed = local_ms * scale, exposed * scale
            bars.append(
                LaneBar(
                    gpu=gpu,
                    index=index,
                    step=mb.step,
                    start_ms=start,
                    estimated_ms=mb.estimated_ms,
                    overhead_ms=overhead,
                    overlap_ms=overlap,
                    sharded_ms=sharded,
                    local_ids=mb.local[j],
                    sharded_ids=mb.sharded,
                    local_tokens=local_tokens,
                    sharded_share_tokens=share,
                    bucket_tokens=plan.bucket_tokens,
                    ranks=mb.ranks,
                    local_ms=local_ms,
                    exposed_comm_ms=exposed,
                )
            )
        for g in mb.ranks:
            free_at[g] = start + mb.estimated_ms
    par = plan.parallel
    any_layout, static = it.lower_bound_ms, it.static_bound_ms
    if lengths is not None and model is not None:
        any_layout, static = iteration_bounds_ms([lengths[i] for mb in it.microbatches for i in mb.seq_ids], model, par)
        any_layout = max(any_layout, it.lower_bound_ms)
        static = max(static, it.static_bound_ms or 0.0)
    return Timeline(
        title=title or f"{plan.solver}: iteration {iteration}",
        num_gpus=par.num_gpus,
        iteration=iteration,
        bars=tuple(bars),
        num_microbatches=len(it.microbatches),
        estimated_ms=it.estimated_ms,
        lower_bound_ms=any_layout,
        static_bound_ms=static,
        static_layout=all(mb.ranks == par.cp_group(mb.ranks[0] // par.cp) for mb in it.microbatches),
    )


def iteration_bounds_ms(lengths: Sequence[int], model: CostModel, parallel: Parallel) -> tuple[float, float]:
    """The two bounds of one iteration's sequences, as ``skrull compare`` names them (solver/reports/compare.py):
    any layout (``sharding_floor_ms``) and static CP groups (the larger of that and ``static_bound_ms``)."""
    any_layout = sharding_floor_ms(lengths, model, parallel)
    return any_layout, max(any_layout, model.static_bound_ms(lengths, parallel))


def plan_timelines(
    plan: Plan,
    *,
    lengths: Sequence[int] | None = None,
    model: CostModel | None = None,
    iterations: Sequence[int] | None = None,
    label: str | None = None,
) -> list[Timeline]:
    """One timeline per iteration (default: every iteration of the plan)."""
    chosen = range(len(plan.iterations)) if iterations is None else iterations
    name = label or plan.solver
    return [
        iteration_timeline(plan, iteration=i, lengths=lengths, model=model, title=f"{name}: iteration {i}")
        for i in chosen
    ]


def _num(x: float) -> str:
    return f"{x:.2f}".rstrip("0").rstrip(".") or "0"


def _ticks(max_ms: float) -> list[float]:
    """About six round tick values (1, 2 or 5 x 10^k ms) from 0 to ``max_ms``."""
    if max_ms <= 0:
        return [0.0]
    raw = max_ms / 6
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [k * step for k in range(int(max_ms / step + 1e-9) + 1)]


def _rect(x: float, y: float, w: float, h: float, fill: str, cls: str, **attrs: str) -> str:
    extra = "".join(f" {k.replace('_', '-')}={quoteattr(v)}" for k, v in attrs.items())
    return (
        f'<rect class="{cls}" x="{_num(x)}" y="{_num(y)}" width="{_num(w)}" height="{_num(h)}" fill="{fill}"{extra}/>'
    )


def runs(ranks: Sequence[int]) -> list[tuple[int, int]]:
    """The GPUs of a group as runs of consecutive ids, ``(first, last)``: ``[0, 1, 2, 5]`` -> ``[(0, 2), (5, 5)]``."""
    out: list[tuple[int, int]] = []
    for g in sorted(ranks):
        if out and g == out[-1][1] + 1:
            out[-1] = (out[-1][0], g)
        else:
            out.append((g, g))
    return out


def group_name(ranks: Sequence[int]) -> str:
    """``GPU 5``, ``GPUs 0-7``, ``GPUs 0-3, 8-11`` (at most three runs named), else ``12 GPUs``."""
    if len(ranks) == 1:
        return f"GPU {ranks[0]}"
    parts = runs(ranks)
    if len(parts) > 3:
        return f"{len(ranks)} GPUs"
    return "GPUs " + ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in parts)


def _ids(ids: Sequence[int], limit: int) -> str:
    """Sequence ids, the first ``limit`` of them and how many more."""
    shown = ",".join(str(i) for i in ids[:limit])
    return shown + (f",+{len(ids) - limit}" if len(ids) > limit else "")


def bar_label(bar: LaneBar, width_px: float) -> str | None:
    """The longest label of the bar that fits ``width_px``: the microbatch, its group, the sharded ids and
    this GPU's whole ones; shorter forms list fewer ids; None when not even ``#k`` fits."""
    room = int((width_px - 6) / LABEL_CHAR_PX)
    group = group_name(bar.ranks) if bar.ranks else f"GPU {bar.gpu}"
    candidates = []
    for limit in (12, 6, 3, 1):
        ids = []
        if bar.sharded_ids:
            ids.append(f"sharded {_ids(bar.sharded_ids, limit)}")
        if bar.local_ids:
            ids.append(f"whole {_ids(bar.local_ids, limit)}")
        candidates.append(" · ".join([f"#{bar.index} {group}", *ids]))
        candidates.append(" · ".join([f"#{bar.index}", *ids]))
    candidates.append(f"#{bar.index}")
    return next((c for c in candidates if len(c) <= room), None)


def _tooltip(bar: LaneBar) -> str:
    parts = [f"GPU {bar.gpu}, step {bar.step}: {bar.estimated_ms:.2f} ms (microbatch #{bar.index})"]
    if bar.ranks:
        parts.append(f"group: {group_name(bar.ranks)}")
    if bar.busy_ms is not None:
        parts.append(
            f"fixed {bar.overhead_ms:.2f} + whole sequences {bar.local_ms or 0.0:.2f} + exchange not hidden "
            f"{bar.exposed_comm_ms or 0.0:.2f} + sharded share {bar.sharded_ms:.2f} ms"
        )
    if bar.bucket_use is not None:
        parts.append(
            f"bucket {100 * bar.bucket_use:.0f}%: {bar.local_tokens} local"
            f" + {bar.sharded_share_tokens:.0f} sharded tokens"
        )
    parts.append(f"local ids {list(bar.local_ids)}; sharded ids {list(bar.sharded_ids)}")
    return "\n".join(parts)


def bounds_text(timeline: Timeline) -> str:
    """The panel's bounds, named as ``skrull compare`` names them, with the one that binds this plan's layout
    said: a flexible plan may go below the static bound, never below the any-layout one."""
    text = f"no plan beats {timeline.lower_bound_ms:.1f} ms (any layout)"
    if timeline.static_bound_ms:
        text += f"; none with static CP groups beats {timeline.static_bound_ms:.1f} ms"
        if not timeline.static_layout:
            text += " (this plan's wider groups are not bound by it)"
    return text


def _panel(timeline: Timeline, *, top: float, px_per_ms: float, axis_ms: float) -> list[str]:
    out = [f'<g class="panel" data-iteration="{timeline.iteration}" transform="translate(0,{_num(top)})">']
    count = f"{timeline.num_microbatches} microbatch{'' if timeline.num_microbatches == 1 else 'es'}"
    out.append(
        f'<text class="title" x="{_num(LABEL_PX)}" y="16" font-weight="bold">{escape(timeline.title)}</text>'
        f'<text class="figures" x="{_num(LABEL_PX)}" y="32" fill="#555">'
        f"{escape(f'estimated {timeline.estimated_ms:.1f} ms, {count}; ' + bounds_text(timeline))}</text>"
    )
    lanes_top = TITLE_PX
    for gpu in range(timeline.num_gpus):
        y = lanes_top + gpu * LANE_PX
        out.append(f'<g class="lane" data-gpu="{gpu}">')
        out.append(f'<text x="{_num(LABEL_PX - 8)}" y="{_num(y + BAR_PX - 5)}" text-anchor="end">GPU {gpu}</text>')
        out.append(
            f'<line x1="{_num(LABEL_PX)}" x2="{_num(LABEL_PX + AXIS_PX)}" y1="{_num(y + BAR_PX / 2)}" '
            f'y2="{_num(y + BAR_PX / 2)}" stroke="#e5e5e5"/>'
        )
        for bar in (b for b in timeline.bars if b.gpu == gpu):
            x = LABEL_PX + bar.start_ms * px_per_ms
            width = bar.estimated_ms * px_per_ms
            out.append(
                f'<g class="microbatch" data-gpu="{gpu}" data-index="{bar.index}" data-step="{bar.step}" '
                f'data-estimated-ms="{bar.estimated_ms:.6g}" data-width="{width:.6g}" '
                f'data-local="{len(bar.local_ids)}" data-sharded="{len(bar.sharded_ids)}">'
            )
            out.append(f"<title>{escape(_tooltip(bar))}</title>")
            out.append(_rect(x, y, width, BAR_PX, COLOURS["waiting"], "slot", stroke="#999", stroke_width="0.6"))
            if bar.busy_ms is None:
                out.append(_rect(x, y, width, BAR_PX, COLOURS["estimated"], "segment estimated"))
            else:
                cursor = x
                parts = (
                    ("overhead", bar.overhead_ms),
                    ("overlap", bar.local_ms if bar.local_ms is not None else bar.overlap_ms),
                    ("exchange", bar.exposed_comm_ms or 0.0),
                    ("sharded", bar.sharded_ms),
                )
                for kind, ms in parts:
                    assert ms is not None
                    w = ms * px_per_ms
                    if w > 0:
                        out.append(_rect(cursor, y, w, BAR_PX, COLOURS[kind], f"segment {kind}"))
                    cursor += w
            if bar.bucket_use is not None:
                assert bar.local_tokens is not None and bar.sharded_share_tokens is not None
                sy = y + BAR_PX + 1
                out.append(_rect(x, sy, width, STRIP_PX, COLOURS["bucket_free"], "bucket"))
                lw = width * bar.local_tokens / bar.bucket_tokens
                sw = width * bar.sharded_share_tokens / bar.bucket_tokens
                if lw > 0:
                    out.append(_rect(x, sy, lw, STRIP_PX, COLOURS["local_tokens"], "bucket-local"))
                if sw > 0:
                    out.append(_rect(x + lw, sy, sw, STRIP_PX, COLOURS["sharded_tokens"], "bucket-sharded"))
            label = bar_label(bar, width)
            if label is not None:
                lw = len(label) * LABEL_CHAR_PX + 4
                out.append(
                    _rect(
                        x + 1, y + 3, lw, BAR_PX - 6, LABEL_BOX, "label-back", stroke=LABEL_BORDER, stroke_width="0.5"
                    )
                )
                out.append(
                    f'<text class="label" x="{_num(x + 3)}" y="{_num(y + BAR_PX / 2 + 3)}" font-size="9" '
                    f'fill="#111">{escape(label)}</text>'
                )
            out.append("</g>")
        out.append("</g>")
    out.extend(_brackets(timeline, lanes_top=lanes_top, px_per_ms=px_per_ms))
    axis_y = lanes_top + timeline.num_gpus * LANE_PX
    out.append(f'<g class="axis" transform="translate(0,{_num(axis_y)})">')
    out.append(f'<line x1="{_num(LABEL_PX)}" x2="{_num(LABEL_PX + AXIS_PX)}" y1="0" y2="0" stroke="#333"/>')
    for t in _ticks(axis_ms):
        tx = LABEL_PX + t * px_per_ms
        out.append(f'<line x1="{_num(tx)}" x2="{_num(tx)}" y1="0" y2="4" stroke="#333"/>')
        out.append(f'<text x="{_num(tx)}" y="16" text-anchor="middle" fill="#333">{_num(t)}</text>')
    out.append(f'<text x="{_num(LABEL_PX - 8)}" y="16" text-anchor="end" fill="#333">ms</text>')
    out.append("</g></g>")
    return out


def _brackets(timeline: Timeline, *, lanes_top: float, px_per_ms: float) -> list[str]:
    """A dark bracket at the start of each microbatch of more than one GPU, over the lanes of its group (one
    stroke per run of consecutive GPUs), so the GPUs that work together read off the picture."""
    out = []
    seen: set[int] = set()
    for bar in timeline.bars:
        if bar.index in seen or len(bar.ranks) < 2:
            continue
        seen.add(bar.index)
        x = LABEL_PX + bar.start_ms * px_per_ms + 1
        for first, last in runs(bar.ranks):
            y1 = lanes_top + first * LANE_PX + 1
            y2 = lanes_top + last * LANE_PX + BAR_PX + STRIP_PX
            # a "[" from the first bar's top to the last strip's bottom: ends ticked, so adjacent groups part
            out.append(
                f'<path class="group-bracket" data-index="{bar.index}" data-first="{first}" data-last="{last}" '
                f'd="M{_num(x + 4)},{_num(y1)} H{_num(x)} V{_num(y2)} H{_num(x + 4)}" fill="none" '
                f'stroke="{COLOURS["group"]}" stroke-width="2"/>'
            )
    return out


def _legend(top: float, where: str, bucket_tokens: int | None = None) -> tuple[list[str], float]:
    """The legend as rows that wrap at the picture's width, and its height; with ``bucket_tokens``, the memory
    strip's scale (a strip the width of its slot is a full bucket)."""
    out = [f'<g class="legend" data-where="{where}" transform="translate({_num(LABEL_PX)},{_num(top)})">']
    x = y = 0.0
    for key, text in LEGEND:
        w = 30 + LEGEND_CHAR_PX * len(text)
        if x > 0 and x + w > AXIS_PX:
            x, y = 0.0, y + LEGEND_ROW_PX
        if key == "group":
            out.append(f'<path class="legend-group" d="M{_num(x + 9)},{_num(y)} H{_num(x + 5)} V{_num(y + 12)} '
                       f'H{_num(x + 9)}" fill="none" stroke="{COLOURS["group"]}" stroke-width="2"/>')  # fmt: skip
        else:
            out.append(_rect(x, y, 12, 12, COLOURS[key], f"legend-{key}", stroke="#999", stroke_width="0.6"))
        out.append(f'<text x="{_num(x + 16)}" y="{_num(y + 10)}">{escape(text)}</text>')
        x += w
    y += LEGEND_ROW_PX
    sample = "#3 GPUs 0-3"
    out.append(
        _rect(0, y + 1, len(sample) * LABEL_CHAR_PX + 4, BAR_PX - 6, LABEL_BOX, "legend-label", stroke=LABEL_BORDER,
              stroke_width="0.5")
    )  # fmt: skip
    out.append(f'<text x="2" y="{_num(y + 10)}" font-size="9">{escape(sample)}</text>')
    out.append(
        f'<text class="legend-labels" x="{_num(len(sample) * LABEL_CHAR_PX + 12)}" y="{_num(y + 10)}" '
        f'fill="#555">{escape(LABEL_KEY)}</text>'
    )
    if bucket_tokens is not None:
        y += LEGEND_ROW_PX
        out.extend(_scale(y, bucket_tokens))
        y += 8
    out.append("</g>")
    return out, y + LEGEND_ROW_PX + 6


def _scale(y: float, bucket_tokens: int) -> list[str]:
    """The memory strip's scale: a strip ``SCALE_PX`` wide with ticks at 0, 50% and 100% of the bucket."""
    out = [f'<g class="legend-scale" data-bucket-tokens="{bucket_tokens}">']
    caption = "memory strip under each bar (its full width = the bucket):"
    out.append(f'<text x="0" y="{_num(y + 8)}">{escape(caption)}</text>')
    x0 = len(caption) * LEGEND_CHAR_PX + 12
    out.append(_rect(x0, y + 2, SCALE_PX, STRIP_PX, COLOURS["bucket_free"], "scale-strip", stroke="#999",
                     stroke_width="0.4"))  # fmt: skip
    out.append(_rect(x0, y + 2, SCALE_PX / 2, STRIP_PX, COLOURS["local_tokens"], "scale-half"))
    for frac, text in ((0.0, "0"), (0.5, "50%"), (1.0, f"{bucket_tokens:,} tokens")):
        tx = x0 + frac * SCALE_PX
        out.append(f'<line x1="{_num(tx)}" x2="{_num(tx)}" y1="{_num(y)}" y2="{_num(y + 10)}" stroke="#333"/>')
        anchor = "start" if frac == 1.0 else "middle"
        out.append(f'<text x="{_num(tx + (3 if frac == 1.0 else 0))}" y="{_num(y + 20)}" font-size="9" '
                   f'text-anchor="{anchor}">{escape(text)}</text>')  # fmt: skip
    out.append("</g>")
    return out


def _panel_height(timeline: Timeline) -> float:
    return TITLE_PX + timeline.num_gpus * LANE_PX + AXIS_LABEL_PX


def render_svg(timelines: Sequence[Timeline], *, title: str | None = None) -> str:
    """One SVG document with a panel per timeline, all on one time scale (so panels compare by eye)."""
    if not timelines:
        raise RequestError("timelines", 0, "nothing to draw: the plan has no iteration")
    axis_ms = max(max(t.makespan_ms for t in timelines), 1e-9)
    px_per_ms = AXIS_PX / axis_ms
    width = LABEL_PX + AXIS_PX + RIGHT_PX
    top = 30.0 if title else 8.0
    body: list[str] = []
    if title:
        body.append(f'<text x="{_num(LABEL_PX)}" y="20" font-size="15" font-weight="bold">{escape(title)}</text>')
    buckets = {b.bucket_tokens for t in timelines for b in t.bars if b.bucket_use is not None}
    bucket = buckets.pop() if len(buckets) == 1 else None
    legend, legend_px = _legend(top, "top", bucket)
    body.extend(legend)
    top += legend_px
    for timeline in timelines:
        body.extend(_panel(timeline, top=top, px_per_ms=px_per_ms, axis_ms=axis_ms))
        top += _panel_height(timeline) + PANEL_GAP_PX
    if top > TALL_PX:  # a tall picture: the legend again where the reader's eye ends
        legend, legend_px = _legend(top, "bottom", bucket)
        body.extend(legend)
        top += legend_px
    height = top + 4
    return "\n".join(
        [
            f'<svg xmlns="http://www.w3.org/2000/svg" width="{_num(width)}" height="{_num(height)}" '
            f'viewBox="0 0 {_num(width)} {_num(height)}" font-family="sans-serif" font-size="11">',
            f'<rect x="0" y="0" width="{_num(width)}" height="{_num(height)}" fill="#ffffff"/>',
            *body,
            "</svg>",
        ]
    )


def svg_to_png(svg: str) -> bytes:
    """PNG bytes of an SVG through ``cairosvg`` (the ``viz`` extra; it needs the system cairo library)."""
    try:
        import cairosvg  # type: ignore[import-untyped,unused-ignore]
    except (ImportError, OSError) as exc:
        raise RequestError(
            "--output", "*.png", f"PNG needs cairosvg and the cairo library (pip install 'skrull[viz]'): {exc}"
        ) from None
    png: bytes = cairosvg.svg2png(bytestring=svg.encode("utf-8"))
    return png
