"""llama-server's `/lora-adapters`: the LoRA adapters a model loaded with (`--lora`), and
their global scales, which every request that names no adapters runs with.

GET lists `{"id", "path", "scale"}`; POST takes `[{"id", "scale"}, ...]` and sets the
global scales (an adapter left out is off, as llama-server does). Both act on the default
model unless `?model=` names another loaded one. Running requests keep the adapters they
started with; a request picks its own with `"lora": [{"id", "scale"}]` (engine/adapters.py).
"""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import Field, TypeAdapter, ValidationError

from localllm.config import Settings
from localllm.engine import adapters
from localllm.engine.client import EngineClient
from localllm.server import wire

router = APIRouter()


_SCALES = TypeAdapter(Annotated[list[wire.LoraScale], Field(max_length=1024)])


@router.api_route("/lora-adapters", methods=["GET", "POST"])
async def lora_adapters(request: Request, model: str | None = None) -> JSONResponse:
    """GET: the adapters and their global scales; POST `[{"id", "scale"}, ...]`: set them."""
    if request.method == "GET":
        rows = await _on_model(request, model, lambda m: adapters.describe(m.adapters))
        return JSONResponse(rows)
    try:
        asked = wire.lora_scales(_SCALES.validate_json(await request.body())) or ()
    except ValidationError as exc:  # answered as any body that does not validate
        raise RequestValidationError(
            [{**e, "loc": ("body", *e["loc"])} for e in exc.errors()]
        ) from None

    def work(m: Any) -> list[dict[str, object]]:
        adapters.set_global(m.adapters, asked)
        return adapters.describe(m.adapters)

    rows = await _on_model(request, model, work)
    return JSONResponse({"success": True, "adapters": rows})


async def _on_model(request: Request, model: str | None, fn: Any) -> Any:
    engine: EngineClient = request.app.state.engine
    settings: Settings = request.app.state.settings
    return await asyncio.to_thread(
        engine.with_model, model, fn, allow_paths=settings.allow_model_paths
    )
