"""The fleet as data: replicas and their ranks, read from the registry (or a Cosmos-RL controller).

    resolve_source   where replicas come from: the registry root, and the controller's list with -ch/-cp
    replica_ranks    one RankStatus per rank of a replica: host, pid, liveness, step, state, last trace
    list_replicas    one ReplicaStatus per replica: ranks alive/total, hosts, state, newest heartbeat
                     (`replica_row`: from the records, without a RankStatus per rank; `replica_status`
                     makes the same row from the statuses, which `replica ls --json` lists too)
    select_ranks     the records a rank filter selects (what a request is written for)

Reads only: nothing here writes the registry (`sidecar.fleet.control` does), prints,
parses flags or imports torch. A rank is alive by pid and create time on this
host, elsewhere by the age of its record file on the registry filesystem's clock
(`liveness`; sidecar.common.clock): `now` here is always that clock's (`clock.fs_now`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.common import clock, layout, registry
from sidecar.common.config import load_config, output_root_of
from sidecar.common.exceptions import BadOption, RequestError
from sidecar.common.identity import (
    ENV_REGISTRY,
    default_registry_root,
    host_name,
    registry_url,
    resolve_registry_root,
    validate_replica_name,
)
from sidecar.common.records import BUSY_STATES, RankRecord, is_alive
from sidecar.common.recordscan import RecordProblem, RecordScan, collector_paused, scan_records
from sidecar.common.replicaname import check_name, controller_replica, not_found
from sidecar.common.request import RankFilter, parse_rank_filter
from sidecar.common.roster import ControllerAtom, ControllerReplica
from sidecar.fleet.controller import DEFAULT_TIMEOUT_S as CONTROLLER_TIMEOUT_S
from sidecar.fleet.controller import META_PATH, ControllerClient, parse_meta_output_dir

# Cosmos-RL's CLI profiles rank 0 when no rank filter is given (so does a request without one).
DEFAULT_RANK_FILTER = "0"
BAD_RECORD = "bad record"  # the liveness of a rank whose record file cannot be used
MAX_PROBLEMS_SHOWN = 3


# --- where replicas come from ----------------------------------------------------


@dataclass
class Source:
    """Where replicas come from: the registry root, plus the controller's list when one was asked."""

    root: Path
    controller: list[ControllerReplica] | None = None
    controller_url: str | None = None
    origin: str = ""  # where `root` came from, for messages: "--registry", "$COSMOS_PROFILER_DIR", ...
    # When `root` came from a relative train.output_dir and holds no replica: which value was
    # relative, which directory was tried and what to do (`relative_output_dir`); else "".
    relative: str = ""
    store_url: str | None = None  # a redis:// registry (`root` is then the CLI's local view of it)


MAX_POINTER_BYTES = 4096


@dataclass
class RelativeOutput:
    """A relative train.output_dir that the registry root was derived from."""

    what: str  # "[train] output_dir = './outputs' in train.toml"
    tail: str  # the output root as a relative path ("outputs"): what a worker's absolute root ends with


def relative_output(value: str | None, what: str, output_root: str | None) -> RelativeOutput | None:
    """`value` (a train.output_dir) when it is relative, with the output root's relative spelling."""
    if not value or os.path.isabs(value) or not output_root:
        return None
    norm = os.path.normpath(value)
    tail = norm if os.path.abspath(norm) == os.path.abspath(output_root) else os.path.dirname(norm)
    return RelativeOutput(f"{what} = {value!r}", tail)


def has_replicas(root: Path) -> bool:
    try:
        return bool(registry.list_replicas(root))
    except Exception:  # noqa: BLE001 - a root that cannot be listed holds nothing usable
        return False


