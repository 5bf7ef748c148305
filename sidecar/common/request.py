"""The profile request model: pure, strict and bounded. No I/O here.

A request arrives as the bytes of a control file (JSON object, or empty for
"this rank's defaults"), as CLI flags, or as a signal. `parse_request` turns
the bytes into a `ProfileRequest` or raises `RequestError` with a message meant
for the person who wrote the file. A writer builds a `ControlRequest` (only the
fields it names) and sends it through its `to_wire()`, the one serialisation.

Bounds that hold everywhere: every integer fits JSON's safe range
(|n| <= 2**53 - 1, `MAX_SAFE_INTEGER`), and a `start_step` may lie at most
`MAX_START_AHEAD_STEPS` steps, and about `MAX_START_AHEAD_S` seconds at the
recent step rate, past the step a rank has reached (`check_start_ahead`; the
CLI and each rank both apply it, so no request can leave a rank armed for ever).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from sidecar.common.config import (
    MAX_ACTIVE_STEPS,
    MAX_FACTOR,
    MAX_RANK,
    MAX_SAFE_INTEGER,
    MAX_WAIT_STEPS,
    MAX_WARMUP_STEPS,
    MIN_FACTOR,
    SubProfilerConfig,
)
from sidecar.common.exceptions import RequestError

KINDS = ("trace", "stacks", "memory", "hang", "cancel", "watch")
# A cancel names only which ranks (default: all) and, optionally, its id.
CANCEL_FIELDS = ("id", "kind", "rank_filter")
MAX_START_STEP = MAX_SAFE_INTEGER
# How far past a rank's current step a start_step may lie: in steps, and in
# time at the recent step rate. Further is a typo or a stuck request, refused.
MAX_START_AHEAD_STEPS = 100_000
MAX_START_AHEAD_S = 24 * 3600.0
MAX_ID_LEN = 128
MAX_RANK_FILTER_TEXT = 4096
MAX_RANK_FILTER_ITEMS = 65536
_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@+-]*$")

FIELDS = (
    "id",
    "kind",
    "active_steps",
    "warmup_steps",
    "wait_steps",
    "start_step",
    "rank_filter",
    "record_shape",
    "profile_memory",
    "with_stack",
    "with_modules",
    # kind "watch" only (the slowdown watch, sidecar.rank.slowdown): capture when steps slow down
    "factor",
    "consecutive",
    "repeat",
    "baseline",
    # kind "trace" only: what asked for it (a slowdown watch's "step time 3.4x the median ...")
    "reason",
)
WATCH_FIELDS = ("factor", "consecutive", "repeat", "baseline")
MAX_CONSECUTIVE = 1000
MAX_REPEAT = 1000
MAX_REASON_LEN = 300
DEFAULT_CONSECUTIVE = 3
_BOOL_FIELDS = ("record_shape", "profile_memory", "with_stack", "with_modules")
_STEP_BOUNDS = {
    "active_steps": (1, MAX_ACTIVE_STEPS),
    "warmup_steps": (0, MAX_WARMUP_STEPS),
    "wait_steps": (0, MAX_WAIT_STEPS),
    "start_step": (0, MAX_START_STEP),
}


@dataclass(frozen=True)
class RankFilter:
    """A set of global ranks, or every rank (`ranks is None`)."""

    ranks: frozenset[int] | None

    ALL_TEXT = "all"

    def __contains__(self, rank: object) -> bool:
        return self.ranks is None or rank in self.ranks

    @property
    def is_all(self) -> bool:
        return self.ranks is None

    def highest(self) -> int | None:
        return None if self.ranks is None else max(self.ranks, default=None)

    def to_json(self) -> str | list[int]:
        return self.ALL_TEXT if self.ranks is None else sorted(self.ranks)

    def __str__(self) -> str:
        if self.ranks is None:
            return self.ALL_TEXT
        if not self.ranks:
            return "none"
        parts: list[str] = []
        ordered = sorted(self.ranks)
        start = prev = ordered[0]
        for rank in ordered[1:] + [None]:
            if rank is not None and rank == prev + 1:
                prev = rank
                continue
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            if rank is not None:
                start = prev = rank
        return ",".join(parts)


def parse_rank_filter(value: Any, field_name: str = "rank_filter") -> RankFilter:
    """Parse `[0, 1]`, `"0-3,8"` or `"all"`. An empty list means rank 0.

    Raises:
        RequestError: naming the part that does not parse.
    """
    if isinstance(value, str):
        text = value.strip()
        if len(text) > MAX_RANK_FILTER_TEXT:
            raise RequestError(f"{field_name} is {len(text)} characters long; at most {MAX_RANK_FILTER_TEXT} are allowed")
        if text.lower() == RankFilter.ALL_TEXT:
            return RankFilter(None)
        if not text:
            raise RequestError(f"{field_name} is empty; give ranks like '0,1', '0-3,8' or 'all'")
        ranks: set[int] = set()
        for part in text.split(","):
            part = part.strip()
            match = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+))?", part)
            if not match:
                raise RequestError(f"{field_name}: cannot parse {part!r}; use ranks like '0,1', '0-3,8' or 'all'")
            low = int(match.group(1))
            high = int(match.group(2)) if match.group(2) is not None else low
            if high < low:
                raise RequestError(f"{field_name}: range {part!r} runs backwards")
            if high > MAX_RANK:
                raise RequestError(f"{field_name}: rank {high} in {part!r} is above the limit {MAX_RANK}")
            if high - low + 1 + len(ranks) > MAX_RANK_FILTER_ITEMS:
                raise RequestError(f"{field_name} selects more than {MAX_RANK_FILTER_ITEMS} ranks; use 'all'")
            ranks.update(range(low, high + 1))
        return RankFilter(frozenset(ranks))
    if isinstance(value, list):
        if len(value) > MAX_RANK_FILTER_ITEMS:
            raise RequestError(f"{field_name} lists {len(value)} ranks; at most {MAX_RANK_FILTER_ITEMS} are allowed")
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int):
                raise RequestError(f"{field_name} must list integer ranks, got {item!r}")
            if not 0 <= item <= MAX_RANK:
                raise RequestError(f"{field_name}: rank {item} is out of range 0..{MAX_RANK}")
        return RankFilter(frozenset(value) if value else frozenset({0}))
    raise RequestError(f"{field_name} must be a list of ranks or a string like '0-3,8' or 'all', got {type(value).__name__}")


@dataclass(frozen=True)
class ProfileRequest:
    """One capture to run. Step counts follow torch.profiler's schedule."""

    id: str
    kind: str = "trace"
    active_steps: int = 1
    warmup_steps: int = 1
    wait_steps: int = 1
    start_step: int | None = None
    rank_filter: RankFilter = RankFilter(frozenset({0}))
    record_shape: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_modules: bool = False
    # kind "watch": capture when a step takes more than `factor` times the recent median,
    # `consecutive` steps in a row; `repeat` re-arms after a capture; `baseline` takes one capture at once
    factor: float | None = None
    consecutive: int = DEFAULT_CONSECUTIVE
    repeat: int = 0
    baseline: bool = True
    reason: str | None = None  # kind "trace": what asked for it (a slowdown watch), said in the log and record
    source: str = "file"  # "file" or "signal": where it came from, never parsed

    @property
    def num_steps(self) -> int:
        """Steps from the start of the schedule to the save."""
        return self.wait_steps + self.warmup_steps + self.active_steps

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["rank_filter"] = self.rank_filter.to_json()
        if self.kind != "watch":  # a record's request keeps the shape it had before the watch
            for name in WATCH_FIELDS:
                del data[name]
        if self.reason is None:
            del data["reason"]
        return data


