"""`/translate` requests: which signature answers each, and what each refuses (no
server: `translate_api` alone; tests/test_server.py sends them over HTTP)."""

import json

import pytest

from keras_transformer import files
from keras_transformer.serving import rest_api, translate_api


def parse(n_best_held=4, **fields):
    return translate_api.parse_request(json.dumps(fields).encode(), n_best_held)


@pytest.mark.parametrize("fields, signature, second, n_best", [
    ({}, files.GREEDY_SIGNATURE, None, None),
    ({"beam": True}, files.BEAM_SIGNATURE, None, None),
    ({"n_best": 2}, files.BEAM_SIGNATURE, None, 2),
    ({"alignment": True}, files.ALIGN_SIGNATURE, None, None),
    ({"alignment": True, "n_best": 3}, files.ALIGN_SIGNATURE, None, 3),
    ({"prefixes": ["Ein", ""]}, files.PREFIX_SIGNATURE, [b"Ein", b""], None),
    ({"prefixes": ["Ein", ""], "n_best": 4}, files.PREFIX_SIGNATURE, [b"Ein", b""], 4),
    ({"seed": -7}, files.SAMPLE_SIGNATURE, [-7, -7], None),
])
def test_each_request_is_answered_by_its_signature(fields, signature, second, n_best):
    request = parse(sentences=["A dog.", "Zwei."], **fields)
    assert request == translate_api.TranslateRequest(
        [b"A dog.", b"Zwei."], signature, second, n_best, signature == files.ALIGN_SIGNATURE)


def test_a_lone_string_is_one_sentence():
    assert parse(sentences="A dog.").sentences == [b"A dog."]


@pytest.mark.parametrize("fields, message", [
    ({"sentences": ["a"], "n_best": 5}, "at most 4: the artifact's n-best lists hold 4"),
    ({"sentences": ["a"], "n_best": True}, "'n_best' must be int"),
    ({"sentences": ["a"], "seed": 2**31}, "32-bit integer"),
    ({"sentences": ["a"], "seed": 1, "alignment": True}, "excludes"),
    ({"sentences": ["a"], "seed": 1, "prefixes": []}, "one per sentence"),
    ({"sentences": ["a"], "prefixes": ["b"], "alignment": True}, "exclude each other"),
    ({"sentences": ["a"], "prefixes": [1]}, "one per sentence"),
    ({"sentences": None}, "string or a list of strings"),
    ({"sentence": ["a"]}, "Unknown field 'sentence': /translate takes alignment, beam"),
])
def test_bad_requests_are_refused_saying_why(fields, message):
    with pytest.raises(rest_api.RestError, match=message) as raised:
        parse(**fields)
    assert raised.value.status == 400


def test_an_artifact_whose_n_best_length_is_unknown_takes_any():
    assert parse(n_best_held=None, sentences=["a"], n_best=50).n_best == 50