def pointed_registries(tail: str, env: Mapping[str, str]) -> list[Path]:
    """Registries that workers with a relative output_dir ending in `tail` registered in, from the
    pointers they left in the per-user default registry (`sidecar.rank.pointer`)."""
    parts = Path(tail).parts
    if not parts or parts == (".",) or ".." in parts:
        return []
    found: dict[str, Path] = {}
    directory = default_registry_root(env) / layout.ROOTS_DIR
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    for name in names:
        try:
            with open(directory / name, "rb") as f:
                pointer = json.loads(f.read(MAX_POINTER_BYTES))
            out, root = Path(pointer["output_dir"]), Path(pointer["registry"])
            replica = validate_replica_name(pointer["replica"])
        except Exception:  # noqa: BLE001 - a stale or foreign file is not a pointer
            continue
        if out.is_absolute() and out.parts[-len(parts):] == parts and (
                any(layout.replica_dir(root, replica).glob("rank-*.json"))
                or layout.nodes_dir(root, replica).is_dir()):
            found.setdefault(str(root), root)
    return list(found.values())


def relative_output_dir(rel: RelativeOutput, root: Path, env: Mapping[str, str]) -> tuple[Path | None, str]:
    """(the registry the job's ranks really use, else None; else what to tell the user) for a root
    derived from a relative output_dir that holds no replica."""
    found = pointed_registries(rel.tail, env)
    if len(found) == 1:
        return found[0], ""
    where = (f" Ranks of jobs with that output_dir registered in: {', '.join(map(str, found))}; pass the one "
             "you mean with --registry." if found else "")
    return None, (f"{rel.what} is relative, so it was resolved against this directory ({os.getcwd()}), "
                  f"giving the registry {root}, which holds no replica. Run the command from the job's launch "
                  f"directory, or pass --registry <launch directory>/{rel.tail}/{layout.REGISTRY_DIR_NAME}.{where}")


def resolve_source(
    registry_dir: str | os.PathLike[str] | None = None,
    controller_host: str | None = None,
    controller_port: str | int | None = None,
    timeout: float = CONTROLLER_TIMEOUT_S,
    env: Mapping[str, str] | None = None,
    config_path: str | os.PathLike[str] | None = None,
) -> Source:
    """Resolve the registry root (and the controller's replicas when host/port are given).

    The root is resolved by the sidecar's own `resolve_registry_root`, so the
    CLI finds what the workers registered: `registry_dir`, else
    COSMOS_PROFILER_DIR, else the job TOML's `[sidecar] registry` or
    `<output root>/profile_control`, else (with a controller) the same from
    GET /api/meta (the output root of the loaded, timestamped config; see
    `sidecar.common.config`), else the per-user default.

    Raises:
        BadOption: only one of host and port was given.
        ConfigError: the TOML cannot be read.
        ControllerError: the controller cannot be reached or answers nonsense.
    """
    env = os.environ if env is None else env
    if (controller_host is None) != (controller_port is None):
        missing = "controller_port" if controller_port is None else "controller_host"
        raise BadOption(missing, "give both -ch/--controller-host and -cp/--controller-port, or neither")
    configured = output_root = None
    rel = None
    if config_path is not None:
        job = load_config(config_path)
        configured, output_root = job.sidecar.registry or None, job.output_root
        rel = relative_output(job.train_output_dir, f"[train] output_dir in {config_path}", output_root)
    replicas = client = None
    from_controller = False
    if controller_host is not None and controller_port is not None:  # both or neither (above)
        client = ControllerClient(controller_host, controller_port, timeout=timeout)
        replicas = client.replicas()
        from_controller = not (registry_dir or env.get(ENV_REGISTRY) or configured or output_root)
        if from_controller:
            meta = client.get_json(META_PATH)
            job_redis = client.job_redis_url(meta)
            if job_redis is not None:  # the job's own Redis (config.redis): its workers' registry
                from sidecar.fleet.storeview import StoreView

                view = StoreView(job_redis)
                view.follow()
                return Source(root=view.root, controller=replicas, controller_url=client.base_url,
                              origin=f"the job's Redis, from the controller's {META_PATH} at {client.base_url}",
                              store_url=view.url.display())
            value = parse_meta_output_dir(meta, client.base_url + META_PATH)
            output_root = output_root_of(value)
            rel = relative_output(value, f"train.output_dir from {client.base_url}{META_PATH}", output_root)
    url = registry_url(registry_dir, env=env, configured=configured)
    if url is not None:  # a redis:// registry, read through a local view of it (sidecar.fleet.storeview)
        from sidecar.fleet.storeview import StoreView

        view = StoreView(url)
        view.follow()
        origin = registry_origin(registry_dir, env, configured, output_root, config_path)
        return Source(root=view.root, controller=replicas, controller_url=client.base_url if client else None,
                      origin=f"{origin}: {view.url}", store_url=view.url.display())
    root, _ = resolve_registry_root(registry_dir, env=env, configured=configured, output_root=output_root)
    origin = (f"the controller's /api/meta at {client.base_url}" if from_controller and client is not None
              else registry_origin(registry_dir, env, configured, output_root, config_path))
    relative = ""
    if rel is not None and not (registry_dir or env.get(ENV_REGISTRY) or configured) and not has_replicas(root):
        found, relative = relative_output_dir(rel, root, env)
        if found is not None:
            origin = (f"{rel.what}, which is relative: its ranks registered in {found} "
                      f"(a pointer in {default_registry_root(env) / layout.ROOTS_DIR})")
            root = found
    return Source(root=root, controller=replicas, controller_url=client.base_url if client else None,
                  origin=origin, relative=relative)


