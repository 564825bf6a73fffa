"""A lean HTTP/1.1 client and server for the router's hot paths.

The router's per-request work is mostly HTTP: the dispatch to a region (proxy mode), the
``/v1/route`` answer (direct mode), the OpenAI-compatible front door. On these hosts httpx
costs about 1 ms of CPU per request and a Starlette app about 0.3 ms; this package, on
httptools' C parser (and uvloop where the process runs on it), costs a few tens of
microseconds. It knows nothing of the scheduler: bytes, headers, timeouts.

- ``scheduler.http.client.HttpClient``: keep-alive pools per origin, streamed bodies,
  timeouts that never cancel the caller's task (scheduler.tasks explains why that matters on
  Python 3.11).
- ``scheduler.http.server.HttpServer``: routes to handlers, chunked streaming answers, limits
  (header and body size, connections, slow clients), 100-continue, keep-alive.
"""
