"""JSON Schema to GBNF: constrain generation to the JSON a schema accepts.

ollama's `format: {...}`, OpenAI's `response_format` (json_schema), llama.cpp's
`--json-schema` and Pydantic's `model_json_schema()` describe the reply as a
JSON Schema; the grammar sampler needs a grammar. `schema_to_gbnf` writes one
in llama.cpp's GBNF dialect (pyllm/gbnf.py) whose language is the JSON texts
the schema accepts, narrowed in ways that keep generation short and
deterministic, as llama.cpp's converter does:

- object members come in the schema's declared order;
- whitespace is bounded, and there is none around the root value, so
  generation ends as soon as that value closes;
- an integer part has at most 16 digits, a fraction or an exponent 1 to 16;
- a schema without `type` takes its type from its keywords (`properties`
  means an object, `items` an array, ...).

A string's `pattern` becomes grammar too (pyllm.json_pattern: the common
regular-expression core). A keyword that constrains values but cannot be
expressed exactly (multipleOf, minimum on a non-integer, not, ...) raises GrammarError naming it
and where it is: a grammar that allows what the schema forbids would hand the
caller output that fails its own validation. Annotations and unknown keywords
are ignored, as JSON Schema says; an unknown `format` is noted in a comment.
"""
from __future__ import annotations

import json
import math
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional
from urllib.parse import unquote

from .errors import GrammarError
from .json_pattern import pattern_to_gbnf

# The shared rules; a grammar holds only those it uses, under these names.
PRIMITIVES: dict[str, str] = {
    "space": r'| " " | "\n" [ \t]{0,20}',
    "value": "object | array | string | number | boolean | null",
    "object": r'"{" space ( member ( "," space member )* )? "}"',
    "member": r'string space ":" space value space',
    "array": r'"[" space ( value space ( "," space value space )* )? "]"',
    "string": r'"\"" char* "\""',
    "char": r'[^"\\\x00-\x1F] | escape',
    "escape": r'"\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )',
    "number": r'"-"? integral-part ( "." [0-9]{1,16} )? ( [eE] ( "+" | "-" )? [0-9]{1,16} )?',
    "integer": r'"-"? integral-part',
    "integral-part": r'"0" | [1-9] [0-9]{0,15}',
    "boolean": r'"true" | "false"',
    "null": r'"null"',
    "date-string": r'"\"" date "\""',
    "time-string": r'"\"" time "\""',
    "date-time-string": r'"\"" date-time "\""',
    "uuid-string": r'"\"" [0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" '
                   r'[0-9a-fA-F]{12} "\""',
    "date-time": r'date "T" time',
    "date": r'[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )',
    "time": r'( [0-1] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{1,9} )? '
            r'( "Z" | ( "+" | "-" ) ( [0-1] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )?',
}
FORMATS = {"date": "date-string", "time": "time-string", "date-time": "date-time-string", "uuid": "uuid-string"}
MAX_INTEGER_DIGITS = 16

