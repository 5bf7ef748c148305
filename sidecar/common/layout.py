"""The one place that knows the paths and names of the registry and of the outputs.

    <registry>/control/<replica>.json                          the trigger of a replica
    <registry>/replicas/<replica>/rank-<k>.json                one record per rank
    <registry>/replicas/<replica>/nodes/<shard>/<host>.json    one record per node, where a node agent rolls
                                                               its ranks' records up (registry on shared
                                                               storage: sidecar.common.noderecord)
    <registry>/replicas/<replica>/rank-<k>.faulthandler.txt    faulthandler's dumps: on sidecar.stacks_signal,
                                                               and the stall watch's timer (stall_after_s);
                                                               under stacks/<k // 256>/ where a node agent serves
    <registry>/replicas/<replica>/summaries/<k // 256>/rank-<k>.json  the summaries of rank k's last captures
                                                               (sidecar.common.capturesummary), written when
                                                               they change: what profile summary|report|diff
                                                               read where a trace is on another machine's disk
    <registry>/replicas/<replica>/slowdown-<watch>-<n>.claim   the rank whose slowdown watch asked for capture n
                                                               (sidecar.rank.slowdown; O_EXCL: the first rank wins)
    <registry>/replicas/<replica>/dumps/rank-<k>/<name>        a copy of a rank's stacks and flight recorder
                                                               dumps, where the registry is a store (redis://)
    <registry>/.clock-<pid>-<token>                            a clock probe (sidecar.common.clock), removed at once
    <output root>/profile_control                              the default registry of a job with [train]
    <per-user default registry>/roots/<replica>.json           where a replica registered elsewhere is
                                                               ({"registry", "output_dir"}): how the CLI finds
                                                               a job whose relative output_dir it resolved
                                                               against another directory
    <output>/profile_trace/<replica>_<rank>/<n>_trace.json.gz  traces, n = 0, 1, 2... per rank and kind
    <output>/profile_trace/<replica>_<rank>/<n>_summary.json   trace n's summary, written beside it once it is
                                                               saved (sidecar.rank.summarizer; format:
                                                               sidecar.common.capturesummary)
    <output>/profile_trace/<replica>_<rank>/<n>_stacks.txt     kind "stacks"
    <output>/profile_trace/<replica>_<rank>/<n>_memory.pickle  kind "memory"
    <output>/profile_trace/<replica>_<rank>/<n>_flight_recorder.json  kind "hang" and stalls: the n of its stacks file (rank.dumps)
    <output>/profile_trace/<replica>_fr_trace/<request>/<recorder>/rank_<k>  the same moment's recorder as torch's
                                                               fr_trace reads it: one folder per request and recorder
                                                               ("cpu", "nccl"), one pickle per rank (rank.flightrec)

The node-local registry of one job's ranks on one node (sidecar.rank.nodeagent), private to the user:

    <node base>/<key>/control.json              the relayed request (an envelope of the control file's bytes)
    <node base>/<key>/records/rank-<k>.json     the records of this node's ranks
    <node base>/<key>/agent/lease-<epoch>       the node agent's lease (O_EXCL), ticked while it serves

Pure: names and path arithmetic, no I/O.
"""

from __future__ import annotations

import os
import re
import zlib
from pathlib import Path

CONTROL_DIR = "control"
REPLICAS_DIR = "replicas"
CONTROL_TEMPLATE = "{replica}.json"
RECORD_TEMPLATE = "rank-{rank}.json"
REGISTRY_DIR_NAME = "profile_control"
# Written (temp + rename) and removed at once by sidecar.common.clock, for the filesystem's time: hidden,
# and no record's or control file's name.
CLOCK_PROBE_TEMPLATE = ".clock-{pid}-{token}"
ROOTS_DIR = "roots"

