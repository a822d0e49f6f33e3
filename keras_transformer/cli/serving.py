"""The verb of serving: `serve`."""

import logging
import sys

from keras_transformer.cli import options

logger = logging.getLogger(__name__)


def _add_serve(parser):
    # Imported here: the server's defaults, without Starlette or uvicorn.
    from keras_transformer.serving.server import DEFAULT_PORT, ServerOptions

    defaults = ServerOptions()
    parser.add_argument("artifact", metavar="ARTIFACT",
                        help="run directory, SavedModel directory, .tflite file or "
                             "CTranslate2 directory")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine "
                             "only; 0.0.0.0 opens it to the network)")
    parser.add_argument("--port", type=options.port, default=DEFAULT_PORT,
                        help=f"port (default: {DEFAULT_PORT}, TF Serving's REST port; 0: "
                             "any free one, printed)")
    parser.add_argument("--model-name", default=defaults.model_name, metavar="NAME",
                        help="NAME in /v1/models/NAME:predict (default: "
                             f"{defaults.model_name})")
    batching = parser.add_argument_group("batching", "sentences of concurrent requests "
                                                     "are translated together")
    batching.add_argument("--max-batch-size", type=options.positive_int, metavar="N",
                          default=defaults.max_batch_size,
                          help=f"most sentences per call (default: {defaults.max_batch_size})")
    batching.add_argument("--batch-timeout-ms", type=options.non_negative_float,
                          metavar="MS", default=defaults.batch_timeout_ms,
                          help="how long a batch waits for more sentences (default: "
                               f"{defaults.batch_timeout_ms:g})")
    limits = parser.add_argument_group("limits")
    limits.add_argument("--max-queued-sentences", type=options.positive_int, metavar="N",
                        default=defaults.max_queued_sentences,
                        help="sentences waiting beyond this are refused with 503 and "
                             f"Retry-After (default: {defaults.max_queued_sentences})")
    limits.add_argument("--max-body-bytes", type=options.positive_int, metavar="N",
                        default=defaults.max_body_bytes,
                        help=f"largest request body (default: {defaults.max_body_bytes})")
    limits.add_argument("--max-sentences", type=options.positive_int, metavar="N",
                        default=defaults.max_sentences,
                        help=f"most sentences per request (default: {defaults.max_sentences})")
    limits.add_argument("--request-timeout", type=options.positive_float, metavar="S",
                        default=defaults.request_timeout_s,
                        help="longest a request may take, in seconds (default: "
                             f"{defaults.request_timeout_s:g})")
    limits.add_argument("--token-env", metavar="VAR", default=defaults.token_env,
                        help="environment variable holding a bearer token; when it is set, "
                             "every route but /, /healthz and /readyz needs "
                             f"'Authorization: Bearer TOKEN' (default: {defaults.token_env})")
    options.add_threads_option(parser)


def _serve(args):
    from keras_transformer.serving import server

    try:
        import prometheus_client  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as error:
        raise ImportError(f"serve needs the serve extra ({error}): pip install -e "
                          "'.[serve]' (or keras-transformer-mt[serve]).") from None
    serve_options = server.ServerOptions(
        model_name=args.model_name, max_batch_size=args.max_batch_size,
        batch_timeout_ms=args.batch_timeout_ms,
        max_queued_sentences=args.max_queued_sentences, max_body_bytes=args.max_body_bytes,
        max_sentences=args.max_sentences, request_timeout_s=args.request_timeout,
        token_env=args.token_env, threads=args.threads)
    service = server.Service(args.artifact, serve_options)
    listening = server.listen(args.host, args.port)
    port = listening.getsockname()[1]
    url = f"http://{args.host if ':' not in args.host else f'[{args.host}]'}:{port}"
    print(f"Serving {service.artifact} ({', '.join(service.signatures)}) on {url}: the page "
          f"at {url}/, TF Serving's API at {url}/v1/models/{args.model_name}:predict, "
          f"{url}/translate. Ctrl+C (or SIGTERM) stops it after the requests in flight.",
          file=sys.stderr, flush=True)
    server.make_server(service).run(sockets=[listening])
    return 0


VERBS = {
    "serve": (_add_serve, _serve, "serve a translator over HTTP: TF Serving's REST API, "
                                  "/translate and a page"),
}
