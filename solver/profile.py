"""Hardware/model profiles: the coefficients of the reference cost model (docs/formats.md, "Profile").

A profile is read from a bundled JSON file under ``profiles/`` (named ``<gpu>/<model>``, stored as
``profiles/<gpu>__<model>.json``) or given inline in a request. Only the specification's fields drive the
cost model; any extra fields (sources, model config, derivation) are kept verbatim in ``extra``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skrull.solver.errors import RequestError, UnknownProfileError
from skrull.solver.jsonsafe import check_bounded
from skrull.solver.resources import PROFILES_DIR_ENV, bundled_dir, find_file, list_stems


@dataclass(frozen=True, slots=True, kw_only=True)
class ComputeCoeffs:
    """``FLOPs(S) = flops_per_token*S + flops_per_token_sq*S^2``; ``T_comp(F) = ms_per_tflop*F/1e12 + fixed_ms``."""

    flops_per_token: float
    flops_per_token_sq: float
    ms_per_tflop: float
    fixed_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class CommCoeffs:
    """``T_comm(T) = ms_per_mib * T * bytes_per_token / 2^20 + fixed_ms`` for T sharded tokens.

    ``kv_bytes_per_token`` (``comm_a2a`` only, optional, default 0): the part of ``bytes_per_token`` that is
    K and V at the profile's ``heads.kv`` heads. A Ulysses group of N GPUs where N does not divide the K/V
    heads sends ``lcm(kv, N) / kv`` copies of each (every GPU gets the K/V heads its query heads use), so
    the all-to-all moves ``bytes_per_token + kv_bytes_per_token * (lcm(kv, N) / kv - 1)`` per token
    (solver/cost.py); without it, the contract's plain form."""

    bytes_per_token: float
    ms_per_mib: float
    fixed_ms: float
    kv_bytes_per_token: float = 0.0


@dataclass(frozen=True, slots=True, kw_only=True)
class HeadCounts:
    """The model's attention heads: Ulysses splits them over the group, so the group size N must divide
    ``attention``; where N does not divide the K/V heads they are replicated to ``lcm(kv, N)`` (each GPU gets
    the K/V heads its query heads read; solver/cp_modes.py ``kv_heads_per_gpu``)."""

    attention: int
    kv: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Link:
    """One kind of link between GPUs (CONTRACT.md "Cluster topology and gathered K/V"): the inverse bus
    bandwidth (busbw, as nccl-tests reports it) of each collective on it, in ms per MiB."""

    allgather_ms_per_mib: float
    alltoall_ms_per_mib: float


#: The two links a topology names, in the order a group is tried: inside one node, then across nodes.
INTRA_NODE = "intra_node"
INTER_NODE = "inter_node"


