"""`serve`: TF Serving's REST API against the SavedModel called in-process, /translate,
batching across requests, limits and hostile requests, on a real HTTP server."""

import asyncio
import base64
import concurrent.futures
import json
import re
import socket
import threading
import time

import numpy as np
import pytest
import tensorflow as tf

from keras_transformer import files
from keras_transformer.serving import batching, rest_api, self_check
from tests.export_helpers import batch_of, tiny_export
from tests.server_helpers import running, server, wait_ready

httpx = pytest.importorskip("httpx")

SENTENCES = [*batch_of(3), "", "x"]
SECONDS = {files.SCORE_SIGNATURE: ["Ein Hund läuft.", "", "zwei Männer", "x", "😀"],
           files.PREFIX_SIGNATURE: ["Ein", "", "zwei Männer", "", "Die"],
           files.SAMPLE_SIGNATURE: [0, 1, 2, 3, -5]}
TOLERANCE = dict(rtol=self_check.SCORE_RTOL, atol=self_check.SCORE_ATOL)


@pytest.fixture(scope="module")
def exported():
    return tiny_export()


@pytest.fixture(scope="module")
def saved_model(exported):
    return tf.saved_model.load(exported.saved_model)


@pytest.fixture(scope="module")
def service(exported):
    return server.Service(exported.saved_model, server.ServerOptions(batch_timeout_ms=0))


@pytest.fixture(scope="module")
def url(service):
    with running(service) as base:
        wait_ready(base)  # warmed up: a test run alone answers as in the whole file
        yield base


def _predict(url, body, name="translator", raw=False):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    response = httpx.post(f"{url}/v1/models/{name}:predict", content=content, timeout=120)
    return response if raw else (response.status_code, response.json())


def _in_process(saved_model, signature, inputs):
    """The signature called on the request's JSON values, converted here."""
    tensors = {name: tf.constant(values, tf.int32 if name == files.SEEDS_INPUT else tf.string)
               for name, values in inputs.items()}
    return {name: value.numpy() for name, value in
            saved_model.signatures[signature](**tensors).items()}


def _request_inputs(signature):
    inputs = {files.INPUT_NAME: SENTENCES}
    if signature in files.SECOND_INPUTS:
        inputs[files.SECOND_INPUTS[signature][0]] = SECONDS[signature]
    return inputs


def _assert_equal_to_json(expected, found):
    """A signature's NumPy outputs equal the JSON values: strings as UTF-8, integers
    exactly, floats as float32 up to the noise of another batch order (the server sorts
    a batch by length)."""
    expected = np.asarray(expected)
    if expected.dtype.kind in "OS":
        expected = np.vectorize(lambda text: text.decode("utf-8"), otypes=[object])(expected)
        assert np.asarray(found, dtype=object).tolist() == expected.tolist()
    elif expected.dtype.kind == "f":
        np.testing.assert_allclose(np.asarray(found, np.float32), expected, **TOLERANCE)
    else:
        np.testing.assert_array_equal(np.asarray(found), expected)


@pytest.mark.parametrize("signature", files.SIGNATURES)
def test_row_format_answers_what_the_saved_model_gives(url, saved_model, signature):
    inputs = _request_inputs(signature)
    if len(inputs) == 1:
        instances = inputs[files.INPUT_NAME]
    else:
        instances = [dict(zip(inputs, values)) for values in zip(*inputs.values())]
    status, answer = _predict(url, {"signature_name": signature, "instances": instances})
    assert status == 200, answer
    expected = _in_process(saved_model, signature, inputs)
    assert len(answer["predictions"]) == len(SENTENCES)
    for i, prediction in enumerate(answer["predictions"]):
        assert set(prediction) == set(expected)
        for name, value in expected.items():
            _assert_equal_to_json(value[i], prediction[name])


@pytest.mark.parametrize("signature", files.SIGNATURES)
def test_columnar_format_answers_what_the_saved_model_gives(url, saved_model, signature):
    inputs = _request_inputs(signature)
    columns = inputs[files.INPUT_NAME] if len(inputs) == 1 else inputs
    status, answer = _predict(url, {"signature_name": signature, "inputs": columns})
    assert status == 200, answer
    expected = _in_process(saved_model, signature, inputs)
    assert set(answer["outputs"]) == set(expected)
    for name, value in expected.items():
        _assert_equal_to_json(value, answer["outputs"][name])


def test_base64_strings_and_versions_answer_as_plain_ones(url):
    plain = _predict(url, {"instances": ["A dog runs."]})
    encoded = {"b64": base64.b64encode("A dog runs.".encode()).decode()}
    assert _predict(url, {"instances": [encoded]}) == plain
    response = httpx.post(f"{url}/v1/models/translator/versions/1:predict",
                          json={"instances": ["A dog runs."]})
    assert (response.status_code, response.json()) == plain