@dataclass(frozen=True)
class ControlRequest:
    """A request as a writer sends it: `profile set|cancel|stacks|hang`, a slowdown watch's capture.

    Only what the writer names goes on the wire: a field left None is the rank's own default
    (its [profiler.sub_profiler_config]), as in a request file written by hand. `to_wire()` is
    the one way to the control file's bytes; `sidecar.common.registry.write_request` the one
    way to the file.
    """

    id: str | None = None
    kind: str | None = None
    rank_filter: RankFilter | None = None
    start_step: int | None = None
    active_steps: int | None = None
    warmup_steps: int | None = None
    wait_steps: int | None = None
    record_shape: bool | None = None
    profile_memory: bool | None = None
    with_stack: bool | None = None
    with_modules: bool | None = None
    factor: float | None = None
    consecutive: int | None = None
    repeat: int | None = None
    baseline: bool | None = None
    reason: str | None = None

    @classmethod
    def same_capture(cls, request: ProfileRequest, **given: Any) -> ControlRequest:
        """A request that records what `request` records (its ranks, step counts and the flags it
        turns on), plus the fields `given`."""
        flags = {name: True for name in _BOOL_FIELDS if getattr(request, name)}
        return cls(rank_filter=request.rank_filter, active_steps=request.active_steps,
                   warmup_steps=request.warmup_steps, wait_steps=request.wait_steps, **{**flags, **given})

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ControlRequest:
        """A request from its JSON object (one written by hand, or by a tool).

        Raises:
            RequestError: a field that is no request field, or a rank filter that does not parse.
        """
        unknown = sorted(k for k in obj if k not in FIELDS)
        if unknown:
            raise RequestError(f"unknown field {unknown[0]!r} in request (known fields: {', '.join(FIELDS)})")
        values = dict(obj)
        if values.get("rank_filter") is not None:
            values["rank_filter"] = parse_rank_filter(values["rank_filter"])
        return cls(**values)

    def to_json(self) -> dict[str, Any]:
        """The JSON object: the fields given, the rank filter as its text ("0-3,8", "all")."""
        data = {name: getattr(self, name) for name in FIELDS if getattr(self, name) is not None}
        if self.rank_filter is not None:
            data["rank_filter"] = str(self.rank_filter)
        return data

    def to_wire(self) -> bytes:
        """The control file's bytes: the JSON object, keys sorted, one line."""
        return (json.dumps(self.to_json(), sort_keys=True) + "\n").encode()


