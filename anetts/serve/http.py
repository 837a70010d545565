"""uvicorn's h11 protocol with a deadline on reading a request's head.

uvicorn closes an idle keep-alive connection after ``timeout_keep_alive``, but once a client has sent
one byte of a request line it waits for the rest of the head for ever, so a client that drips its
headers a byte at a time holds a connection (and a file descriptor) as long as it likes. Here the
head of every request, from its first byte (or from the connection's opening), must arrive within ``header_timeout`` seconds, or the
connection gets a 408 and is closed.
"""
from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from anetts.serve.config import HEADER_TIMEOUT_S


class HeadTimeoutH11(H11Protocol):
    header_timeout = HEADER_TIMEOUT_S
    _head_timer: asyncio.TimerHandle | None = None

    def _awaiting_head(self) -> bool:
        return self.conn.their_state is h11.IDLE

    def _arm(self) -> None:
        if self._head_timer is None and self._awaiting_head():
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_timed_out)

    def connection_made(self, transport) -> None:  # a connection that never sends a byte is closed too
        super().connection_made(transport)
        self._arm()

    def data_received(self, data: bytes) -> None:
        self._arm()
        super().data_received(data)
        if self._head_timer is not None and not self._awaiting_head():
            self._head_timer.cancel()
            self._head_timer = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().connection_lost(exc)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing() or not self._awaiting_head():
            return
        self.logger.info("closing a connection whose request head took longer than %g s", self.header_timeout)
        body = b"the request head took longer than this server waits for it\n"
        self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                             b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        self.transport.close()


def protocol_with(header_timeout: float) -> type[HeadTimeoutH11]:
    """The protocol class for uvicorn's ``http=`` with this deadline on each request head."""
    return type("HeadTimeoutH11", (HeadTimeoutH11,), {"header_timeout": float(header_timeout)})