def registry_origin(registry_dir: Any, env: Mapping[str, str], configured: str | None, output_root: str | None,
                    config_path: Any) -> str:
    """Where `resolve_registry_root` took the root from, in words (the same order)."""
    if registry_dir:
        return "--registry"
    if env.get(ENV_REGISTRY):
        return f"${ENV_REGISTRY}"
    if configured:
        return f"[sidecar] registry in {config_path}"
    if output_root:
        return f"[train] output_dir in {config_path}"
    return f"the per-user default; set ${ENV_REGISTRY} or pass --registry DIR for another"


# --- ranks and replicas -----------------------------------------------------------


@dataclass
class RankStatus:
    """One row of `replica lsr`."""

    replica: str
    rank: int
    role: str
    host: str
    pid: int | None
    alive: bool
    liveness: str  # "alive", or why not: "exited", "process gone", "no heartbeat for 42s", "no record"
    step: int | None
    state: str  # a record state, or "unknown" without a record
    world_size: int | None
    request_id: str | None = None
    selected: bool | None = None
    misaligned: bool = False
    trace_path: str | None = None
    num_captures: int = 0
    error: str | None = None
    refused: str | None = None
    heartbeat_age: float | None = None
    host_ip: str | None = None  # from the controller
    # Another live process writes this rank's record too (a second job under this
    # replica name): {"pid", "host", "job", "seen_at"}; see sidecar.rank.heartbeat (_on_conflict).
    conflict: dict[str, Any] | None = None
    # [train.ckpt] upload_s3 (sidecar.rank.upload); all None on a rank that uploads nothing (absent from --json).
    upload_to: str | None = None
    trace_url: str | None = None
    upload_error: str | None = None
    signal: str | None = None  # the signal that asks this rank for a capture (`kill -s` spelling), if any


@dataclass
class ReplicaStatus:
    """One row of `replica ls`."""

    name: str
    role: str
    num_alive: int
    num_ranks: int
    hosts: list[str]
    state: str  # idle | profiling | stalled | error | down (no live rank) | unknown (no rank records)
    heartbeat_age: float | None  # seconds since the newest heartbeat
    step: int | None  # highest step a live rank reports
    arrived: bool | None = None  # from the controller
    conflicts: list[dict[str, Any]] = field(default_factory=list)  # {"rank", "pid", "host", "job"} per held rank
    problems: list[str] = field(default_factory=list)  # rank record files that cannot be used, and why