CONFIG_TABLE = "profiler.sub_profiler_config"
COUNTS = ("active_steps", "warmup_steps", "wait_steps")
_NO_STEPS_KINDS = ("cancel", "stacks", "hang")  # kinds that trace no step: their counts are never used


def bound_count(name: str, value: int, key: str) -> tuple[int, str | None]:
    """A step count within the sidecar's bounds, for a value the sidecar did not refuse
    when it came (cosmos-rl's config, a cosmos-rl worker's call).

    Args:
        name: active_steps, warmup_steps or wait_steps.
        key: where the value came from, for the messages ("profiler.sub_profiler_config.active_steps").

    Returns:
        (value, note): above the limit, the limit and a note saying so; else (value, None).

    Raises:
        RequestError: below the floor (a negative count, or no active step), naming `key`.
    """
    low, high = _STEP_BOUNDS[name]
    if value > high:
        return high, f"{key} = {value} is above the sidecar's limit of {high}; {high} is used"
    if value < low:
        raise RequestError(f"{key} = {value}, but {name} must be at least {low}; give {name} in the request")
    return value, None


def config_defaults(sub: SubProfilerConfig) -> tuple[dict[str, Any], list[str]]:
    """The request fields a rank's config supplies when a request omits them, and notes
    (one line per key) on what bounding them did.

    The config is taken as cosmos-rl takes it; its values are bounded here, where the
    sidecar uses them: a count above the sidecar's limit is clamped to it; a count
    below its floor stays, so that a request taking it from the config is refused
    (`check_counts`), naming the key; ranks outside 0..MAX_RANK name no rank and are
    left out of the filter.
    """
    values: dict[str, Any] = {"kind": "trace", "start_step": None}
    notes: list[str] = []
    for name in COUNTS:
        key = f"{CONFIG_TABLE}.{name}"
        value = getattr(sub, name)
        try:
            values[name], note = bound_count(name, value, key)
        except RequestError:
            values[name], note = value, (f"{key} = {value} is below {_STEP_BOUNDS[name][0]}: a request that does "
                                         f"not give {name} is refused")
        if note:
            notes.append(note)
    ranks = [r for r in sub.rank_filter if 0 <= r <= MAX_RANK]
    if len(ranks) != len(sub.rank_filter):
        left_out = sorted(set(sub.rank_filter) - set(ranks))
        notes.append(f"{CONFIG_TABLE}.rank_filter: {', '.join(map(str, left_out[:5]))}"
                     f"{', ...' if len(left_out) > 5 else ''} name no rank (0..{MAX_RANK}) and are left out"
                     + ("; the config's rank_filter selects no rank" if not ranks else ""))
    values["rank_filter"] = RankFilter(frozenset(ranks)) if sub.rank_filter else RankFilter(frozenset({0}))
    for name in _BOOL_FIELDS:
        values[name] = getattr(sub, name)
    return values, notes


