"""`keras-transformer serve` as a process: SIGTERM drains what it accepted, kill -9 and a
restart lose nothing but the requests in flight."""

import concurrent.futures
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.export_helpers import batch_of, tiny_export
from tests.server_helpers import ServeProcess, wait_ready

httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def exported():
    return tiny_export()


def _predict(url, sentences):
    return httpx.post(f"{url}/v1/models/translator:predict", json={"instances": sentences},
                      timeout=120)


def _queued(url):
    text = httpx.get(f"{url}/metrics").text
    line = next(line for line in text.splitlines()
                if line.startswith("keras_transformer_queued_sentences "))
    return float(line.split()[1])


def test_sigterm_answers_every_accepted_request_then_exits(exported):
    # Batches wait 8 s for company: the requests are still queued when SIGTERM comes.
    serve = ServeProcess(exported.tflite, "--batch-timeout-ms", "8000",
                         "--max-batch-size", "64")
    try:
        wait_ready(serve.url)
        requests = [batch_of(8)[i:i + 2] for i in range(6)]
        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            answers = [pool.submit(_predict, serve.url, sentences) for sentences in requests]
            deadline = time.monotonic() + 30
            while _queued(serve.url) < 12:
                assert time.monotonic() < deadline, "the requests were not queued"
                time.sleep(0.05)
            serve.process.send_signal(signal.SIGTERM)
            responses = [answer.result() for answer in answers]
        assert [response.status_code for response in responses] == [200] * len(requests)
        assert [len(response.json()["predictions"]) for response in responses] == [2] * 6
        # uvicorn exits by the signal it was sent, once it has answered.
        assert serve.wait(60) in (0, -signal.SIGTERM)
        assert "Traceback" not in "".join(serve.lines)
        with pytest.raises(httpx.ConnectError):
            _predict(serve.url, ["A dog."])
    finally:
        serve.stop()


def test_after_kill_9_under_load_a_restart_answers_the_first_request(exported):
    serve = ServeProcess(exported.tflite_quantized)
    port = int(serve.url.rsplit(":", 1)[1])
    try:
        wait_ready(serve.url)
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            load = [pool.submit(_predict, serve.url, batch_of(4)) for _ in range(8)]
            time.sleep(0.5)
            serve.process.send_signal(signal.SIGKILL)
            for future in load:  # answered before the kill, or cut by it
                try:
                    assert future.result().status_code == 200
                except httpx.TransportError:
                    pass
        serve.wait(30)
        restarted = ServeProcess(exported.tflite_quantized, port=port)
        try:
            # The first request, sent as soon as it listens, without waiting for /readyz.
            response = _predict(restarted.url, ["A dog runs across the field."])
            assert response.status_code == 200
            assert len(response.json()["predictions"]) == 1
        finally:
            restarted.stop()
    finally:
        serve.stop()


def test_a_port_in_use_is_one_error_line_naming_it(exported):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "keras_transformer", "serve", exported.tflite, "--port",
             str(port)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1].startswith(
        f"error: cannot listen on 127.0.0.1:{port} (Address already in use)")
