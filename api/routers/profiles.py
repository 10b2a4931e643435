"""``/v1/profiles``: list, read and upload hardware/model profiles (docs/formats.md "Profile")."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from skrull.api.access import caller_tenant
from skrull.api.errors import invalid_field
from skrull.api.limits import parsed_body
from skrull.api.routers.common import JSON, body_schema, problems, service
from skrull.api.schemas import ProfileList, ProfileModel, ProfileSummary
from skrull.solver.jsonsafe import check_text

router = APIRouter(prefix="/v1/profiles", tags=["profiles"])


@router.get("", operation_id="listProfiles", summary="Bundled and uploaded profiles", response_model=ProfileList)
async def list_profiles(request: Request) -> ProfileList:
    svc = service(request)
    names = await svc.blocking(svc.profiles.names, caller_tenant(request))
    return ProfileList(profiles=[ProfileSummary(name=n, source=s) for n, s in names])


@router.get(
    "/{name:path}",
    operation_id="getProfile",
    summary="One profile",
    response_model=ProfileModel,
    responses=problems(404),
)
async def get_profile(name: str, request: Request) -> Response:
    check_text(name, "name")
    svc = service(request)  # ProfileModel documents the answer; the library's writer makes it
    return Response(await svc.blocking(svc.profiles.document_json, name, caller_tenant(request)), media_type=JSON)


@router.post(
    "",
    status_code=201,
    operation_id="uploadProfile",
    summary="Upload a measured profile; requests can then name it",
    response_model=ProfileModel,
    openapi_extra=body_schema("ProfileModel"),
    responses={
        200: {"model": ProfileModel, "description": "the identical profile was already stored"},
        **problems(409, 413, 415, 422, 429),
    },
)
async def upload_profile(request: Request) -> Response:
    """The body is a profile document (docs/formats.md "Profile") with a new ``name``; it is read by the
    planning library's one JSON reader and validated by its one profile reader, which name the field and
    value of any mistake, and answered as that library writes it."""
    svc = service(request)
    doc = await parsed_body(request)  # parsed off the event loop
    if not isinstance(doc, dict):
        raise invalid_field("profile", doc, "must be a profile object")
    tenant = caller_tenant(request)
    name, created = await svc.blocking(svc.profiles.upload, doc, tenant)
    stored = await svc.blocking(svc.profiles.document_json, name, tenant)
    return Response(
        stored,
        status_code=201 if created else 200,
        media_type=JSON,
        headers={"Location": f"/v1/profiles/{name}"},
    )
