"""libkineto's on-demand protocol, as its IPC fabric speaks it: pure encode and decode, no I/O.

What kineto sends and takes (pytorch/kineto `libkineto/ipcfabric/FabricManager.h`, `Utils.h`,
`src/IpcFabricConfigClient.cpp`, `src/Config.cpp`):

- One AF_UNIX SOCK_DGRAM datagram per message: `struct Metadata { size_t size; char type[32]; }`
  (40 bytes, `METADATA`), then `size` payload bytes.
- A poll, type "req": `struct LibkinetoRequest { int32 type; int32 n; int64 jobid; int32 pids[n]; }`.
  `type` bits: EVENTS (1), ACTIVITIES (2; set only while kineto's profiler can take a config).
  `pids[0]` is the polling process, then its ancestors; `jobid` is `$SLURM_JOB_ID` or 0.
- The answer: `Metadata{size=len(config), type="req"}` and the config text. The client takes any
  datagram queued for it as the answer to its current poll, so one is sent only to a poll that
  takes a config (never a late one, never an empty one).

`ondemand_config` writes the config an on-demand capture sends; `base_config` the base config
(`KINETO_CONFIG`) that sets the poll interval and carries the user's own settings.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

METADATA = struct.Struct("<Q32s")
REQUEST_HEAD = struct.Struct("<iiq")
MESSAGE_TYPE = b"req"
EVENTS = 1
ACTIVITIES = 2
MAX_PIDS = 64  # kineto sends the process and up to 10 ancestors
INTERVAL_KEY = "ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS"
POLL_INTERVAL_S = 1


@dataclass(frozen=True)
class Poll:
    """One poll from a libkineto client."""

    type: int
    jobid: int
    pids: tuple[int, ...]

    @property
    def pid(self) -> int:
        """The polling process (0 when the poll named none)."""
        return self.pids[0] if self.pids else 0

    @property
    def takes_activities(self) -> bool:
        """Its profiler can take an activities (trace) config now."""
        return bool(self.type & ACTIVITIES)


def decode_poll(data: bytes) -> Poll:
    """A poll datagram, read.

    Raises:
        ValueError: it is not a well-formed "req" message.
    """
    if len(data) < METADATA.size + REQUEST_HEAD.size:
        raise ValueError(f"a poll of {len(data)} bytes is too short")
    size, kind = METADATA.unpack_from(data)
    if kind.split(b"\0", 1)[0] != MESSAGE_TYPE:
        raise ValueError(f"message type {kind.split(bytes(1), 1)[0]!r} is not a poll")
    if size != len(data) - METADATA.size:
        raise ValueError(f"payload size {size} does not match the datagram ({len(data) - METADATA.size})")
    type_, n, jobid = REQUEST_HEAD.unpack_from(data, METADATA.size)
    if not 0 <= n <= MAX_PIDS or size != REQUEST_HEAD.size + 4 * n:
        raise ValueError(f"a poll naming {n} pids in {size} bytes")
    pids = struct.unpack_from(f"<{n}i", data, METADATA.size + REQUEST_HEAD.size)
    return Poll(type_, jobid, tuple(pids))


def encode_poll(poll: Poll) -> bytes:
    """A poll as kineto sends it (tests and benchmarks play kineto with it)."""
    body = REQUEST_HEAD.pack(poll.type, len(poll.pids), poll.jobid) + struct.pack(f"<{len(poll.pids)}i", *poll.pids)
    return METADATA.pack(len(body), MESSAGE_TYPE) + body


def encode_reply(config: str) -> bytes:
    """The answer carrying `config` (no NUL: kineto takes `size` bytes as the text)."""
    body = config.encode()
    return METADATA.pack(len(body), MESSAGE_TYPE) + body


def decode_reply(data: bytes) -> str:
    """The config an answer carries (the inverse of `encode_reply`)."""
    size, _ = METADATA.unpack_from(data)
    return data[METADATA.size:METADATA.size + size].decode()


def _flag(value: bool) -> str:
    return "true" if value else "false"


def ondemand_config(*, start_iteration: int, warmup: int, active: int, log_file: str, trace_id: str,
                    record_shapes: bool = False, with_stack: bool = False, with_modules: bool = False,
                    with_flops: bool = False) -> str:
    """The config of one iteration-based on-demand capture.

    Kineto warms up from `start_iteration - warmup` and records `active` iterations from
    `start_iteration`. Never `PROFILE_MEMORY` (the memory snapshot mode) nor `PROFILE_PROFILE_MEMORY`:
    on demand they gave no memory events, and the first left a CPU process spinning.
    """
    if active < 1 or warmup < 0 or start_iteration < 0:
        raise ValueError(f"a capture of {active} steps after {warmup} warmup from iteration {start_iteration}")
    if "\n" in log_file or "\n" in trace_id:
        raise ValueError("a log file or trace id with a line break")
    lines = [
        f"PROFILE_START_ITERATION={start_iteration}",
        "PROFILE_START_ITERATION_ROUNDUP=1",
        f"ACTIVITIES_WARMUP_ITERATIONS={warmup}",
        f"ACTIVITIES_ITERATIONS={active}",
        f"ACTIVITIES_LOG_FILE={log_file}",
        f"REQUEST_TRACE_ID={trace_id}",
        f"PROFILE_REPORT_INPUT_SHAPES={_flag(record_shapes)}",
        f"PROFILE_WITH_STACK={_flag(with_stack)}",
        f"PROFILE_WITH_MODULES={_flag(with_modules)}",
        f"PROFILE_WITH_FLOPS={_flag(with_flops)}",
    ]
    return "\n".join(lines) + "\n"


def base_config(user_text: str | None, interval_s: int = POLL_INTERVAL_S) -> str:
    """The base config kineto reads at start: the user's own (their base config file's text, if any),
    with its poll interval replaced by `interval_s` whole seconds."""
    kept = [line for line in (user_text or "").splitlines()
            if line.split("=", 1)[0].strip() != INTERVAL_KEY]
    return "\n".join([*kept, f"{INTERVAL_KEY}={int(interval_s)}"]) + "\n"


def log_file_written(log_file: str, pid: int) -> str:
    """Where kineto writes the trace asked to go to `log_file`: `_<pid>` goes before `.json` when the
    name has it (as torch 2.13's kineto does)."""
    at = log_file.rfind(".json")
    if at < 0:
        return log_file
    return f"{log_file[:at]}_{pid}{log_file[at:]}"
