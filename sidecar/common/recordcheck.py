"""The rank record's checker: a record file's JSON checked field by field against the dataclass's
annotations (types, ranges), fast enough for the 10,000 records of a big job's `replica ls`.

    schema = RecordSchema(RankRecord, int_limits={"rank": ...}, objects={"conflict": {...}})
    record = schema.parse(data)      # a RankRecord, or ValueError naming the first bad field

What a record holds is `sidecar.common.records`'s (its fields, their bounds, the safe read of
one file); how a record is checked is this module's. Standard library only, no I/O.
"""

from __future__ import annotations

import dataclasses
import json
import math
import operator
import types
import typing
from collections.abc import Mapping
from typing import Any, Generic, Protocol, TypeVar, cast

# Bounds that hold for every number of a record: integers within JSON's safe range, floats finite.
MAX_SAFE_INT = (1 << 53) - 1
MAX_FLOAT = 1e300
# Signatures seen, per schema, and their plans; bounded, so that odd records cannot grow it without end.
MAX_PLANS = 256

Record = TypeVar("Record")
FieldCheck = typing.Callable[[Any], "str | None"]
Signature = tuple[tuple[str, ...], tuple[type, ...]]


# json.loads of bytes first guesses their encoding and wraps the scanner in two calls
# and two regex matches, a third of its cost on a record. A record as a sidecar writes
# it (UTF-8, "{" first, nothing after the object but a newline) goes to the scanner
# directly; anything else, and any failure, takes json.loads, for its value or its error.
class _Scanner(Protocol):
    """The scanner JSONDecoder sets on itself (undeclared in typeshed): (value, end) at an index."""

    def scan_once(self, string: str, index: int, /) -> tuple[Any, int]: ...


_scan_json = cast(_Scanner, json.JSONDecoder()).scan_once
_JSON_SPACE = " \t\n\r"  # what json.loads allows after the value


def loads(data: bytes) -> Any:
    """`json.loads(data)`, a third faster for a record as a sidecar writes it."""
    if data[:1] == b"{":
        try:
            text = data.decode("utf-8", "surrogatepass")  # the codec json.loads picks for such bytes
            obj, end = _scan_json(text, 0)
        except (ValueError, StopIteration, RecursionError):
            pass
        else:
            if end == len(text) or not text[end:].strip(_JSON_SPACE):
                return obj
    return json.loads(data)


def _type_name(value: Any) -> str:
    return "null" if value is None else {dict: "object", list: "array", str: "string", bool: "boolean"}.get(
        type(value), type(value).__name__)


def checker(hint: Any) -> FieldCheck:
    """A function that says why a value does not fit the type `hint` (a dataclass field's
    annotation), or returns None. Built once per field."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        inner = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        check = checker(inner[0]) if len(inner) == 1 else (lambda value: None)
        if type(None) in typing.get_args(hint):
            return lambda value: None if value is None else check(value)
        return check
    if hint is bool:
        return lambda value: None if value is True or value is False else f"must be true or false, got {_type_name(value)}"
    if hint is int:
        def check_int(value: Any) -> str | None:
            if type(value) is not int:  # bool is an int subclass: refused too
                return f"must be an integer, got {_type_name(value)}"
            return None if 0 <= value <= MAX_SAFE_INT else f"must be between 0 and {MAX_SAFE_INT}, got {value}"
        return check_int
    if hint is float:
        def check_float(value: Any) -> str | None:
            if type(value) is not float and type(value) is not int:
                return f"must be a number, got {_type_name(value)}"
            return None if math.isfinite(value) and abs(value) <= MAX_FLOAT else f"must be a finite number, got {value}"
        return check_float
    if hint is str:
        return lambda value: None if type(value) is str else f"must be a string, got {_type_name(value)}"
    if origin is dict:
        return lambda value: None if type(value) is dict else f"must be an object, got {_type_name(value)}"
    if origin is list:
        item_check = checker(typing.get_args(hint)[0])

        def check_list(value: Any) -> str | None:
            if type(value) is not list:
                return f"must be an array, got {_type_name(value)}"
            for i, item in enumerate(value):
                problem = item_check(item)
                if problem:
                    return f"item {i} {problem}"
            return None
        return check_list
    return lambda value: None  # Any


def _plain_types(hint: Any) -> frozenset[type]:
    """The types a field's value may have without a closer look (lists and checked objects
    get one; so does an int in a float field, which may overflow)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return frozenset().union(*(_plain_types(arg) for arg in typing.get_args(hint)))
    if hint in (int, float, str, bool, type(None)):
        return frozenset({hint})
    return frozenset({dict}) if typing.get_origin(hint) is dict else frozenset()


