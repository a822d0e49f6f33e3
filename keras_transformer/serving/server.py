"""`keras-transformer serve`: any exported translator over HTTP, with TF Serving's REST API.

    keras-transformer serve RUN_DIR/export/translator_dynamic_range.tflite
    curl -d '{"instances": ["A man rides a bike."]}' \\
        localhost:8501/v1/models/translator:predict

Serves a SavedModel, a `.tflite` file, a CTranslate2 directory or a run directory (its
SavedModel) on Starlette and uvicorn: an ASGI framework and server that are small (no
validation layer: the request formats are TF Serving's, parsed in `rest_api`), run
requests concurrently on one event loop (what batching across requests needs: many
waiting requests cost no threads), and drain in-flight requests on SIGTERM. Routes:

- `POST /v1/models/NAME[/versions/1]:predict`, `GET /v1/models/NAME[/metadata]`: TF
  Serving's REST API (`rest_api`) for every signature the artifact holds;
- `POST /translate`: `{"sentences": [...], "beam": true, "n_best": 3, "alignment":
  true, "prefixes": [...], "seed": 7}` in, one object per sentence out (`translate_api`);
- `GET /`: a page to translate from a browser (`page.html`);
- `GET /healthz` (the process answers), `GET /readyz` (the first translation has
  run), `GET /metrics` (Prometheus: requests, errors, latency, batch sizes, queue).

Sentences of concurrent requests are batched (`batching.Batcher`). Limits
(`ServerOptions`): body size (413), sentences per request (400), a timeout per request
(body included: 408 while reading it, 504 after), a bounded queue (503 with
`Retry-After`); sentences longer than the artifact's limit are truncated by the
artifact. With the environment variable `ServerOptions.token_env` set, every route but
`/`, `/healthz` and `/readyz` needs `Authorization: Bearer <its value>` (401).
Errors are `{"error": message}`, as TF Serving's.
"""

import asyncio
import contextlib
import dataclasses
import hmac
import importlib.resources
import json
import logging
import os
import time

from keras_transformer import files

# The rest (NumPy, the runners, Starlette) is imported where it is used: the command
# line reads `ServerOptions` and the defaults below to build its parser.

logger = logging.getLogger(__name__)

# TF Serving's REST port.
DEFAULT_PORT = 8501
DEFAULT_MODEL_NAME = "translator"
# The sentence translated before the server says it is ready.
WARM_UP_SENTENCE = b"A man rides a bike."


@dataclasses.dataclass(frozen=True)
class ServerOptions:
    """What `serve` allows and how it batches.

    Attributes:
        model_name: str. NAME in TF Serving's paths.
        max_batch_size: int. Most sentences per call of the artifact.
        batch_timeout_ms: float. How long a batch waits for more sentences.
        max_queued_sentences: int. Sentences waiting beyond this are refused (503).
        max_body_bytes: int. Largest request body (413).
        max_sentences: int. Most sentences per request (400).
        request_timeout_s: float. Longest a request may take, reading its body
            included (408 while reading, 504 after).
        token_env: str. The environment variable whose value, when set, is the bearer
            token every API route requires.
        threads: int or `None`. Threads of the runtime (each runtime's default).
    """

    model_name: str = DEFAULT_MODEL_NAME
    max_batch_size: int = 32
    batch_timeout_ms: float = 5.0
    max_queued_sentences: int = 1024
    max_body_bytes: int = 10 * 2**20
    max_sentences: int = 1000
    request_timeout_s: float = 60.0
    token_env: str = "KERAS_TRANSFORMER_TOKEN"
    threads: int = None

    def __post_init__(self):
        if self.max_sentences > self.max_queued_sentences:
            raise ValueError(f"max_sentences ({self.max_sentences}) exceeds "
                             f"max_queued_sentences ({self.max_queued_sentences}): such a "
                             "request could never be queued (serve --max-sentences, "
                             "--max-queued-sentences).")