TYPES = ("object", "array", "string", "number", "integer", "boolean", "null")
# The keywords that constrain values of one type; others are ignored unless listed below.
TYPE_KEYWORDS = {
    "object": frozenset({"properties", "required", "additionalProperties", "patternProperties", "propertyNames",
                         "minProperties", "maxProperties", "dependentRequired", "dependentSchemas", "dependencies",
                         "unevaluatedProperties"}),
    "array": frozenset({"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems",
                        "contains", "minContains", "maxContains", "unevaluatedItems"}),
    "string": frozenset({"minLength", "maxLength", "format", "pattern"}),
    "number": frozenset({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
}
UNSUPPORTED = {
    "object": TYPE_KEYWORDS["object"] - {"properties", "required", "additionalProperties"},
    "array": frozenset({"contains", "minContains", "maxContains", "unevaluatedItems", "uniqueItems"}),
    "string": frozenset(),
    "number": TYPE_KEYWORDS["number"],
    "integer": frozenset({"multipleOf"}),
}
UNSUPPORTED_ANYWHERE = ("not", "if", "then", "else", "$dynamicRef", "$recursiveRef")
COMBINATORS = ("$ref", "anyOf", "oneOf", "allOf")
VALUE_KEYWORDS = frozenset({"type", "enum", "const", *COMBINATORS, *UNSUPPORTED_ANYWHERE}).union(
    *TYPE_KEYWORDS.values())

# A grammar token: literal, class, repetition count, or rule reference (the last group).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|\[(?:[^\]\\]|\\.)*\]|\{[0-9,]*\}|([A-Za-z0-9_-]+)')
_ATOM = re.compile(r'[A-Za-z0-9_-]+|"(?:[^"\\]|\\.)*"')


def schema_to_gbnf(schema: dict | bool, root: str = "root") -> str:
    """The GBNF grammar (root rule first, one rule a line) of the JSON texts
    `schema` accepts. Raises GrammarError for a bad schema or one that uses a
    value constraint this converter cannot express. `root` names the start
    rule, for a grammar that uses this one inside a larger one."""
    if root in PRIMITIVES or not re.fullmatch(r"[A-Za-z0-9-]+", root):
        raise GrammarError(f"{root!r} cannot name the schema's rule")
    return _Converter(schema, root).grammar()


@dataclass(frozen=True)
class _Member:
    key: str
    value: str      # rule reference or literal for the member's value
    required: bool


class _Converter:
    def __init__(self, schema: Any, root: str = "root"):
        self._schema, self._root = schema, root
        self._outside = {"root"} - {root}   # a grammar around this one starts at its own root
        self._rules: dict[str, Optional[str]] = {}    # name -> body (None while being built), in output order
        self._ref_names: dict[str, str] = {"#": root}
        self._heads: set[str] = {root}   # refs being built whose text so far is empty: a use is left recursion
        self._notes: list[str] = []

    def grammar(self) -> str:
        self._reserve(self._root)
        self._rules[self._root] = self._body(self._schema, self._root, "#")
        used = self._reachable(self._root)
        lines = ["# " + " ".join(note.splitlines()) for note in self._notes]
        lines += [f"{name} ::= {body}" for name, body in self._rules.items() if name in used]
        lines += [f"{name} ::= {body}" for name, body in PRIMITIVES.items() if name in used]
        return "\n".join(lines) + "\n"

    # -- rules and names

    def _reserve(self, hint: str) -> str:
        base = re.sub(r"[^A-Za-z0-9]+", "-", hint).strip("-") or "rule"
        name, n = base, 0
        while name in self._rules or name in PRIMITIVES or name in self._outside:
            n += 1
            name = f"{base}-{n}"
        self._rules[name] = None
        return name

    def _named(self, hint: str, build: Callable[[str], str]) -> str:
        """A reference to a rule for `build(name)`, or the body itself when it is
        one reference or literal. The name is reserved first so that the rules
        built inside are named after it and come after it."""
        name = self._reserve(hint)
        body = build(name)
        if _ATOM.fullmatch(body):
            del self._rules[name]
            return body
        self._rules[name] = body
        return name

    def _reachable(self, start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            body = self._rules[name] if name in self._rules else PRIMITIVES[name]
            todo += [m.group(1) for m in _TOKEN.finditer(body) if m.group(1)]
        return seen

    def _child(self, name: str, part: str) -> str:
        return part if name == self._root else f"{name}-{part}"

    @contextmanager
    def _inside_container(self) -> Iterator[None]:
        """Values inside an object or array come after a bracket: no left recursion there."""
        heads, self._heads = self._heads, set()
        try:
            yield
        finally:
            self._heads = heads

    # -- schemas

    def _visit(self, schema: Any, hint: str, path: str) -> str:
        return self._named(hint, lambda name: self._body(schema, name, path))

    def _body(self, schema: Any, name: str, path: str) -> str:
        if schema is True:
            return "value"
        if schema is False:
            raise GrammarError(f"the JSON schema at {path} is false: no value is valid")
        if not isinstance(schema, dict):
            raise GrammarError(f"a JSON schema must be an object or a boolean, not {type(schema).__name__} "
                               f"(at {path})")
        for keyword in UNSUPPORTED_ANYWHERE:
            if keyword in schema:
                raise _unsupported(keyword, path)
        present = [k for k in schema if k in VALUE_KEYWORDS]
        for combinator in COMBINATORS:
            if combinator in schema:
                _refuse_siblings(combinator, present, (), path)
                if combinator == "$ref":
                    return self._ref(schema["$ref"], path)
                if combinator == "allOf":
                    return self._all_of(schema["allOf"], name, path)
                return self._any_of(schema[combinator], name, f"{path}/{combinator}")
        if "enum" in schema or "const" in schema:
            _refuse_siblings("enum" if "enum" in schema else "const", present, ("enum", "const", "type"), path)
            return self._constants(schema, path)
        types = _types(schema, path)
        if types is None:
            return "value"
        if "integer" in types and "number" in types:
            types.remove("integer")
        return " | ".join(self._typed(t, schema, name, path) for t in types)

    def _ref(self, ref: Any, path: str) -> str:
        if not isinstance(ref, str):
            raise GrammarError(f"$ref at {path} must be a string, not {ref!r}")
        if ref in self._ref_names:
            name = self._ref_names[ref]
            if name in self._heads:
                raise GrammarError(f"$ref {ref!r} at {path} refers back to itself before any object or array "
                                   "encloses it (the grammar would be left-recursive)")
            return name
        target = self._resolve(ref, path)
        name = self._reserve(ref.rsplit("/", 1)[-1])
        self._ref_names[ref] = name
        self._heads.add(name)
        try:
            self._rules[name] = self._body(target, name, ref)
        finally:
            self._heads.discard(name)
        return name

    def _resolve(self, ref: str, path: str) -> Any:
        if not ref.startswith("#/"):
            raise GrammarError(f"$ref {ref!r} at {path} is not supported: only references inside the schema, "
                               "such as #/$defs/Name, are")
        target = self._schema
        for part in ref[2:].split("/"):
            part = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and part in target:
                target = target[part]
            elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
                target = target[int(part)]
            else:
                raise GrammarError(f"$ref {ref!r} at {path} does not point to anything in the schema")
        return target

    def _all_of(self, members: Any, name: str, path: str) -> str:
        if not isinstance(members, list) or not members:
            raise GrammarError(f"allOf at {path} must be a non-empty list of schemas")
        if len(members) > 1:
            raise GrammarError(f"JSON schema keyword 'allOf' with more than one schema at {path} is not supported")
        return self._body(members[0], name, f"{path}/allOf/0")

    def _any_of(self, members: Any, name: str, path: str) -> str:
        if not isinstance(members, list) or not members:
            raise GrammarError(f"{path.rsplit('/', 1)[-1]} at {path} must be a non-empty list of schemas")
        alternatives = [self._visit(member, f"{name}-{i}", f"{path}/{i}")
                        for i, member in enumerate(members) if member is not False]
        if not alternatives:
            raise GrammarError(f"every schema of {path} is false: no value is valid")
        return " | ".join(dict.fromkeys(alternatives))

    def _constants(self, schema: dict, path: str) -> str:
        values = schema.get("enum", [schema.get("const")])
        if not isinstance(values, list) or not values:
            raise GrammarError(f"enum at {path} must be a non-empty list")
        if "const" in schema:
            values = [v for v in values if _same_json(v, schema["const"])]
        if "type" in schema:
            types = _types(schema, path)
            values = [v for v in values if any(_is_instance(v, t) for t in types)]
        if not values:
            raise GrammarError(f"no value of enum/const at {path} is valid for the schema")
        return " | ".join(dict.fromkeys(_constant(v, path) for v in values))

    def _typed(self, type_name: str, schema: dict, name: str, path: str) -> str:
        for keyword in UNSUPPORTED.get(type_name, ()):
            if keyword in schema and not (keyword == "uniqueItems" and schema[keyword] is False):
                raise _unsupported(keyword, path, f" for type {type_name!r}" if type_name == "number" else "")
        if type_name == "object":
            return self._object(schema, name, path)
        if type_name == "array":
            return self._array(schema, name, path)
        if type_name == "string":
            return self._string(schema, path)
        if type_name == "integer":
            return _integer(*_integer_bounds(schema, path), path)
        return type_name    # number, boolean, null: their shared rules

    def _string(self, schema: dict, path: str) -> str:
        lo, hi = _count_bounds(schema, "minLength", "maxLength", path)
        fmt = schema.get("format")
        if fmt is not None and not isinstance(fmt, str):
            raise GrammarError(f"format at {path} must be a string, not {fmt!r}")
        if fmt in FORMATS:
            if lo or hi is not None:
                raise GrammarError(f"minLength/maxLength with format {fmt!r} at {path} is not supported")
            return FORMATS[fmt]
        if "pattern" in schema:
            if lo or hi is not None or fmt is not None:
                raise GrammarError(f"pattern with minLength/maxLength or format at {path} is not supported")
            return pattern_to_gbnf(schema["pattern"], "char", f"{path}/pattern")
        if fmt is not None:
            self._notes.append(f"format {fmt!r} at {path} is not enforced: any string is accepted there")
        if hi == 0:
            return r'"\"\""'
        if lo == 0 and hi is None:
            return "string"
        return rf'"\"" char{_repeat(lo, hi)} "\""'

    def _object(self, schema: dict, name: str, path: str) -> str:
        properties = schema.get("properties", {})
        if not isinstance(properties, dict):
            raise GrammarError(f"properties at {path} must be an object")
        required = schema.get("required", [])
        if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
            raise GrammarError(f"required at {path} must be a list of property names")
        required = list(dict.fromkeys(required))
        # Without additionalProperties: no keys beside the declared ones (as llama.cpp), any keys if none are.
        additional = schema.get("additionalProperties", "properties" not in schema)
        if not properties and not required and (additional is True or additional == {}):
            return "object"
        members = []
        with self._inside_container():
            for key, sub in properties.items():
                if sub is False:
                    if key in required:
                        raise GrammarError(f"property {key!r} at {path} is required but its schema is false")
                    continue
                value = self._visit(sub, self._child(name, key), f"{path}/properties/{key}")
                members.append(_Member(key, value, key in required))
            undeclared = [k for k in required if k not in properties]
            if undeclared and additional is False:
                raise GrammarError(f"required at {path} names {undeclared[0]!r}, which is not in properties, "
                                   "and additionalProperties is false: no object is valid")
            extra = None
            if additional is not False:
                value = self._visit(additional, self._child(name, "additional-value"),
                                    f"{path}/additionalProperties")
                members += [_Member(key, value, True) for key in undeclared]
                key = self._key_other_than([*properties, *undeclared], name)
                extra = f'{key} space ":" space {value} space'
        return _sequence('"{" space', self._members(members, extra, name), '"}"')

    def _members(self, members: list[_Member], extra: Optional[str], name: str) -> str:
        """What goes between the braces: the declared members in order, where
        optional ones may be left out, then the extra ones if allowed. Every
        member but the first written starts with a comma, so there is one
        alternative per member that can come first (the optional ones before
        the first required one, and that one). "The members from i on, each
        after a comma" is a rule of its own where two places continue with it."""
        kvs = [f'{_literal(_dumps(m.key))} space ":" space {m.value} space' for m in members]
        extras = f'( "," space {extra} )*' if extra else ""

        def piece(i: int) -> str:
            return f'"," space {kvs[i]}' if members[i].required else f'( "," space {kvs[i]} )?'

        first_required = next((i for i, m in enumerate(members) if m.required), None)
        heads = len(members) if first_required is None else first_required + 1
        # from member i (2 <= i < heads) on: after the alternative starting at i-1 and after the rest from i-1
        rest = {i: self._reserve(f"{name}-rest-{members[i].key}") for i in range(2, heads)}

        def rest_from(i: int) -> str:
            if i in rest:
                return rest[i]
            return _sequence(piece(i), rest_from(i + 1)) if i < len(members) else extras

        for i, rule in rest.items():
            self._rules[rule] = _sequence(piece(i), rest_from(i + 1))
        alternatives = [_sequence(kvs[i], rest_from(i + 1)) for i in range(heads)]
        if first_required is not None:
            return _group(alternatives)   # one alternative when the first member is required
        if extra:
            alternatives.append(_sequence(extra, extras))
        return f"( {' | '.join(alternatives)} )?" if alternatives else ""

    def _key_other_than(self, names: list[str], name: str) -> str:
        """A key that is none of `names` (as they are written without escapes),
        so extra members cannot repeat declared ones."""
        plain = [n for n in names if _dumps(n)[1:-1] == n]
        if not plain:
            return "string"
        trie: dict = {}
        for key in plain:
            node = trie
            for ch in key:
                node = node.setdefault(ch, {})
            node[""] = {}   # end of a name

        def rest(node: dict) -> str:
            alternatives = [] if "" in node else [r'"\""']
            chars = sorted(ch for ch in node if ch)
            alternatives += [f"{_literal(ch)} {rest(node[ch])}" for ch in chars]
            other = "".join(_class_char(ch) for ch in chars)
            alternatives.append(rf'( [^"\\\x00-\x1F{other}] | escape ) char* "\""')
            return _group(alternatives)

        return self._named(self._child(name, "additional-key"), lambda _: rf'"\"" {rest(trie)}')

    def _array(self, schema: dict, name: str, path: str) -> str:
        items = schema.get("items", True)
        if isinstance(items, list):    # the tuple form before draft 2020-12
            prefix, rest, prefix_path = items, schema.get("additionalItems", True), f"{path}/items"
        else:
            prefix, rest, prefix_path = schema.get("prefixItems", []), items, f"{path}/prefixItems"
        if not isinstance(prefix, list):
            raise GrammarError(f"prefixItems at {path} must be a list of schemas")
        lo, hi = _count_bounds(schema, "minItems", "maxItems", path)
        if any(s is False for s in prefix):   # no item may stand there, so the array ends before
            hi = min(next(i for i, s in enumerate(prefix) if s is False), hi if hi is not None else len(prefix))
            prefix = prefix[:hi]
        if rest is False:
            hi = min(len(prefix), hi if hi is not None else len(prefix))
        if hi is not None and lo > hi:
            raise GrammarError(f"no array satisfies the item counts at {path}")
        with self._inside_container():
            positional = [self._visit(s, self._child(name, f"item-{i}"), f"{prefix_path}/{i}")
                          for i, s in enumerate(prefix[:hi])]
            needs_rest = hi is None or hi > len(positional)
            rest_item = self._visit(rest, self._child(name, "item"), f"{path}/items") if needs_rest else ""

        def after(i: int) -> str:
            """Items from position i on, each after a comma."""
            if hi is not None and i >= hi:
                return ""
            if i >= len(positional):
                return _repeated(f'"," space {rest_item} space', max(lo - i, 0), None if hi is None else hi - i)
            part = _sequence(f'"," space {positional[i]} space', after(i + 1))
            return part if i < lo else f"( {part} )?"

        if hi == 0:
            return '"[" space "]"'
        items_text = _sequence(f"{positional[0] if positional else rest_item} space", after(1))
        return _sequence('"[" space', items_text if lo > 0 else f"( {items_text} )?", '"]"')


# -- schema helpers

def _unsupported(keyword: str, path: str, detail: str = "") -> GrammarError:
    return GrammarError(f"JSON schema keyword {keyword!r} at {path} is not supported{detail}")


def _refuse_siblings(keyword: str, present: list[str], allowed: tuple[str, ...], path: str) -> None:
    for other in present:
        if other != keyword and other not in allowed:
            raise GrammarError(f"JSON schema keyword {other!r} alongside {keyword!r} at {path} is not supported")


def _types(schema: dict, path: str) -> Optional[list[str]]:
    """The types a schema allows, from `type` or else from its keywords; None: any."""
    if "type" not in schema:
        inferred = [t for t, keywords in TYPE_KEYWORDS.items() if not keywords.isdisjoint(schema)]
        return inferred or None
    declared = schema["type"]
    names = [declared] if isinstance(declared, str) else declared
    if not isinstance(names, list) or not names:
        raise GrammarError(f"type at {path} must be a type name or a non-empty list of them, not {declared!r}")
    for t in names:
        if t not in TYPES:
            raise GrammarError(f"unknown JSON schema type {t!r} at {path} (known: {', '.join(TYPES)})")
    return list(dict.fromkeys(names))


def _is_instance(value: Any, type_name: str) -> bool:
    if type_name == "integer":
        return (isinstance(value, int) or isinstance(value, float) and value.is_integer()) \
            and not isinstance(value, bool)
    python_types = {"null": type(None), "boolean": bool, "number": (int, float), "string": str,
                    "array": list, "object": dict}[type_name]
    return isinstance(value, python_types) and (type_name == "boolean" or not isinstance(value, bool))


def _same_json(a: Any, b: Any) -> bool:
    """Equal as JSON values: true is not 1."""
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def _count_bounds(schema: dict, low_key: str, high_key: str, path: str) -> tuple[int, Optional[int]]:
    lo, hi = schema.get(low_key, 0), schema.get(high_key)
    for key, v in ((low_key, lo), (high_key, hi)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise GrammarError(f"{key} at {path} must be a non-negative integer, not {v!r}")
    if hi is not None and lo > hi:
        raise GrammarError(f"{low_key} {lo} is above {high_key} {hi} at {path}: no value is valid")
    return lo, hi


def _integer_bounds(schema: dict, path: str) -> tuple[Optional[int], Optional[int]]:
    """The least and greatest integers allowed (None: unbounded), from the
    2020-12 keywords or draft 4's boolean exclusiveMinimum/exclusiveMaximum."""
    def number(key: str, allow_bool: bool) -> Any:
        v = schema.get(key)
        if v is None or allow_bool and isinstance(v, bool):
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise GrammarError(f"{key} at {path} must be a number, not {v!r}")
        return v

    minimum, maximum = number("minimum", False), number("maximum", False)
    exclusive_min, exclusive_max = number("exclusiveMinimum", True), number("exclusiveMaximum", True)
    lows, highs = [], []
    if minimum is not None:
        lows.append(math.floor(minimum) + 1 if exclusive_min is True else math.ceil(minimum))
    if maximum is not None:
        highs.append(math.ceil(maximum) - 1 if exclusive_max is True else math.floor(maximum))
    if not isinstance(exclusive_min, (bool, type(None))):
        lows.append(math.floor(exclusive_min) + 1)
    if not isinstance(exclusive_max, (bool, type(None))):
        highs.append(math.ceil(exclusive_max) - 1)
    return max(lows, default=None), min(highs, default=None)


# -- grammar text

def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _literal(text: str) -> str:
    """A GBNF string literal for `text`."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in "\n\r\t":
            out.append({"\n": r"\n", "\r": r"\r", "\t": r"\t"}[ch])
        elif ord(ch) < 0x20 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _class_char(ch: str) -> str:
    """`ch` inside a character class: hex escapes for what would be syntax there."""
    return f"\\x{ord(ch):02X}" if ch in "\\]^-\"[" or ord(ch) < 0x20 or ch == "\x7f" else ch


def _constant(value: Any, path: str) -> str:
    """Exactly `value`, with the whitespace allowed inside containers."""
    if isinstance(value, dict):
        members = [f'{_literal(_dumps(k))} space ":" space {_constant(v, path)} space' for k, v in value.items()]
        return _sequence('"{" space', ' "," space '.join(members), '"}"')
    if isinstance(value, list):
        items = [f"{_constant(v, path)} space" for v in value]
        return _sequence('"[" space', ' "," space '.join(items), '"]"')
    try:
        return _literal(_dumps(value))
    except (TypeError, ValueError) as e:
        raise GrammarError(f"enum/const at {path} holds {value!r}, which is not a JSON value") from e


def _sequence(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _group(alternatives: list[str]) -> str:
    return alternatives[0] if len(alternatives) == 1 else f"( {' | '.join(alternatives)} )"


def _repeat(lo: int, hi: Optional[int]) -> str:
    """The postfix for lo..hi repetitions (hi None: unbounded)."""
    if hi is None:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    if (lo, hi) == (0, 1):
        return "?"
    if (lo, hi) == (1, 1):
        return ""
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _repeated(expr: str, lo: int, hi: Optional[int]) -> str:
    if hi == 0:
        return ""
    return expr if (lo, hi) == (1, 1) else f"( {expr} ){_repeat(lo, hi)}"


# -- integer ranges

def _integer(lo: Optional[int], hi: Optional[int], path: str) -> str:
    """The integers from lo to hi (None: unbounded), as alternatives of digit patterns."""
    if lo is None and hi is None:
        return "integer"
    if lo is not None and hi is not None and lo > hi:
        raise GrammarError(f"no integer satisfies the minimum and maximum at {path}")
    alternatives = []
    if lo is None or lo < 0:
        magnitudes = _naturals(1 if hi is None or hi >= 0 else -hi, None if lo is None else -lo)
        alternatives.append(f'"-" {_group(magnitudes)}')
    if hi is None or hi >= 0:
        alternatives += _naturals(0 if lo is None or lo < 0 else lo, hi)
    return " | ".join(alternatives)


def _naturals(a: int, b: Optional[int]) -> list[str]:
    """Patterns for the decimals of a..b (b None: up to MAX_INTEGER_DIGITS
    digits), shortest first. Each length of digits whose numbers are all in
    range is one class; the lengths where the range starts or ends are split."""
    patterns = []
    if a == 0:
        patterns.append('"0"')
        a = 1
    if b is not None and a > b:
        return patterns
    longest = len(str(b)) if b is not None else max(MAX_INTEGER_DIGITS, len(str(a)))
    full_lengths = []
    for n in range(len(str(a)), longest + 1):
        low, high = max(a, 10 ** (n - 1)), 10 ** n - 1 if b is None else min(b, 10 ** n - 1)
        if (low, high) == (10 ** (n - 1), 10 ** n - 1):
            full_lengths.append(n)
            continue
        if full_lengths:
            patterns.append(_full_lengths(full_lengths))
            full_lengths = []
        patterns += [_render_digits(p) for p in _same_length(str(low), str(high))]
    if full_lengths:
        patterns.append(_full_lengths(full_lengths))
    return patterns


def _full_lengths(lengths: list[int]) -> str:
    tail = _repeat(lengths[0] - 1, lengths[-1] - 1)
    return "[1-9]" if lengths == [1] else f"[1-9] [0-9]{tail}"


def _same_length(x: str, y: str) -> list[list[str]]:
    """Patterns for x..y, decimals of the same length, as lists of atoms:
    a digit string (a literal) or a class with its count."""
    if x == y:
        return [[x]]
    if len(x) == 1:
        return [[f"[{x}-{y}]"]]
    if x[0] == y[0]:
        return [[x[0], *p] for p in _same_length(x[1:], y[1:])]
    n = len(x) - 1
    first, last = int(x[0]), int(y[0])
    head, tail = [], []
    if x[1:] != "0" * n:      # x's leading digit with the numbers from x up
        head = [[x[0], *p] for p in _same_length(x[1:], "9" * n)]
        first += 1
    if y[1:] != "9" * n:      # y's leading digit with the numbers up to y
        tail = [[y[0], *p] for p in _same_length("0" * n, y[1:])]
        last -= 1
    middle = []
    if first <= last:
        lead = str(first) if first == last else f"[{first}-{last}]"
        middle = [[lead, "[0-9]" + (f"{{{n}}}" if n > 1 else "")]]
    return head + middle + tail


def _render_digits(atoms: list[str]) -> str:
    """Atoms as GBNF, adjacent digit literals joined into one."""
    out, digits = [], ""
    for atom in atoms:
        if atom.isdigit():
            digits += atom
            continue
        if digits:
            out.append(f'"{digits}"')
            digits = ""
        out.append(atom)
    if digits:
        out.append(f'"{digits}"')
    return " ".join(out)
