"""JSON Schema to GBNF (pyllm/json_schema.py): each grammar, run by the GBNF
engine (pyllm/gbnf.py), accepts JSON the schema allows, written with various
whitespace, and refuses what it does not; schemas that use what the converter
cannot express are refused with the keyword and where it is."""
import itertools
import json
import re

import pytest

from pyllm.errors import GrammarError
from pyllm.gbnf import Grammar
from pyllm.json_schema import schema_to_gbnf


def grammar(schema) -> Grammar:
    return Grammar.parse(schema_to_gbnf(schema))


def layouts(value) -> list[str]:
    """`value` as JSON text, compact, spaced, and indented with spaces and tabs."""
    return [json.dumps(value), json.dumps(value, separators=(",", ":")), json.dumps(value, indent=2),
            json.dumps(value, indent="\t", ensure_ascii=False)]


def check(schema, valid=(), invalid=(), texts=(), bad_texts=()):
    """Values in `valid` are accepted in every layout, those in `invalid` in
    none; `texts` and `bad_texts` are JSON texts written by hand."""
    g = grammar(schema)
    for value in valid:
        for text in layouts(value):
            assert g.accepts(text), text
    for value in invalid:
        for text in layouts(value):
            assert not g.accepts(text), text
    for text in texts:
        assert g.accepts(text), text
    for text in bad_texts:
        assert not g.accepts(text), text


# --- the grammar's text

def test_root_first_one_rule_a_line_each_shared_rule_once():
    text = schema_to_gbnf({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array"}},
                           "required": ["a"]})
    assert text.endswith("\n") and not text.endswith("\n\n")
    names = [line.split(" ::= ")[0] for line in text.splitlines()]
    assert names[0] == "root"
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[A-Za-z0-9-]+ ::= .+", line) for line in text.splitlines())
    assert {"space", "string", "char", "escape", "array", "value"} <= set(names)
    assert text == schema_to_gbnf({"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "array"}},
                                   "required": ["a"]})


def test_only_the_rules_used_are_written():
    assert schema_to_gbnf({"type": "boolean"}) == 'root ::= boolean\nboolean ::= "true" | "false"\n'
    assert schema_to_gbnf({"type": "integer", "minimum": 1}) == "root ::= [1-9] [0-9]{0,15}\n"
    names = {line.split(" ::= ")[0] for line in schema_to_gbnf({"type": "string"}).splitlines()}
    assert names == {"root", "string", "char", "escape"}