def liveness(record: RankRecord, this_host: str | None = None, now: float | None = None) -> tuple[bool, str]:
    """(alive, why): same host by pid and create time, elsewhere by the age of its record file
    (`now`: the registry filesystem's clock, `clock.fs_now`; this host's where not given)."""
    now = time.time() if now is None else now
    this_host = host_name() if this_host is None else this_host
    if record.exited_at:
        return False, "exited"
    if is_alive(record, this_host, now):
        return True, "alive"
    if record.host == this_host and record.pid:
        return False, "process gone"
    return False, f"no heartbeat for {format_age(clock.record_age(record, now))}"


def format_age(seconds: float | None) -> str:
    """3s, 2m05s, 1h02m, 3d04h; "-" for None."""
    if seconds is None:
        return "-"
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


Judged = dict[tuple[float, float], tuple[bool, str]]


def judged_liveness(record: RankRecord, this_host: str, now: float, judged: Judged) -> tuple[bool, str]:
    """`liveness`, judged once for the records it judges alike: a live record of another host is
    judged by its file's time and its heartbeat interval alone (the ranks of one node record share
    both), so `judged` keeps the verdict by those (one dict per scan: `now` is one too)."""
    if record.exited_at or (record.host == this_host and record.pid):
        return liveness(record, this_host, now)  # the pid is checked per rank
    key = (clock.written_at(record), record.heartbeat_interval)
    verdict = judged.get(key)
    if verdict is None:
        verdict = judged[key] = liveness(record, this_host, now)
    return verdict


def _status(name: str, rank: int, record: RankRecord | None, atom: ControllerAtom | None, this_host: str,
            now: float, judged: Judged | None = None) -> RankStatus:
    if record is None:
        return RankStatus(
            replica=name, rank=rank, role="", host=atom.host_name if atom else "", pid=None, alive=False,
            liveness="no record", step=None, state="unknown", world_size=None,
            trace_path=atom.trace_path if atom else None, host_ip=atom.host_ip if atom else None,
        )
    alive, why = liveness(record, this_host, now) if judged is None else judged_liveness(record, this_host, now, judged)
    # By position, in the order of RankStatus's fields (STATUS_FIELDS, which a test holds to it): a
    # call by 24 keywords costs 3 times as much, and `replica lsr` makes 10,000.
    return RankStatus(
        name, rank, record.role, record.host or (atom.host_name if atom else ""),  # replica, rank, role, host
        record.pid or None, alive, why, record.step,  # pid, alive, liveness, step
        rank_state(record, alive, now), record.world_size, record.request_id, record.selected,  # state ... selected
        record.misaligned, record.trace_path or (atom.trace_path if atom else None),  # misaligned, trace_path
        record.num_captures, record.error, record.refused,  # num_captures, error, refused
        max(0.0, now - clock.written_at(record)) if record.heartbeat_at else None,  # heartbeat_age
        atom.host_ip if atom else None, record.conflict if alive else None,  # host_ip, conflict
        record.upload_to, record.trace_url, record.upload_error, record.signal,  # upload_to ... signal
    )


# RankStatus's fields in the order `_status` gives them.
STATUS_FIELDS = ("replica", "rank", "role", "host", "pid", "alive", "liveness", "step", "state", "world_size",
                 "request_id", "selected", "misaligned", "trace_path", "num_captures", "error", "refused",
                 "heartbeat_age", "host_ip", "conflict", "upload_to", "trace_url", "upload_error", "signal")


# A live rank with the stall watch on whose heartbeat is older than this many intervals
# (and than stall_after_s) is frozen: no Python thread runs (a C call holds the GIL), so
# its record cannot say "stalled" itself.
FROZEN_HEARTBEATS = 3.0


