"""Tenants: which team a bearer token belongs to, and the plan ids and Idempotency-Keys each team sees.

``SKRULL_SUBMIT_TOKENS="team-a=tokA,team-b=tokB"`` and ``SKRULL_READ_TOKENS="team-a=tokAr"``: a token
belongs to the tenant named before ``=``; entries without a name (``tokC``) form the default tenant, so
settings written before tenants existed keep working. A name is letters, digits and ``_.-`` (it starts
with a letter or digit) and the token after ``=`` must not start with ``=``, so a base64 token with
padding (``dG9rZW4=``) stays one unnamed token.

Isolation needs no tenant column in the job store, so it holds on SQLite, on PostgreSQL and across
replicas alike:

* A plan id is the content address of the request *within its tenant*: the default tenant's ids are
  ``sha256(canonical request)[:32]`` as before; a named tenant's are ``<prefix>-<sha256(name, NUL,
  canonical request)[:32]>`` with ``prefix = sha256("tenant", NUL, name)[:8]``. The same request from two
  tenants gets two plans (no id collides: the prefixes differ, and a default id has no ``-``), the same
  request within one tenant gets the same plan.
* Every route that names a plan (envelope, DELETE, rank views, pictures) answers 404 unless the id is
  the caller's tenant's (``owns``): a 404 like an unknown id, so ids of other teams leak nothing.
* Idempotency-Keys are stored as ``<prefix>:<key>`` for a named tenant (``scoped_key``): one team's key
  never answers another team's plan. A default-tenant key that looks like that stored form (``<8 hex>:``),
  or starts with the escape ``-:``, is stored as ``-:<key>``; every other default key is stored as sent,
  so keys stored before stay valid. No stored form of one tenant is a stored form of another, so no
  tenant can claim, or learn a plan id from, another's keys.

Uploaded profiles are shared by every tenant (they hold no data of a team's batches).
"""

from __future__ import annotations

import hashlib
import re

from skrull.solver.errors import RequestError

DEFAULT_TENANT = ""
#: What a named tenant's stored key starts with, or the escape of a default key that does.
_STORED_FORM = re.compile(r"([0-9a-f]{8}|-):")
_NAMED = re.compile(r"([A-Za-z0-9][A-Za-z0-9_.-]{0,63})=([^=].*)")


def parse_tokens(text: str, *, field: str) -> dict[str, str]:
    """``{token: tenant}`` of a comma-separated tokens setting (module doc)."""
    out: dict[str, str] = {}
    for entry in (e.strip() for e in text.split(",")):
        if not entry:
            continue
        named = _NAMED.fullmatch(entry)
        tenant, token = (named.group(1), named.group(2).strip()) if named else (DEFAULT_TENANT, entry)
        if out.get(token, tenant) != tenant:
            raise RequestError(field, f"{tenant or '(default)'}=...", "a token may belong to one tenant only")
        out[token] = tenant
    return out


def tenant_prefix(tenant: str) -> str:
    """The id prefix of a named tenant's plans (empty for the default tenant)."""
    if tenant == DEFAULT_TENANT:
        return ""
    return hashlib.sha256(b"tenant\0" + tenant.encode()).hexdigest()[:8]


def plan_id_for(tenant: str, canonical_json: str) -> str:
    """Content address of a request within its tenant (module doc)."""
    if tenant == DEFAULT_TENANT:
        return hashlib.sha256(canonical_json.encode()).hexdigest()[:32]
    digest = hashlib.sha256(tenant.encode() + b"\0" + canonical_json.encode()).hexdigest()[:32]
    return f"{tenant_prefix(tenant)}-{digest}"


def owns(tenant: str, plan_id: str) -> bool:
    """Whether ``plan_id`` may be a plan of ``tenant``."""
    prefix, dash, _ = plan_id.partition("-")
    if tenant == DEFAULT_TENANT:
        return not dash
    return bool(dash) and prefix == tenant_prefix(tenant)


def scoped_key(tenant: str, idempotency_key: str | None) -> str | None:
    """The Idempotency-Key as stored: scoped to a named tenant."""
    if idempotency_key is None:
        return None
    if tenant == DEFAULT_TENANT:
        return f"-:{idempotency_key}" if _STORED_FORM.match(idempotency_key) else idempotency_key
    return f"{tenant_prefix(tenant)}:{idempotency_key}"