class RecordSchema(Generic[Record]):
    """How records of the dataclass `cls` are parsed and checked.

    Args:
        cls: the record's dataclass; its annotations say each field's type.
        int_limits: integer fields with a bound below MAX_SAFE_INT (ranks, world sizes).
        objects: object fields whose keys are checked too: {field: {key: type}}; each key is required.
    """

    def __init__(self, cls: type[Record], int_limits: Mapping[str, int] | None = None,
                 objects: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        hints = typing.get_type_hints(cls)
        self.cls = cls
        self.names = frozenset(f.name for f in fields)
        self.defaults = {f.name: f.default for f in fields if f.default is not dataclasses.MISSING}
        self.factories = [(f.name, f.default_factory) for f in fields if f.default_factory is not dataclasses.MISSING]
        self.required = tuple(f.name for f in fields if f.default is dataclasses.MISSING
                              and f.default_factory is dataclasses.MISSING)
        self.rank_limits = dict(int_limits or {})
        self.objects = {name: {key: checker(hint) for key, hint in keys.items()} for name, keys in (objects or {}).items()}
        self.checks: dict[str, FieldCheck] = {name: checker(hint) for name, hint in hints.items()}
        self.plain_types = {name: _plain_types(hint) - ({dict} if name in self.objects else set())
                            for name, hint in hints.items()}
        self.int_limits = {name: self.rank_limits.get(name, MAX_SAFE_INT) for name in hints}
        self.list_fields = frozenset(name for name, hint in hints.items() if typing.get_origin(hint) is list)
        # Every field, for a record that names them all: a value each (overwritten), in one order;
        # and the plans of such records, by the types of their values in that order.
        self.template: dict[str, Any] = dict.fromkeys(f.name for f in fields)
        # Each field's name, as the one string object the dataclass's attributes are looked up by: a
        # record's dict keyed by these (not the JSON parser's new strings) finds them by pointer.
        self.canonical = {name: name for name in self.template}
        self.order = tuple(self.template)
        self.plans: dict[Signature, _Plan] = {}
        self.complete_plans: dict[tuple[type, ...], _Plan] = {}
        self.partial_plans: dict[Signature, _Plan] = {}
        self.factory_names = tuple(name for name, _ in self.factories)

    def parse(self, data: bytes) -> Record:
        """Parse and check a record field by field.

        Raises:
            ValueError: not JSON, not an object, a required field missing, or a
                field of the wrong type or out of range (the message names it).
        """
        try:
            obj = loads(data)
        except RecursionError:
            raise ValueError("it is nested too deeply to be a rank record") from None
        return self.parse_object(obj)

    def parse_object(self, obj: Any) -> Record:
        """`parse` for a record's object already read from JSON (a node record's entry). It is
        taken over by the record: the caller must not use it afterwards.

        Raises:
            ValueError: as `parse`.
        """
        if not isinstance(obj, dict):
            raise ValueError(f"it holds a JSON {type(obj).__name__}, not an object")
        # The common case, without a call per field: records of one sidecar share their keys
        # and the types of their values, so what to check is worked out once per such
        # signature (`_Plan`), and then only the ranges of its numbers and the lists and
        # objects are looked at.
        template = self.template
        if len(obj) == len(template):
            # A record that names every field and nothing else (any sidecar's own): its
            # values go into a copy of a dict of all fields (keys in one order, and the
            # field names themselves rather than the parser's new strings per record,
            # so attribute lookups compare pointers), and its signature is their types.
            fields = template.copy()
            fields.update(obj)
            if len(fields) == len(template):
                kinds = tuple(map(type, fields.values()))
                plan = self.complete_plans.get(kinds)
                if plan is None:
                    plan = _Plan(self, (self.order, kinds))
                    if len(self.complete_plans) < MAX_PLANS:
                        self.complete_plans[kinds] = plan
                if not plan.passes(fields):
                    self.check_all(obj)  # raises ValueError, naming the first bad field
                record = self.cls.__new__(self.cls)
                record.__dict__ = fields
                return cast(Record, record)
        signature = (tuple(obj), tuple(map(type, obj.values())))
        plan = self.plans.get(signature)
        if plan is None:
            plan = _Plan(self, signature)
            if len(self.plans) < MAX_PLANS:
                self.plans[signature] = plan
        if plan.unknown:  # a newer sidecar's record: keep what we know
            obj = {k: v for k, v in obj.items() if k in self.names}
        if not plan.passes(obj):
            self.check_all(obj)  # raises ValueError, naming the first bad field
        # What the dataclass __init__ does for a checked object, at a seventh of its
        # cost: the defaults (fresh lists for default factories), then the fields read.
        record = self.cls.__new__(self.cls)
        values = record.__dict__
        values.update(self.defaults)
        for name, factory in self.factories:
            if name not in obj:
                values[name] = factory()
        values.update(obj)
        return cast(Record, record)

    def check_fields(self, obj: dict[str, Any]) -> None:
        """Check the fields `obj` holds, none required: a part of a record (the fields that the
        entries of a node record share, or one entry's own). Names that are no field are left
        for the caller to drop.

        Raises:
            ValueError: a field of the wrong type or out of range (the message names it).
        """
        signature = (tuple(obj), tuple(map(type, obj.values())))
        plan = self.partial_plans.get(signature)
        if plan is None:
            plan = _Plan(self, signature, partial=True)
            if len(self.partial_plans) < MAX_PLANS:
                self.partial_plans[signature] = plan
        if not plan.passes(obj):
            self.check_all({k: v for k, v in obj.items() if k in self.names}, partial=True)

    def columns_pass(self, rows: list[dict[str, Any]]) -> bool:
        """Whether every field of `rows`, parts of records with the same keys (a node record's
        entries), fits: each field checked once for all of them, as `_Plan.passes` checks a record.
        False: one of them does not (`check_fields` on each says which)."""
        names, plain, limits = self.names, self.plain_types, self.int_limits
        for name in rows[0]:
            if name not in names:
                continue
            values = list(map(operator.itemgetter(name), rows))
            kinds = set(map(type, values))
            if kinds <= plain[name]:
                if int in kinds:
                    ints = values if len(kinds) == 1 else [v for v in values if type(v) is int]
                    if min(ints) < 0 or max(ints) > limits[name]:
                        return False
                if float in kinds:
                    floats = values if len(kinds) == 1 else [v for v in values if type(v) is float]
                    total = sum(floats)  # NaN if any is NaN
                    if total != total or min(floats) < -MAX_FLOAT or max(floats) > MAX_FLOAT:
                        return False
            elif any(self.check_field(name, v) for v in values):
                return False
        return True

    def base(self, common: dict[str, Any]) -> tuple[dict[str, Any], tuple[str, ...], tuple[str, ...]]:
        """For records that share the fields `common` (checked: `check_fields`): the values that
        `assemble` starts each such record from, `common`'s and the default factories' (the
        fields at a plain default are left to the class, where the dataclass keeps them: a
        record's dict holds what it says, a third of a whole one for a node's entries, which
        10,000 ranks of `replica ls` make); the required fields it lacks; and the lists and
        objects in it, which each record copies."""
        values = {name: factory() for name, factory in self.factories}
        canonical = self.canonical
        values.update({canonical[k]: v for k, v in common.items() if k in canonical})
        shared = tuple(k for k, v in common.items() if (type(v) is list or type(v) is dict) and k in self.names)
        return values, tuple(n for n in self.required if n not in common), self.factory_names + shared

    def assemble(self, base: dict[str, Any], own: dict[str, Any], required: tuple[str, ...],
                 shared: tuple[str, ...]) -> Record:
        """A record of `base` (`base()`) and its own fields `own` (checked: `check_fields`).

        Args:
            required, shared: as `base()` returned them: the required fields `base` does
                not give, and its lists and objects (each record gets copies).

        Raises:
            ValueError: a required field is in neither.
        """
        for name in required:
            if name not in own:
                raise ValueError(f"field {name!r} is missing")
        values = base.copy()
        for name in shared:
            value = values[name]
            values[name] = type(value)(value)
        canonical = self.canonical
        values.update({canonical[k]: v for k, v in own.items() if k in canonical})
        record = self.cls.__new__(self.cls)
        record.__dict__ = values
        return cast(Record, record)

    def check_field(self, name: str, value: Any) -> str | None:
        """Why `value` does not fit field `name`, or None."""
        problem = self.checks[name](value)
        limit = self.rank_limits.get(name)
        if problem is None and limit is not None and value > limit:
            problem = f"must be at most {limit}, got {value}"
        keys = self.objects.get(name)
        if problem is None and keys is not None and value is not None:
            for key, check in keys.items():
                if key not in value:
                    return f"has no {key!r}"
                problem = check(value[key])
                if problem:
                    return f"key {key!r} {problem}"
        return problem

    def check_all(self, obj: dict[str, Any], partial: bool = False) -> None:
        """Check every field of a record's object, in order (`partial`: none is required).

        Raises:
            ValueError: a required field is missing, or a field is of the wrong type or out of range.
        """
        missing = [] if partial else [name for name in self.required if name not in obj]
        if missing:
            raise ValueError(f"field {missing[0]!r} is missing")
        for name, value in obj.items():
            kind = type(value)
            if kind in self.plain_types[name]:
                if kind is int:
                    if 0 <= value <= self.int_limits[name]:
                        continue
                elif kind is not float or -MAX_FLOAT <= value <= MAX_FLOAT:  # NaN fails this too
                    continue
            problem = self.check_field(name, value)
            if problem:
                raise ValueError(f"field {name!r} {problem}")


class _Plan:
    """How to check a record object of one signature (its keys, and the types of its values)."""

    def __init__(self, schema: RecordSchema[Any], signature: Signature, partial: bool = False) -> None:
        names, kinds = signature
        self.schema = schema
        self.unknown = not set(names) <= schema.names
        self.ok = partial or all(name in names for name in schema.required)  # else `check_all` says which is missing
        self.ints: list[str] = []  # ints within 0..MAX_SAFE_INT
        self.ranks: list[tuple[str, int]] = []  # and within their own bounds
        self.floats: list[str] = []  # floats within +-MAX_FLOAT (not NaN)
        self.lists: list[str] = []  # lists in list fields: `check_field` for their items
        self.others: list[str] = []  # other lists and objects: `check_field`
        for name, kind in zip(names, kinds, strict=True):
            if name not in schema.names:
                continue
            if kind is list and name in schema.list_fields:
                self.lists.append(name)
            elif kind not in schema.plain_types[name]:
                self.others.append(name)
            elif kind is int:
                if name in schema.rank_limits:
                    self.ranks.append((name, schema.rank_limits[name]))
                else:
                    self.ints.append(name)
            elif kind is float:
                self.floats.append(name)

    def passes(self, obj: dict[str, Any]) -> bool:
        if not self.ok:
            return False
        get = obj.__getitem__
        if self.ints:
            values = tuple(map(get, self.ints))
            if min(values) < 0 or max(values) > MAX_SAFE_INT:
                return False
        for name, limit in self.ranks:
            if not 0 <= obj[name] <= limit:
                return False
        if self.floats:
            values = tuple(map(get, self.floats))
            total = sum(values)  # NaN if any is NaN (the bounds keep a sum of the others finite)
            if total != total or min(values) < -MAX_FLOAT or max(values) > MAX_FLOAT:
                return False
        check_field = self.schema.check_field
        for name in self.lists:
            if obj[name] and check_field(name, obj[name]):  # an empty history or recent_steps is fine
                return False
        return not any(check_field(name, obj[name]) for name in self.others)