class Service:
    """An artifact's signatures behind a batcher, and what the routes report.

    Loads the artifact's default signature at once (a bad path fails here, before any
    port is opened) and its other signatures on first use, on the batcher's thread.

    Args:
        path: str. A run directory, SavedModel directory, `.tflite` file or CTranslate2
            directory.
        options: `ServerOptions`.
    """

    def __init__(self, path, options=ServerOptions()):
        from keras_transformer.serving import artifacts, batching, rest_api, runners

        self.options = options
        self.artifact = artifacts.resolve_artifact(path)
        self.signatures = runners.signature_names(self.artifact)
        # Hypotheses the n-best lists hold; `None` where no report or options say.
        self.n_best = _exported_n_best(self.artifact)
        if files.is_ctranslate2_dir(self.artifact) or self.artifact.endswith(".tflite"):
            self.signature_defs = rest_api.signature_defs(self.signatures,
                                                          n_best=self.n_best)
        else:
            self.signature_defs = rest_api.saved_model_signature_defs(self.artifact)
        self._runners = {files.GREEDY_SIGNATURE: runners.open_runner(
            self.artifact, threads=options.threads)}
        self.metrics = Metrics()
        self.batcher = batching.Batcher(
            self._call, max_batch_size=options.max_batch_size,
            batch_timeout=options.batch_timeout_ms / 1000,
            max_queued=options.max_queued_sentences, on_batch=self.metrics.batch)
        self.metrics.watch_queue(lambda: self.batcher.queued)
        self.ready = False

    def _call(self, signature, sentences, second):
        """Calls `signature` on the batcher's thread, opening its runner on first use."""
        from keras_transformer.serving import runners

        if signature not in self._runners:
            first = self._runners[files.GREEDY_SIGNATURE]
            self._runners[signature] = (
                first.with_signature(signature) if hasattr(first, "with_signature") else
                runners.open_runner(self.artifact, signature=signature,
                                    threads=self.options.threads))
        return self._runners[signature](sentences, second)

    async def warm_up(self):
        """Translates `WARM_UP_SENTENCE`; the server is ready after it."""
        try:
            await self.batcher.call(files.GREEDY_SIGNATURE, [WARM_UP_SENTENCE], None)
            self.ready = True
        except Exception:  # the process stays up, not ready, and says why
            logger.exception("The warm-up translation failed: %s is not ready.",
                             self.artifact)

    async def run(self, signature, sentences, second=None):
        """The outputs of `signature` on a request's sentences, batched."""
        from keras_transformer.serving import batching, rest_api

        if signature not in self.signatures:
            raise rest_api.RestError(rest_api.INVALID_ARGUMENT, f"{self.artifact} has no "
                                     f"signature {signature!r} (it holds "
                                     f"{', '.join(self.signatures)}).")
        if len(sentences) > self.options.max_sentences:
            raise rest_api.RestError(rest_api.INVALID_ARGUMENT, f"{len(sentences)} sentences "
                                     f"in one request, at most {self.options.max_sentences} "
                                     "may be (serve --max-sentences): split the request.")
        try:
            outputs = await self.batcher.run(signature, sentences, second)
        except batching.QueueFull as error:
            raise rest_api.RestError(rest_api.UNAVAILABLE, f"The server is busy: {error}. "
                                     "Retry later.", {"Retry-After": "1"}) from None
        self.metrics.sentences.labels(signature).inc(len(sentences))
        return outputs


class Metrics:
    """The Prometheus metrics of one server, in a registry of its own."""

    def __init__(self):
        import prometheus_client as prometheus  # here: the serve extra

        self.registry = prometheus.CollectorRegistry()
        self._prometheus = prometheus
        common = dict(registry=self.registry, namespace="keras_transformer")
        self.requests = prometheus.Counter(
            "requests", "HTTP requests answered, by route and status code.",
            ["route", "code"], **common)
        self.errors = prometheus.Counter(
            "request_errors", "Requests answered with a 4xx or 5xx status.",
            ["route", "code"], **common)
        self.latency = prometheus.Histogram(
            "request_seconds", "Time from a request's arrival to its answer.", ["route"],
            buckets=(.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60), **common)
        self.batch_sizes = prometheus.Histogram(
            "batch_size", "Sentences per call of the artifact.", ["signature"],
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256), **common)
        self.batch_seconds = prometheus.Histogram(
            "batch_seconds", "Time of one call of the artifact.", ["signature"], **common)
        self.sentences = prometheus.Counter(
            "sentences", "Sentences translated (or scored), by signature.", ["signature"],
            **common)
        self.queue = prometheus.Gauge(
            "queued_sentences", "Sentences waiting for a batch.", **common)

    def watch_queue(self, queued):
        self.queue.set_function(queued)

    def batch(self, signature, size, seconds):
        self.batch_sizes.labels(signature).observe(size)
        self.batch_seconds.labels(signature).observe(seconds)

    def answered(self, route, code, seconds):
        self.requests.labels(route, str(code)).inc()
        if code >= 400:
            self.errors.labels(route, str(code)).inc()
        self.latency.labels(route).observe(seconds)

    def text(self):
        return self._prometheus.generate_latest(self.registry)