def test_floats_are_written_as_tf_serving_writes_them():
    # TF Serving's own expectations (util/json_tensor_test.cc), and 0.2, whose float32
    # read as a double is 0.20000000298023224.
    values = np.array([9000000, 999999, 0.5, .0003, .00003, 555557.5, 0.2, np.nan,
                       np.inf, -np.inf], np.float32)
    written = json.dumps(rest_api.json_values(values))
    assert written == ("[9000000.0, 999999.0, 0.5, 0.0003, 3e-05, 555557.5, 0.2, NaN, "
                       "Infinity, -Infinity]")
    # Six digits that do not read back as the float32 get nine.
    assert rest_api.json_values(np.float32([1 / 3])) == [0.333333343]


def test_status_and_metadata_answer_as_tf_serving(url, exported):
    status = httpx.get(f"{url}/v1/models/translator").json()
    assert status == {"model_version_status": [{"version": "1", "state": "AVAILABLE",
                      "status": {"error_code": "OK", "error_message": ""}}]}
    metadata = httpx.get(f"{url}/v1/models/translator/metadata").json()
    assert metadata["model_spec"] == {"name": "translator", "signature_name": "",
                                      "version": "1"}
    defs = metadata["metadata"]["signature_def"]["signature_def"]
    assert set(files.SIGNATURES) <= set(defs)
    score = defs[files.SCORE_SIGNATURE]
    assert score["inputs"][files.TRANSLATIONS_INPUT]["dtype"] == "DT_STRING"
    assert score["outputs"]["token_scores"]["tensor_shape"]["dim"] == [
        {"size": "-1", "name": ""}] * 2
    assert score["method_name"] == "tensorflow/serving/predict"


def test_signature_table_matches_the_saved_models_signature_defs(exported):
    """The metadata served for .tflite and CTranslate2 artifacts (from the table) is the
    SavedModel's, but for the tensor names, which only a graph has."""
    real = rest_api.saved_model_signature_defs(exported.saved_model)
    real = {name: real[name] for name in files.SIGNATURES}
    for definition in real.values():
        for tensor in [*definition["inputs"].values(), *definition["outputs"].values()]:
            tensor["name"] = ""
    n_best = exported.report["translator"]["n_best"]
    assert rest_api.signature_defs(files.SIGNATURES, n_best=n_best) == real


@pytest.mark.parametrize("body, status, message", [
    (b"{not json", 400, "JSON Parse error"),
    (b"", 400, "The document is empty"),
    (b"[1, 2]", 400, "Is not object"),
    (b"[" * 100_000, 400, "JSON Parse error"),
    (b'{"instances": ["a"], "inputs": ["a"]}', 400, "expecting only one of"),
    (b'{"instances": "a"}', 400, "to be an list/array"),
    (b'{"instances": []}', 400, "No values in 'instances'"),
    (b'{"sentences": ["a"]}', 400, "Missing 'inputs' or 'instances' key"),
    (b'{"instances": [1]}', 400, "is not of expected type: string"),
    (b'{"instances": [["a"]]}', 400, "one value per sentence"),
    (b'{"instances": [{"b64": "%%%"}]}', 400, "Unable to base64 decode"),
    (b'{"instances": ["\\ud800"]}', 400, "lone surrogate"),
    (b'{"signature_name": "nope", "instances": ["a"]}', 400, 'name: "nope" not found'),
    (b'{"signature_name": 3, "instances": ["a"]}', 400, "must be a string value"),
    (b'{"signature_name": "score", "instances": ["a"]}', 400, "plain list"),
    (b'{"signature_name": "score", "instances": [{"sentences": "a"}]}', 400,
     "keys must be equal to"),
    (b'{"signature_name": "score", "inputs": {"sentences": ["a"]}}', 400,
     "Missing named input: translations"),
    (b'{"signature_name": "score", "inputs": {"sentences": ["a"], "translations": []}}',
     400, "different batch sizes"),
    (b'{"signature_name": "sample", "inputs": {"sentences": ["a"], "seeds": [true]}}',
     400, "not of expected type: int32"),
    (b'{"signature_name": "sample", "inputs": {"sentences": ["a"], "seeds": [4294967296]}}',
     400, "not of expected type: int32"),
    (b'{"inputs": "a"}', 400, "must be a list"),
])
def test_bad_requests_get_tf_servings_error_and_status(url, body, status, message):
    response = _predict(url, body, raw=True)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    assert list(response.json()) == ["error"] and message in response.json()["error"]


