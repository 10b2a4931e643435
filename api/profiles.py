"""Profiles a request can name: the bundled ones (``profiles/``) and those uploaded to the store.

A request naming an uploaded profile gets the stored document inlined before validation, so the job
stores the coefficients it was solved with. Bundled names cannot be uploaded over, and an uploaded
name keeps one meaning: re-uploading the identical profile is a no-op, different values are refused.

Uploaded profiles belong to the tenant that uploaded them (``api.tenants``): each tenant lists, reads and
names only its own and the bundled ones (shared by all, read-only), so no tenant can take a name another
uses or price another's requests, and an unknown-profile error lists only what the caller may name
(at most ``NAMES_LISTED``). A named tenant's profile is stored as ``<prefix>:<name>`` (names hold no
``:``), the default tenant's as ``<name>``, so profiles uploaded before tenants existed stay the default
tenant's. A tenant holds at most ``SKRULL_TENANT_MAX_PROFILES`` (429 ``quota-exceeded`` beyond).
"""

from __future__ import annotations

import json
import re
from typing import Any

from skrull.api.errors import ApiProblem, invalid_field
from skrull.api.store.base import JobStore
from skrull.api.tenants import DEFAULT_TENANT, tenant_prefix
from skrull.solver.errors import RequestError
from skrull.solver.profile import Profile, bundled_profile_names, load_profile, profile_from_dict

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
#: Names an unknown-profile error lists (the bundled ones, then the caller's own): enough to spot a typo,
#: bounded however many a tenant uploaded.
NAMES_LISTED = 50


class ProfileCatalog:
    def __init__(self, store: JobStore, *, max_profile_bytes: int = 65_536, max_profiles: int | None = None) -> None:
        self._store = store
        #: stored size of an uploaded profile: every request naming it stores it inlined, so this bounds what
        #: a small request can make the store hold (SKRULL_MAX_PROFILE_BYTES)
        self.max_profile_bytes = max_profile_bytes
        #: uploaded profiles per tenant (SKRULL_TENANT_MAX_PROFILES)
        self.max_profiles = max_profiles

    def names(self, tenant: str = DEFAULT_TENANT) -> list[tuple[str, str]]:
        """(name, source) for every profile ``tenant`` may name: the bundled ones first, then its own."""
        bundled = [(n, "bundled") for n in bundled_profile_names()]
        return bundled + [(n, "uploaded") for n in self._store.profile_names(scope=tenant_prefix(tenant))]

    def document_json(self, name: str, tenant: str = DEFAULT_TENANT) -> str:
        """The profile as the planning library writes it (``Profile.to_dict``), as canonical JSON: a bundled
        profile written now, an uploaded one of ``tenant`` as stored (written the same way when uploaded)."""
        if name in bundled_profile_names():
            return canonical_profile_json(load_profile(name))
        stored = self._store.get_profile(name, scope=tenant_prefix(tenant))
        if stored is None:
            raise invalid_field("name", name, self._unknown_reason(tenant), status=404, slug="unknown-profile")
        return stored

    def _unknown_reason(self, tenant: str) -> str:
        names = [n for n, _ in self.names(tenant)]
        shown = ", ".join(names[:NAMES_LISTED]) or "none"
        more = f" and {len(names) - NAMES_LISTED} more (GET /v1/profiles)" if len(names) > NAMES_LISTED else ""
        return f"unknown profile; known: {shown}{more}"

    def inline(self, request_doc: dict[str, Any], tenant: str = DEFAULT_TENANT) -> dict[str, Any]:
        """The request with an uploaded profile's name (``tenant``'s) replaced by its document (bundled names
        stay); an inline profile document is refused past ``max_profile_bytes``, as an upload would be."""
        name = request_doc.get("profile")
        if isinstance(name, dict):
            size = len(json.dumps(name, separators=(",", ":")).encode())
            if size > self.max_profile_bytes:
                raise RequestError(
                    "profile",
                    f"{size} bytes",
                    f"an inline profile may hold at most {self.max_profile_bytes} bytes (SKRULL_MAX_PROFILE_BYTES), "
                    "as an uploaded one",
                )
            return request_doc
        if not isinstance(name, str) or name in bundled_profile_names():
            return request_doc
        stored = self._store.get_profile(name, scope=tenant_prefix(tenant))
        if stored is None:
            raise RequestError("profile", name, self._unknown_reason(tenant))
        return {**request_doc, "profile": json.loads(stored)}

    def upload(self, doc: dict[str, Any], tenant: str = DEFAULT_TENANT) -> tuple[str, bool]:
        """Validate and store a profile of ``tenant``; (name, created)."""
        name = doc.get("name")
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise invalid_field(
                "name",
                name,
                "required: 1-128 characters of letters, digits, '.', '_', '-', '/', starting with a letter or digit",
            )
        if name in bundled_profile_names():
            raise ApiProblem(
                status=409,
                slug="profile-exists",
                title="profile exists",
                field="name",
                value=name,
                detail=f"name: {json.dumps(name)}: a bundled profile has this name; upload under another name",
            )
        profile = profile_from_dict(doc, path="profile")
        stored = canonical_profile_json(profile)
        if len(stored.encode()) > self.max_profile_bytes:
            raise invalid_field(
                "profile",
                f"{len(stored.encode())} bytes",
                f"a stored profile may hold at most {self.max_profile_bytes} bytes (SKRULL_MAX_PROFILE_BYTES): every "
                "request naming it stores it; keep large sources elsewhere",
                slug="limit-exceeded",
            )
        return name, self._store.put_profile(name, stored, scope=tenant_prefix(tenant), max_profiles=self.max_profiles)


def canonical_profile_json(profile: Profile) -> str:
    """What is stored and served: the library's one writer of the format, keys sorted, no spaces."""
    return json.dumps(profile.to_dict(), sort_keys=True, separators=(",", ":"))
