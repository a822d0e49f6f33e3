"""TF Serving's REST API for our translators' signatures, without TF Serving.

What `serve` answers on `/v1/models/...`, written from TF Serving's own handlers
(`model_servers/http_rest_api_handler.cc`, `http_rest_api_util.cc`,
`util/json_tensor.cc`), so that a client of TF Serving works unchanged against `serve`:

- paths: `POST /v1/models/NAME[/versions/N|/labels/L]:predict`, `GET /v1/models/NAME
  [/versions/N]` (status) and `GET /v1/models/NAME[/versions/N]/metadata` (signature defs);
  names are case-insensitive in the verb, as TF Serving's regular expressions;
- requests: `signature_name` (default `serving_default`), and `instances` (row format: a
  value per sentence, or an object per sentence for signatures with two inputs) or
  `inputs` (columnar: a list, or an object of lists); strings as JSON strings or
  `{"b64": ...}`; int32 inputs as JSON integers;
- responses: `{"predictions": [{output: value, ...} per sentence]}` for the row format,
  `{"outputs": {output: value}}` for the columnar one; floats written as TF Serving
  writes them (the shortest of `%g` and `%.9g` that reads back as the same float32);
- errors: `{"error": message}` with TF Serving's status-to-HTTP mapping (`RestError`).

One difference, documented: TF Serving writes string outputs as raw bytes, invalid UTF-8
included (which makes its JSON invalid); here invalid UTF-8 is replaced by U+FFFD.

Nothing here imports TensorFlow, except `saved_model_signature_defs`.
"""

import base64
import json
import os
import re

import numpy as np

from keras_transformer import files

# The version `serve` reports: one model, as a TF Serving base path with one version.
MODEL_VERSION = 1

# TF Serving's paths (http_rest_api_util.cc), `(?i)` as there.
_PREDICT_PATH = re.compile(
    r"(?i)/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:"
    r"(classify|regress|predict)")
_STATUS_PATH = re.compile(
    r"(?i)/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?"
    r"(?:/(metadata))?")

# absl status codes as TF Serving answers them (http_server.cc `ToHTTPStatusCode`).
INVALID_ARGUMENT = 400
NOT_FOUND = 404
UNIMPLEMENTED = 501
DEADLINE_EXCEEDED = 504
UNAVAILABLE = 503
UNAUTHENTICATED = 401
RESOURCE_EXHAUSTED = 429

_STRING, _INT32, _FLOAT = "DT_STRING", "DT_INT32", "DT_FLOAT"
_B, _N = -1, "N"  # the batch; the n-best list's length, fixed at export
_TRANSLATION_OUTPUTS = {"translations": (_STRING, [_B]), "token_ids": (_INT32, [_B, -1]),
                        "scores": (_FLOAT, [_B])}
# Each signature's inputs and outputs: dtype and sizes (-1: the batch's or the call's).
# `serving.translator` documents them; tests/test_server.py holds this table to the
# exported SavedModel's signature defs.
SIGNATURE_SPECS = {
    files.GREEDY_SIGNATURE: ({files.INPUT_NAME: (_STRING, [_B])}, _TRANSLATION_OUTPUTS),
    files.BEAM_SIGNATURE: ({files.INPUT_NAME: (_STRING, [_B])}, _TRANSLATION_OUTPUTS),
    files.N_BEST_SIGNATURE: ({files.INPUT_NAME: (_STRING, [_B])}, {
        "translations": (_STRING, [_B, _N]), "token_ids": (_INT32, [_B, _N, -1]),
        "scores": (_FLOAT, [_B, _N]), "normalized_scores": (_FLOAT, [_B, _N])}),
    files.SCORE_SIGNATURE: ({files.INPUT_NAME: (_STRING, [_B]),
                             files.TRANSLATIONS_INPUT: (_STRING, [_B])}, {
        "scores": (_FLOAT, [_B]), "token_scores": (_FLOAT, [_B, -1]),
        "token_ids": (_INT32, [_B, -1]), "tokens": (_STRING, [_B, -1])}),
    files.PREFIX_SIGNATURE: ({files.INPUT_NAME: (_STRING, [_B]),
                              files.PREFIXES_INPUT: (_STRING, [_B])}, _TRANSLATION_OUTPUTS),
    files.SAMPLE_SIGNATURE: ({files.INPUT_NAME: (_STRING, [_B]),
                              files.SEEDS_INPUT: (_INT32, [_B])}, _TRANSLATION_OUTPUTS),
    files.ALIGN_SIGNATURE: ({files.INPUT_NAME: (_STRING, [_B])}, {
        **_TRANSLATION_OUTPUTS, "attention": (_FLOAT, [_B, -1, -1]),
        "source_words": (_INT32, [_B, -1]), "target_words": (_INT32, [_B, -1]),
        "alignments": (_INT32, [_B, -1])}),
}


