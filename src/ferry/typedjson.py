"""Check decoded JSON against a ``TypedDict``, so that the TypedDict is the schema.

Every document ferry reads from outside (a checkpoint's manifest, the files of a job
directory, control requests) is declared once, as a TypedDict, and parsed here before
anything uses it: the declaration is what mypy checks the readers against, and what the
parser checks the bytes against. The parser understands the few types these documents
use: ``str``, ``int``, ``float``, ``bool``, ``None``, ``object`` (any JSON value),
``Literal[...]``, unions, ``list[X]``, ``dict[str, X]`` (or ``Mapping[str, X]``) and nested
TypedDicts.

Rules, the same for every document: an ``int`` is not a ``bool`` and fits in 64 bits; a
``float`` is finite and may be written as an integer; a key the TypedDict does not declare
is dropped (a newer writer may add one); a key it requires must be there.
"""

from __future__ import annotations

import json
import math
import types
from collections.abc import Callable, Mapping
from typing import Literal, TypeVar, Union, cast, get_args, get_origin, get_type_hints

T = TypeVar("T")

INT_MIN, INT_MAX = -(2**63), 2**63 - 1


class SchemaError(ValueError):
    """A value does not match its declared type; the message names the field."""

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field or 'the document'}: {why}")
        self.field = field
        self.why = why


def _name(hint: object) -> str:
    if hint is type(None):
        return "null"
    if isinstance(hint, type) and not _is_typeddict(hint):
        return {"str": "a string", "int": "an integer", "float": "a number", "bool": "true or false",
                "object": "a JSON value"}.get(hint.__name__, hint.__name__)  # fmt: skip
    origin = get_origin(hint)
    if origin is Literal:
        return " or ".join(repr(a) for a in get_args(hint))
    if origin in (Union, types.UnionType):
        return " or ".join(_name(a) for a in get_args(hint))
    if origin is list:
        return f"a list of {_name(get_args(hint)[0])}"
    return "an object"


def _got(value: object) -> str:
    if value is None:
        return "null"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def _is_typeddict(hint: object) -> bool:
    return isinstance(hint, type) and issubclass(hint, dict) and hasattr(hint, "__required_keys__")


def _join(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


def check(value: object, hint: object, path: str = "") -> object:
    """``value`` as ``hint`` declares it (floats written as integers become floats, a
    TypedDict loses its undeclared keys); SchemaError naming ``path`` otherwise."""
    if hint is object:
        return value
    if hint is type(None):
        if value is None:
            return None
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if not INT_MIN <= value <= INT_MAX:
                raise SchemaError(path, f"integer {value} is out of range")
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value) or abs(value) > 1e300:
                raise SchemaError(path, f"expected a finite number, got {value!r}")
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif _is_typeddict(hint):
        if isinstance(value, dict):
            return _fields(value, cast("type[Mapping[str, object]]", hint), path, None)
    else:
        return _generic(value, hint, path)
    raise SchemaError(path, f"expected {_name(hint)}, got {_got(value)}")


def _generic(value: object, hint: object, path: str) -> object:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
    elif origin in (Union, types.UnionType):
        for arg in args:
            try:
                return check(value, arg, path)
            except SchemaError as exc:
                if exc.field != path:  # the right shape, wrong inside: say where
                    raise
    elif origin is list:
        if isinstance(value, list):
            return [check(v, args[0], _join(path, i)) for i, v in enumerate(value)]
    elif origin in (dict, Mapping):  # a Mapping field: read as a dict, declared read-only
        if isinstance(value, dict):
            return {k: check(v, args[1], _join(path, k)) for k, v in value.items()}
    else:
        raise TypeError(f"typedjson cannot check {hint!r}")  # a programming error, not a bad file
    raise SchemaError(path, f"expected {_name(hint)}, got {_got(value)}")


def _fields(
    doc: Mapping[str, object],
    schema: type[Mapping[str, object]],
    path: str,
    dropped: Callable[[SchemaError], None] | None,
) -> dict[str, object]:
    hints = _hints(schema)
    required: frozenset[str] = getattr(schema, "__required_keys__", frozenset())
    out: dict[str, object] = {}
    for key, hint in hints.items():
        where = _join(path, key)
        if key not in doc:
            if key in required:
                raise SchemaError(where, "missing")
            continue
        try:
            out[key] = check(doc[key], hint, where)
        except SchemaError as exc:
            if dropped is None or key in required:
                raise
            dropped(exc)
    return out


_HINTS: dict[type, dict[str, object]] = {}


def _hints(schema: type) -> dict[str, object]:
    if schema not in _HINTS:  # resolving string annotations is slow; schemas are few
        _HINTS[schema] = get_type_hints(schema)
    return _HINTS[schema]


def loads(data: str | bytes) -> object:
    """``json.loads``, with JSON nested past Python's recursion limit (``[[[[...``, which no
    ferry writer makes) refused as ValueError like any other bad JSON, not RecursionError."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("JSON nested deeper than any document ferry writes") from None


def parse(raw: object, schema: type[T], path: str = "") -> T:
    """``raw`` (decoded JSON) as the TypedDict ``schema``; SchemaError at the first bad field."""
    if not isinstance(raw, dict):
        raise SchemaError(path, f"expected an object, got {_got(raw)}")
    return cast(T, _fields(raw, cast("type[Mapping[str, object]]", schema), path, None))


def salvage(raw: object, schema: type[T], dropped: Callable[[SchemaError], None], path: str = "") -> T:
    """Like ``parse``, for documents that are read while they are alive (status, events):
    an optional field that does not match is left out and handed to ``dropped``; only a
    bad required field (or a document that is not an object) raises SchemaError."""
    if not isinstance(raw, dict):
        raise SchemaError(path, f"expected an object, got {_got(raw)}")
    return cast(T, _fields(raw, cast("type[Mapping[str, object]]", schema), path, dropped))


__all__ = ["SchemaError", "check", "loads", "parse", "salvage"]
