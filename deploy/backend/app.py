#!/usr/bin/env python3
"""A stand-in for the FastAPI Claude Code backend that ils-gateway sits in front of.

It never calls a model: every answer is deterministic fake text, so it can run anywhere (CI, a laptop with no
credentials) and so tests can check exactly what came through the gateway. It covers the traffic shapes the real
backend produces -- short JSON answers, Server-Sent Event streams, other streamed bodies, WebSockets, large
downloads and uploads, slow responses -- plus a few /debug endpoints that let a test see what the backend
actually received and whether it noticed a client going away.

    python3 deploy/backend/app.py --host 127.0.0.1 --port 8000
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import logging
import random
import time
from typing import AsyncIterator, Callable, Iterator, Optional

import uvicorn
from fastapi import FastAPI, Query, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel
from sse_starlette.sse import EventSourceResponse

log = logging.getLogger("ils-sample-backend")

app = FastAPI(title="ils-gateway sample backend", version="1.0")


# --------------------------------------------------------------------------------------------------------------
# Stream bookkeeping
#
# The gateway promises that when a client hangs up, the backend learns about it quickly (so a real backend stops
# paying for model tokens nobody will read). The only way to observe that from outside is for the backend to count
# how its streams ended, so every streaming response below is wrapped in TrackedStream, which reports here.
# --------------------------------------------------------------------------------------------------------------


class StreamStats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.active = 0
        self.completed = 0
        self.disconnected = 0
        self.last_disconnect_at: Optional[float] = None

    def snapshot(self) -> dict:
        return {
            "active": self.active,
            "completed": self.completed,
            "disconnected": self.disconnected,
            "last_disconnect_at": self.last_disconnect_at,
        }


stats = StreamStats()


class TrackedStream(Response):
    """Wraps a streaming response and records in `stats` how it ended.

    Starlette's StreamingResponse and sse-starlette's EventSourceResponse both run the body generator next to a
    task that waits for the ASGI `http.disconnect` message; when the client goes away they cancel the generator
    (asyncio.CancelledError at whatever `await` it is parked on) and return. The cancellation can land either
    inside the generator or inside the `send` that follows a `yield`, so the generator alone cannot reliably tell.
    Watching at the ASGI level can: the stream was cut by the client if the body never reached its end and the
    server reported `http.disconnect`. Anything else that stops a stream early (an error, server shutdown) is
    deliberately not counted as a client disconnect.
    """

    def __init__(self, kind: str, make_response: Callable[[AsyncIterator], Response], body: AsyncIterator) -> None:
        self.kind = kind
        self.finished = False
        self.generator_cancelled = False
        self.inner = make_response(self._watch(body))
        # FastAPI attaches its background tasks here; the inner response is the one that runs them.
        self.background = None
        self.status_code = self.inner.status_code
        self.raw_headers = self.inner.raw_headers

    async def _watch(self, body: AsyncIterator) -> AsyncIterator:
        try:
            async for item in body:
                yield item
            self.finished = True
        except asyncio.CancelledError:
            self.generator_cancelled = True
            raise
        finally:
            # Close the inner generator now rather than whenever the garbage collector gets to it.
            await body.aclose()

    async def __call__(self, scope, receive, send) -> None:
        saw_disconnect = False

        async def watched_receive():
            nonlocal saw_disconnect
            message = await receive()
            if message["type"] == "http.disconnect":
                saw_disconnect = True
            return message

        if self.background is not None and self.inner.background is None:
            self.inner.background = self.background
        stats.active += 1
        try:
            await self.inner(scope, watched_receive, send)
        finally:
            stats.active -= 1
            if self.finished:
                stats.completed += 1
            elif saw_disconnect:
                stats.disconnected += 1
                stats.last_disconnect_at = time.time()
                log.info("%s stream: client disconnected (generator cancelled: %s)", self.kind, self.generator_cancelled)
            else:
                log.warning("%s stream: ended early without a client disconnect", self.kind)


# --------------------------------------------------------------------------------------------------------------
# Claude-like endpoints
# --------------------------------------------------------------------------------------------------------------


def fake_answer(prompt: str) -> str:
    # Deterministic, so a test can predict it; it echoes the prompt so a test can tell requests apart.
    return f"This is a canned answer to: {prompt}"


class QueryRequest(BaseModel):
    prompt: str


class StreamRequest(BaseModel):
    prompt: str = "hello"
    n: int = 5
    interval_ms: int = 200


@app.get("/health")
async def health() -> dict:
    return {"status": "ok"}


@app.post("/claude/query")
async def claude_query(body: QueryRequest) -> dict:
    return {"answer": fake_answer(body.prompt), "prompt": body.prompt}


async def sse_events(prompt: str, n: int, interval_ms: int) -> AsyncIterator[dict]:
    words = fake_answer(prompt).split()
    for i in range(n):
        if i:
            await asyncio.sleep(interval_ms / 1000)
        # emitted_at is taken just before the event is handed to the server, so a test on the same machine can
        # tell whether an event reached it before a later one was even produced (i.e. nothing buffered it).
        payload = {"index": i, "text": words[i % len(words)], "emitted_at": time.time()}
        yield {"event": "message", "data": json.dumps(payload)}
    yield {"event": "done", "data": json.dumps({"count": n})}


def sse_response(req: StreamRequest) -> Response:
    return TrackedStream(
        "sse",
        # Real SSE backends commonly set X-Accel-Buffering for nginx; harmless here and lets tests see it pass.
        lambda body: EventSourceResponse(body, headers={"X-Accel-Buffering": "no", "Cache-Control": "no-cache"}),
        sse_events(req.prompt, req.n, req.interval_ms),
    )


@app.get("/claude/stream")
async def claude_stream_get(
    prompt: str = "hello", n: int = Query(5, ge=0), interval_ms: int = Query(200, ge=0)
) -> Response:
    return sse_response(StreamRequest(prompt=prompt, n=n, interval_ms=interval_ms))


@app.post("/claude/stream")
async def claude_stream_post(body: StreamRequest) -> Response:
    return sse_response(body)


@app.get("/claude/sessions")
async def claude_sessions() -> list:
    return [
        {"id": "sess-0001", "title": "Refactor the parser", "created_at": "2025-01-01T10:00:00Z", "turns": 12},
        {"id": "sess-0002", "title": "Write release notes", "created_at": "2025-01-02T09:30:00Z", "turns": 3},
    ]


# --------------------------------------------------------------------------------------------------------------
# Other traffic shapes
# --------------------------------------------------------------------------------------------------------------


@app.websocket("/ws/echo")
async def ws_echo(ws: WebSocket) -> None:
    await ws.accept()
    try:
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is not None:
                await ws.send_text(message["text"])
            elif message.get("bytes") is not None:
                await ws.send_bytes(message["bytes"])
    except WebSocketDisconnect:
        return


async def plain_chunks(n: int, interval_ms: int) -> AsyncIterator[bytes]:
    for i in range(n):
        if i:
            await asyncio.sleep(interval_ms / 1000)
        yield f"chunk {i} emitted_at={time.time():.6f}\n".encode()


@app.get("/stream/plain")
async def stream_plain(n: int = Query(5, ge=0), interval_ms: int = Query(200, ge=0)) -> Response:
    # application/octet-stream on purpose: a proxy that only streams text/event-stream and buffers everything
    # else would pass the SSE tests and fail this one.
    return TrackedStream(
        "plain",
        lambda body: StreamingResponse(body, media_type="application/octet-stream"),
        plain_chunks(n, interval_ms),
    )


BYTES_CHUNK = 64 * 1024


def pseudorandom_blocks(size: int, seed: int) -> Iterator[bytes]:
    """The same bytes for the same (size, seed), however they are consumed.

    random.Random is fast enough for tens of MiB and is stable across Python versions for randbytes; the chunk
    size is fixed so /bytes and /bytes/sha256 always draw identical sequences.
    """
    rng = random.Random(seed)
    remaining = size
    while remaining > 0:
        n = min(BYTES_CHUNK, remaining)
        yield rng.randbytes(n)
        remaining -= n


@app.get("/bytes")
async def bytes_download(
    size: int = Query(1024, ge=0), seed: int = 0, chunked: int = 0
) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        for block in pseudorandom_blocks(size, seed):
            yield block
            # A real suspension point. Without it, a download whose client left ran to its end without letting the
            # event loop run (uvicorn's `send` returns at once after a disconnect, and anyio can miss the cancel of a
            # task it just woke), so 100 abandoned 256 MiB downloads kept this server from accepting any connection
            # for up to two minutes, which looked like an overlay that had stopped serving.
            await asyncio.sleep(0)

    # With an explicit Content-Length uvicorn frames the body by length; without one it uses chunked encoding.
    # Both must survive the gateway unchanged.
    headers = {} if chunked else {"Content-Length": str(size)}
    return StreamingResponse(body(), media_type="application/octet-stream", headers=headers)


@app.get("/bytes/sha256")
async def bytes_sha256(size: int = Query(1024, ge=0), seed: int = 0) -> dict:
    # A hash header cannot precede a streamed body, so tests fetch the expected digest separately.
    h = hashlib.sha256()
    for block in pseudorandom_blocks(size, seed):
        h.update(block)
    return {"sha256": h.hexdigest(), "size": size}


@app.post("/upload")
async def upload(request: Request) -> dict:
    # Read incrementally: the point is to see what arrives, not to hold it all in memory.
    h = hashlib.sha256()
    n = 0
    async for chunk in request.stream():
        h.update(chunk)
        n += len(chunk)
    return {"bytes": n, "sha256": h.hexdigest()}


@app.get("/slow-headers")
async def slow_headers(delay_s: float = Query(5.0, ge=0)) -> dict:
    # Stands in for a non-streamed /claude/query that thinks for a long time before answering.
    await asyncio.sleep(delay_s)
    return {"slept": delay_s}


# --------------------------------------------------------------------------------------------------------------
# Debug endpoints (what did the backend actually see?)
# --------------------------------------------------------------------------------------------------------------


@app.api_route("/debug/headers", methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
async def debug_headers(request: Request) -> dict:
    headers: dict = {}
    # request.headers.raw keeps duplicates and order, which a dict of str would lose.
    for name, value in request.headers.raw:
        headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
    return {
        "headers": headers,
        "client": request.client.host if request.client else None,
        "method": request.method,
        "path": request.url.path,
        "query": request.url.query,
    }


@app.get("/debug/streams")
async def debug_streams() -> dict:
    return stats.snapshot()


@app.post("/debug/reset")
async def debug_reset() -> dict:
    stats.reset()
    return stats.snapshot()


# --------------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description="Sample Claude Code backend for ils-gateway (fake answers).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    args = parser.parse_args()

    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        # The gateway is the only client; X-Forwarded-* must reach /debug/headers untouched and request.client
        # must be the real TCP peer, so uvicorn must not interpret proxy headers itself.
        proxy_headers=False,
        # Tests stop and restart this process; open SSE streams must not hold shutdown up for long.
        timeout_graceful_shutdown=1,
    )


if __name__ == "__main__":
    main()
