"""Read one Chrome trace without torch, one event at a time, and tell who wrote it.

Traces can be hundreds of MB, so nothing here `json.load`s one: `TraceReader`
streams the `traceEvents` array one event at a time, and each consumer keeps
only what it needs (open spans per thread and totals per name for a summary,
a pid map for a merge).

    with TraceReader(path) as reader:
        reader.header()["baseTimeNanoseconds"]
        for event in reader.events():
            ...

Also here, for every consumer of a capture: `identity_of` (the rank, host and
replica a trace names, else its `<replica>_<rank>` directory), `as_paths` and
`check_unique` (one trace per rank). About 420 lines: the streaming JSON parser
with its error messages is most of it, and it is one piece.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from sidecar.common.exceptions import TraceError
from sidecar.common.layout import RANK_DIR_RE, TRACE_FILE_RE
from sidecar.common.registry import open_regular

__all__ = ["CHUNK_CHARS", "MAX_VALUE_CHARS", "TraceReader", "iter_events"]

CHUNK_CHARS = 1 << 18
# One JSON value (an event, a metadata key) larger than this is taken for a broken file.
MAX_VALUE_CHARS = 64 << 20
_WS = re.compile(r"[ \t\n\r]*")
_GZIP_MAGIC = b"\x1f\x8b"
# Where a trace's rank comes from when the trace itself says it (not its directory or position).
RANKED_SOURCES = ("distributedInfo", "cosmos_profiler")


class TraceReader:
    """Stream one Chrome trace (gzip or plain JSON) one event at a time.

    Reads the JSON Object Format (`{"traceEvents": [...], ...}`, what kineto
    writes) and the JSON Array Format (`[...]`). The top-level keys other than
    `traceEvents` land in `metadata`: those before the array once `header()`
    returns, all of them once `events()` is exhausted. Gzip is detected from
    the content, not the name.

        with TraceReader(path) as reader:
            reader.header()["baseTimeNanoseconds"]
            for event in reader.events():
                ...

    Memory is one chunk of text plus the value being decoded, whatever the
    file size: each event is decoded with `json.JSONDecoder.raw_decode` from a
    buffer that is refilled and compacted as it is consumed.

    Raises:
        TraceError: the file is missing, not UTF-8, a truncated or corrupt
            gzip, malformed or truncated JSON, or not a Chrome trace.
    """

    def __init__(self, path: str | os.PathLike[str], chunk_chars: int = CHUNK_CHARS) -> None:
        self.path = Path(path)
        self.metadata: dict[str, Any] = {}
        self.num_events = 0
        self._chunk = max(1, int(chunk_chars))
        self._decoder = json.JSONDecoder()
        self._buf = ""
        self._pos = 0
        self._offset = 0  # characters dropped from the front of _buf so far
        self._eof = False
        self._state = "start"  # start -> events -> done
        self._array_format = False
        self._has_events = False
        self._raw, self._text, self.is_gzip = _open_text(self.path)
        for observer in tuple(_READ_OBSERVERS):
            observer(self.path)

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for f in (self._text, self._raw):
            try:
                f.close()
            except (OSError, EOFError, zlib.error):
                pass

    def header(self) -> dict[str, Any]:
        """Read up to the start of `traceEvents`; return the metadata seen so far."""
        if self._state == "start":
            ch = self._peek()
            if ch == "[":
                self._pos += 1
                self._array_format = self._has_events = True
                self._state = "events"
            elif ch == "{":
                self._pos += 1
                self._read_members(first=True)
            elif ch == "":
                raise TraceError(f"{self.path} is empty, not a Chrome trace")
            else:
                raise TraceError(
                    f"{self.path} is not a Chrome trace: it starts with {ch!r}, not a JSON object or array"
                )
        return self.metadata

    def events(self) -> Iterator[dict[str, Any]]:
        """Yield every event of `traceEvents` in file order, then read the trailing keys."""
        self.header()
        if self._state != "events":
            return
        first = True
        while True:
            ch = self._peek()
            if ch == "]":
                self._pos += 1
                break
            if not first:
                if ch != ",":
                    raise self._unexpected(ch, "',' or ']' between events", "the traceEvents array")
                self._pos += 1
                ch = self._peek()
            if ch == "":
                raise self._unexpected(ch, "an event", "the traceEvents array")
            event = self._value("an event in traceEvents")
            if not isinstance(event, dict):
                raise TraceError(
                    f"{self.path} is not a Chrome trace: event {self.num_events} of traceEvents is "
                    f"a JSON {_json_type(event)}, not an object"
                )
            first = False
            self.num_events += 1
            yield event
        self._state = "after"
        if self._array_format:
            self._finish()
        else:
            self._read_members(first=False)

    def read_metadata(self) -> dict[str, Any]:
        """All top-level keys, reading (and dropping) the events if they come first."""
        for _ in self.events():
            pass
        return self.metadata

    # -- the JSON structure around the events --------------------------------

    def _read_members(self, first: bool) -> None:
        """Read `"key": value` pairs of the top-level object until traceEvents or the closing brace."""
        expect_comma = not first
        while True:
            ch = self._peek()
            if ch == "}":
                self._pos += 1
                self._finish()
                return
            if expect_comma:
                if ch != ",":
                    raise self._unexpected(ch, "',' or '}' between top-level keys", "the top-level object")
                self._pos += 1
                ch = self._peek()
            if ch != '"':
                raise self._unexpected(ch, "a top-level key", "the top-level object")
            key = self._value("a top-level key")
            if self._peek() != ":":
                raise self._unexpected(self._peek(), f"':' after the key {key!r}", "the top-level object")
            self._pos += 1
            if key == "traceEvents":
                if self._has_events:
                    raise TraceError(f"{self.path} is not a valid Chrome trace: it has two traceEvents arrays")
                ch = self._peek()
                if ch != "[":
                    raise TraceError(f"{self.path} is not a Chrome trace: traceEvents is not an array")
                self._pos += 1
                self._has_events = True
                self._state = "events"
                return
            self.metadata[key] = self._value(f"the value of the top-level key {key!r}")
            expect_comma = True

    def _finish(self) -> None:
        self._state = "done"
        if self._peek() != "":
            raise TraceError(
                f"{self.path} is not a valid Chrome trace: extra data after the end of the trace "
                f"at character {self._offset + self._pos}"
            )
        if not self._has_events:
            raise TraceError(f"{self.path} is not a Chrome trace: it has no traceEvents array")

    # -- the buffer -------------------------------------------------------------

    def _read_more(self, at_least: int = 0) -> bool:
        if self._eof:
            return False
        try:
            data = self._text.read(max(self._chunk, at_least))
        except EOFError:
            raise TraceError(
                f"{self.path}: truncated gzip file: the compressed data ends early "
                "(was it copied or written only in part?)"
            ) from None
        except (gzip.BadGzipFile, zlib.error) as exc:
            raise TraceError(f"{self.path}: corrupt gzip data ({exc})") from None
        except UnicodeDecodeError as exc:
            what = "its gzip content is" if self.is_gzip else "it is"
            raise TraceError(
                f"{self.path} is not a Chrome trace: {what} not UTF-8 text (byte {exc.start} of a chunk)"
            ) from None
        except OSError as exc:
            raise TraceError(f"cannot read {self.path}: {exc.strerror or exc}") from None
        if not data:
            self._eof = True
            return False
        if self._pos:
            self._offset += self._pos
            self._buf = self._buf[self._pos :] + data
            self._pos = 0
        else:
            self._buf += data
        return True

    def _peek(self) -> str:
        """Skip whitespace; the next character, or '' at the end of the file."""
        while True:
            blank = _WS.match(self._buf, self._pos)
            assert blank is not None  # _WS matches the empty string, so anywhere
            self._pos = blank.end()
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._read_more():
                return ""

    def _value(self, what: str) -> Any:
        self._peek()
        while True:
            try:
                value, end = self._decoder.raw_decode(self._buf, self._pos)
            except RecursionError:
                raise TraceError(
                    f"{self.path} is not a Chrome trace: {what} at character {self._offset + self._pos} nests too deep"
                ) from None
            except json.JSONDecodeError as exc:
                if not _may_continue(self._buf, exc):
                    raise self._malformed(what, exc) from None
                pending = len(self._buf) - self._pos
                if pending > MAX_VALUE_CHARS:
                    raise TraceError(
                        f"{self.path}: {what} at character {self._offset + self._pos} is malformed "
                        f"or larger than {MAX_VALUE_CHARS} characters ({exc.msg})"
                    ) from None
                if not self._read_more(pending):  # grow geometrically: one big value stays linear
                    raise TraceError(f"{self.path} is truncated: it ends in the middle of {what}") from None
                continue
            if (
                isinstance(value, (int, float))
                and not isinstance(value, bool)
                and _NUMBER_PART.fullmatch(self._buf, end)
                and self._read_more()
            ):
                continue  # a top-level number may go on in the next chunk ("0" then ".5")
            self._pos = end
            return value

    def _malformed(self, what: str, exc: json.JSONDecodeError) -> TraceError:
        return TraceError(
            f"{self.path} is not a valid Chrome trace: malformed JSON in {what} "
            f"at character {self._offset + exc.pos}: {exc.msg}"
        )

    def _unexpected(self, ch: str, expected: str, where: str) -> TraceError:
        if ch == "":
            return TraceError(f"{self.path} is truncated: it ends inside {where}")
        return TraceError(
            f"{self.path} is not a valid Chrome trace: expected {expected} at character "
            f"{self._offset + self._pos}, found {ch!r}"
        )


_LITERALS = ("true", "false", "null", "NaN", "Infinity", "-Infinity")
_NUMBER_PART = re.compile(r"[-+.eE0-9]*")


def _may_continue(buf: str, exc: json.JSONDecodeError) -> bool:
    """Could more text after `buf` make this failed decode succeed (the value is cut, not wrong)?"""
    if exc.msg.startswith("Unterminated"):
        return True  # a string or array without its end yet
    rest = buf[exc.pos :]
    # The scanner fails at most a literal's length before the end of a cut value.
    if len(rest) > 16:
        return False
    return (
        not rest
        or exc.msg.startswith("Invalid \\u")  # a \uXXXX escape cut short
        or any(lit.startswith(rest) for lit in _LITERALS)
        or bool(_NUMBER_PART.fullmatch(rest))
    )


# Called with each trace file a TraceReader opens (`observe_reads`): the CLI's progress on large captures.
_READ_OBSERVERS: list[Callable[[Path], None]] = []


@contextlib.contextmanager
def observe_reads(observer: Callable[[Path], None]) -> Iterator[None]:
    """Within the block, call `observer(path)` each time a trace file is opened for reading."""
    _READ_OBSERVERS.append(observer)
    try:
        yield
    finally:
        _READ_OBSERVERS.remove(observer)


def iter_events(path: str | os.PathLike[str]) -> Iterator[dict[str, Any]]:
    """Every event of one trace file, streamed (see `TraceReader`)."""
    with TraceReader(path) as reader:
        yield from reader.events()


def _open_text(path: Path) -> tuple[IO[bytes], IO[str], bool]:
    try:
        raw = open_regular(path)
    except FileNotFoundError:
        raise TraceError(f"{path}: no such trace file") from None
    except IsADirectoryError:
        raise TraceError(f"{path} is a directory, not a trace file") from None
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        is_gzip = raw.read(2) == _GZIP_MAGIC
        raw.seek(0)
    except OSError as exc:
        raw.close()
        raise TraceError(f"cannot read {path}: {exc.strerror or exc}") from None
    binary = gzip.GzipFile(fileobj=raw, mode="rb") if is_gzip else raw
    # utf-8-sig: json.load accepts a leading BOM in bytes, so do we.
    return raw, io.TextIOWrapper(binary, encoding="utf-8-sig"), is_gzip


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return "number"


# -- identity -------------------------------------------------------------------


@dataclass(frozen=True)
class TraceIdentity:
    """Who wrote a trace, as far as its metadata and its directory tell."""

    rank: int | None
    rank_source: str  # distributedInfo | cosmos_profiler | directory | position
    host: str | None
    replica: str | None
    role: str | None
    world_size: int | None
    request_id: str | None


def identity_of(meta: Mapping[str, Any], path: Path) -> TraceIdentity:
    """Who wrote a trace: distributedInfo, then the sidecar's metadata, then the `<replica>_<rank>` directory."""
    dist = meta.get("distributedInfo")
    dist = dist if isinstance(dist, dict) else {}
    ours = meta.get("cosmos_profiler")
    ours = ours if isinstance(ours, dict) else {}
    dir_match = RANK_DIR_RE.match(path.parent.name)
    rank, source = _as_int(dist.get("rank")), "distributedInfo"
    if rank is None:
        rank, source = _as_int(ours.get("rank")), "cosmos_profiler"
    if rank is None and dir_match:
        rank, source = int(dir_match["rank"]), "directory"
    if rank is None:
        source = "position"
    host = ours.get("host") if isinstance(ours.get("host"), str) else None
    if host is None and isinstance(meta.get("host_name"), str):  # kineto writes host_name
        host = meta["host_name"]
    replica = ours.get("replica") if isinstance(ours.get("replica"), str) else None
    if replica is None and dir_match:
        replica = dir_match["replica"]
    world_size = _as_int(dist.get("world_size"))
    if world_size is None:
        world_size = _as_int(ours.get("world_size"))
    role = ours.get("role") if isinstance(ours.get("role"), str) else None
    request_id = ours.get("request_id") if isinstance(ours.get("request_id"), str) else None
    return TraceIdentity(rank, source, host, replica, role, world_size, request_id)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def capture_index(path: Path) -> int | None:
    """n of a trace named `<n>_trace.json[.gz]`, else None."""
    match = TRACE_FILE_RE.match(path.name)
    return int(match["n"]) if match else None


def as_paths(paths: Iterable[str | os.PathLike[str]] | Mapping[Any, str | os.PathLike[str]]) -> list[Path]:
    """One path, paths, or a mapping's values, as a list of Paths."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    elif isinstance(paths, Mapping):
        paths = list(paths.values())
    return [Path(p) for p in paths]


def check_unique(ranks: list[tuple[int, Path]]) -> None:
    """Raise TraceError when two (rank, path) pairs name one rank."""
    seen: dict[int, Path] = {}
    for rank, path in ranks:
        if rank in seen:
            raise TraceError(
                f"two traces are for rank {rank}: {seen[rank]} and {path}; "
                "pass one capture at a time (find_captures groups them)"
            )
        seen[rank] = path

