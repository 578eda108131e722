"""The FastAPI app: routes, API-key check, and errors in each API's own format."""

import hashlib
import hmac
import logging
import time
from typing import Sequence, Union

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from . import anthropic_api, openai_api, responses_api
from .common import ANTHROPIC_ERROR_TYPES, APIError
from .engine import Engine
from .tools import tool_format

log = logging.getLogger(__name__)

# Default cap on a request body: far above any agent's request (Claude Code's
# first turn is ~0.2 MB), far below what would exhaust memory.
MAX_REQUEST_BYTES = 32 << 20

def error_response(
    request: Request, status: int, message: str, *, type_=None, param=None, code=None
) -> JSONResponse:
    """Anthropic's error shape under /v1/messages, OpenAI's everywhere else."""
    if request.url.path.startswith("/v1/messages"):
        kind = ANTHROPIC_ERROR_TYPES.get(status, "invalid_request_error")
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


class BodyLimit:
    """ASGI middleware: read a request body whole, answering 413 past `max_bytes`.

    The app then gets the body in one piece; the disconnect that follows it
    still reaches the app through the original `receive`.
    """

    def __init__(self, app, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD"):
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.max_bytes:
            return await self._reject(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._reject(scope, receive, send)
            more = message.get("more_body", False)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _reject(self, scope, receive, send):
        request = Request(scope, receive)
        response = error_response(
            request,
            413,
            f"the request body is larger than this server's limit of "
            f"{self.max_bytes} bytes (--max-request-bytes)",
            code="request_too_large",
        )
        await response(scope, receive, send)


class LastResort:
    """ASGI middleware: a bug, not a bad request, still gets the API's JSON format.

    It logs the traceback once and answers 500 (an exception handler for
    Exception would re-raise to uvicorn, which logs again and drops the
    connection). Plain ASGI, as for `KeyCheck`.
    """

    def __init__(self, app, metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as e:
            log.exception("unhandled error on %s", scope["path"])
            if started:  # too late for a status; the connection ends
                raise
            self.metrics.requests.labels(scope["path"], "500").inc()
            request = Request(scope, receive)
            response = error_response(request, 500, f"internal error ({type(e).__name__})")
            await response(scope, receive, send)


class KeyCheck:
    """ASGI middleware: every route but /health needs one of `keys`.

    The matching key's digest names the request's prompt-cache entries
    (`request.state.cache_key`), so the cache never holds a raw key. Plain
    ASGI rather than `@app.middleware`: Starlette's BaseHTTPMiddleware hides
    a client's disconnect from the route, which must see it to cancel.
    """

    def __init__(self, app, keys: Sequence[str]):
        self.app, self.keys = app, [k.encode() for k in keys]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] == "/health":
            return await self.app(scope, receive, send)
        request = Request(scope, receive)
        auth = request.headers.get("authorization", "")
        given = request.headers.get("x-api-key") or (
            auth[7:] if auth.lower().startswith("bearer ") else ""
        )
        given = given.encode("latin-1")
        match = [k for k in self.keys if hmac.compare_digest(given, k)]
        if not match:
            response = error_response(
                request, 401, "invalid or missing API key", code="invalid_api_key"
            )
            return await response(scope, receive, send)
        scope.setdefault("state", {})["cache_key"] = hashlib.sha256(
            match[0]
        ).hexdigest()[:16]
        await self.app(scope, receive, send)


def create_app(
    engine: Engine,
    *,
    api_key: Union[str, Sequence[str], None] = None,
    max_request_bytes: int = MAX_REQUEST_BYTES,
) -> FastAPI:
    """Build the app around a started `Engine`.

    Args:
        engine: owns the model on its generation thread.
        api_key: a key or several; when set, every route but /health needs
          one, as `Authorization: Bearer KEY` or `x-api-key: KEY`. Each key
          has its own prompt-cache entries (and `cached_tokens`).
        max_request_bytes: larger request bodies are answered 413.
    """
    keys = [api_key] if isinstance(api_key, str) else list(api_key or [])
    app = FastAPI(title="mlx-dflash", docs_url=None, redoc_url=None)
    app.include_router(openai_api.make_router(engine))
    app.include_router(anthropic_api.make_router(engine))
    app.include_router(responses_api.make_router(engine))
    app.add_middleware(BodyLimit, max_bytes=max_request_bytes)
    started = int(time.time())

    app.add_middleware(LastResort, metrics=engine.metrics)
    if keys:
        app.add_middleware(KeyCheck, keys=keys)

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
                "tool_format": tool_format(engine.tokenizer),
                "distributed": engine.config.distributed,
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
