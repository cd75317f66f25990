"""Group routes: completion per group (RL: the samples of one task, ``groups``).

``GET /groups`` (admin key) lists the live groups and the last completed ones
(``programs.completed_groups_kept``); ``GET /groups/{id}`` (API key) shows one, live or
completed: members seen, live and done, and the seconds from the group's first request to
each member's release — first, median, last, and the spread between first and last.
"""

from __future__ import annotations

from fastapi import APIRouter
from starlette.requests import Request
from starlette.responses import JSONResponse

from thunder_sgl.errors import NotFound
from thunder_sgl.gateway.http import check_key
from thunder_sgl.gateway.inbound import check_program_id
from thunder_sgl.gateway.runtime import Gateway


def build_groups_router(gw: Gateway) -> APIRouter:
    router = APIRouter(tags=["groups"])

    @router.get("/groups")
    async def list_groups(request: Request) -> JSONResponse:
        check_key(request, gw.admin_key, "admin key")
        table = gw.controller.programs.groups
        return JSONResponse({
            "object": "list", "live": [g.describe() for g in table.live()],
            "completed": [g.describe() for g in table.completed], "completed_total": table.completed_total,
        })

    @router.get("/groups/{group_id}")
    async def get_group(request: Request, group_id: str) -> JSONResponse:
        check_key(request, gw.cfg.gateway.api_key, "API key")
        gid = check_program_id(group_id, "group id", "group_id")
        g = gw.controller.programs.groups.find(gid)
        if g is None:
            raise NotFound(f"group {gid!r} not found (never seen, or completed long ago)", code="group_not_found")
        return JSONResponse(g.describe())

    return router
