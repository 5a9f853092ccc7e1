"""How messages quote what they refuse (`ngspec.errors`): in JSON's words, whatever the value."""

import numpy as np
import pytest

from ngspec.errors import NULL, first_sentence, json_kind, json_kinds, short


@pytest.mark.parametrize("value, quoted", [
    ("été", '"été"'),  # as written, not "\u00e9t\u00e9"
    (None, "null"), (True, "true"), (float("nan"), "NaN"), ({"a": [1]}, '{"a": [1]}'),
    ("x" * 50, '"' + "x" * 39),  # cut at 40 characters
    (np.int64(5), '"np.int64(5)"'),  # set in Python, not read from JSON: as Python writes it
])
def test_short_quotes_a_value_as_json_does(value, quoted):
    assert short(value) == quoted


def test_short_quotes_a_whole_value_when_asked():
    assert short({"max_tokens": 5, "temperature": 0.0, "seed": 1234567890}, None) == '{"max_tokens": 5, "temperature": 0.0, "seed": 1234567890}'


def test_kinds_are_named_in_jsons_words():
    assert json_kinds((int, float, NULL)) == "a number or null"
    assert json_kinds((str, dict, NULL)) == "a string, a JSON object or null"
    assert [json_kind(v) for v in (None, False, 1.5, "x", [1], {})] == ["null", "false", "a number", "a string", "a list", "a JSON object"]


@pytest.mark.parametrize("exc, said", [
    (RuntimeError("PytorchStreamReader failed reading zip archive: not a ZIP archive. This is an internal miniz error."),
     "PytorchStreamReader failed reading zip archive: not a ZIP archive."),
    (ValueError("Error while deserializing header: header too large"), "Error while deserializing header: header too large"),
    (ValueError("Weights only load failed. In PyTorch 2.6, ...\nPlease file an issue"), "Weights only load failed."),
    (ValueError("version 1.2 found"), "version 1.2 found"),  # a point inside a sentence does not end it
    (EOFError(), "it ends early"), (KeyError(), "KeyError"),
])
def test_first_sentence_drops_class_names_and_advice(exc, said):
    assert first_sentence(exc) == said
