"""Profiles a request can name: the bundled ones (``profiles/``) and those uploaded to the store.

A request naming an uploaded profile gets the stored document inlined before validation, so the job
stores the coefficients it was solved with. Bundled names cannot be uploaded over, and an uploaded
name keeps one meaning: re-uploading the identical profile is a no-op, different values are refused.
"""

from __future__ import annotations

import json
import re
from typing import Any

from skrull.api.errors import ApiProblem, invalid_field
from skrull.api.store.base import JobStore
from skrull.solver.errors import RequestError
from skrull.solver.profile import Profile, bundled_profile_names, load_profile, profile_from_dict

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")


class ProfileCatalog:
    def __init__(self, store: JobStore, *, max_profile_bytes: int = 65_536) -> None:
        self._store = store
        #: stored size of an uploaded profile: every request naming it stores it inlined, so this bounds what
        #: a small request can make the store hold (SKRULL_MAX_PROFILE_BYTES)
        self.max_profile_bytes = max_profile_bytes

    def names(self) -> list[tuple[str, str]]:
        """(name, source) for every profile, bundled first."""
        bundled = [(n, "bundled") for n in bundled_profile_names()]
        return bundled + [(n, "uploaded") for n in self._store.profile_names()]

    def document_json(self, name: str) -> str:
        """The profile as the planning library writes it (``Profile.to_dict``), as canonical JSON: a bundled
        profile written now, an uploaded one as stored (written the same way when it was uploaded)."""
        if name in bundled_profile_names():
            return canonical_profile_json(load_profile(name))
        stored = self._store.get_profile(name)
        if stored is None:
            raise invalid_field("name", name, self._unknown_reason(), status=404, slug="unknown-profile")
        return stored

    def _unknown_reason(self) -> str:
        names = [n for n, _ in self.names()]
        return f"unknown profile; known: {', '.join(names) or 'none'}"

    def inline(self, request_doc: dict[str, Any]) -> dict[str, Any]:
        """The request with an uploaded profile's name replaced by its document (bundled names stay)."""
        name = request_doc.get("profile")
        if not isinstance(name, str) or name in bundled_profile_names():
            return request_doc
        stored = self._store.get_profile(name)
        if stored is None:
            raise RequestError("profile", name, self._unknown_reason())
        return {**request_doc, "profile": json.loads(stored)}

    def upload(self, doc: dict[str, Any]) -> tuple[str, bool]:
        """Validate and store a profile; (name, created)."""
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
        return name, self._store.put_profile(name, stored)


def canonical_profile_json(profile: Profile) -> str:
    """What is stored and served: the library's one writer of the format, keys sorted, no spaces."""
    return json.dumps(profile.to_dict(), sort_keys=True, separators=(",", ":"))
