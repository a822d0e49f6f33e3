"""A real `serve` HTTP server for the tests: in a thread of the test process, or a
`keras-transformer serve` process, on a free loopback port."""

import contextlib
import os
import re
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("uvicorn", reason="serve needs the serve extra (pip install -e '.[serve]')")

from keras_transformer.serving import server  # noqa: E402


@contextlib.contextmanager
def running(service):
    """Serves `service` (`server.Service`) from a thread; yields its base URL."""
    listening = server.listen("127.0.0.1", 0)
    uvicorn_server = server.make_server(service)
    thread = threading.Thread(target=uvicorn_server.run, kwargs={"sockets": [listening]},
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not uvicorn_server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"
    finally:
        uvicorn_server.should_exit = True
        thread.join(30)


def wait_ready(url, timeout=60):
    """Waits until `url`/readyz answers 200."""
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                return
        time.sleep(0.1)
    raise AssertionError(f"{url} was not ready within {timeout} s")


class ServeProcess:
    """`keras-transformer serve ARTIFACT --port 0 ARGS...` in a process of its own."""

    def __init__(self, artifact, *args, port=0, env=None):
        self.process = subprocess.Popen(
            [sys.executable, "-m", "keras_transformer", "serve", str(artifact), "--port",
             str(port), *args], stderr=subprocess.PIPE, text=True,
            env={**os.environ, **(env or {})})
        self.lines = []
        for line in self.process.stderr:  # until it says where it listens
            self.lines.append(line)
            found = re.search(r" on (http://127\.0\.0\.1:\d+)", line)
            if found:
                self.url = found.group(1)
                break
        else:
            raise AssertionError("serve exited before listening:\n" + "".join(self.lines))
        # The rest of its output, read so that the pipe never fills.
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.process.stderr),
                                        daemon=True)
        self._reader.start()

    def wait(self, timeout=60):
        code = self.process.wait(timeout)
        self._reader.join(5)
        return code

    def stop(self):
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)
