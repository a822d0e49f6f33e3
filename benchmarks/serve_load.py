"""`keras-transformer serve` under load, faults and hostile requests, on loopback.

    python -m benchmarks.serve_load --source val.en.gz \\
        --artifact RUN/export/translator_dynamic_range.tflite --artifact RUN/export/ctranslate2 \\
        --clients 1 8 64 --seconds 20 --soak-minutes 10 --hostile --faults --json out.json

For each artifact, a `serve` process (greedy, `/v1/models/translator:predict`, one
sentence per request as interactive clients send them) takes `--clients` concurrent
keep-alive clients for `--seconds` each: sentences/s, p50/p99 latency, errors, and the
server's mean batch size (its `/metrics`). With the server stopped, the same artifact then
translates the same sentences offline (`load_translator`, batches of 32 sorted by length,
as `translate`): the load's throughput at saturation over it is the `offline` ratio.

`--soak-minutes M` keeps the largest client count on the first artifact for M minutes,
reading the server's resident memory every 30 s. `--hostile` sends requests meant to
break a server (malformed JSON, wrong types and shapes, a 100 MB body, 10,000 sentences,
invalid UTF-8, disconnects mid-request, a body sent a byte a second) and checks that each
gets a 4xx JSON error or a correct answer, never a 5xx, and that normal requests are
answered after. `--faults` kills the server with SIGKILL under load and restarts it on
the same port (time to the first answer), then sends SIGTERM under load (accepted
requests that were answered). Every phase is bounded in time and stops by itself.

The clients are a minimal asyncio HTTP/1.1 client (not a library's), so that on a 2-core
machine the load they add beside the server is small; they share the CPU with it all
the same, which the offline ratio includes.
"""

import argparse
import asyncio
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from benchmarks import common  # noqa: E402
from keras_transformer.data.text import read_lines  # noqa: E402

PATH = "/v1/models/translator:predict"


def parse_arguments(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--artifact", action="append", required=True,
                        help="an artifact to serve (repeat for more)")
    parser.add_argument("--source", required=True, help="sentences, one a line (plain or .gz)")
    parser.add_argument("--sentences", type=int, default=1000, help="first N lines")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--seconds", type=float, default=20.0, help="of each load level")
    parser.add_argument("--soak-minutes", type=float, default=0.0)
    parser.add_argument("--hostile", action="store_true")
    parser.add_argument("--faults", action="store_true")
    parser.add_argument("--serve-args", default="", help="more options of serve, one string")
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    return parser.parse_args(argv)


class Server:
    """A `keras-transformer serve` process on a free (or the given) loopback port."""

    def __init__(self, artifact, *args, port=0):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "keras_transformer", "serve", artifact, "--port", str(port),
             *args], stderr=subprocess.PIPE, text=True)
        for line in self.process.stderr:
            found = re.search(r" on http://127\.0\.0\.1:(\d+)", line)
            if found:
                self.port = int(found.group(1))
                break
        else:
            raise RuntimeError(f"serve {artifact} exited before listening")

    def wait_ready(self, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if asyncio.run(request(self.port, "GET", "/readyz"))[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError("serve was not ready in time")

    def rss_mb(self):
        with open(f"/proc/{self.process.pid}/status") as file:
            return int(re.search(r"VmRSS:\s+(\d+)", file.read()).group(1)) / 1024

    def metrics(self):
        text = asyncio.run(request(self.port, "GET", "/metrics"))[1].decode()
        found = {}
        for name in ("batch_size_sum", "batch_size_count"):
            found[name] = sum(float(value) for value in re.findall(
                rf"^keras_transformer_{name}\{{[^}}]*\}} (\S+)$", text, re.M))
        return found

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


async def request(port, method, path, body=b"", connection=None, timeout=120):
    """One HTTP/1.1 request; returns `(status, body)`. With `connection` (a
    `(reader, writer)` pair) it is kept alive for the next."""
    reader, writer = connection or await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
                 "Content-Type: application/json\r\n\r\n".encode() + body)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout)
    status = int(head.split(b" ", 2)[1])
    length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
    content = await asyncio.wait_for(reader.readexactly(length), timeout)
    if connection is None:
        writer.close()
    return status, content