TRACE_DIR = "profile_trace"
RANK_DIR_TEMPLATE = "{replica}_{rank}"
TRACE_TEMPLATE = "{n}_trace.json.gz"
# Named by its trace's n (not numbered on its own): `summary_path_for`.
SUMMARY_TEMPLATE = "{n}_summary.json"
STACKS_TEMPLATE = "{n}_stacks.txt"
MEMORY_TEMPLATE = "{n}_memory.pickle"
FLIGHT_RECORDER_TEMPLATE = "{n}_flight_recorder.json"
# `python -m torch.distributed.flight_recorder.fr_trace <that folder>/<recorder>` infers the prefix "rank_"
# and takes the rank from the digits after it; a folder per request keeps one file per rank in it.
FR_TRACE_DIR_TEMPLATE = "{replica}_fr_trace"
FR_TRACE_FILE_TEMPLATE = "rank_{rank}"
# Appended to by faulthandler from a signal handler or its watchdog thread (never renamed:
# it writes to a descriptor opened at install); readers take the bytes a dump added. Beside
# the record, not in the trace dir: a rank that never captures creates no trace dir.
FAULT_STACKS_TEMPLATE = "rank-{rank}.faulthandler.txt"

# Created with O_EXCL by the first rank whose slowdown watch fires for capture n of watch <watch>.
SLOWDOWN_CLAIM_TEMPLATE = "slowdown-{watch}-{n}.claim"

STACKS_DIR = "stacks"
CARRIED_SUMMARIES_DIR = "summaries"
CARRIED_SUMMARIES_TEMPLATE = "rank-{rank}.json"
CARRIED_SUMMARIES_RE = re.compile(r"^rank-(?P<rank>\d+)\.json$")
# With a redis:// registry, a copy of each stacks and flight recorder dump a rank writes, in its node's mirror of
# the registry, which the node agent carries to the store: the CLI reads it where the rank's disk is out of reach.
DUMPS_DIR = "dumps"
RANKS_PER_STACKS_DIR = 256
NODES_DIR = "nodes"
NODE_TEMPLATE = "{host}.json"
# Node records per shard directory, on average: the shard count is the power of two that keeps the
# job's nodes (its world size over its ranks per node) at most this many per shard, at most
# MAX_NODE_SHARDS (65,536 nodes at 256 each).
NODES_PER_SHARD = 128
MAX_NODE_SHARDS = 256
NODE_CONTROL = "control.json"
NODE_RECORDS_DIR = "records"
NODE_AGENT_DIR = "agent"
LEASE_PREFIX = "lease-"
_UNSAFE_HOST = re.compile(r"[^A-Za-z0-9._-]")

RANK_DIR_RE = re.compile(r"^(?P<replica>.+)_(?P<rank>\d+)$")
TRACE_FILE_RE = re.compile(r"^(?P<n>\d+)_trace\.json(?:\.gz)?$")
SUMMARY_FILE_RE = re.compile(r"^(?P<n>\d+)_summary\.json$")


def summary_path_for(trace_path: str | os.PathLike[str]) -> Path | None:
    """`<n>_summary.json` beside a trace `<n>_trace.json[.gz]`; None for a trace named otherwise."""
    path = Path(trace_path)
    match = TRACE_FILE_RE.match(path.name)
    return path.with_name(SUMMARY_TEMPLATE.format(n=int(match["n"]))) if match else None


def fr_trace_dir(trace_dir: Path, replica: str, request: str, recorder: str) -> Path:
    """`<output>/profile_trace/<replica>_fr_trace/<request>/<recorder>`, from a rank's trace dir
    (`<output>/profile_trace/<replica>_<rank>`): the folder torch's fr_trace reads."""
    return Path(trace_dir).parent / FR_TRACE_DIR_TEMPLATE.format(replica=replica) / request / recorder


def control_path(root: Path, replica: str) -> Path:
    return Path(root) / CONTROL_DIR / CONTROL_TEMPLATE.format(replica=replica)


def root_pointer_path(default_root: Path, replica: str) -> Path:
    """`<per-user default registry>/roots/<replica>.json`: where that replica's registry is."""
    return Path(default_root) / ROOTS_DIR / CONTROL_TEMPLATE.format(replica=replica)


def replica_dir(root: Path, replica: str) -> Path:
    return Path(root) / REPLICAS_DIR / replica


def record_path(root: Path, replica: str, rank: int) -> Path:
    return replica_dir(root, replica) / RECORD_TEMPLATE.format(rank=rank)


