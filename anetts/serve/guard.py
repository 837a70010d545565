"""What a request must pass before the app reads its body, as ASGI middleware (outermost first):

1. :class:`ErrorBoundary`: an unexpected exception becomes a 500 in OpenAI's shape and the connection
   stays usable; once a response has started, the exception is raised on, so the server aborts the
   connection and a client sees a cut response as cut, never as a complete one.
2. :class:`HostCheck`: the ``Host`` header must name this server (loopback names when it is bound to
   loopback), so a page on another site cannot reach it through DNS rebinding.
3. CORS (Starlette's, only for ``--cors-origin``), then :class:`WriteOrigin`: a request that changes
   something (POST, DELETE, ...) from a browser page of another origin is refused unless that origin
   is allowed. A multipart POST is a CORS "simple request", sent without a preflight, so CORS alone
   would not stop a foreign page from registering voices blind.
4. :class:`KeyCheck`: with API keys, ``/v1`` needs ``Authorization: Bearer <key>``, checked in constant
   time before a byte of the body is read.
5. :class:`BodyLimit`: a body over the limit is a 413, whether declared or streamed.
"""
from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from anetts.serve.errors import APIError, error_body

log = logging.getLogger("anetts.serve")

API_KEY_ENV = "ANETTS_API_KEY"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
PROTECTED_PREFIX = "/v1/"


# ------------------------------------------------------------------------------------ keys

@dataclass(frozen=True)
class ApiKey:
    """A key clients send, and the owner id it stands for (what a voice store records, never the key)."""

    secret: bytes
    owner: str


def _checked(secret: str, where: str) -> str:
    secret = secret.strip()
    if not secret or any(ch.isspace() for ch in secret) or not secret.isprintable():
        raise ValueError(f"{where}: an API key is one printable word without spaces")
    return secret


def api_keys(secrets_: tuple[str, ...] | list[str]) -> tuple[ApiKey, ...]:
    """The keys a server accepts, each with the owner id it stands for (a hash of the key, never the key)."""
    return tuple(ApiKey(s.encode(), "key_" + hashlib.sha256(s.encode()).hexdigest()[:12])
                 for s in (_checked(s, f"API key {i + 1}") for i, s in enumerate(secrets_)))


def read_keys(key_file: Path | None = None, environ=os.environ) -> tuple[str, ...]:
    """The API keys: one per line of ``key_file`` (``#`` starts a comment), else ``$ANETTS_API_KEY``.
    Neither comes from the command line, where ``ps`` shows it to every local user."""
    if key_file is not None:
        try:
            lines = Path(key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"cannot read the API key file {key_file}: {e}") from None
        keys = [_checked(line.split("#", 1)[0], f"{key_file} line {n}") for n, line in enumerate(lines, 1)
                if line.split("#", 1)[0].strip()]
        if not keys:
            raise ValueError(f"the API key file {key_file} holds no key")
    elif environ.get(API_KEY_ENV):
        keys = [_checked(environ[API_KEY_ENV], f"${API_KEY_ENV}")]
    else:
        return ()
    if len(set(keys)) != len(keys):
        raise ValueError(f"the API key file {key_file} lists a key twice")
    return tuple(keys)