def test_whitespace_is_bounded_and_never_around_the_root():
    g = grammar({"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}}})
    assert g.accepts('{\n  "a" : [ 1 ,\n\t2 ]\n}')
    assert g.accepts("{" + "\n" + " " * 20 + '"a": []}')
    assert not g.accepts("{" + "\n" + " " * 21 + '"a": []}')
    assert not g.accepts('{"a":  []}')      # one space or a newline with indentation, not two spaces
    assert not g.accepts('{"a":\r\n[]}')
    for text in (' {"a": []}', '{"a": []} ', '{"a": []}\n'):
        assert not g.accepts(text)
    assert not grammar({"type": "string"}).accepts(' "x"')


def test_rule_names_come_from_properties_and_defs_sanitised_and_deduplicated():
    text = schema_to_gbnf({"type": "object", "properties": {
        "first name": {"type": "string", "maxLength": 3},
        "first_name": {"type": "string", "maxLength": 4},
        "space": {"type": "string", "minLength": 1},
        "pet": {"$ref": "#/$defs/Pet"}}, "$defs": {"Pet": {"enum": ["cat", "dog"]}}})
    names = [line.split(" ::= ")[0] for line in text.splitlines()]
    assert {"first-name", "first-name-1", "space-1", "Pet"} <= set(names)
    assert names.count("space") == 1


# --- primitives

def test_strings_with_escapes_and_any_code_point():
    check({"type": "string"},
          valid=["", "plain", 'q"uote', "back\\slash", "new\nline", "tab\t", "é日本🙂", "\x7f", "\x00"],
          texts=[r'"\/\b\f\n\r\t\u00e9\uD83D\uDE42"', '"a/b"'],
          bad_texts=['"\x01"', '"line\nbreak"', r'"\x41"', r'"\u12g4"', '"open', "'single'", '"a"b"', "x"],
          invalid=[1, None, ["a"]])


def test_string_lengths_count_characters_and_escapes_as_one():
    check({"type": "string", "minLength": 2, "maxLength": 3}, valid=["ab", "abc", "é🙂", 'a"'],
          invalid=["a", "abcd", ""], texts=[r'"\u0041\n"'], bad_texts=[r'"\u0041"'])
    check({"type": "string", "maxLength": 0}, valid=[""], invalid=["a"])
    check({"type": "string", "minLength": 1}, valid=["a", "x" * 100], invalid=[""])


def test_numbers_and_integers():
    check({"type": "number"}, valid=[0, -0.5, 1.25e-7, 10, 3.14159, -12000000000.0],
          texts=["1e5", "1E+05", "-0", "0.000", "12.5e-3"],
          bad_texts=["01", "1.", ".5", "+1", "1e", "--1", "NaN", "Infinity", '"1"', "0x10", "1" * 17])
    check({"type": "integer"}, valid=[0, 7, -42, 10 ** 15],
          texts=["-0", "9" * 16], bad_texts=["01", "1.0", "1e3", "-", "+3", "9" * 17, '"3"'])


def test_booleans_and_null():
    check({"type": "boolean"}, valid=[True, False], invalid=[None, 0, "true"], bad_texts=["True", "tru"])
    check({"type": "null"}, valid=[None], invalid=[False, 0, ""], bad_texts=["nul", "Null"])


def test_any_value():
    doc = {"a": [1, 2.5, "x", None, True, {"b": []}], "c": {}}
    for schema in ({}, True, {"title": "Anything", "description": "any JSON"}):
        check(schema, valid=[doc, [], "s", 0, None, False], bad_texts=["", "{", "[1,]", "{'a': 1}", "nil"])


# --- formats

def test_date_time_and_uuid_formats():
    check({"type": "string", "format": "date"}, valid=["2024-02-29", "1999-12-31", "0001-01-01"],
          invalid=["2024-13-01", "2024-00-10", "2024-01-32", "2024-1-01", "24-01-01", "2024-01-01T00:00:00", ""])
    check({"type": "string", "format": "time"},
          valid=["00:00:00", "23:59:59", "12:30:00.5", "12:30:00.123456Z", "08:15:00+05:30", "08:15:00-11:00"],
          invalid=["24:00:00", "12:60:00", "12:00", "12:00:00.", "12:00:00+5:30", "12:00:00z"])
    check({"type": "string", "format": "date-time"}, valid=["2024-05-06T07:08:09Z", "2024-05-06T07:08:09.25+01:00"],
          invalid=["2024-05-06 07:08:09", "2024-05-06", "2024-05-06T25:00:00"])
    check({"type": "string", "format": "uuid"}, valid=["123e4567-e89b-12d3-a456-426614174000",
                                                       "123E4567-E89B-12D3-A456-426614174000"],
          invalid=["123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g", ""])


def test_an_unknown_format_is_not_enforced_and_says_so():
    text = schema_to_gbnf({"type": "object", "properties": {"mail": {"type": "string", "format": "email"}}})
    assert text.startswith("# format 'email' at #/properties/mail is not enforced")
    g = Grammar.parse(text)
    assert g.accepts('{"mail": "not an address"}')


# --- integer ranges

RANGES = [(0, None), (1, None), (-15, 123), (-1000, -7), (5, 5), (0, 0), (10, 99), (None, -3), (None, 20),
          (100, 1000), (37, 4321), (-9, 9), (-100, 0), (99, 101)]


@pytest.mark.parametrize("lo,hi", RANGES)
def test_integer_ranges_hold_exactly_the_integers_in_range(lo, hi):
    schema = {"type": "integer"}
    if lo is not None:
        schema["minimum"] = lo
    if hi is not None:
        schema["maximum"] = hi
    g = grammar(schema)
    for n in itertools.chain(range(-1100, 1100, 1), range(4300, 4330), [10 ** 9, -10 ** 9, 10 ** 15, -10 ** 15]):
        expected = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert g.accepts(str(n)) == expected, n
    assert not g.accepts("007") and not g.accepts("1.0")
    assert g.accepts("9" * 16) == (hi is None) and not g.accepts("9" * 17)


def test_exclusive_and_draft4_and_fractional_bounds():
    def accepted(schema):
        g = grammar({"type": "integer", **schema})
        return [n for n in range(-20, 21) if g.accepts(str(n))]
    assert accepted({"exclusiveMinimum": 0, "exclusiveMaximum": 5}) == [1, 2, 3, 4]
    assert accepted({"minimum": 0, "exclusiveMinimum": True, "maximum": 5, "exclusiveMaximum": True}) == [1, 2, 3, 4]
    assert accepted({"minimum": -2.5, "maximum": 2.5}) == [-2, -1, 0, 1, 2]
    assert accepted({"exclusiveMinimum": -2.5, "exclusiveMaximum": 1.0}) == [-2, -1, 0]
    assert accepted({"minimum": 3, "exclusiveMinimum": 5, "maximum": 7}) == [6, 7]
    assert accepted({"minimum": 0, "exclusiveMinimum": False, "maximum": 2}) == [0, 1, 2]


def test_non_negative_and_positive_integers_have_the_usual_rules():
    assert schema_to_gbnf({"type": "integer", "minimum": 0}) == 'root ::= "0" | [1-9] [0-9]{0,15}\n'
    assert schema_to_gbnf({"type": "integer", "exclusiveMinimum": 0}) == "root ::= [1-9] [0-9]{0,15}\n"


# --- enum and const

def test_enum_of_any_json_values():
    values = ["red", 'say "hi"', "back\\slash", 3, -2.5, True, None, [1, "x"], {"k": {"n": [None]}}]
    check({"enum": values}, valid=values, invalid=["blue", "Red", 4, False, [1], {"k": {}}, {}],
          bad_texts=['"red" ', '"say \\"hi\\"'])
    # a literal has one spelling: non-ASCII characters as themselves, not as \u escapes
    check({"enum": ["é🙂"]}, texts=['"é🙂"'], bad_texts=['"\\u00e9\\ud83d\\ude42"'])


def test_enum_literals_are_json_dumps_text():
    assert schema_to_gbnf({"enum": ["red", "green"]}) == 'root ::= "\\"red\\"" | "\\"green\\""\n'


def test_enum_is_filtered_by_type_and_const():
    check({"type": "string", "enum": ["a", 1, None]}, valid=["a"], invalid=[1, None])
    check({"type": ["integer", "null"], "enum": ["a", 1, 2.0, True, None]}, valid=[1, 2.0, None], invalid=["a", True])
    check({"const": "only"}, valid=["only"], invalid=["other"])
    check({"const": 1, "enum": [1, True, 2]}, valid=[1], invalid=[True, 2])
    check({"const": {"a": [1, 2]}, "title": "fixed"}, valid=[{"a": [1, 2]}], invalid=[{"a": [2, 1]}])


# --- type lists and combinators

def test_type_lists_and_any_of():
    check({"type": ["string", "null"]}, valid=["x", None], invalid=[1, False])
    check({"type": ["integer", "number"]}, valid=[1, 1.5], invalid=["1"])
    for keyword in ("anyOf", "oneOf"):
        check({keyword: [{"type": "integer", "minimum": 0}, {"type": "string", "maxLength": 1}, False]},
              valid=[0, 12, "", "a"], invalid=[-1, "ab", None])
    check({"allOf": [{"type": "boolean"}], "description": "a single wrapped schema"}, valid=[True], invalid=[1])


# --- objects

PROPS = {"a": {"type": "integer"}, "b": {"type": "string"}, "c": {"type": "boolean"}, "d": {"type": "null"}}
SAMPLE = {"a": 1, "b": "x", "c": True, "d": None}


@pytest.mark.parametrize("required", [[], ["a"], ["b"], ["c", "d"], ["b", "d"], ["d"], ["a", "b", "c", "d"]])
def test_declared_members_come_in_order_optional_ones_may_be_left_out(required):
    g = grammar({"type": "object", "properties": PROPS, "required": required})
    for n in range(5):
        for keys in itertools.permutations("abcd", n):
            expected = list(keys) == sorted(keys) and set(required) <= set(keys)
            value = {k: SAMPLE[k] for k in keys}
            for text in layouts(value):
                assert g.accepts(text) == expected, text


def test_commas_must_be_exactly_right():
    for required in ([], ["b"]):
        check({"type": "object", "properties": PROPS, "required": required},
              texts=['{"a":1,"b":"x"}', '{"b":"x"}', '{"b":"x","d":null}'],
              bad_texts=['{,"b":"x"}', '{"b":"x",}', '{"a":1,,"b":"x"}', '{"a":1 "b":"x"}', '{"b":"x",,"d":null}',
                         '{"a":1,"b":"x","c":true,}', '{"b""x"}', "{"])


def test_no_additional_properties_unless_allowed():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    check(schema, valid=[{"a": 1}], invalid=[{"a": 1, "z": 2}, {}, {"a": "1"}, [], "a"])
    check({**schema, "additionalProperties": False}, valid=[{"a": 1}], invalid=[{"a": 1, "z": 2}])
    check({**schema, "additionalProperties": True}, valid=[{"a": 1}, {"a": 1, "z": [None], "y": {}}],
          invalid=[{"z": 1, "a": 1}], texts=['{"a": 1, "a ": 2, "": 3, "aa": 4, "\\\\": 5}'])
    check({**schema, "additionalProperties": {"type": "string"}}, valid=[{"a": 1, "z": "s", "é": ""}],
          invalid=[{"a": 1, "z": 2}])


def test_extra_members_cannot_repeat_a_declared_key():
    schema = {"type": "object", "properties": {"ab": {"type": "integer"}, "b": {"type": "integer"},
                                               "x": False, "-]": {"type": "integer"}, "^[": {"type": "integer"}},
              "additionalProperties": True}
    check(schema, valid=[{"ab": 1, "a": 2, "abc": 3, "": 4, "B": 5, "xx": 6, "a-b": 7, "]": 8, "-": 9, "^": 10}],
          invalid=[{"b": 1, "ab": 2}, {"x": 1}, {"ab": 1, "x": 1}],
          bad_texts=['{"ab": 1, "ab": 2}', '{"ab": 1, "b": 2, "b": 3}', '{"b": 1, "b": 2}', '{"-]": 1, "-]": 2}',
                     '{"^[": 1, "^[": 2}'])


def test_objects_without_properties():
    check({"type": "object"}, valid=[{}, {"k": [1, {"n": None}]}], invalid=[[], None])
    check({"type": "object", "additionalProperties": {"type": "integer"}}, valid=[{}, {"x": 1, "y": -2}],
          invalid=[{"x": "1"}])
    check({"type": "object", "additionalProperties": False}, valid=[{}], invalid=[{"x": 1}])
    check({"type": "object", "properties": {}}, valid=[{}], invalid=[{"x": 1}])


def test_required_names_outside_properties_take_the_additional_schema():
    check({"type": "object", "required": ["id"]}, valid=[{"id": 1}, {"id": "x", "more": 2}], invalid=[{}, {"x": 1}])
    check({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "id"],
           "additionalProperties": {"type": "string"}}, valid=[{"a": 1, "id": "x"}, {"a": 1, "id": "x", "z": "y"}],
          invalid=[{"a": 1}, {"a": 1, "id": 2}])


def test_property_names_that_need_escaping():
    props = {'say "hi"': {"type": "integer"}, "back\\slash": {"type": "integer"}, "é 日本": {"type": "integer"},
             "": {"type": "integer"}}
    value = {'say "hi"': 1, "back\\slash": 2, "é 日本": 3, "": 4}
    check({"type": "object", "properties": props, "required": list(props)}, invalid=[{'say "hi"': 1}],
          texts=[json.dumps(value, ensure_ascii=False), json.dumps(value, ensure_ascii=False, indent=1)],
          bad_texts=['{"say \\"hi\\"": 1, "back\\slash": 2, "é 日本": 3, "": 4}'])


# --- arrays

def test_items_and_counts():
    check({"type": "array", "items": {"type": "integer"}}, valid=[[], [1], list(range(30))],
          invalid=[["1"], [1, None], {}], bad_texts=["[1,]", "[,1]", "[1,,2]", "[1 2]", "["])
    schema = {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 3}
    check(schema, valid=[["a", "b"], ["a", "b", "c"]], invalid=[[], ["a"], ["a", "b", "c", "d"]])
    check({"type": "array", "minItems": 1}, valid=[[None], [1, "x", []]], invalid=[[]])
    check({"type": "array", "maxItems": 0}, valid=[[]], invalid=[[1]])
    check({"type": "array", "items": False}, valid=[[]], invalid=[[1]])


def test_prefix_items_are_positional_and_then_items_apply():
    tuple_schema = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]}
    check(tuple_schema, valid=[[], [1], [1, "a"], [1, "a", None, {}]], invalid=[["a"], [1, 2]])
    check({**tuple_schema, "items": False}, valid=[[], [1], [1, "a"]], invalid=[[1, "a", 2]])
    check({**tuple_schema, "items": {"type": "boolean"}, "minItems": 2, "maxItems": 4},
          valid=[[1, "a"], [1, "a", True], [1, "a", True, False]], invalid=[[1], [1, "a", 1], [1, "a", True] * 2])
    # Pydantic's Tuple[int, str]
    check({**tuple_schema, "minItems": 2, "maxItems": 2}, valid=[[1, "a"]], invalid=[[1], [1, "a", "b"]])
    check({"type": "array", "items": [{"type": "integer"}], "additionalItems": False}, valid=[[], [1]],
          invalid=[[1, 2]])