def rank_state(record: RankRecord, alive: bool, now: float) -> str:
    """The record's state; "stalled" also for a live rank with the stall watch on that is frozen."""
    if alive and record.stall_after_s and record.state != "stalled":
        age = clock.record_age(record, now)
        if age > max(record.stall_after_s, FROZEN_HEARTBEATS * (record.heartbeat_interval or 2.0)):
            return "stalled"
    return record.state


def _bad_status(name: str, problem: RecordProblem, atom: ControllerAtom | None) -> RankStatus:
    return RankStatus(
        replica=name, rank=problem.rank if problem.rank is not None else -1, role="",
        host=atom.host_name if atom else "", pid=None, alive=False, liveness=BAD_RECORD, step=None,
        state="unknown", world_size=None, error=problem.error, host_ip=atom.host_ip if atom else None,
    )


def replica_ranks(
    root: Path, name: str, controller: list[ControllerReplica] | None = None, now: float | None = None,
    scan: RecordScan | None = None,
) -> list[RankStatus]:
    """One status per rank of `name`, ordered by rank; ranks below the world size
    (or known to the controller) without a record are listed as "no record".
    `scan`: the replica's records when the caller has read them already.

    Raises:
        ReplicaNotFound: no such replica in the registry (or at the controller).
    """
    return _replica(root, name, controller, now, scan)[0]


def _replica(
    root: Path, name: str, controller: list[ControllerReplica] | None = None, now: float | None = None,
    scan: RecordScan | None = None,
) -> tuple[list[RankStatus], list[str]]:
    """`replica_ranks`, and the problems that stand for no rank (a node record file that is
    no good: its ranks are listed as without a record)."""
    with collector_paused():
        return _replica_ranks(root, name, controller, now, scan)


@dataclass
class _RankSet:
    """The ranks of a replica, as its records, bad files and the controller's atoms give them."""

    name: str
    now: float  # the registry filesystem's clock
    this_host: str
    scan: RecordScan
    records: dict[int, RankRecord]
    bad: dict[int, RecordProblem]  # the ranks whose record cannot be used
    atoms: dict[int, ControllerAtom]
    ranks: list[int] | None  # every rank, in order; None: exactly those of scan.records (0..world-1, nothing else)
    unranked: list[str]  # the problems of no one rank

    def each(self) -> Iterator[tuple[int, RankRecord | None, RecordProblem | None, ControllerAtom | None]]:
        """(rank, record, bad file, controller atom) for each rank, in order."""
        if self.ranks is None:
            for record in self.scan.records:
                yield record.rank, record, None, None
            return
        for k in self.ranks:
            yield k, self.records.get(k), self.bad.get(k), self.atoms.get(k)


def _rank_set(
    root: Path, name: str, controller: list[ControllerReplica] | None, now: float | None, scan: RecordScan | None,
) -> _RankSet:
    check_name(name)
    now = clock.fs_now(root) if now is None else now
    scan = scan_records(root, name) if scan is None else scan
    records = {r.rank: r for r in scan.records}
    bad = {p.rank: p for p in scan.problems if p.rank is not None}
    atoms: dict[int, ControllerAtom] = {}
    if controller is not None:
        atoms = {a.global_rank: a for a in controller_replica(controller, name).atoms}
    elif not records and not bad and name not in registry.list_replicas(root):
        raise not_found(name)
    world = max([r.world_size for r in records.values()] + [0])
    ranks: list[int] | None = None
    if atoms or bad or len(records) != world or (world and scan.records[-1].rank != world - 1):
        ranks = sorted(set(records) | set(atoms) | set(bad) | set(range(world)))
    # (else every rank below the world size has a record, and nothing else does: scan.records is by rank)
    return _RankSet(name, now, host_name(), scan, records, bad, atoms, ranks,
                    [p.error for p in scan.problems if p.rank is None])


