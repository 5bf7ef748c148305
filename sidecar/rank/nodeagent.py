"""One poller per node: the node agent, elected among a node's ranks, with no process of its own.

Where the registry sits on shared storage (a network or FUSE filesystem; `[sidecar] node_agent`), the ranks of one node share a node-local directory (tmpfs, private
to the user: `node_base`), keyed by the job's registry and replica (`layout.node_key`):

    <node dir>/control.json              the relayed request (sidecar.rank.noderelay)
    <node dir>/records/rank-<k>.json     each rank's own record, as it would be in the registry
    <node dir>/agent/lease-<epoch>       who the agent is (sidecar.rank.nodelease)

Every rank watches the relay file with inotify and writes its record here. One of them, the
agent, also:
- polls the shared control file (the only rank of the node that does) and relays each new
  version into the node dir, where its ranks see it within milliseconds (`_relay`);
- rolls its node's records up into one node record in the shared registry
  (sidecar.common.noderecord), rewritten only when what it says changes, and otherwise
  ticked (its mtime set to now) once per heartbeat (`_rollup`).

At rest that is one open of the control file per poll interval and one utime per heartbeat
per node, whatever the number of ranks on it. The poll interval grows with the number of
nodes past `NODES_AT_BASE_POLL` (`scaled_poll_interval`).

Every rank runs `NodeLink`'s thread. A rank that is not the agent looks at the lease every
half heartbeat and takes the next term when the agent's process is gone, or its beat is
older than `STALE_LEASE_HEARTBEATS` heartbeats (it holds the GIL, or is stopped): within two
heartbeats. The new agent resumes the relay from what the last envelope says was relayed, so
a request is neither lost (an agent killed between its read and its write) nor run twice (the
ranks drop an envelope of a version they took already).
"""

from __future__ import annotations

import errno
import logging
import math
import os
import shutil
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.common import clock, layout, noderecord, startstep
from sidecar.common.config import SidecarSettings
from sidecar.common.exceptions import RequestError
from sidecar.common.records import RankRecord, RecordError, is_alive, pid_alive, read_record
from sidecar.common.registry import (
    ControlFile,
    atomic_write,
    ensure_dir,
    filesystem_type,
    is_network_fs,
)
from sidecar.rank import noderelay
from sidecar.rank.nodelease import Lease
from sidecar.rank.threads import Worker
from sidecar.rank.triggers.file import FileTrigger
from sidecar.rank.triggers.inotify import InotifyWatch, WakePipe

if TYPE_CHECKING:
    from sidecar.common.redisstore import RedisStore
    from sidecar.rank.storesync import StoreSync
    from sidecar.rank.triggers.store import StoreTrigger

log = logging.getLogger("sidecar")

ENV_NODE_DIR = "COSMOS_PROFILER_NODE_DIR"
STALE_LEASE_HEARTBEATS = 1.5
MIN_STALE_LEASE_S = 1.0
# A rank whose own record was not written or ticked for this many heartbeats is not vouched for
# by the node record's ticks any more: its entry keeps its own last heartbeat.
QUIET_HEARTBEATS = 2.0
CLOCK_PROBE_EVERY_S = 600.0
# A new anchor's rate is the pace since the last anchor (at least this long ago) where that agrees
# with the recent pace within this fraction; else the recent pace (the job changed speed).
LONG_RATE_MIN_S = 5.0
LONG_RATE_AGREES = 0.25
NODES_AT_BASE_POLL = 256
MAX_SCALED_POLL_S = 4.0
# After an event in the records dir, wait this long for the rest of a burst (a request arms
# all ranks of the node within a few ms) before the node record is rewritten.
SETTLE_S = 0.02


def node_base(settings: SidecarSettings, env: Mapping[str, str] | None = None) -> Path:
    """The node-local base directory: COSMOS_PROFILER_NODE_DIR, `[sidecar] node_dir`,
    $XDG_RUNTIME_DIR/cosmos-profiler-node, /dev/shm/cosmos-profiler-<uid>, /tmp/cosmos-profiler-node-<uid>."""
    env = os.environ if env is None else env
    chosen = env.get(ENV_NODE_DIR) or settings.node_dir
    if chosen:
        return Path(chosen)
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime) and os.access(runtime, os.W_OK):
        return Path(runtime) / "cosmos-profiler-node"
    if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK):
        return Path("/dev/shm") / f"cosmos-profiler-{os.getuid()}"
    return Path("/tmp") / f"cosmos-profiler-node-{os.getuid()}"


