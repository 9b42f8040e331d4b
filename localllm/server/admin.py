"""/admin/load and /admin/unload: what `localllm load` and `localllm stop` ask of a running
server. Behind the same Host, Origin and key checks as every route (server/guard.py)."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import Field

from localllm.config import Settings
from localllm.engine.client import EngineClient
from localllm.errors import InvalidRequest
from localllm.server import wire

router = APIRouter()


class AdminLoad(wire.Wire):
    """POST /admin/load: load a model beside the default, for `ttl` idle seconds."""

    model: wire.Name
    n_ctx: int | None = Field(default=None, ge=16, le=1 << 20)
    # seconds or a duration ("10m"); negative: stays loaded for good; None: the setting's
    keep_alive: wire.KeepAlive = None


class AdminUnload(wire.Wire):
    """POST /admin/unload: one model by name, or all of them."""

    model: wire.Name | None = None
    all: bool = False


@router.post("/admin/load")
async def load(body: AdminLoad, request: Request) -> JSONResponse:
    engine: EngineClient = request.app.state.engine
    settings: Settings = request.app.state.settings
    row = await asyncio.to_thread(
        engine.preload,
        body.model,
        n_ctx=body.n_ctx,
        keep_alive=body.keep_alive,
        allow_paths=settings.allow_model_paths,
    )
    return JSONResponse({"loaded": row})


@router.post("/admin/unload")
async def unload(body: AdminUnload, request: Request) -> JSONResponse:
    engine: EngineClient = request.app.state.engine
    if body.model is None and not body.all:
        raise InvalidRequest('name a model, or send "all": true', param="model")
    if body.model is not None and body.all:
        raise InvalidRequest('send a model or "all": true, not both', param="all")
    gone = await asyncio.to_thread(engine.unload, None if body.all else body.model)
    if body.model is not None and not gone:
        loaded = ", ".join(r.model for r in engine.status().loaded) or "none"
        raise InvalidRequest(
            f"the model {body.model} is not loaded (loaded: {loaded})",
            param="model",
            code="model_not_loaded",
        )
    return JSONResponse({"unloaded": gone})