class RestError(Exception):
    """An error answered as TF Serving answers it: `status` and `{"error": message}`."""

    def __init__(self, status, message, headers=None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}

    def body(self):
        return {"error": self.message}


class PredictRequest:
    """A parsed `:predict` request: `signature`, `inputs` ({name: list of values, one
    per sentence}: bytes for strings, int for int32) and `row_format` (instances)."""

    def __init__(self, signature, inputs, row_format):
        self.signature = signature
        self.inputs = inputs
        self.row_format = row_format

    @property
    def sentences(self):
        return self.inputs[files.INPUT_NAME]

    @property
    def second(self):
        """The second input's values (`files.SECOND_INPUTS`), or `None`."""
        name = files.SECOND_INPUTS.get(self.signature, (None,))[0]
        return self.inputs[name] if name else None


def parse_path(method, path):
    """Returns `(model name, version or None, label or None, verb)` of a REST path.

    `verb` is `predict` (or `classify`/`regress`) for POST, `metadata` or `status` for
    GET.

    Raises:
        RestError: a path TF Serving would not match, answered as it answers that.
    """
    pattern = _PREDICT_PATH if method == "POST" else _STATUS_PATH
    match = pattern.fullmatch(path) if method in ("POST", "GET") else None
    if match is None:
        raise RestError(INVALID_ARGUMENT, f"Malformed request: {method} {path}")
    name, version, label, verb = match.groups()
    if method == "GET":
        verb = "metadata" if verb else "status"
        if not name:
            raise RestError(INVALID_ARGUMENT, "Missing model name in request.")
    return name, (int(version) if version else None), label, verb.lower()


def check_model(name, version, label, served_name):
    """Raises `RestError` (404) unless the path names the served model's version."""
    if name != served_name or label is not None or version not in (None, MODEL_VERSION):
        if label is not None:
            spec = f"label {label!r}"
        else:
            spec = f"Specific({name}, {version})" if version is not None else f"Latest({name})"
        raise RestError(NOT_FOUND, f"Servable not found for request: {spec}")


def parse_predict(body, signatures):
    """Parses a `:predict` body as TF Serving does.

    Args:
        body: bytes. The request body.
        signatures: the served signatures' names.

    Returns:
        A `PredictRequest`.

    Raises:
        RestError: with TF Serving's message for what is wrong.
    """
    document = parse_json(body)
    signature = document.get("signature_name", files.GREEDY_SIGNATURE)
    if not isinstance(signature, str):
        raise _format_error(document, "not formatted correctly. 'signature_name' key must "
                                      "be a string value.")
    signature = signature or files.GREEDY_SIGNATURE
    if signature not in signatures:
        raise RestError(INVALID_ARGUMENT, f'Serving signature name: "{signature}" not '
                                          "found in signature def")
    specs = SIGNATURE_SPECS[signature][0]
    has_instances, has_inputs = "instances" in document, "inputs" in document
    if has_instances and has_inputs:
        raise _format_error(document, "Not formatted correctly expecting only one of "
                                      "'inputs' or 'instances' keys to exist ")
    if has_instances:
        instances = document["instances"]
        if not isinstance(instances, list):
            raise _format_error(document, "Expecting 'instances' to be an list/array")
        if not instances:
            raise _format_error(document, "No values in 'instances' array")
        inputs = _instances(instances, specs)
    elif has_inputs:
        inputs = _columns(document["inputs"], specs)
    else:
        raise RestError(INVALID_ARGUMENT, "Missing 'inputs' or 'instances' key")
    sizes = {len(values) for values in inputs.values()}
    if len(sizes) > 1:
        counts = ", ".join(f"{len(values)} {name}" for name, values in inputs.items())
        raise RestError(INVALID_ARGUMENT, f"The inputs have different batch sizes "
                                          f"({counts}): give one value of each per "
                                          "sentence.")
    return PredictRequest(signature, inputs, has_instances)


def parse_json(body):
    if not body:
        raise RestError(INVALID_ARGUMENT, "JSON Parse error: The document is empty")
    try:
        # Undecodable bytes pass as the bytes they are (surrogate escapes), as TF
        # Serving's parser passes them on to the graph.
        document = json.loads(body.decode("utf-8", "surrogateescape"))
    except (ValueError, RecursionError) as error:
        raise RestError(INVALID_ARGUMENT, f"JSON Parse error: {error}") from None
    if not isinstance(document, dict):
        raise _format_error(document, "Is not object")
    return document