def wants_agent(settings: SidecarSettings, registry_root: Path, store: RedisStore | None = None) -> tuple[bool, str]:
    """(whether this rank's node uses an agent, why), as `[sidecar] node_agent` says; always with a
    store (a `redis://` registry: the agent alone talks to it for its node)."""
    if store is not None:
        return True, f"the registry is {store.url}"
    if settings.node_agent == "on":
        return True, "node_agent = on"
    if settings.node_agent == "off":
        return False, "node_agent = off"
    fstype = filesystem_type(registry_root)
    if is_network_fs(fstype):
        return True, f"the registry is on a {fstype} filesystem"
    return False, f"the registry is on a local {fstype or 'unknown'} filesystem"


def private_dir(path: Path) -> None:
    """Create `path` (0700) and check that it is this user's and no one else's.

    Raises:
        OSError: it cannot be created, or it is another user's, or others may write it.
    """
    ensure_dir(path, private=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "not a directory", os.fspath(path))
    if st.st_uid != os.getuid():
        raise PermissionError(errno.EPERM, f"owned by uid {st.st_uid}, not this user ({os.getuid()})", os.fspath(path))
    if stat.S_IMODE(st.st_mode) & 0o022:
        raise PermissionError(errno.EPERM, f"others may write it (mode {stat.S_IMODE(st.st_mode):o})", os.fspath(path))


def scaled_poll_interval(poll_interval: float, world_size: int, local_world_size: int) -> float:
    """The agent's poll interval: the configured one up to NODES_AT_BASE_POLL nodes, then growing
    with the number of nodes (so the job's polls of the control file stay near that many per
    second), up to MAX_SCALED_POLL_S."""
    nodes = max(1, math.ceil(world_size / max(1, local_world_size)))
    scaled = poll_interval * nodes / NODES_AT_BASE_POLL
    return max(poll_interval, min(scaled, MAX_SCALED_POLL_S))