def carried_summaries_path(root: Path, replica: str, rank: int) -> Path:
    """The summaries of a rank's last captures, as it publishes them: under summaries/<rank // 256>/,
    beside the records but not in them (a record is read by every `replica ls`; these only by the
    analysis commands)."""
    return (replica_dir(root, replica) / CARRIED_SUMMARIES_DIR / f"{rank // RANKS_PER_STACKS_DIR:03d}"
            / CARRIED_SUMMARIES_TEMPLATE.format(rank=rank))


def fault_stacks_path(root: Path, replica: str, rank: int, sharded: bool = False) -> Path:
    """Beside the rank's record; `sharded` (a node agent's job, whose rank records are not in the
    registry): under stacks/<rank // 256>/, so that no directory of a big job holds thousands."""
    name = FAULT_STACKS_TEMPLATE.format(rank=rank)
    if sharded:
        return replica_dir(root, replica) / STACKS_DIR / f"{rank // RANKS_PER_STACKS_DIR:03d}" / name
    return replica_dir(root, replica) / name


def dump_copy_path(root: Path, replica: str, rank: int, name: str) -> Path:
    """`<registry>/replicas/<replica>/dumps/rank-<k>/<name>`: a copy of a rank's `<n>_stacks.txt` or
    `<n>_flight_recorder.json` (a redis:// registry's mirror, and the CLI's view of it)."""
    return replica_dir(root, replica) / DUMPS_DIR / f"rank-{rank}" / name


def dump_copy_of(root: Path, path: str | os.PathLike[str]) -> Path | None:
    """Where the copy of the dump at `path` (`<output>/profile_trace/<replica>_<rank>/<name>`) would be
    under `root`; None for a path of no rank's trace dir."""
    path = Path(path)
    match = RANK_DIR_RE.match(path.parent.name)
    if match is None:
        return None
    return dump_copy_path(root, match.group("replica"), int(match.group("rank")), path.name)


def slowdown_claim_path(root: Path, replica: str, watch: str, n: int) -> Path:
    return replica_dir(root, replica) / SLOWDOWN_CLAIM_TEMPLATE.format(watch=watch, n=n)


def rank_trace_dir(output: Path, replica: str, rank: int) -> Path:
    """`<output>/profile_trace/<replica>_<rank>`: where one rank's files go."""
    return Path(output) / TRACE_DIR / RANK_DIR_TEMPLATE.format(replica=replica, rank=rank)


def registry_for_output_root(output_root: str | Path) -> Path:
    """Cosmos-RL layout: the registry sits beside `profile_trace/`, in the output root."""
    return Path(output_root) / REGISTRY_DIR_NAME


def node_shards(world_size: int, ranks_per_node: int = 1) -> int:
    """How many shard directories a replica of `world_size` ranks, `ranks_per_node` on each node
    (LOCAL_WORLD_SIZE: every agent of a job sees the same), spreads its node records over."""
    nodes = -(-world_size // max(1, ranks_per_node))
    shards = 1
    while shards < MAX_NODE_SHARDS and shards * NODES_PER_SHARD < nodes:
        shards *= 2
    return shards


def nodes_dir(root: Path, replica: str) -> Path:
    return replica_dir(root, replica) / NODES_DIR


def node_record_path(root: Path, replica: str, host: str, world_size: int, ranks_per_node: int = 1) -> Path:
    """`<registry>/replicas/<replica>/nodes/<shard>/<host>.json`; the shard by a hash of the host."""
    name = _UNSAFE_HOST.sub("_", host) or "_"
    shard = zlib.crc32(name.encode()) % node_shards(world_size, ranks_per_node)
    return nodes_dir(root, replica) / f"{shard:02x}" / NODE_TEMPLATE.format(host=name)


def node_key(registry_root: str | os.PathLike[str], replica: str, host: str) -> str:
    """The name of one job's node-local directory: its registry, replica and host, hashed (two jobs
    of one user on one node, under other registries or replica names, never share one; nor do two
    hosts, should a node_dir be set to a directory they share)."""
    import hashlib  # here, not at the top: it loads OpenSSL, which every CLI command would pay for at start

    text = f"{os.path.abspath(registry_root)}\0{replica}\0{host}"
    return f"{replica[:40]}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def node_record_local(node_dir: Path, rank: int) -> Path:
    return Path(node_dir) / NODE_RECORDS_DIR / RECORD_TEMPLATE.format(rank=rank)