def _replica_ranks(
    root: Path, name: str, controller: list[ControllerReplica] | None, now: float | None, scan: RecordScan | None,
) -> tuple[list[RankStatus], list[str]]:
    ranks = _rank_set(root, name, controller, now, scan)
    this_host, now_ = ranks.this_host, ranks.now
    judged: Judged = {}
    if ranks.ranks is None:
        return [_status(name, r.rank, r, None, this_host, now_, judged) for r in ranks.scan.records], ranks.unranked
    return [
        _bad_status(name, problem, atom) if problem is not None
        else _status(name, k, record, atom, this_host, now_, judged)
        for k, record, problem, atom in ranks.each()
    ], ranks.unranked


def replica_status(name: str, ranks: Sequence[RankStatus], role: str = "", arrived: bool | None = None,
                   unranked: Sequence[str] = ()) -> ReplicaStatus:
    """The replica's row from its ranks' statuses (`unranked`: the problems of no one rank)."""
    live = [r for r in ranks if r.alive]
    known = [r for r in ranks if r.state != "unknown"]
    state = _replica_state(len(known), [r.state for r in live])
    ages = [r.heartbeat_age for r in known if r.heartbeat_age is not None]
    steps = [r.step for r in live if r.step is not None]
    return ReplicaStatus(
        name=name,
        role=role or next((r.role for r in known if r.role), ""),
        num_alive=len(live),
        num_ranks=len(ranks),
        hosts=sorted({r.host for r in ranks if r.host}),
        state=state,
        heartbeat_age=min(ages) if ages else None,
        step=max(steps) if steps else None,
        arrived=arrived,
        conflicts=[{"rank": r.rank, **{k: r.conflict[k] for k in ("pid", "host", "job")}} for r in live if r.conflict],
        problems=[r.error or "" for r in ranks if r.liveness == BAD_RECORD] + list(unranked),
    )


def replica_row(ranks: _RankSet, role: str = "", arrived: bool | None = None) -> ReplicaStatus:
    """`replica_status` of the statuses of `ranks`, without making them: what the row reads of
    each rank, as `_status` and `_bad_status` give it (a test holds the two to one answer).
    `replica ls` of 10,000 ranks makes no status per rank."""
    now, this_host = ranks.now, ranks.this_host
    judged: Judged = {}
    num_ranks = num_known = 0
    hosts: set[str] = set()
    live_states: list[str] = []
    age: float | None = None
    step: int | None = None
    conflicts: list[dict[str, Any]] = []
    problems: list[str] = []
    for k, record, problem, atom in ranks.each():
        num_ranks += 1
        if record is None or problem is not None:  # no record, or a bad one: state "unknown", not alive
            if atom is not None and atom.host_name:
                hosts.add(atom.host_name)
            if problem is not None:
                problems.append(problem.error or "")
            continue
        alive, _ = judged_liveness(record, this_host, now, judged)
        state = rank_state(record, alive, now)
        host = record.host or (atom.host_name if atom else "")
        if host:
            hosts.add(host)
        if alive:
            live_states.append(state)
            if record.step is not None and (step is None or record.step > step):
                step = record.step
            if record.conflict:
                conflicts.append({"rank": k, **{key: record.conflict[key] for key in ("pid", "host", "job")}})
        if state != "unknown":
            num_known += 1
            if not role and record.role:
                role = record.role
            if record.heartbeat_at:
                heartbeat_age = max(0.0, now - clock.written_at(record))
                if age is None or heartbeat_age < age:
                    age = heartbeat_age
    return ReplicaStatus(
        name=ranks.name, role=role, num_alive=len(live_states), num_ranks=num_ranks, hosts=sorted(hosts),
        state=_replica_state(num_known, live_states), heartbeat_age=age, step=step, arrived=arrived,
        conflicts=conflicts, problems=problems + ranks.unranked,
    )


