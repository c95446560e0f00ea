"""The JSON Schema subset validator (edge_sdk.trust.schema_check) on its own, apart from the
manifest's schema (tests/edge_sdk/test_manifest_schema.py runs it on that)."""
import re

import pytest

from edge_sdk.trust.schema_check import check


def test_json_equality_in_const_and_enum():
    # JSON: 1 == 1.0, but true is not 1 (Python says True == 1)
    assert check(1.0, {"const": 1}) == []
    assert check(True, {"const": 1}) == ["value: expected 1, got True"]
    assert check(1, {"enum": [True, False]}) == ["value: expected one of [True, False], got 1"]
    assert check([1, 2], {"uniqueItems": True, "type": "array"}) == []
    assert check([1, 1.0], {"uniqueItems": True, "type": "array"}) == \
        ["value: expected unique items"]


def test_a_bool_is_neither_an_integer_nor_a_number():
    assert check(True, {"type": "integer"}) == ["value: expected integer, got bool True"]
    assert check(False, {"type": ["number", "null"]}) == \
        ["value: expected number or null, got bool False"]


def test_problems_name_their_path_through_refs_items_and_properties():
    schema = {"$defs": {"Row": {"type": "object", "required": ["id"],
                                "properties": {"id": {"type": "string", "minLength": 1}},
                                "additionalProperties": False}},
              "type": "array", "items": {"$ref": "#/$defs/Row"}}
    assert check([{"id": "a"}, {"id": ""}, {"x": 1}], schema, "rows") == [
        "rows[1].id: expected at least 1 character(s)",
        "rows[2].id: missing required key",
        "rows[2]: unknown key 'x'",
    ]


@pytest.mark.parametrize("schema, message", [
    ({"oneOf": [{"type": "integer"}]}, "does not implement: ['oneOf']"),
    ({"$ref": "http://example.com/s.json"}, "only local #/$defs/ references"),
])
def test_a_schema_outside_the_subset_is_refused_not_ignored(schema, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        check(1, schema)
