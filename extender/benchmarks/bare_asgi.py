"""The least an ASGI answer costs here: read the body, answer fixed JSON bytes (the HTTP floor of the benchmark).

python -m uvicorn --app-dir extender/benchmarks bare_asgi:app --http httptools --loop uvloop
"""

from __future__ import annotations

_ANSWER = b'{"status":"ok"}'
_HEADERS = [(b"content-type", b"application/json"), (b"content-length", str(len(_ANSWER)).encode())]


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    more = True
    while more:  # the body, read whole as the extender reads it
        message = await receive()
        more = message.get("more_body", False)
    await send({"type": "http.response.start", "status": 200, "headers": _HEADERS})
    await send({"type": "http.response.body", "body": _ANSWER})
