"""The FastAPI app: routes, API-key check, and errors in each API's own format."""

import hmac
import logging
import time
from typing import Optional

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from . import anthropic_api, openai_api
from .common import APIError
from .engine import Engine

log = logging.getLogger(__name__)

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "overloaded_error",
}


def error_response(
    request: Request, status: int, message: str, *, type_=None, param=None, code=None
) -> JSONResponse:
    """Anthropic's error shape under /v1/messages, OpenAI's everywhere else."""
    if request.url.path.startswith("/v1/messages"):
        kind = _ANTHROPIC_TYPES.get(status, "invalid_request_error")
        body = {"type": "error", "error": {"type": kind, "message": message}}
    else:
        if type_ is None:
            type_ = "invalid_request_error" if status < 500 else "server_error"
        body = {
            "error": {"message": message, "type": type_, "param": param, "code": code}
        }
    return JSONResponse(body, status_code=status)


def _validation_message(exc: RequestValidationError):
    errs = exc.errors()
    if not errs:
        return "invalid request", None
    e = errs[0]
    loc = [str(x) for x in e.get("loc", ()) if x != "body"]
    if e.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    if e.get("type") == "extra_forbidden":
        return f"Unrecognized request argument supplied: {'.'.join(loc)}", loc[0]
    where = ".".join(loc) or "body"
    # A validator's ValueError reads as itself, without pydantic's "Value error, ".
    msg = str(e["ctx"]["error"]) if e.get("type") == "value_error" else e.get("msg")
    return f"{where}: {msg}", (loc[0] if loc else None)


def create_app(engine: Engine, *, api_key: Optional[str] = None) -> FastAPI:
    """Build the app around a started `Engine`.

    Args:
        engine: owns the model on its generation thread.
        api_key: when set, every route but /health needs it, as
          `Authorization: Bearer KEY` or `x-api-key: KEY`.
    """
    app = FastAPI(title="mlx-dflash", docs_url=None, redoc_url=None)
    app.include_router(openai_api.make_router(engine))
    app.include_router(anthropic_api.make_router(engine))
    started = int(time.time())

    @app.middleware("http")
    async def last_resort(request: Request, call_next):
        # A bug, not a bad request: log the traceback once and answer JSON in the
        # API's own format (an exception handler for Exception would re-raise it
        # to uvicorn, which logs it again and drops the connection).
        try:
            return await call_next(request)
        except Exception as e:
            log.exception("unhandled error on %s", request.url.path)
            engine.metrics.requests.labels(request.url.path, "500").inc()
            return error_response(request, 500, f"internal error ({type(e).__name__})")

    @app.middleware("http")
    async def check_key(request: Request, call_next):
        if api_key and request.url.path != "/health":
            auth = request.headers.get("authorization", "")
            given = request.headers.get("x-api-key") or (
                auth[7:] if auth.lower().startswith("bearer ") else ""
            )
            if not hmac.compare_digest(given.encode(), api_key.encode()):
                return error_response(
                    request, 401, "invalid or missing API key", code="invalid_api_key"
                )
        return await call_next(request)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError):
        engine.metrics.requests.labels(request.url.path, str(exc.status)).inc()
        return error_response(
            request,
            exc.status,
            exc.message,
            type_=exc.type,
            param=exc.param,
            code=exc.code,
        )

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError):
        engine.metrics.requests.labels(request.url.path, "400").inc()
        message, param = _validation_message(exc)
        return error_response(request, 400, message, param=param)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        return error_response(request, exc.status_code, str(exc.detail))

    @app.get("/health")
    async def health():
        if not engine.alive:
            return JSONResponse(
                {"status": "error", "detail": "generation thread stopped"},
                status_code=503,
            )
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        card = {
            "id": engine.config.model_name,
            "object": "model",
            "created": started,
            "owned_by": "mlx-dflash",
            "type": "model",
            "display_name": engine.config.model_name,
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "mlx_dflash": {
                "drafter": engine.drafter_name,
                "block_size": engine.block_size,
                "greedy_engine": engine.engine_name(0.0),
                "sampling_engine": engine.engine_name(1.0),
                "max_context": engine.config.max_context,
            },
        }
        return {
            "object": "list",
            "data": [card],
            "has_more": False,
            "first_id": card["id"],
            "last_id": card["id"],
        }

    @app.get("/metrics")
    async def metrics():
        return Response(
            generate_latest(engine.metrics.registry), media_type=CONTENT_TYPE_LATEST
        )

    return app