def key_owner(keys: tuple[ApiKey, ...], authorization: str | None) -> str | None:
    """The owner of the bearer key in an ``Authorization`` header, or None. Every key is compared, in
    constant time each, so the time taken does not tell which key came close."""
    scheme, _, token = (authorization or "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    given = token.strip().encode()
    found = None
    for k in keys:
        if secrets.compare_digest(given, k.secret):
            found = k.owner
    return found


# ------------------------------------------------------------------------------------ hosts

def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _is_wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::", "[::]")


def allowed_hosts(bind: str, extra: list[str] | tuple[str, ...] = ()) -> frozenset[str] | None:
    """Host names a request may name for a server bound to ``bind``: the loopback names and the bound
    address, plus ``extra``; None (any) for a wildcard bind with no ``extra`` (the operator has exposed
    the server to every network it is on, under names it did not give)."""
    extra = tuple(h.lower().strip("[]") for h in extra)
    if _is_wildcard(bind) and not extra:
        return None
    names = {*LOOPBACK_NAMES, *extra}
    if not _is_wildcard(bind):
        names.add(bind.lower().strip("[]"))
    return frozenset(names)


def _host_name(value: str) -> str:
    """``example.org:8000`` -> ``example.org``; ``[::1]:8000`` -> ``::1``."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


# ------------------------------------------------------------------------------------ middleware

def _headers(scope) -> dict[bytes, bytes]:
    return {k.lower(): v for k, v in scope.get("headers") or []}


async def send_error(send, e: APIError) -> None:
    """An APIError as a whole JSON response, sent straight from middleware."""
    body = json.dumps(error_body(e.message, e.type, e.param, e.code)).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
               *((k.lower().encode(), v.encode()) for k, v in e.headers.items())]
    await send({"type": "http.response.start", "status": e.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class ErrorBoundary:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracked(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except Exception:
            if started:  # the status is out: abort the connection rather than end the body cleanly
                raise
            log.exception("%s %s failed", scope.get("method"), scope.get("path"))
            await send_error(send, APIError(500, "the server failed to make this response; its log has the "
                                                 "details", type="server_error"))


class HostCheck:
    def __init__(self, app, hosts: frozenset[str] | None):
        self.app, self.hosts = app, hosts

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.hosts is not None:
            host = _headers(scope).get(b"host", b"").decode("latin-1")
            if _host_name(host) not in self.hosts:
                return await send_error(send, APIError(
                    400, f"Host {host[:80]!r} is not a name of this server (allowed: {sorted(self.hosts)}; "
                         "add names with --allowed-host)", param="Host", code="host_not_allowed"))
        return await self.app(scope, receive, send)


class WriteOrigin:
    def __init__(self, app, cors_origins: list[str] | tuple[str, ...] = ()):
        self.app, self.allowed = app, {o.rstrip("/").lower() for o in cors_origins}

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope.get("method", "").upper() in WRITE_METHODS:
            h = _headers(scope)
            origin = h.get(b"origin")
            if origin is not None:
                origin_s = origin.decode("latin-1").rstrip("/").lower()
                parts = urlsplit(origin_s)
                same = parts.scheme in ("http", "https") and parts.netloc == h.get(b"host", b"").decode("latin-1").lower()
                if not same and origin_s not in self.allowed:
                    return await send_error(send, APIError(
                        403, f"a page from {origin_s[:80]!r} may not {scope['method']} here: this server takes "
                             "writes from its own page and from origins allowed with --cors-origin",
                        param="Origin", code="origin_not_allowed", type="permission_error"))
        return await self.app(scope, receive, send)


class KeyCheck:
    def __init__(self, app, keys: tuple[str, ...] = ()):
        self.app, self.keys = app, api_keys(keys)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        owner = None
        if self.keys and scope.get("path", "").startswith(PROTECTED_PREFIX):
            auth = _headers(scope).get(b"authorization", b"").decode("latin-1")
            owner = key_owner(self.keys, auth)
            if owner is None:
                return await send_error(send, APIError(
                    401, "missing or wrong API key: send it as 'Authorization: Bearer <key>'", code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"}))
        scope.setdefault("state", {})["owner"] = owner
        return await self.app(scope, receive, send)


class BodyLimit:
    """Requests whose body is larger than ``limit`` bytes get a 413, declared or not."""

    def __init__(self, app, limit: int):
        self.app, self.limit = app, limit

    def _error(self, size: str) -> APIError:
        return APIError(413, f"the request body is {size}, more than this server's limit of {self.limit} bytes",
                        param="body", code="body_too_large")

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _headers(scope).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return await send_error(send, self._error(f"{int(declared)} bytes"))
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise self._error(f"over {self.limit} bytes")
            return message

        await self.app(scope, limited, send)