@dataclass(frozen=True, slots=True, kw_only=True)
class Topology:
    """The cluster a profile's GPUs sit in. GPU ``g`` is on node ``g // gpus_per_node`` (torchrun numbers
    global ranks node by node, and a DP x CP mesh keeps CP innermost); a group whose ranks are all on one
    node uses ``intra_node``, any other ``inter_node`` (the slowest link bounds a ring or an all-to-all).
    ``source`` says where each figure comes from (measured: how, when, on what; or published: which)."""

    gpus_per_node: int
    intra_node: Link
    inter_node: Link
    source: str = ""

    def link_name(self, ranks: Sequence[int]) -> str:
        """``intra_node`` when every rank of the group is on one node, else ``inter_node``."""
        nodes = {rank // self.gpus_per_node for rank in ranks}
        return INTRA_NODE if len(nodes) <= 1 else INTER_NODE

    def link(self, name: str) -> Link:
        return self.intra_node if name == INTRA_NODE else self.inter_node


#: What an all-gather microbatch keeps of the gathered K/V from forward to backward (``memory.gathered_kv``):
#: ``others``, the K/V of the other GPUs' shares, ``(N-1)/N * T`` (CONTRACT.md's rule, the default);
#: ``key_prefixes``, the key prefix ``[0, end)`` of each of the GPU's own pieces (worker/dacp.py), at most
#: ``(2N+1)/(2N) * T`` (solver/cost.py ``gathered_kv_factor``).
GATHERED_KV_OTHERS = "others"
GATHERED_KV_KEY_PREFIXES = "key_prefixes"
GATHERED_KV_RULES = (GATHERED_KV_OTHERS, GATHERED_KV_KEY_PREFIXES)


#: What a collective of a microbatch overlaps (profile section ``overlap``, ``with``): the local attention
#: call of the same layer (worker/dacp.py), or all the local compute (the contract's plain form).
OVERLAP_LOCAL_ATTENTION = "local_attention"
OVERLAP_LOCAL_COMPUTE = "local_compute"
OVERLAP_SCOPES = (OVERLAP_LOCAL_ATTENTION, OVERLAP_LOCAL_COMPUTE)


@dataclass(frozen=True, slots=True, kw_only=True)
class Overlap:
    """What the worker hides communication behind (CONTRACT.md allows this refinement of the reference form).

    ``scope`` (the section's ``with``): ``local_attention``, each collective overlaps only the local
    attention of the same layer, ``A_j = ms_per_flop * flops_per_token_sq * sum_{local[j]} S^2``;
    ``local_compute``, all of the local compute (``A_j = T_comp(local_j)``). Each direction overlaps on its
    own (forward's collective with forward's share of ``A_j``, backward's with backward's), so a GPU with
    local sequences takes ``max(H_f, A_f) + max(H_b, A_b) + T_exposed + (T_comp(local_j) - A_j) +
    T_comp(sharded/N)``, the shares read from what runs (solver/cost.py, "Overlap"). ``ulysses_exposed``
    (e in [0, 1]): the share of a Ulysses microbatch's all-to-all that runs after the attention, hidden
    behind nothing (worker/dacp.py: the output's all-to-all back in forward and dQ/dK/dV's back in backward,
    half the volume: 0.5); all-gather hides its whole gather.
    ``source`` says how the figures were found."""

    scope: str = OVERLAP_LOCAL_ATTENTION
    ulysses_exposed: float = 0.0
    source: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """``heads`` and ``comm_a2a`` are optional: a profile without them cannot plan ``ulysses`` microbatches
    (``T_a2a(T) = comm_a2a.ms_per_mib * (T/N) * comm_a2a.bytes_per_token / 2^20 + comm_a2a.fixed_ms``).

    ``topology`` (optional) prices each group with the link its ranks use instead of ``comm.ms_per_mib``
    and ``comm_a2a.ms_per_mib``. ``activation_bytes_per_token`` and ``kv_bytes_per_token`` (optional,
    ``memory`` section; the rule needs both) charge an all-gather microbatch the gathered K/V of the sharded
    sequences: ``own tokens + r * (N-1)/N * sum(sharded S) <= bucket_tokens`` with ``r = kv / activation``
    (``gathered_kv_ratio``; 0 without them). ``gathered_kv`` (optional, ``memory.gathered_kv``) says which
    K/V the worker keeps: None or ``others`` the contract's ``(N-1)/N``, ``key_prefixes`` the key prefix of
    each own piece, ``(2N+1)/(2N)`` (``GATHERED_KV_RULES``; solver/cost.py). ``overlap`` (optional) says
    what the worker hides communication behind (``Overlap``; without it, all the local compute: the
    contract's plain form)."""

    name: str
    compute: ComputeCoeffs
    comm: CommCoeffs
    bucket_tokens: int
    microbatch_ms: float
    heads: HeadCounts | None = None
    comm_a2a: CommCoeffs | None = None
    topology: Topology | None = None
    activation_bytes_per_token: float | None = None
    kv_bytes_per_token: float | None = None
    gathered_kv: str | None = None
    overlap: Overlap | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def plans_ulysses(self) -> bool:
        """Whether the profile has what pricing a ``ulysses`` microbatch needs (``heads`` and ``comm_a2a``)."""
        return self.heads is not None and self.comm_a2a is not None

    @property
    def gathered_kv_ratio(self) -> float:
        """``r = kv_bytes_per_token / activation_bytes_per_token``: the bucket tokens one gathered token of
        another GPU's share costs an all-gather microbatch (0 where the profile does not say)."""
        if not self.kv_bytes_per_token or not self.activation_bytes_per_token:
            return 0.0
        return self.kv_bytes_per_token / self.activation_bytes_per_token

    def to_dict(self) -> dict[str, Any]:
        """The specification's document: the original extra fields, with the core coefficients on top."""
        out = copy.deepcopy(self.extra)
        out["name"] = self.name
        out["compute"] = {
            **out.get("compute", {}),
            "flops_per_token": self.compute.flops_per_token,
            "flops_per_token_sq": self.compute.flops_per_token_sq,
            "ms_per_tflop": self.compute.ms_per_tflop,
            "fixed_ms": self.compute.fixed_ms,
        }
        out["comm"] = {
            **out.get("comm", {}),
            "bytes_per_token": self.comm.bytes_per_token,
            "ms_per_mib": self.comm.ms_per_mib,
            "fixed_ms": self.comm.fixed_ms,
        }
        out["memory"] = {**out.get("memory", {}), "bucket_tokens": self.bucket_tokens}
        if self.activation_bytes_per_token is not None:
            out["memory"]["activation_bytes_per_token"] = self.activation_bytes_per_token
        if self.kv_bytes_per_token is not None:
            out["memory"]["kv_bytes_per_token"] = self.kv_bytes_per_token
        if self.gathered_kv is not None:
            out["memory"]["gathered_kv"] = self.gathered_kv
        if self.topology is not None:
            topo = self.topology
            out["topology"] = {
                **out.get("topology", {}),
                "gpus_per_node": topo.gpus_per_node,
                INTRA_NODE: _link_dict(topo.intra_node),
                INTER_NODE: _link_dict(topo.inter_node),
                "source": topo.source,
            }
        if self.overlap is not None:
            out["overlap"] = {
                **out.get("overlap", {}),
                "with": self.overlap.scope,
                "ulysses_exposed": self.overlap.ulysses_exposed,
                "source": self.overlap.source,
            }
        out["microbatch_ms"] = self.microbatch_ms
        if self.heads is not None:
            out["heads"] = {**out.get("heads", {}), "attention": self.heads.attention, "kv": self.heads.kv}
        if self.comm_a2a is not None:
            out["comm_a2a"] = {
                **out.get("comm_a2a", {}),
                "bytes_per_token": self.comm_a2a.bytes_per_token,
                "ms_per_mib": self.comm_a2a.ms_per_mib,
                "fixed_ms": self.comm_a2a.fixed_ms,
            }
            if self.comm_a2a.kv_bytes_per_token:
                out["comm_a2a"]["kv_bytes_per_token"] = self.comm_a2a.kv_bytes_per_token
        return out


def _link_dict(link: Link) -> dict[str, float]:
    return {"allgather_ms_per_mib": link.allgather_ms_per_mib, "alltoall_ms_per_mib": link.alltoall_ms_per_mib}


#: Largest magnitude of a profile coefficient. Costs multiply coefficients by up to S^2 (S <= 2^40 tokens),
#: so 1e30 * 2^80 ~ 1.2e54 stays far inside a float; every measured coefficient is many orders smaller.
MAX_COEFFICIENT = 1e30
MAX_BUCKET_TOKENS = 2**40


def _number(doc: dict[str, Any], key: str, path: str, *, positive: bool = False) -> float:
    if key not in doc:
        raise RequestError(f"{path}.{key}", None, "required number is missing")
    value = doc[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(f"{path}.{key}", value, "must be a finite number")
    # Compared as given, before float() or isfinite(), which overflow on integers like 10**400.
    if not -MAX_COEFFICIENT <= value <= MAX_COEFFICIENT:
        raise RequestError(f"{path}.{key}", value, f"must be a finite number of magnitude <= {MAX_COEFFICIENT:g}")
    if value < 0 or (positive and value == 0):
        raise RequestError(f"{path}.{key}", value, "must be > 0" if positive else "must be >= 0")
    return float(value)


def _section(doc: dict[str, Any], key: str, path: str) -> dict[str, Any]:
    value = doc.get(key)
    if not isinstance(value, dict):
        raise RequestError(f"{path}.{key}", value, "must be an object")
    return value


#: Most attention heads a profile may name.
MAX_HEADS = 2**20


def _heads(doc: dict[str, Any], path: str) -> HeadCounts | None:
    """The optional ``heads`` section: ``attention`` >= 1 heads, ``kv`` in 1..attention dividing it (GQA)."""
    if "heads" not in doc:
        return None
    heads = _section(doc, "heads", path)
    counts: dict[str, int] = {}
    for key in ("attention", "kv"):
        value = heads.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_HEADS:
            raise RequestError(f"{path}.heads.{key}", value, f"must be an integer in 1..{MAX_HEADS}")
        counts[key] = value
    if counts["kv"] > counts["attention"] or counts["attention"] % counts["kv"]:
        raise RequestError(
            f"{path}.heads.kv",
            counts["kv"],
            f"must divide heads.attention = {counts['attention']} (grouped-query attention)",
        )
    return HeadCounts(attention=counts["attention"], kv=counts["kv"])


def _comm(section: dict[str, Any], path: str, *, kv_part: bool = False) -> CommCoeffs:
    """A communication section; with ``kv_part`` (``comm_a2a``) also its optional ``kv_bytes_per_token``,
    at most ``bytes_per_token`` (it is part of it)."""
    coeffs = CommCoeffs(
        bytes_per_token=_number(section, "bytes_per_token", path),
        ms_per_mib=_number(section, "ms_per_mib", path),
        fixed_ms=_number(section, "fixed_ms", path),
    )
    if not kv_part or "kv_bytes_per_token" not in section:
        return coeffs
    kv_bytes = _number(section, "kv_bytes_per_token", path)
    if kv_bytes > coeffs.bytes_per_token:
        raise RequestError(
            f"{path}.kv_bytes_per_token",
            kv_bytes,
            f"is the K/V part of bytes_per_token = {coeffs.bytes_per_token:g}: it cannot be larger",
        )
    return dataclasses.replace(coeffs, kv_bytes_per_token=kv_bytes)


#: Most GPUs a node of a profile's topology may hold.
MAX_GPUS_PER_NODE = 2**20
#: Longest ``topology.source`` text kept.
MAX_SOURCE_CHARS = 4096


def _topology(doc: dict[str, Any], path: str) -> Topology | None:
    """The optional ``topology`` section (CONTRACT.md): ``gpus_per_node`` >= 1 and both links' figures."""
    if "topology" not in doc:
        return None
    section = _section(doc, "topology", path)
    where = f"{path}.topology"
    per_node = section.get("gpus_per_node")
    if isinstance(per_node, bool) or not isinstance(per_node, int) or not 1 <= per_node <= MAX_GPUS_PER_NODE:
        raise RequestError(f"{where}.gpus_per_node", per_node, f"must be an integer in 1..{MAX_GPUS_PER_NODE}")
    links = {}
    for name in (INTRA_NODE, INTER_NODE):
        link = _section(section, name, where)
        links[name] = Link(
            allgather_ms_per_mib=_number(link, "allgather_ms_per_mib", f"{where}.{name}"),
            alltoall_ms_per_mib=_number(link, "alltoall_ms_per_mib", f"{where}.{name}"),
        )
    source = section.get("source", "")
    if not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS:
        raise RequestError(f"{where}.source", source, f"must be a string of at most {MAX_SOURCE_CHARS} characters")
    return Topology(gpus_per_node=per_node, intra_node=links[INTRA_NODE], inter_node=links[INTER_NODE], source=source)


def _overlap(doc: dict[str, Any], path: str) -> Overlap | None:
    """The optional ``overlap`` section: ``with`` one of ``OVERLAP_SCOPES`` (default ``local_attention``),
    ``ulysses_exposed`` in [0, 1] (default 0), ``source`` a string."""
    if "overlap" not in doc:
        return None
    section = _section(doc, "overlap", path)
    where = f"{path}.overlap"
    scope = section.get("with", OVERLAP_LOCAL_ATTENTION)
    if scope not in OVERLAP_SCOPES:
        raise RequestError(f"{where}.with", scope, f"must be one of {', '.join(OVERLAP_SCOPES)}")
    exposed = _number(section, "ulysses_exposed", where) if "ulysses_exposed" in section else 0.0
    if exposed > 1.0:
        raise RequestError(f"{where}.ulysses_exposed", exposed, "must be in 0..1 (a share of the all-to-all)")
    source = section.get("source", "")
    if not isinstance(source, str) or len(source) > MAX_SOURCE_CHARS:
        raise RequestError(f"{where}.source", source, f"must be a string of at most {MAX_SOURCE_CHARS} characters")
    return Overlap(scope=scope, ulysses_exposed=exposed, source=source)


def _memory_bytes(memory: dict[str, Any], path: str) -> tuple[float | None, float | None]:
    """``memory.activation_bytes_per_token`` and ``memory.kv_bytes_per_token``. The gathered-K/V rule
    needs both: ``kv_bytes_per_token`` without ``activation_bytes_per_token`` (> 0, it divides) is an
    error; ``activation_bytes_per_token`` alone (a derivation's figure) charges nothing."""
    activation = (
        _number(memory, "activation_bytes_per_token", f"{path}.memory", positive=True)
        if "activation_bytes_per_token" in memory
        else None
    )
    if "kv_bytes_per_token" not in memory:
        return activation, None
    kv = _number(memory, "kv_bytes_per_token", f"{path}.memory")
    if activation is None:
        raise RequestError(
            f"{path}.memory.activation_bytes_per_token", None, "is required with memory.kv_bytes_per_token"
        )
    return activation, kv


def _gathered_kv(memory: dict[str, Any], path: str) -> str | None:
    """``memory.gathered_kv`` (optional): one of ``GATHERED_KV_RULES``."""
    if "gathered_kv" not in memory:
        return None
    value = memory["gathered_kv"]
    if not isinstance(value, str) or value not in GATHERED_KV_RULES:
        raise RequestError(f"{path}.memory.gathered_kv", value, f"must be one of {', '.join(GATHERED_KV_RULES)}")
    return value


def profile_from_dict(doc: Any, *, path: str = "profile") -> Profile:
    """Parse a profile document (docs/formats.md "Profile"), naming the field of any error."""
    if not isinstance(doc, dict):
        raise RequestError(path, doc, "must be a profile name or an object")
    check_bounded(doc, field=path, root=path)
    name = doc.get("name", "inline")
    if not isinstance(name, str) or not name:
        raise RequestError(f"{path}.name", name, "must be a non-empty string")
    compute = _section(doc, "compute", path)
    comm = _section(doc, "comm", path)
    memory = _section(doc, "memory", path)
    bucket = memory.get("bucket_tokens")
    if isinstance(bucket, bool) or not isinstance(bucket, int) or not 1 <= bucket <= MAX_BUCKET_TOKENS:
        raise RequestError(f"{path}.memory.bucket_tokens", bucket, f"must be an integer in 1..{MAX_BUCKET_TOKENS}")
    activation_bytes, kv_bytes = _memory_bytes(memory, path)
    return Profile(
        name=name,
        compute=ComputeCoeffs(
            flops_per_token=_number(compute, "flops_per_token", f"{path}.compute"),
            flops_per_token_sq=_number(compute, "flops_per_token_sq", f"{path}.compute"),
            ms_per_tflop=_number(compute, "ms_per_tflop", f"{path}.compute", positive=True),
            fixed_ms=_number(compute, "fixed_ms", f"{path}.compute"),
        ),
        comm=_comm(comm, f"{path}.comm"),
        bucket_tokens=bucket,
        microbatch_ms=_number(doc, "microbatch_ms", path),
        heads=_heads(doc, path),
        comm_a2a=_comm(_section(doc, "comm_a2a", path), f"{path}.comm_a2a", kv_part=True)
        if "comm_a2a" in doc
        else None,
        topology=_topology(doc, path),
        activation_bytes_per_token=activation_bytes,
        kv_bytes_per_token=kv_bytes,
        gathered_kv=_gathered_kv(memory, path),
        overlap=_overlap(doc, path),
        extra=copy.deepcopy(doc),
    )


def profiles_dir() -> Path:
    """The bundled profiles folder inside the installed package (``skrull/profiles``)."""
    return bundled_dir("profiles")


def profile_file_name(name: str) -> str:
    return name.replace("/", "__") + ".json"


def bundled_profile_names() -> tuple[str, ...]:
    """Bundled profiles plus those in ``$SKRULL_PROFILES_DIR`` (directories separated by ``os.pathsep``)."""
    return tuple(stem.replace("__", "/") for stem in list_stems("profiles", PROFILES_DIR_ENV))


def load_profile(name: str, *, path: str = "profile") -> Profile:
    """Load a bundled profile by name (``h100-80g/qwen2.5-0.5b``)."""
    names = bundled_profile_names()
    if name not in names:
        known = ", ".join(names) or "none"
        raise UnknownProfileError(path, name, f"unknown profile; known (bundled and ${PROFILES_DIR_ENV}): {known}")
    found = find_file("profiles", PROFILES_DIR_ENV, profile_file_name(name))
    assert found is not None, name
    with open(found, encoding="utf-8") as fh:
        return profile_from_dict(json.load(fh), path=path)