# --- references

def test_defs_and_definitions():
    check({"$defs": {"Id": {"type": "integer", "minimum": 1}}, "type": "array", "items": {"$ref": "#/$defs/Id"}},
          valid=[[1, 2]], invalid=[[0]])
    check({"definitions": {"Id": {"type": "string"}}, "$ref": "#/definitions/Id"}, valid=["x"], invalid=[1])
    check({"$defs": {"a/b": {"type": "null"}}, "$ref": "#/$defs/a~1b"}, valid=[None])


TREE = {
    "$defs": {"Node": {
        "type": "object",
        "properties": {"name": {"type": "string"},
                       "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
        "required": ["name", "children"]}},
    "$ref": "#/$defs/Node"}


def test_a_recursive_tree():
    leaf = {"name": "leaf", "children": []}
    tree = {"name": "root", "children": [leaf, {"name": "mid", "children": [leaf, leaf]}]}
    check(TREE, valid=[leaf, tree], invalid=[{"name": "x"}, {"name": "x", "children": [{"name": "y"}]},
                                             {"name": "x", "children": [1]}])


def test_the_root_can_refer_to_itself():
    check({"type": "object", "properties": {"next": {"anyOf": [{"$ref": "#"}, {"type": "null"}]}},
           "required": ["next"]}, valid=[{"next": None}, {"next": {"next": {"next": None}}}], invalid=[{"next": 1}])


# Pydantic's model_json_schema() for:
#   class Color(str, Enum): RED = "red"; GREEN = "green"
#   class Address(BaseModel): street: str; zip_code: str = Field(max_length=10)
#   class Person(BaseModel):
#       name: str; age: int = Field(ge=0); color: Color
#       address: Optional[Address] = None; tags: list[str] = []; born: date
PYDANTIC = {
    "$defs": {
        "Address": {"properties": {"street": {"title": "Street", "type": "string"},
                                   "zip_code": {"maxLength": 10, "title": "Zip Code", "type": "string"}},
                    "required": ["street", "zip_code"], "title": "Address", "type": "object"},
        "Color": {"enum": ["red", "green"], "title": "Color", "type": "string"}},
    "properties": {
        "name": {"title": "Name", "type": "string"},
        "age": {"minimum": 0, "title": "Age", "type": "integer"},
        "color": {"$ref": "#/$defs/Color"},
        "address": {"anyOf": [{"$ref": "#/$defs/Address"}, {"type": "null"}], "default": None},
        "tags": {"default": [], "items": {"type": "string"}, "title": "Tags", "type": "array"},
        "born": {"format": "date", "title": "Born", "type": "string"}},
    "required": ["name", "age", "color", "born"],
    "title": "Person", "type": "object"}


def test_a_pydantic_model():
    person = {"name": "Ada", "age": 36, "color": "green", "address": {"street": "1 Main St", "zip_code": "12345"},
              "tags": ["math", "engines"], "born": "1815-12-10"}
    minimal = {"name": "Ada", "age": 36, "color": "red", "born": "1815-12-10"}
    with_null = {"name": "Ada", "age": 36, "color": "red", "address": None, "born": "1815-12-10"}
    check(PYDANTIC, valid=[person, minimal, with_null],
          invalid=[{**minimal, "age": -1}, {**minimal, "color": "blue"}, {**minimal, "born": "1815-13-10"},
                   {"name": "Ada", "age": 36, "color": "red"}, {**minimal, "extra": 1}, {**minimal, "address": None},
                   {**person, "address": {"street": "x", "zip_code": "12345678901"}},
                   {**person, "address": {"street": "x"}}, {**person, "tags": [1]}])
    g = grammar(PYDANTIC)
    assert not g.accepts(json.dumps(minimal) + " ")
    assert not g.accepts(json.dumps(minimal)[:-1])


# --- refusals

UNSUPPORTED = [
    ({"type": "object", "properties": {"zip": {"type": "string", "pattern": "^([0-9])\\1$"}}},
     "at #/properties/zip/pattern: the escape '\\1'"),
    ({"type": "number", "minimum": 0}, "'minimum' at # is not supported for type 'number'"),
    ({"type": "number", "exclusiveMaximum": 1.5}, "'exclusiveMaximum' at #"),
    ({"minimum": 0}, "'minimum' at #"),
    ({"type": "integer", "multipleOf": 2}, "'multipleOf' at #"),
    ({"type": "object", "patternProperties": {"^x": {}}}, "'patternProperties' at #"),
    ({"type": "object", "propertyNames": {"maxLength": 3}}, "'propertyNames' at #"),
    ({"type": "object", "minProperties": 1}, "'minProperties' at #"),
    ({"type": "object", "maxProperties": 1}, "'maxProperties' at #"),
    ({"type": "object", "dependentRequired": {"a": ["b"]}}, "'dependentRequired' at #"),
    ({"type": "array", "uniqueItems": True}, "'uniqueItems' at #"),
    ({"type": "array", "contains": {"type": "integer"}}, "'contains' at #"),
    ({"$defs": {"A": {"not": {"type": "null"}}}, "type": "array", "items": {"$ref": "#/$defs/A"}},
     "'not' at #/$defs/A"),
    ({"if": {"type": "string"}, "then": {"minLength": 1}}, "'if' at #"),
    ({"type": "array", "items": {"anyOf": [{"type": "string", "pattern": "(?=a)"}]}},
     "at #/items/anyOf/0/pattern: look-around"),
    ({"allOf": [{"type": "string"}, {"maxLength": 3}]}, "'allOf' with more than one schema at #"),
    ({"type": "object", "anyOf": [{"required": ["a"]}]}, "'type' alongside 'anyOf' at #"),
    ({"enum": ["a", "bb"], "maxLength": 1}, "'maxLength' alongside 'enum' at #"),
    ({"type": "object", "properties": {"a": {"$ref": "https://example.com/a.json"}}},
     "$ref 'https://example.com/a.json' at #/properties/a is not supported"),
    ({"type": "string", "format": "date", "maxLength": 5}, "minLength/maxLength with format 'date' at #"),
]


@pytest.mark.parametrize("schema,message", UNSUPPORTED)
def test_what_cannot_be_expressed_is_refused(schema, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        schema_to_gbnf(schema)


BAD = [
    (False, "false: no value is valid"),
    ("string", "must be an object or a boolean, not str"),
    ({"type": "str"}, "unknown JSON schema type 'str' at #"),
    ({"type": []}, "non-empty list"),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"], "additionalProperties": False},
     "required at # names 'b', which is not in properties"),
    ({"type": "object", "properties": {"a": False}, "required": ["a"]},
     "property 'a' at # is required but its schema is false"),
    ({"type": "object", "properties": {"a": {"type": 3}}}, "at #/properties/a"),
    ({"type": "object", "required": "a"}, "required at # must be a list"),
    ({"$ref": "#/$defs/Missing"}, "does not point to anything"),
    ({"$ref": "#node"}, "is not supported"),
    ({"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "null"}]}}, "$ref": "#/$defs/A"}, "left-recursive"),
    ({"enum": []}, "non-empty list"),
    ({"type": "string", "enum": [1, 2]}, "no value of enum/const at # is valid"),
    ({"enum": [float("nan")]}, "not a JSON value"),
    ({"anyOf": [False, False]}, "every schema of #/anyOf is false"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "no integer satisfies"),
    ({"type": "integer", "exclusiveMinimum": 1, "exclusiveMaximum": 2}, "no integer satisfies"),
    ({"type": "integer", "minimum": "0"}, "minimum at # must be a number"),
    ({"type": "string", "minLength": 3, "maxLength": 2}, "minLength 3 is above maxLength 2 at #"),
    ({"type": "string", "format": ["date"]}, "format at # must be a string"),
    ({"type": "array", "maxItems": -1}, "maxItems at # must be a non-negative integer"),
    ({"type": "array", "prefixItems": [{}, {}], "items": False, "minItems": 3}, "no array satisfies"),
]


@pytest.mark.parametrize("schema,message", BAD)
def test_bad_schemas_are_refused(schema, message):
    with pytest.raises(GrammarError, match=re.escape(message)):
        schema_to_gbnf(schema)


def test_annotations_and_unknown_keywords_are_ignored():
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": "x", "$comment": "c", "title": "t",
              "description": "d", "default": 1, "examples": [1], "deprecated": True, "readOnly": True,
              "writeOnly": False, "x-vendor": {"anything": 1}, "type": "integer"}
    check(schema, valid=[1], invalid=["1"])
    check({"type": "string", "minimum": 3, "items": {"type": "integer"}}, valid=["s"], invalid=[3])