def make_app(service):
    """Returns the Starlette application of `service` (`Service`)."""
    from starlette.applications import Starlette
    from starlette.responses import HTMLResponse, JSONResponse, Response
    from starlette.routing import Route

    from keras_transformer.serving import rest_api

    page = page_html(service.n_best)

    async def tf_serving(request, body):
        return await _tf_serving(service, request, body)

    async def translate(request, body):
        return _json_response(await _translate(service, body))

    async def healthz(request, body):
        return JSONResponse({"status": "ok"})

    async def readyz(request, body):
        if service.ready:
            return JSONResponse({"ready": True})
        return JSONResponse({"ready": False, "error": "the first translation has not run "
                             "yet"}, 503, headers={"Retry-After": "1"})

    async def metrics(request, body):
        return Response(service.metrics.text(), media_type="text/plain; version=0.0.4")

    async def index(request, body):
        return HTMLResponse(page)

    async def not_found(request, body):
        raise rest_api.RestError(rest_api.NOT_FOUND, f"No route {request.method} "
                                 f"{request.url.path}: see / for the page, /v1/models/"
                                 f"{service.options.model_name}:predict and /translate.")

    @contextlib.asynccontextmanager
    async def lifespan(app):
        warm_up = asyncio.get_running_loop().create_task(service.warm_up())
        yield
        warm_up.cancel()
        service.batcher.close()

    def route(path, name, function, methods, **options):
        return Route(path, _endpoint(service, name, function, **options), methods=methods)

    routes = [
        route("/", "page", index, ["GET"], needs_token=False),
        route("/healthz", "healthz", healthz, ["GET"], needs_token=False),
        route("/readyz", "readyz", readyz, ["GET"], needs_token=False),
        route("/metrics", "metrics", metrics, ["GET"]),
        route("/translate", "translate", translate, ["POST"], reads_body=True),
        route("/v1/{path:path}", "tf_serving", tf_serving, ["GET", "POST"], reads_body=True),
        route("/{path:path}", "other", not_found, ["GET", "POST", "PUT", "DELETE", "PATCH"],
              needs_token=False),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def _endpoint(service, route, function, *, needs_token=True, reads_body=False):
    """The Starlette endpoint of `function(request, body)` (`body`: the request's bytes
    when `reads_body`, else `None`): the bearer token checked (`needs_token`), the body
    read within its limits, the whole within the request timeout, a `RestError` answered
    as TF Serving does, any other failure answered 500 and logged, and every answer
    counted in `service.metrics` under `route`."""
    from starlette.responses import JSONResponse

    from keras_transformer.serving import rest_api

    options = service.options

    async def endpoint(request):
        started = time.monotonic()
        try:
            if needs_token:
                _check_token(request, options.token_env)
            deadline = started + options.request_timeout_s
            body = (await _read_body(request, options.max_body_bytes, deadline)
                    if reads_body else None)
            try:
                response = await asyncio.wait_for(
                    function(request, body), max(deadline - time.monotonic(), 0))
            except asyncio.TimeoutError:
                raise rest_api.RestError(rest_api.DEADLINE_EXCEEDED, "Deadline exceeded: "
                                         f"the request took more than "
                                         f"{options.request_timeout_s:g} s (serve "
                                         "--request-timeout).") from None
        except rest_api.RestError as error:
            response = JSONResponse(error.body(), error.status, headers=error.headers)
        except Exception as error:  # a failure of ours: answered, logged
            logger.exception("%s %s failed", request.method, request.url.path)
            response = JSONResponse({"error": f"Internal error: {error}"}, 500)
        service.metrics.answered(route, response.status_code, time.monotonic() - started)
        return response

    return endpoint


async def _tf_serving(service, request, body):
    """The answer of TF Serving's REST API under /v1/ (`rest_api`)."""
    from starlette.responses import JSONResponse

    from keras_transformer.serving import rest_api

    name, version, label, verb = rest_api.parse_path(request.method, request.url.path)
    rest_api.check_model(name, version, label, service.options.model_name)
    if verb == "status":
        return JSONResponse(rest_api.status_response())
    if verb == "metadata":
        return JSONResponse(rest_api.metadata_response(name, service.signature_defs))
    if verb != "predict":
        raise rest_api.RestError(rest_api.INVALID_ARGUMENT, f"The {verb} API is not "
                                 "served: translators have predict signatures only.")
    predict = rest_api.parse_predict(body, service.signatures)
    outputs = await service.run(predict.signature, predict.sentences, predict.second)
    return _json_response(rest_api.predict_response(outputs, predict.row_format))


# Alternatives the page asks for by default, and at most where the artifact does not say.
PAGE_N_BEST, PAGE_N_BEST_MAX = 3, 16


def page_html(n_best=None):
    """The page served at /, its alternatives field held to the artifact's n-best lists
    (`n_best` hypotheses; `None`: unknown), which the server refuses to exceed."""
    limit = PAGE_N_BEST_MAX if n_best is None else n_best
    page = importlib.resources.files(__package__).joinpath("page.html").read_text("utf-8")
    return page.replace("N_BEST_MAX", str(limit)).replace(
        "N_BEST_VALUE", str(min(PAGE_N_BEST, limit)))


def _exported_n_best(artifact):
    """The length of the artifact's n-best lists, from its export report or
    CTranslate2 options; `None` when neither says."""
    from keras_transformer.serving import artifacts

    return artifacts.exported_options(artifact).get("n_best")


def _json_response(content):
    """A JSON response; NaN and infinities as TF Serving writes them (NaN, Infinity)."""
    from starlette.responses import Response

    return Response(json.dumps(content, ensure_ascii=False, allow_nan=True),
                    media_type="application/json")


def _check_token(request, token_env):
    from keras_transformer.serving import rest_api

    token = os.environ.get(token_env)
    if not token:
        return
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {token}".encode()):
        raise rest_api.RestError(rest_api.UNAUTHENTICATED, "A bearer token is required: "
                                 "send 'Authorization: Bearer TOKEN'.",
                                 {"WWW-Authenticate": "Bearer"})


async def _read_body(request, limit, deadline):
    """The request's body; 413 beyond `limit` bytes (the rest is read and dropped, so
    that the client, still sending, gets the answer), 408 past `deadline`."""
    from starlette.requests import ClientDisconnect

    from keras_transformer.serving import rest_api

    length = request.headers.get("content-length")
    if length is not None and not length.isdigit():
        raise rest_api.RestError(rest_api.INVALID_ARGUMENT, "Content-Length is not a number.")
    chunks, size = [], 0

    async def read():
        nonlocal size
        async for chunk in request.stream():
            size += len(chunk)
            if size <= limit:
                chunks.append(chunk)

    try:
        await asyncio.wait_for(read(), max(deadline - time.monotonic(), 0))
    except asyncio.TimeoutError:
        raise rest_api.RestError(408, "The request body did not arrive in time.") from None
    except ClientDisconnect:
        raise rest_api.RestError(400, "The client disconnected while sending.") from None
    if size > limit:
        raise rest_api.RestError(413, f"The request body has {size} bytes, at most {limit} "
                                 "may be (serve --max-body-bytes): split the request.")
    return b"".join(chunks)


async def _translate(service, body):
    """The answer of `POST /translate` (`translate_api`)."""
    from keras_transformer.serving import translate_api

    request = translate_api.parse_request(body, service.n_best)
    calls = [service.run(request.signature, request.sentences, request.second)]
    if request.n_best:
        calls.append(service.run(files.N_BEST_SIGNATURE, request.sentences))
    return translate_api.response(request, *await asyncio.gather(*calls))


def listen(host="127.0.0.1", port=DEFAULT_PORT):
    """Returns a TCP socket bound to `host`:`port` (0: any free port) and listening, for
    `make_server(...).run(sockets=[it])`: a port in use fails here, in one line, and a
    request sent once this returns waits in the backlog instead of being refused.

    Raises:
        OSError: the address cannot be bound, with what to do.
    """
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say so. Without
    # it a keep-alive client waits 40 ms per answer (Nagle's algorithm on the answer's
    # second write against the client's delayed ACK); the accepted sockets inherit it.
    listening = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        listening.bind((host, port))
        listening.listen(2048)
    except OSError as error:
        listening.close()
        raise OSError(f"cannot listen on {host}:{port} ({error.strerror}): choose another "
                      "--port, or stop what uses it.") from None
    return listening


def make_server(service, drain_timeout_s=None):
    """Returns a `uvicorn.Server` of `service`; run it with `.run(sockets=[listen(...)])`.

    SIGTERM and SIGINT stop it taking connections and let every request it accepted
    finish (at most `drain_timeout_s` seconds, `None`: as long as they take), then it
    exits.
    """
    import uvicorn  # here: the serve extra

    config = uvicorn.Config(
        make_app(service), log_level="warning", access_log=False,
        timeout_graceful_shutdown=drain_timeout_s, lifespan="on",
        # Idle keep-alive connections close after 5 s, as uvicorn's default.
        timeout_keep_alive=5)
    return uvicorn.Server(config)
