"""Every error the server sends is OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``.

Client faults are 4xx naming the field (``param``); anything else is a 500 whose message says only
that the server failed (the traceback goes to the server's log, never into the response).
"""
from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger("anetts.serve")


class APIError(StarletteHTTPException):
    """A response in OpenAI's error shape. An HTTPException, so that one raised while FastAPI reads the
    body (the body limit) reaches its handler as itself, not as FastAPI's "error parsing the body"."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(status, message, headers)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def __str__(self) -> str:
        return self.message


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def error_response(e: APIError) -> JSONResponse:
    return JSONResponse(error_body(e.message, e.type, e.param, e.code), status_code=e.status, headers=e.headers)


def _field(loc) -> str | None:
    """The top-level request field a validation error is about (OpenAI's `param`): `body.voice.id` -> `voice`."""
    parts = [p for p in loc if isinstance(p, str) and p not in ("body", "query", "path", "header")]
    return parts[0] if parts else None


def _validation_message(err: dict) -> str:
    field = _field(err.get("loc", ())) or "request body"
    kind, msg = err.get("type", ""), err.get("msg", "invalid")
    if kind == "json_invalid":
        return f"the request body is not valid JSON: {err.get('ctx', {}).get('error', msg)}"
    if kind == "missing":
        return f"{field} is required"
    if kind == "extra_forbidden":
        return f"{field} is not a field of this request"
    if kind == "model_attributes_type" or kind == "dict_type":
        return f"{field}: expected a JSON object"
    return f"{field}: {msg}"


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api(_: Request, e: APIError):
        return error_response(e)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, e: RequestValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        return error_response(APIError(400, _validation_message(first), param=_field(first.get("loc", ()))))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, e: StarletteHTTPException):
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return error_response(APIError(e.status_code, str(e.detail), type=kind, headers=getattr(e, "headers", None)))