def _replica_state(num_known: int, live_states: Sequence[str]) -> str:
    """A replica's state from its ranks': how many are known (have a state), and the live ones' states."""
    if not num_known:
        return "unknown"
    if not live_states:
        return "down"
    if any(state == "stalled" for state in live_states):
        return "stalled"
    if any(state in BUSY_STATES for state in live_states):
        return "profiling"
    if any(state == "error" for state in live_states):
        return "error"
    return "idle"


def list_replicas(
    root: Path, controller: list[ControllerReplica] | None = None, now: float | None = None
) -> list[ReplicaStatus]:
    """One status per replica: from the registry, or the controller's replicas joined with it."""
    now = clock.fs_now(root) if now is None else now
    with collector_paused():
        if controller is None:
            return [replica_row(_rank_set(root, name, None, now, None)) for name in registry.list_replicas(root)]
        return [replica_row(_rank_set(root, r.name, controller, now, None), role=r.role, arrived=r.arrived)
                for r in controller]


def replicas_with_ranks(
    root: Path, controller: list[ControllerReplica] | None = None, now: float | None = None
) -> list[tuple[ReplicaStatus, list[RankStatus]]]:
    """`list_replicas` with each replica's ranks (`replica_ranks`), read once: the whole fleet in one call."""
    now = clock.fs_now(root) if now is None else now
    out = []
    if controller is None:
        for name in registry.list_replicas(root):
            ranks, unranked = _replica(root, name, now=now)
            out.append((replica_status(name, ranks, unranked=unranked), ranks))
        return out
    for r in controller:
        ranks, unranked = _replica(root, r.name, controller, now=now)
        out.append((replica_status(r.name, ranks, role=r.role, arrived=r.arrived, unranked=unranked), ranks))
    return out


# --- the ranks a request is for -------------------------------------------------------


def select_ranks(
    root: Path,
    name: str,
    rank_filter: str | Sequence[int] | RankFilter | None,
    default_filter: str,
    controller: list[ControllerReplica] | None = None,
) -> tuple[dict[int, RankRecord], RankFilter, list[int], dict[int, str]]:
    """The replica's records, the parsed filter, the ranks it selects, and why
    the record of a rank could not be used (by rank).

    Raises:
        ReplicaNotFound: no rank records (and no controller that knows the name).
        RequestError: the controller knows the replica but the registry has no records.
        BadOption: the filter does not parse, or names a rank past the world size.
    """
    scan = scan_records(root, name)
    records = {r.rank: r for r in scan.records}
    if not records:
        if scan.problems:
            raise RequestError(
                f"replica {name} has no usable rank record under {root}: "
                + "; ".join(p.error for p in scan.problems[:MAX_PROBLEMS_SHOWN])
                + (f"; and {len(scan.problems) - MAX_PROBLEMS_SHOWN} more" if len(scan.problems) > MAX_PROBLEMS_SHOWN else "")
            )
        if controller is not None:
            raise RequestError(
                f"replica {name} is registered with the controller, but has no rank records under {root}; "
                "is the sidecar installed in it, and is that its registry (else pass --registry DIR)?"
            )
        registry.check_root(root)
        raise not_found(name)
    if isinstance(rank_filter, RankFilter):
        filter_ = rank_filter
    else:
        try:
            filter_ = parse_rank_filter(default_filter if rank_filter is None else rank_filter)
        except RequestError as exc:
            raise BadOption("rank_filter", str(exc)) from None
    world = max(max(r.world_size for r in records.values()), max(records) + 1)
    top = filter_.highest()
    if top is not None and top >= world:
        raise BadOption(
            "rank_filter",
            f"rank {top} is out of range: replica {name} has {world} rank{'s' if world != 1 else ''} (0-{world - 1})",
        )
    selected = list(range(world)) if filter_.is_all else sorted(filter_.ranks or ())
    problems = {p.rank: p.error for p in scan.problems if p.rank is not None}
    return records, filter_, selected, problems