def local_world_size(env: Mapping[str, str] | None = None) -> int:
    env = os.environ if env is None else env
    for name in ("LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        try:
            return max(1, int(env.get(name, "")))
        except ValueError:
            continue
    return 1


class NodeLink:
    """One rank's part in its node's registry (see the module docstring).

    Args:
        node_dir: this job's node-local directory.
        registry_root, replica, rank, host, world_size: where and who.
        settings: the rank's `[sidecar]` settings.
        records: the rank records of this node dir, read (`read_local_records`).
    """

    def __init__(self, node_dir: Path, registry_root: Path, replica: str, rank: int, host: str, world_size: int,
                 settings: SidecarSettings, log_once: Callable[[str, int, str], None],
                 store: RedisStore | None = None) -> None:
        self.node_dir = Path(node_dir)
        # A redis:// registry: `registry_root` is then this node's mirror of it (storeurl.mirror_dir), which
        # the agent carries to the store (StoreSync) and whose requests it takes from there (StoreTrigger).
        self.store = store
        self._sync: StoreSync | None = None
        self.registry_root = Path(registry_root)
        self.replica = replica
        self.rank = rank
        self.host = host
        self.settings = settings
        self._log_once = log_once
        self.envelope_path = self.node_dir / layout.NODE_CONTROL
        self.records_dir = self.node_dir / layout.NODE_RECORDS_DIR
        self.shared_control = layout.control_path(registry_root, replica)
        self.node_record = layout.node_record_path(registry_root, replica, host, world_size, local_world_size())
        self.lease = Lease(self.node_dir / layout.NODE_AGENT_DIR, rank, host)
        self.heartbeat = settings.heartbeat_interval
        self.stale_lease_s = max(MIN_STALE_LEASE_S, STALE_LEASE_HEARTBEATS * self.heartbeat)
        self.poll_interval = scaled_poll_interval(settings.poll_interval, world_size, local_world_size())
        self.envelope_limit = noderelay.envelope_limit(settings.max_control_bytes)
        self._worker = Worker("cosmos-profiler-node", self._run, on_wake=self._poke)
        self._shared: FileTrigger | StoreTrigger | None = None  # the agent's watch of the shared control file
        self._records_watch: InotifyWatch | None = None
        self._wake: WakePipe | None = None
        self._anchors: dict[int, noderecord.Pace] = {}
        # The last record read of each rank, and when: a rank whose file went (the node dir removed
        # under the job) stays in the node record while its process lives, until it writes again.
        self._seen: dict[int, RankRecord] = {}
        # What the agent relayed last (the control file's signature, and the digest of its bytes):
        # in the node record too, so that an agent that finds no relay file (the node dir removed)
        # resumes from there rather than from the file as it is now.
        self._relayed: tuple[list[int] | None, str | None] = (None, None)
        self._last_key: bytes | None = None
        self._tick_due = 0.0
        self._offset: float | None = None
        self._offset_due = 0.0
        self._ticks = True  # a utime is stamped by the filesystem (not FUSE: there the node record is rewritten)
        self.num_relays = 0
        self.num_node_writes = 0
        self.num_node_ticks = 0
        self.terms = 0  # how many times this rank became the agent

    @property
    def is_agent(self) -> bool:
        return self.lease.epoch is not None

    # -- lifecycle --------------------------------------------------------

    def prepare(self) -> None:
        """Create the node dir (private to the user). Raises OSError: it is unusable."""
        private_dir(self.node_dir.parent)
        private_dir(self.node_dir)
        ensure_dir(self.records_dir, private=True)

    def start(self) -> None:
        """Take the agent's term if no one serves (before this rank's own trigger starts, so the
        relay file it takes as its baseline is there), then run the thread."""
        if self._wake is None:
            self._wake = WakePipe()
        self._look()
        self._worker.start()

    def stop(self) -> None:
        """At exit: the agent writes its node record a last time and gives its term up; a rank
        that finds no live agent (the last of its node) does the same for its own exit, and the
        last rank of the job on this node removes the node dir (the node record stays)."""
        self._worker.stop()
        last = False
        try:
            if self.is_agent or (self.lease.vacant(self.stale_lease_s) and self.lease.claim()):
                self._rollup(force=True)
                last = not any(r.rank != self.rank and r.exited_at is None and pid_alive(r.pid, r.start_since_boot)
                               for r in self.read_local_records())
        except Exception:  # noqa: BLE001 - at exit: never raise
            log.debug("[Profiler] the node record's last write failed", exc_info=True)
        self._step_down(release=True)
        if last:  # the job's last rank on this node: its node dir (RAM, on tmpfs) goes with it
            shutil.rmtree(self.node_dir, ignore_errors=True)
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.close()

    def forget_in_child(self) -> None:
        self.lease.forget()
        self._shared = None
        self._records_watch = None

    # -- the thread -------------------------------------------------------

    def _poke(self) -> None:
        wake = self._wake
        if wake is not None:
            wake.poke()

    def _run(self, worker: Worker) -> None:
        while not worker.stopping:
            try:
                if self.is_agent:
                    self._agent_turn(worker)
                else:
                    if worker.sleep(self.heartbeat / 2):
                        return
                    self._look()
            except Exception:  # noqa: BLE001 - the node link must outlive any one bad turn
                self._log_once("node-agent", logging.ERROR, "[Profiler] the node agent's loop failed; continuing")
                log.debug("[Profiler] node agent failure", exc_info=True)
                if worker.sleep(self.heartbeat / 2):
                    return

    def _look(self) -> None:
        """A rank that is not the agent: take the next term when no live agent serves."""
        if self.lease.vacant(self.stale_lease_s) and self.lease.claim():
            self._become_agent()

    def _agent_turn(self, worker: Worker) -> None:
        """Wait for a change of a record of the node (or half a heartbeat), beat, roll up."""
        if self._records_watch is not None and self._records_watch.gone:  # the node dir was removed
            self._records_watch.close()
            self._records_watch = None
        if self._records_watch is None:
            self._watch_records()
        watch, wake = self._records_watch, self._wake
        timeout = max(0.0, min(self.heartbeat / 2, self._tick_due - time.time()))
        if watch is not None and wake is not None:
            names = watch.wait(timeout, wake.fd)
            if names and not worker.stopping:
                watch.wait(SETTLE_S, wake.fd)  # the rest of a burst
        elif worker.sleep(timeout):
            return
        if worker.stopping:
            return
        if not self.lease.beat():
            log.info("[Profiler] rank %d is no longer its node's agent (another rank took over)", self.rank)
            self._step_down(release=False)
            return
        self._rollup()

    # -- becoming and leaving the agent ---------------------------------------

    def _become_agent(self) -> None:
        self.terms += 1
        envelope = noderelay.read(self.envelope_path, self.envelope_limit)
        baseline = None
        if envelope is not None:  # resume from what the last agent relayed (the digest of an error's text is none)
            relayed = envelope["source"] is not None and not envelope.get("error")
            baseline = (envelope["source"], bytes.fromhex(envelope["digest"]) if relayed else None)
        else:
            baseline = self._relayed_by_node_record()
        trigger: FileTrigger | StoreTrigger
        if self.store is not None:
            from sidecar.rank.storesync import Outage, StoreSync
            from sidecar.rank.triggers.store import StoreTrigger

            outage = Outage(self.store.url.display(), f"rank {self.rank}, its node's agent")
            trigger = StoreTrigger(self.store, self.replica, self._relay, self._relay_error,
                                   max_bytes=self.settings.max_control_bytes, baseline=baseline,
                                   thread_name="cosmos-profiler-node-watch", outage=outage)
            self._sync = StoreSync(self.store, self.registry_root, self.replica, self.heartbeat, outage)
            self._sync.start()
        else:
            trigger = FileTrigger(
                self.shared_control, self._relay, self._relay_error, mode=self.settings.watch,
                poll_interval=self.poll_interval, safety_interval=max(0.5, min(6 * self.heartbeat, 30.0)),
                max_bytes=self.settings.max_control_bytes, allowed_uids=tuple(self.settings.allowed_uids),
                allowed_gids=tuple(self.settings.allowed_gids), settle_time=self.settings.settle_time,
                baseline=baseline, thread_name="cosmos-profiler-node-watch",
            )
        trigger.start()
        self._shared = trigger
        source, digest = trigger.seen
        self._relayed = (list(source) if source is not None else None, digest.hex() if digest is not None else None)
        if envelope is None and baseline is None:  # the first agent: what the shared file holds now is no request
            source, digest = trigger.seen
            self._write_envelope(noderelay.encode(source=source, data=b"", baseline=True, agent=self._agent_info())
                                 if digest is None else self._baseline_envelope(source))
        self._watch_records()
        self._ticks = not (filesystem_type(self.registry_root) or "").startswith("fuse")
        self._last_key = None
        self._tick_due = 0.0
        log.info("[Profiler] rank %d is its node's agent (term %s): it watches %s for the node (%s) and writes %s",
                 self.rank, self.lease.epoch, self.shared_control, trigger.mode, self.node_record)
        self._rollup(force=True)

    def _relayed_by_node_record(self) -> tuple[tuple[int, int, int, int] | None, bytes | None] | None:
        """Where a live agent of this job left the relay, as its node record says; None when there is
        no such record (the first agent of the node, or one a job before this one left)."""
        try:
            node, mtime = noderecord.read_node_file(self.node_record)
        except (OSError, RecordError):
            return None
        relayed = node.get("agent", {}).get("relayed") if isinstance(node.get("agent"), dict) else None
        if not isinstance(relayed, dict) or time.time() - mtime > clock.MIN_STALE_S + 2 * self.heartbeat:
            return None
        pids = [(e.get("pid"), e.get("start_since_boot")) for e in noderecord.node_entries(node) if isinstance(e, dict)]
        if not any(pid_alive(pid, started) for pid, started in pids):
            return None  # no rank of it is running here: another job's
        source, digest = relayed.get("source"), relayed.get("digest")
        try:
            return (tuple(int(v) for v in source) if isinstance(source, list) and len(source) == 4 else None,  # type: ignore[return-value]
                    bytes.fromhex(digest) if isinstance(digest, str) else None)
        except ValueError:
            return None

    def _watch_records(self) -> None:
        try:
            ensure_dir(self.records_dir, private=True)
            self._records_watch = InotifyWatch(self.records_dir)
        except OSError:
            self._records_watch = None  # the loop turns every half heartbeat instead

    def _baseline_envelope(self, source: tuple[int, int, int, int] | None) -> bytes:
        try:
            from sidecar.common.registry import read_control

            data = read_control(self.shared_control, self.settings.max_control_bytes,
                                self.settings.allowed_uids, self.settings.allowed_gids).data
        except (OSError, RequestError):
            data = b""
        return noderelay.encode(source=source, data=data, baseline=True, agent=self._agent_info())

    def _step_down(self, release: bool) -> None:
        trigger, self._shared = self._shared, None
        if trigger is not None:
            trigger.stop()
        sync, self._sync = self._sync, None
        if sync is not None:
            sync.stop(flush=release)  # at exit: the last node record goes to the store
        watch, self._records_watch = self._records_watch, None
        if watch is not None:
            watch.close()
        if release:
            self.lease.release()
        else:
            self.lease.epoch = None
        self._anchors.clear()

    def _agent_info(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "epoch": self.lease.epoch,
                "relayed": {"source": self._relayed[0], "digest": self._relayed[1]}}

    # -- the relay --------------------------------------------------------------

    def _relay(self, control: ControlFile) -> None:
        """The shared control file's new version, on the agent's watcher thread: into the node dir."""
        if not self.lease.still_mine():
            return  # another rank took over while this one was away: it relays
        self._write_envelope(noderelay.encode(source=control.signature, data=control.data, repeat=control.repeat,
                                              agent=self._agent_info()))
        self._relayed = (list(control.signature), noderelay.digest_of(control.data))
        self.num_relays += 1

    def _relay_error(self, exc: RequestError) -> None:
        if not self.lease.still_mine():
            return
        trigger = self._shared
        source = trigger.seen[0] if trigger is not None else None
        self._write_envelope(noderelay.encode(source=source, data=str(exc).encode(), error=str(exc),
                                              agent=self._agent_info()))
        self._relayed = (list(source) if source is not None else None, None)
        self.num_relays += 1

    def _write_envelope(self, raw: bytes) -> None:
        try:
            noderelay.write(self.envelope_path, raw)
        except OSError as exc:
            self._log_once("node-relay", logging.ERROR,
                           f"[Profiler] the node agent cannot relay to {self.envelope_path}: {exc}")

    # -- the node record --------------------------------------------------------

    def read_local_records(self) -> list[RankRecord]:
        """The records of this node's ranks; a rank whose file went while its process lives keeps
        the record last read (it writes again at its next heartbeat)."""
        records: dict[int, RankRecord] = {}
        try:
            names = os.listdir(self.records_dir)
        except OSError:
            names = []
        for name in names:
            if not (name.startswith("rank-") and name.endswith(".json")):
                continue
            try:
                record = read_record(self.records_dir / name)
            except (OSError, RecordError):
                continue
            records[record.rank] = record
        for rank, last in list(self._seen.items()):
            if rank not in records and last.exited_at is None and pid_alive(last.pid, last.start_since_boot):
                records[rank] = last
        self._seen = records
        return [records[rank] for rank in sorted(records)]

    def _anchor(self, record: RankRecord, now: float, relaxed: bool) -> noderecord.Pace:
        """The rank's pace anchor: the one it has while what its record saw agrees with it, else a
        new one at what its record saw. Its record saw its step at its last full write, and still
        that step at its last tick (a rank that steps writes in full: a tick says nothing moved).
        Ahead of the anchor is re-anchored at once (a start step planned from it would come too
        early); behind only when `relaxed` (the node record's tick is due): a start step planned
        from it comes later than it need, and a loaded node whose ranks lag would otherwise
        rewrite its record at every turn."""
        _, rate = startstep.projected_step(record, now)
        seen_at = max(record.heartbeat_at, record.file_mtime or 0.0)
        seen = record.step
        old = self._anchors.get(record.rank)
        if old is not None:
            if seen_at <= old.t:
                return old  # nothing seen since the anchor
            expected = old.at(seen_at)
            ahead = seen - expected > noderecord.ahead_slack(old.rate)
            behind = expected - seen > noderecord.behind_slack(old.rate)
            if not ahead and not (behind and relaxed):
                return old
            if seen == old.step:
                rate = 0.0  # not one step since the anchor: it stands still
            elif old.rate > 0 and seen_at - old.t >= LONG_RATE_MIN_S and seen > old.step and rate > 0:
                # The pace since the last anchor: a steady job's true rate, where the recent one
                # (the fastest between samples) runs a little high and would drift again soon.
                long_run = (seen - old.step) / (seen_at - old.t)
                if abs(long_run - rate) <= LONG_RATE_AGREES * rate:
                    rate = long_run
        new = noderecord.Pace(seen_at, seen, max(0.0, rate))
        self._anchors[record.rank] = new
        return new

    def _rollup(self, force: bool = False) -> None:
        """Build the node record; write it when it says something new, else tick it when due."""
        if not self.lease.still_mine():
            return
        now = time.time()
        if self._offset is None or now >= self._offset_due:
            self._measure_offset(now)
        quiet_after = QUIET_HEARTBEATS * self.heartbeat + 1.0
        entries = []
        for record in self.read_local_records():
            age = now - (record.file_mtime if record.file_mtime is not None else record.heartbeat_at)
            fresh = (record.exited_at is None and age <= max(quiet_after, QUIET_HEARTBEATS * record.heartbeat_interval)
                     and is_alive(record, self.host, now))
            entry = noderecord.entry(record, self._anchor(record, now, now >= self._tick_due) if fresh else None, fresh)
            entry["watch"] = self._shared.mode if self._shared is not None else entry["watch"]
            entry["poll_interval"] = self.poll_interval
            entries.append(entry)
        agent = self._agent_info()
        key = noderecord.content_key(entries, agent, self._offset, self.heartbeat)
        if force or key != self._last_key or not self._ticks and now >= self._tick_due:
            data = noderecord.build(self.replica, self.host, agent, entries, now, self._offset, self.heartbeat)
            try:
                atomic_write(self.node_record, data)
            except FileNotFoundError:
                ensure_dir(self.node_record.parent)
                atomic_write(self.node_record, data)
            except OSError as exc:
                self._log_once("node-record", logging.ERROR,
                               f"[Profiler] the node agent cannot write {self.node_record}: {exc}")
                return
            self._last_key = key
            self._tick_due = now + self.heartbeat
            self.num_node_writes += 1
            if self._sync is not None:
                self._sync.wake()
        elif now >= self._tick_due:
            try:
                os.utime(self.node_record, None, follow_symlinks=False)
                self.num_node_ticks += 1
            except OSError:
                self._last_key = None  # gone: written in full at the next turn
            self._tick_due = now + self.heartbeat

    def _measure_offset(self, now: float) -> None:
        """The shared filesystem's clock less this node's, from a probe (four metadata operations,
        every CLOCK_PROBE_EVERY_S); the node record carries it, so readers place its times."""
        if self._sync is not None:  # a redis:// registry: the store's clock, as its sync thread measured it
            self._offset = self._sync.clock_offset if self._sync.clock_offset is not None else 0.0
            self._offset_due = now + (CLOCK_PROBE_EVERY_S if self._sync.clock_offset is not None else self.heartbeat)
            return
        directory = self.node_record.parent
        try:
            ensure_dir(directory)
            self._offset = round(clock.fs_now(directory) - time.time(), 3)
        except OSError:
            self._offset = None
        self._offset_due = now + CLOCK_PROBE_EVERY_S


def link_for(registry_root: Path, replica: str, rank: int, host: str, world_size: int, settings: SidecarSettings,
             log_once: Callable[[str, int, str], None], store: RedisStore | None = None) -> NodeLink | None:
    """The rank's node link where its node uses an agent (`wants_agent`), its node dir made ready;
    None where it does not, or where the node dir is unusable (said once: the rank then watches
    the shared registry on its own, as without an agent)."""
    use, why = wants_agent(settings, registry_root, store)
    if not use:
        return None
    base = node_base(settings)
    link = NodeLink(base / layout.node_key(registry_root, replica, host), registry_root, replica, rank, host, world_size,
                    settings, log_once, store)
    try:
        link.prepare()
    except OSError as exc:
        log.warning("[Profiler] rank %d: the node-local directory %s cannot be used (%s); this rank watches the "
                    "shared registry on its own (set COSMOS_PROFILER_NODE_DIR to a directory of your own)",
                    rank, link.node_dir, exc)
        return None
    log.debug("[Profiler] rank %d shares %s with its node (%s)", rank, link.node_dir, why)
    return link