async def load(port, sentences, clients, seconds):
    """`clients` keep-alive clients sending one sentence each per request for `seconds`."""
    latencies, errors = [], 0
    stop = time.monotonic() + seconds

    async def client(number):
        nonlocal errors
        connection = await asyncio.open_connection("127.0.0.1", port)
        index = number
        while time.monotonic() < stop:
            body = json.dumps({"instances": [sentences[index % len(sentences)]]}).encode()
            start = time.monotonic()
            try:
                status, _ = await request(port, "POST", PATH, body, connection)
            except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError):
                errors += 1
                connection = await asyncio.open_connection("127.0.0.1", port)
                continue
            if status == 200:
                latencies.append(time.monotonic() - start)
            else:
                errors += 1
            index += clients
        connection[1].close()

    start = time.monotonic()
    await asyncio.gather(*(client(i) for i in range(clients)))
    elapsed = time.monotonic() - start
    latencies.sort()

    def quantile(q):  # in ms
        if not latencies:
            return float("nan")
        return latencies[min(int(q * len(latencies)), len(latencies) - 1)] * 1000

    return {"clients": clients, "seconds": round(elapsed, 1), "answered": len(latencies),
            "sentences_per_s": round(len(latencies) / elapsed, 2),
            "p50_ms": round(quantile(0.5), 1), "p99_ms": round(quantile(0.99), 1),
            "errors": errors}


def offline(artifact, sentences):
    """Sentences/s of `load_translator(artifact)` on `sentences` (after one batch)."""
    from keras_transformer import loading

    translator = loading.load_translator(artifact)
    translator(sentences[:32])
    start = time.perf_counter()
    translator(sentences)
    return len(sentences) / (time.perf_counter() - start)


def hostile(artifact, serve_args):
    """Sends each hostile request to a server with a 5 s request timeout; returns rows."""
    server = Server(artifact, "--request-timeout", "5", *serve_args)
    server.wait_ready()
    port = server.port
    many = json.dumps({"instances": ["A dog."] * 10_000}).encode()
    cases = {
        "malformed JSON": b'{"instances": ["a",',
        "not an object": b"[1, 2, 3]",
        "wrong type": b'{"instances": [1, 2]}',
        "wrong shape": b'{"instances": [["a", "b"]]}',
        "unknown signature": b'{"signature_name": "x", "instances": ["a"]}',
        "invalid UTF-8 escape": b'{"instances": ["\\udc80\\ud800"]}',
        "invalid UTF-8 bytes": b'{"instances": ["caf\xe9"]}',
        "10,000 sentences": many,
        "deep nesting": b'{"instances": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
    }
    rows = []
    for name, body in cases.items():
        status, content = asyncio.run(request(port, "POST", PATH, body))
        rows.append(_hostile_row(name, status, content))
    rows.append(_hostile_row("100 MB body", *_big_body(port, 100 * 2**20)))
    rows.append(_hostile_row("disconnect mid-body", *_disconnect(port)))
    rows.append(_hostile_row("a byte a second", *_slow_body(port)))
    status, content = asyncio.run(request(port, "POST", PATH, b'{"instances": ["A dog."]}'))
    rows.append({"case": "normal request after", "status": status,
                 "ok": status == 200 and server.process.poll() is None})
    server.stop()
    return rows


def _hostile_row(name, status, content):
    try:
        is_json = "error" in json.loads(content) if status != 200 else True
    except ValueError:
        is_json = False
    return {"case": name, "status": status,
            "ok": status is None or (status < 500 and is_json)}


def _big_body(port, size):
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {size}\r\n\r\n"
                     .encode())
        chunk = b" " * 2**20
        try:
            for _ in range(size // len(chunk)):
                sock.sendall(chunk)
        except OSError:  # the server answered and closed before the end
            pass
        return _read_answer(sock)


def _disconnect(port):
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{{\"in"
                     .encode())
    return None, b""  # nothing to read: the check is the request that follows


def _slow_body(port):
    body = b'{"instances": ["A dog."]}'
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST {PATH} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                     .encode())
        try:
            for byte in body:
                sock.sendall(bytes([byte]))
                time.sleep(1)
        except OSError:
            pass
        return _read_answer(sock)


def _read_answer(sock):
    data = b""
    try:
        while b"\r\n\r\n" not in data:
            part = sock.recv(65536)
            if not part:
                break
            data += part
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))
        while len(body) < length:
            body += sock.recv(65536)
        return int(head.split(b" ", 2)[1]), body
    except (OSError, AttributeError, IndexError, ValueError):
        return None, b""