def _format_error(value, message):
    text = json.dumps(value, ensure_ascii=False)
    text = text if len(text) <= 256 else text[:256] + "..."
    return RestError(INVALID_ARGUMENT, f"JSON Value: {text} {message}")


def _is_base64(value):
    return isinstance(value, dict) and len(value) == 1 and isinstance(value.get("b64"), str)


def _instances(instances, specs):
    """The `{name: values}` of a row-format request (FillTensorMapFromInstancesList)."""
    objects = isinstance(instances[0], dict) and not _is_base64(instances[0])
    if not objects and len(specs) > 1:
        raise RestError(INVALID_ARGUMENT, "instances is a plain list, but expecting list "
                        "of objects as multiple input tensors required as per "
                        "tensorinfo_map")
    inputs = {name: [] for name in specs}
    for index, instance in enumerate(instances):
        is_object = isinstance(instance, dict) and not _is_base64(instance)
        if is_object != objects:
            found = "object" if is_object else "list"
            wanted = "object" if objects else "value/list"
            raise RestError(INVALID_ARGUMENT, f"Expecting {wanted} but got {found} at item "
                                              f"{index} of input list")
        items = instance if objects else {next(iter(specs)): instance}
        if set(items) != set(specs):
            unknown = sorted(set(items) - set(specs))
            if unknown:
                raise RestError(INVALID_ARGUMENT, f"Failed to process element: {index} "
                                f"key: {unknown[0]} of 'instances' list. Error: "
                                f"INVALID_ARGUMENT: JSON object: does not have named "
                                f"input: {unknown[0]}")
            raise RestError(INVALID_ARGUMENT, f"Failed to process element: {index} of "
                            f"'instances' list. JSON object: {json.dumps(instance)} keys "
                            f"must be equal to: {','.join(sorted(specs))}")
        for name, value in items.items():
            inputs[name].append(input_value(value, specs[name][0], index))
    return inputs


def _columns(value, specs):
    """The `{name: values}` of a columnar request (FillTensorMapFromInputsMap)."""
    if not isinstance(value, dict) or _is_base64(value):
        if len(specs) > 1:
            raise RestError(INVALID_ARGUMENT, "inputs is a plain value/list, but expecting "
                            "an object as multiple input tensors required as per "
                            "tensorinfo_map")
        value = {next(iter(specs)): value}
    inputs = {}
    for name, (dtype, _) in specs.items():
        if name not in value:
            raise RestError(INVALID_ARGUMENT, f"Missing named input: {name} in 'inputs' "
                                              "object.")
        column = value[name]
        if not isinstance(column, list):
            # A scalar where the signature wants one value per sentence.
            raise RestError(INVALID_ARGUMENT, f"input '{name}' must be a list with one "
                            f"value per sentence (rank 1), got {_json_type(column)}")
        inputs[name] = [input_value(item, dtype, index) for index, item in enumerate(column)]
    return inputs


def input_value(value, dtype, index):
    """One sentence's value of an input: bytes for DT_STRING, int for DT_INT32."""
    if isinstance(value, list):
        raise RestError(INVALID_ARGUMENT, f"Failed to process element: {index} of the "
                        "input list. Error: input must be one value per sentence "
                        f"(rank 1), got a list: {json.dumps(value)[:100]}")
    if dtype == _STRING:
        if _is_base64(value):
            try:
                return base64.b64decode(value["b64"], validate=True)
            except ValueError:
                raise RestError(INVALID_ARGUMENT, "Unable to base64 decode") from None
        if isinstance(value, str):
            try:
                return value.encode("utf-8", "surrogateescape")
            except UnicodeEncodeError:  # a lone surrogate escape, \ud800 say
                raise RestError(INVALID_ARGUMENT, f"Failed to process element: {index}: "
                                "the string holds an invalid \\u escape (a lone "
                                "surrogate).") from None
    elif (dtype == _INT32 and isinstance(value, int) and not isinstance(value, bool)
          and -2**31 <= value < 2**31):
        return value
    text = json.dumps(value, ensure_ascii=False)[:100]
    raise RestError(INVALID_ARGUMENT, f"JSON Value: {text} Type: {_json_type(value)} is "
                                      f"not of expected type: {dtype[3:].lower()}")


def _json_type(value):
    for kind, name in ((bool, "True" if value is True else "False"), (str, "String"),
                       (dict, "Object"), (list, "Array"), ((int, float), "Number")):
        if isinstance(value, kind):
            return name
    return "Null"