def test_wrong_model_name_or_version_is_not_found(url):
    assert _predict(url, {"instances": ["a"]}, name="other")[0] == 404
    assert _predict(url, {"instances": ["a"]}, name="translator/versions/2")[0] == 404
    assert httpx.get(f"{url}/v1/models/other").status_code == 404
    assert httpx.get(f"{url}/nowhere").json()["error"].startswith("No route")


def test_invalid_utf8_in_the_body_is_translated_as_those_bytes(url, saved_model):
    body = b'{"instances": ["caf\xe9 au lait", "\xff\xfe"]}'
    status, answer = _predict(url, body)
    assert status == 200
    expected = _in_process(saved_model, files.GREEDY_SIGNATURE,
                           {files.INPUT_NAME: [b"caf\xe9 au lait", b"\xff\xfe"]})
    assert [p["translations"] for p in answer["predictions"]] == [
        text.decode("utf-8", "replace") for text in expected["translations"]]


def test_translate_endpoint_gives_n_best_lists_scores_and_alignments(url, saved_model):
    sentences = ["A dog runs across the field.", "Two men."]
    response = httpx.post(f"{url}/translate", json={
        "sentences": sentences, "n_best": 2, "alignment": True}, timeout=120)
    assert response.status_code == 200, response.text
    answers = response.json()["translations"]
    aligned = _in_process(saved_model, files.ALIGN_SIGNATURE, {files.INPUT_NAME: sentences})
    n_best = _in_process(saved_model, files.N_BEST_SIGNATURE, {files.INPUT_NAME: sentences})
    for i, answer in enumerate(answers):
        assert answer["source"] == sentences[i]
        assert answer["translation"] == aligned["translations"][i].decode()
        # The server sorts a batch by length: float sums may differ in the last digits
        # from the in-process call's batch (serving/batching.py).
        np.testing.assert_allclose(answer["score"], aligned["scores"][i], rtol=1e-5)
        assert answer["source_words"] == sentences[i].split()
        assert [h["translation"] for h in answer["n_best"]] == [
            t.decode() for t in n_best["translations"][i][:2]]
        words = aligned["target_words"][i]
        for source_word, target_word in answer["alignment"]:
            # The pair's target word has a token aligned to the source word.
            tokens = np.flatnonzero(words == target_word)
            assert source_word in aligned["alignments"][i][tokens]