def faults(artifact, sentences, serve_args):
    """kill -9 under load, a restart on the same port, then SIGTERM under load."""
    server = Server(artifact, *serve_args)
    server.wait_ready()
    port = server.port

    async def under_load(action, delay):
        batches = [[sentences[(i + j) % len(sentences)] for j in range(4)]
                   for i in range(0, 64, 4)]
        tasks = [asyncio.ensure_future(request(port, "POST", PATH, json.dumps(
            {"instances": batch}).encode())) for batch in batches]
        await asyncio.sleep(delay)
        action()
        return await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(under_load(lambda: server.process.send_signal(signal.SIGKILL), 0.5))
    server.process.wait(30)
    start = time.monotonic()
    restarted = Server(artifact, *serve_args, port=port)
    status, _ = asyncio.run(request(port, "POST", PATH, b'{"instances": ["A dog runs."]}'))
    first = time.monotonic() - start
    results = asyncio.run(under_load(lambda: restarted.process.send_signal(signal.SIGTERM),
                                     0.5))
    answered = sum(1 for r in results if not isinstance(r, Exception) and r[0] == 200)
    refused = sum(1 for r in results if isinstance(r, Exception))
    code = restarted.process.wait(120)
    return {"restart_first_status": status, "restart_to_first_answer_s": round(first, 2),
            "sigterm_requests": len(results), "sigterm_answered": answered,
            "sigterm_not_accepted": refused, "sigterm_exit": code}


def main(argv=None):
    args = parse_arguments(argv)
    sentences = read_lines(args.source)[:args.sentences]
    serve_args = args.serve_args.split()
    result = {**common.header(args), "load": [], "offline": {}}
    for artifact in args.artifact:
        server = Server(artifact, *serve_args)
        server.wait_ready()
        for clients in args.clients:
            before = server.metrics()
            row = asyncio.run(load(server.port, sentences, clients, args.seconds))
            after = server.metrics()
            batches = after["batch_size_count"] - before["batch_size_count"]
            row.update(artifact=os.path.basename(artifact.rstrip("/")),
                       mean_batch=round((after["batch_size_sum"] - before["batch_size_sum"])
                                        / max(batches, 1), 1))
            result["load"].append(row)
            print(json.dumps(row), flush=True)
        if args.soak_minutes and artifact == args.artifact[0]:
            result["soak"] = soak(server, sentences, max(args.clients), args.soak_minutes)
            print(json.dumps(result["soak"]), flush=True)
        server.stop()
        speed = offline(artifact, sentences)
        result["offline"][artifact] = round(speed, 2)
        best = max(r["sentences_per_s"] for r in result["load"] if r["artifact"] ==
                   os.path.basename(artifact.rstrip("/")))
        print(f"{artifact}: offline {speed:.1f} sentences/s; served at saturation "
              f"{best:.1f}, ratio {best / speed:.2f}", flush=True)
    if args.hostile:
        result["hostile"] = hostile(args.artifact[0], serve_args)
        common.print_table(result["hostile"], [(key, key) for key in ("case", "status", "ok")])
    if args.faults:
        result["faults"] = faults(args.artifact[0], sentences, serve_args)
        print(json.dumps(result["faults"]), flush=True)
    common.print_table(result["load"], [(key, key) for key in (
        "artifact", "clients", "sentences_per_s", "p50_ms", "p99_ms", "errors", "mean_batch")])
    if args.json:
        common.write_json(args.json, result)


def soak(server, sentences, clients, minutes):
    """`clients` for `minutes`, resident memory read every 30 s."""
    readings = [round(server.rss_mb(), 1)]
    rows = []
    for _ in range(max(1, round(minutes * 2))):
        rows.append(asyncio.run(load(server.port, sentences, clients, 30)))
        readings.append(round(server.rss_mb(), 1))
    return {"clients": clients, "minutes": minutes, "rss_mb": readings,
            "answered": sum(r["answered"] for r in rows),
            "errors": sum(r["errors"] for r in rows),
            "sentences_per_s": round(statistics.mean(r["sentences_per_s"] for r in rows), 2)}


if __name__ == "__main__":
    main()