def defaults_from_config(sub: SubProfilerConfig) -> dict[str, Any]:
    """The request fields a rank's config supplies when a request omits them (see `config_defaults`)."""
    return config_defaults(sub)[0]


def check_counts(values: dict[str, Any], given: Any = ()) -> None:
    """Refuse a request whose step counts, taken from the config (not in `given`), are below their floor.

    Raises:
        RequestError: naming the config key and what to give instead.
    """
    if values.get("kind") in _NO_STEPS_KINDS:
        return
    for name in COUNTS:
        if name not in given and values[name] < _STEP_BOUNDS[name][0]:
            bound_count(name, values[name], f"this rank's config has {CONFIG_TABLE}.{name}")


def parse_request(data: bytes, defaults: dict[str, Any], fallback_id: str) -> ProfileRequest:
    """Parse control-file bytes into a request.

    Args:
        data: the file's content; empty or whitespace means "defaults".
        defaults: from `defaults_from_config`.
        fallback_id: the id to use when the request names none.

    Raises:
        RequestError: with a message naming what is wrong.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RequestError(f"request is not UTF-8 text (byte {exc.start})") from None
    if not text.strip():
        check_counts(defaults)
        return ProfileRequest(id=fallback_id, **defaults)
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RequestError(f"request is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise RequestError("request is not valid JSON: nested too deeply") from None
    except ValueError as exc:  # not a decode error: e.g. an integer longer than sys.get_int_max_str_digits()
        raise RequestError(f"request is not valid JSON: {exc}") from None
    return request_from_dict(obj, defaults, fallback_id)


def request_from_dict(obj: Any, defaults: dict[str, Any], fallback_id: str) -> ProfileRequest:
    """Validate a decoded JSON request (see `parse_request`)."""
    if not isinstance(obj, dict):
        raise RequestError(f"request must be a JSON object, got a JSON {_json_type(obj)}")
    unknown = sorted(k for k in obj if k not in FIELDS)
    if unknown:
        raise RequestError(f"unknown field {unknown[0]!r} in request (known fields: {', '.join(FIELDS)})")
    values = dict(defaults)
    for key, value in obj.items():
        if key == "id":
            values["id"] = _check_id(value)
        elif key == "kind":
            if value not in KINDS:
                raise RequestError(f"kind must be one of {', '.join(KINDS)}, got {value!r}")
            values["kind"] = value
        elif key in _STEP_BOUNDS:
            if value is None and key == "start_step":
                values[key] = None
                continue
            low, high = _STEP_BOUNDS[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise RequestError(f"{key} must be an integer, got {value!r}")
            if not low <= value <= high:
                raise RequestError(f"{key} must be between {low} and {high}{_bound_note(high)}, got {value}")
            values[key] = value
        elif key == "rank_filter":
            values[key] = parse_rank_filter(value)
        elif key == "factor":
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not MIN_FACTOR < value <= MAX_FACTOR:
                raise RequestError(f"factor must be a number above {MIN_FACTOR:g} and at most {MAX_FACTOR:g}, got {value!r}")
            values[key] = float(value)
        elif key in ("consecutive", "repeat"):
            low, high = (1, MAX_CONSECUTIVE) if key == "consecutive" else (0, MAX_REPEAT)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise RequestError(f"{key} must be an integer between {low} and {high}, got {value!r}")
            values[key] = value
        elif key == "baseline":
            if not isinstance(value, bool):
                raise RequestError(f"baseline must be true or false, got {value!r}")
            values[key] = value
        elif key == "reason":
            if not isinstance(value, str) or len(value) > MAX_REASON_LEN:
                raise RequestError(f"reason must be a string of at most {MAX_REASON_LEN} characters")
            values[key] = value
        elif key in _BOOL_FIELDS:
            if not isinstance(value, bool):
                raise RequestError(f"{key} must be true or false, got {value!r}")
            values[key] = value
    values.setdefault("id", fallback_id)
    if values["kind"] == "cancel":
        extra = sorted(k for k in obj if k not in CANCEL_FIELDS)
        if extra:
            raise RequestError(
                f"field {extra[0]!r} has no meaning in a cancel request (a cancel takes {', '.join(CANCEL_FIELDS)})"
            )
        if "rank_filter" not in obj:
            values["rank_filter"] = RankFilter(None)  # a cancel ends whatever runs, on every rank
    if values["kind"] == "watch" and "factor" not in obj:
        raise RequestError("a watch request needs a factor (a step slower than factor x the recent median "
                           "counts as slow), e.g. \"factor\": 3")
    if values["kind"] != "watch":
        extra = sorted(k for k in obj if k in WATCH_FIELDS)
        if extra:
            raise RequestError(f"field {extra[0]!r} has meaning only in a watch request (\"kind\": \"watch\")")
    if "reason" in obj and values["kind"] != "trace":
        raise RequestError("field 'reason' has meaning only in a trace request")
    if values["kind"] == "hang" and "rank_filter" not in obj:
        values["rank_filter"] = RankFilter(None)  # a hang is found by lining every rank up
    check_counts(values, given=obj)
    return ProfileRequest(**values)


def _bound_note(high: int) -> str:
    return " (2**53-1, the largest integer JSON carries exactly)" if high == MAX_SAFE_INTEGER else ""


def file_request_id(mtime_ns: int, data: bytes) -> str:
    """The id of a control-file version that names none (or is re-issued): the
    same on every rank that reads that version, different for every new version."""
    import hashlib  # here, not at the top: it loads OpenSSL, which every CLI command would pay for at start

    return f"file-{mtime_ns}-{hashlib.sha256(data).hexdigest()[:8]}"


def is_complete(data: bytes) -> bool:
    """Whether control-file bytes look finished: not empty, and whole JSON.

    A file seen empty or half-written may be a writer between its truncate and
    its write; the file trigger reads it again before it takes it as it is.
    """
    if not data.strip():
        return False
    try:
        json.loads(data)
    except (ValueError, RecursionError):
        return False
    return True


def check_start_ahead(start_step: int, current_step: int, rate: float | None) -> str | None:
    """Why `start_step` is too far past `current_step` (None when it is within the horizon).

    Args:
        rate: recent steps per second, when known; the time bound applies only then.
    """
    ahead = start_step - current_step
    if ahead > MAX_START_AHEAD_STEPS:
        return (
            f"start_step {start_step} is {ahead} steps past step {current_step}; "
            f"the limit is {MAX_START_AHEAD_STEPS} steps ahead"
        )
    if rate and ahead / rate > MAX_START_AHEAD_S:
        return (
            f"start_step {start_step} is {ahead} steps past step {current_step}, about {_duration(ahead / rate)} "
            f"at the recent {rate:.3g} steps/s; the limit is {_duration(MAX_START_AHEAD_S)} ahead"
        )
    return None


def _duration(seconds: float) -> str:
    if seconds >= 2 * 86400:
        return f"{round(seconds / 86400, 1):g} days"
    if seconds >= 3600:
        return f"{round(seconds / 3600, 1):g} h"
    return f"{seconds:.0f} s"


def _check_id(value: Any) -> str:
    if not isinstance(value, str):
        raise RequestError(f"id must be a string, got {value!r}")
    if not value or len(value) > MAX_ID_LEN or not _ID_RE.fullmatch(value):  # fullmatch: `$` alone lets a trailing newline in
        raise RequestError(
            f"id must be 1-{MAX_ID_LEN} characters of letters, digits and ._:@+- starting with a letter or digit, got {value[:40]!r}"
        )
    return value


def _json_type(obj: Any) -> str:
    return {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(obj), "number" if isinstance(obj, (int, float)) else type(obj).__name__
    )