def test_translate_endpoint_greedy_prefix_and_sampling(url, saved_model):
    def translate(**body):
        response = httpx.post(f"{url}/translate", json={"sentences": ["A dog."], **body},
                              timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["translations"][0]["translation"]

    def signature(name, second=None):
        inputs = {files.INPUT_NAME: ["A dog."]}
        if second is not None:
            inputs[files.SECOND_INPUTS[name][0]] = [second]
        return _in_process(saved_model, name, inputs)["translations"][0].decode()

    assert translate() == signature(files.GREEDY_SIGNATURE)
    assert translate(beam=True) == signature(files.BEAM_SIGNATURE)
    assert translate(prefixes=["Ein"]) == signature(files.PREFIX_SIGNATURE, "Ein")
    assert translate(seed=7) == signature(files.SAMPLE_SIGNATURE, 7)


@pytest.mark.parametrize("body, message", [
    ({"sentences": [1]}, "list of strings"),
    ({"sentences": ["a"], "beam": "yes"}, "'beam' must be bool"),
    ({"sentences": ["a"], "n_best": 0}, "at least 1"),
    ({"sentences": ["a"], "n_best": 5}, "at most 4: the artifact's n-best lists hold 4"),
    ({"sentences": ["a"], "seed": 1, "beam": True}, "excludes"),
    ({"sentences": ["a"], "prefixes": ["a", "b"]}, "one per sentence"),
    ({"sentences": ["a"], "colour": "red"}, "Unknown field 'colour'"),
])
def test_translate_endpoint_refuses_bad_options(url, body, message):
    response = httpx.post(f"{url}/translate", json=body)
    assert response.status_code == 400 and message in response.json()["error"]


def _alternatives_field(page):
    return re.search(r'<input type="number" id="n_best"[^>]*>', page).group(0)


def test_the_pages_alternatives_are_held_to_the_artifacts_n_best_lists(url, service):
    # Past the artifact's n-best length the server answers 400, so the page never
    # offers it, nor asks for it by default.
    page = httpx.get(f"{url}/").text
    assert service.n_best is not None and "N_BEST" not in page
    assert f'max="{service.n_best}" value="{min(3, service.n_best)}"' in \
        _alternatives_field(page)
    for n_best, field in ((1, 'max="1" value="1"'), (2, 'max="2" value="2"'),
                          (8, 'max="8" value="3"'), (None, 'max="16" value="3"')):
        assert field in _alternatives_field(server.page_html(n_best))


def test_health_readiness_and_metrics(url):
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{url}/readyz").status_code == 200
    assert _predict(url, {"instances": ["A dog runs."]})[0] == 200  # a batch to count
    text = httpx.get(f"{url}/metrics").text
    for name in ("requests_total", "request_errors_total", "request_seconds_bucket",
                 "batch_size_bucket", "queued_sentences"):
        assert f"keras_transformer_{name}" in text


def _metric(text, name, **labels):
    selector = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
    found = re.search(rf"^keras_transformer_{name}\{{{selector}\}} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def test_concurrent_requests_are_batched_and_answered_in_order(exported, saved_model):
    service = server.Service(exported.saved_model, server.ServerOptions(
        max_batch_size=8, batch_timeout_ms=300))
    requests = [batch_of(12)[i:i + 1 + i % 3] for i in range(10)]
    with running(service) as base:
        def send(sentences):
            return httpx.post(f"{base}/v1/models/translator:predict",
                              json={"instances": sentences}, timeout=120).json()

        with concurrent.futures.ThreadPoolExecutor(len(requests)) as pool:
            answers = list(pool.map(send, requests))
        metrics = httpx.get(f"{base}/metrics").text
    batches = _metric(metrics, "batch_size_count", signature=files.GREEDY_SIGNATURE)
    sentences = _metric(metrics, "batch_size_sum", signature=files.GREEDY_SIGNATURE)
    assert sentences == sum(map(len, requests))  # the warm-up is not batched
    assert batches < len(requests)  # batches of more than one request were formed
    for sentences, answer in zip(requests, answers):
        expected = _in_process(saved_model, files.GREEDY_SIGNATURE,
                               {files.INPUT_NAME: sentences})
        for i, prediction in enumerate(answer["predictions"]):
            assert prediction["translations"] == expected["translations"][i].decode()
            ids, width = prediction["token_ids"], expected["token_ids"].shape[1]
            # The batch's padding, beyond the request's own.
            assert ids[:width] == expected["token_ids"][i].tolist()
            assert set(ids[width:]) <= {files.PAD_ID}
            np.testing.assert_allclose(prediction["scores"], expected["scores"][i],
                                       **TOLERANCE)


class _Blocked:
    """A stand-in artifact call that waits until released, then echoes its sentences."""

    def __init__(self):
        self.release = threading.Event()
        self.calls = []

    def __call__(self, signature, sentences, second):
        if list(sentences) == [server.WARM_UP_SENTENCE]:  # the server's own, not waited on
            return {"translations": np.array(sentences, dtype=object),
                    "scores": np.zeros(1, np.float32)}
        self.calls.append(list(sentences))
        self.release.wait(60)
        return {"translations": np.array(sentences, dtype=object),
                "scores": np.zeros(len(sentences), np.float32)}


def _wait_until(condition, timeout=30):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the server did not get there in time"
        time.sleep(0.01)


def _blocked_service(exported, **options):
    service = server.Service(exported.saved_model, server.ServerOptions(**options))
    blocked = _Blocked()
    service.batcher = batching.Batcher(blocked, max_batch_size=service.options.max_batch_size,
                                       batch_timeout=0,
                                       max_queued=service.options.max_queued_sentences)
    service.ready = True
    return service, blocked


def test_a_full_queue_answers_503_with_retry_after(exported):
    service, blocked = _blocked_service(exported, max_batch_size=2, max_queued_sentences=4,
                                        max_sentences=4)
    with running(service) as base, concurrent.futures.ThreadPoolExecutor(3) as pool:
        def send(sentences):
            return httpx.post(f"{base}/v1/models/translator:predict",
                              json={"instances": sentences}, timeout=60)

        first = pool.submit(send, ["a", "b"])  # taken into a batch, blocked there
        _wait_until(lambda: blocked.calls == [[b"a", b"b"]])
        second = pool.submit(send, ["c", "d", "e"])  # waits in the queue
        _wait_until(lambda: service.batcher.queued == 3)
        refused = send(["f", "g"])
        assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
        assert "busy" in refused.json()["error"]
        blocked.release.set()
        assert [p["translations"] for p in first.result().json()["predictions"]] == ["a", "b"]
        assert [p["translations"] for p in second.result().json()["predictions"]] == [
            "c", "d", "e"]


def test_a_request_past_its_timeout_answers_504_and_the_server_goes_on(exported):
    service, blocked = _blocked_service(exported, request_timeout_s=0.5)
    with running(service) as base:
        response = httpx.post(f"{base}/v1/models/translator:predict",
                              json={"instances": ["a"]}, timeout=30)
        assert response.status_code == 504 and "Deadline exceeded" in response.json()["error"]
        blocked.release.set()
        response = httpx.post(f"{base}/v1/models/translator:predict",
                              json={"instances": ["b"]}, timeout=30)
        assert response.status_code == 200


def test_limits_on_body_size_and_sentences(exported):
    service = server.Service(exported.saved_model, server.ServerOptions(
        max_body_bytes=1000, max_sentences=3))
    with running(service) as base:
        big = httpx.post(f"{base}/v1/models/translator:predict",
                         json={"instances": ["x" * 2000]})
        assert big.status_code == 413 and "--max-body-bytes" in big.json()["error"]
        many = httpx.post(f"{base}/translate", json={"sentences": ["a"] * 4})
        assert many.status_code == 400 and "--max-sentences" in many.json()["error"]
        assert httpx.post(f"{base}/translate", json={"sentences": ["a"] * 3}).status_code == 200


def test_a_bearer_token_guards_the_api_when_set(exported, monkeypatch):
    monkeypatch.setenv("KT_TEST_TOKEN", "s3cret")
    service = server.Service(exported.saved_model, server.ServerOptions(
        token_env="KT_TEST_TOKEN"))
    with running(service) as base:
        path = f"{base}/v1/models/translator:predict"
        refused = httpx.post(path, json={"instances": ["a"]})
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        wrong = httpx.post(path, json={"instances": ["a"]},
                           headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        assert httpx.post(path, json={"instances": ["a"]},
                          headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(f"{base}/metrics").status_code == 401
        assert httpx.get(f"{base}/healthz").status_code == 200


def _raw(url, data, *, close_after_send=False, read=True):
    """Sends raw bytes to the server; returns the status line's code (or None)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as connection:
        connection.sendall(data)
        if close_after_send or not read:
            return None
        answer = connection.recv(65536).decode("latin-1")
        return int(answer.split(" ", 2)[1])


def test_hostile_clients_get_errors_and_the_server_answers_after(exported):
    # Each request's time covers the rest of the queue: the last one below waits for the
    # sentence of a client that left, on a CPU that may be slow and shared.
    service = server.Service(exported.saved_model, server.ServerOptions(
        max_body_bytes=100_000, request_timeout_s=5.0))
    path = b"POST /v1/models/translator:predict HTTP/1.1\r\nHost: x\r\n"
    with running(service) as base:
        wait_ready(base)
        # Disconnects in the middle of a body, and after a full request.
        _raw(base, path + b"Content-Length: 1000\r\n\r\n{\"instan", close_after_send=True)
        _raw(base, path + b"Content-Length: 20\r\n\r\n{\"instances\": [\"a\"]}",
             close_after_send=True)
        # A body that stops arriving: 408 once the request's time is up.
        assert _raw(base, path + b"Content-Length: 1000\r\n\r\n{\"inst") == 408
        # A body far over the limit, announced or chunked: 413, read to its end.
        assert _raw(base, path + b"Content-Length: 300000\r\n\r\n" + b" " * 300_000) == 413
        chunk = b"%x\r\n%s\r\n" % (50_000, b" " * 50_000)
        assert _raw(base, path + b"Transfer-Encoding: chunked\r\n\r\n" + chunk * 4
                    + b"0\r\n\r\n") == 413
        assert _raw(base, path + b"Content-Length: abc\r\n\r\n") == 400
        response = httpx.post(f"{base}/v1/models/translator:predict",
                              json={"instances": ["A dog runs."]}, timeout=60)
        assert response.status_code == 200


def test_a_short_load_is_answered_without_errors_in_batches(exported):
    """The smoke test of the load benchmark (`benchmarks/serve_load.py`): 16 keep-alive
    clients for 2 s on the int8 .tflite."""
    from benchmarks import serve_load

    service = server.Service(exported.tflite_quantized)
    with running(service) as base:
        port = int(base.rsplit(":", 1)[1])
        row = asyncio.run(serve_load.load(port, batch_of(40), clients=16, seconds=2))
        metrics = httpx.get(f"{base}/metrics").text
    assert row["answered"] > 16 and row["errors"] == 0
    batches = _metric(metrics, "batch_size_count", signature=files.GREEDY_SIGNATURE)
    assert _metric(metrics, "batch_size_sum", signature=files.GREEDY_SIGNATURE) / batches > 1