def predict_response(outputs, row_format):
    """The JSON object (a dict) TF Serving answers for a signature's `outputs`.

    Args:
        outputs: `{name: NumPy array}`, the batch first in each.
        row_format: bool. The request used `instances`.
    """
    values = {name: json_values(array) for name, array in sorted(outputs.items())}
    if not row_format:
        return {"outputs": values if len(values) > 1 else next(iter(values.values()))}
    batch = {len(value) for value in values.values()}
    if len(batch) > 1:
        raise RestError(INVALID_ARGUMENT, "outputs have inconsistent batch sizes")
    count = batch.pop() if batch else 0
    if len(values) == 1:
        return {"predictions": next(iter(values.values()))}
    return {"predictions": [{name: value[i] for name, value in values.items()}
                            for i in range(count)]}


def json_values(array):
    """A NumPy array as the nested lists TF Serving writes (json_tensor.cc)."""
    array = np.asarray(array)
    if array.dtype == object or array.dtype.kind in "SU":
        flat = [text.decode("utf-8", "replace") if isinstance(text, bytes) else str(text)
                for text in array.reshape([-1])]
        return np.array(flat, dtype=object).reshape(array.shape).tolist()
    if array.dtype.kind == "f":
        return tf_serving_floats(array).tolist()
    return array.tolist()


def tf_serving_floats(array):
    """The float64 values of the decimals TF Serving writes for float32 `array`.

    TF Serving writes `absl::StrCat(value)` (printf's `%g`, six digits) and, where that
    does not read back as the same float32, `%.9g` (WriteDecimal in json_tensor.cc):
    0.2 is written 0.2, not 0.20000000298023224 as float(np.float32(0.2)) would.
    """
    values = np.asarray(array, np.float32)
    if values.size == 0:
        return values.astype(np.float64)
    finite = np.isfinite(values)
    short = np.char.mod("%g", np.where(finite, values, 0).astype(np.float64))
    exact = short.astype(np.float32) == np.where(finite, values, 0)
    long = np.char.mod("%.9g", np.where(finite, values, 0).astype(np.float64))
    written = np.where(exact, short, long).astype(np.float64)
    return np.where(finite, written, values.astype(np.float64))


def status_response():
    """GET /v1/models/NAME: the model's one version, AVAILABLE (GetModelStatusResponse)."""
    return {"model_version_status": [{
        "version": str(MODEL_VERSION), "state": "AVAILABLE",
        "status": {"error_code": "OK", "error_message": ""}}]}


def metadata_response(name, signature_defs):
    """GET /v1/models/NAME/metadata: the model spec and its signature defs."""
    return {"model_spec": {"name": name, "signature_name": "",
                           "version": str(MODEL_VERSION)},
            "metadata": {"signature_def": {"signature_def": signature_defs}}}


def signature_defs(signatures, n_best=None):
    """The signature defs of `signatures` as TF Serving's metadata writes them, from
    `SIGNATURE_SPECS` (for artifacts that hold none: `.tflite`, CTranslate2); tensor
    names are empty, as there is no graph.

    Args:
        signatures: names of signatures.
        n_best: int or `None` (unknown, -1). The exported length of n-best lists.
    """
    def tensor(dtype, sizes):
        dims = [{"size": str(n_best or -1) if size == _N else str(size), "name": ""}
                for size in sizes]
        return {"dtype": dtype, "tensor_shape": {"dim": dims, "unknown_rank": False},
                "name": ""}

    defs = {}
    for name in signatures:
        inputs, outputs = SIGNATURE_SPECS[name]
        defs[name] = {"inputs": {key: tensor(*spec) for key, spec in inputs.items()},
                      "outputs": {key: tensor(*spec) for key, spec in outputs.items()},
                      "method_name": "tensorflow/serving/predict", "defaults": {}}
    return defs


def saved_model_signature_defs(directory):
    """The signature defs of a SavedModel's serving graph, as TF Serving's metadata
    writes them (protobuf's JSON with the field names kept and every field printed)."""
    from google.protobuf import json_format
    from tensorflow.core.protobuf import saved_model_pb2  # here: only SavedModels need it

    saved_model = saved_model_pb2.SavedModel()
    with open(os.path.join(directory, "saved_model.pb"), "rb") as file:
        saved_model.ParseFromString(file.read())
    graph = next(graph for graph in saved_model.meta_graphs
                 if "serve" in graph.meta_info_def.tags)
    return {name: json_format.MessageToDict(
                definition, preserving_proto_field_name=True,
                always_print_fields_with_no_presence=True)
            for name, definition in graph.signature_def.items()}
