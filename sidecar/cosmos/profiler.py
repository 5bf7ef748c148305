"""cosmos-rl 0.4.7's `CosmosProfiler`, driven by the sidecar.

One class, two homes: the stand-in's `cosmos_rl.utils.profiler` (where cosmos-rl
is absent) exports it, and with the real cosmos-rl `sidecar.cosmos.integration` puts it
in place of cosmos-rl's own class when that module is imported.

It keeps 0.4.7's constructor `(config, parallel_dims, replica_name, api_client)`,
its attributes (`wait_steps`, `warmup_steps`, `active_steps`, `rank_filter`, ...,
`profiled_times`, `is_started`, `initialized`) and the meaning of the calls its
workers make:

- `start()` (SFT worker, once): if this rank is in the config's `rank_filter`,
  trace `wait_steps + warmup_steps + active_steps` steps from now;
- `start_dynamic(...)` (RL policy worker, on a controller command): the same
  with the command's `active_steps`, ranks and options;
- `step()` after each training step; `check_finished()` is True once after each
  capture of this rank has finished;
- `stop()` / `stop_and_save()` / `save()` end the running capture early and
  save what it recorded.

Traces go where 0.4.7 puts them (`dirname(train.output_dir)/profile_trace/
<replica>_<rank>/<n>_trace.json.gz`) with its log lines. What the sidecar adds:
the worker also listens to its control file and a signal (so `cosmos-profiler
profile set`, `touch` and `kill -s <its signal>` start captures; never the worker's
checkpoint signal, `train.signal_to_handle`, SIGUSR1 by default: see
`checkpoint_signals`; `replica lsr` names each rank's), the trace is written off
the training thread, and the trace directory is reported to the controller
through the worker's `api_client` addresses off the training thread, with a
bound (0.4.7 retries for about 50 minutes inside `stop_and_save`, and raises
AttributeError into `step()` when `api_client` is None).

Nothing here raises into the worker: a profiler whose rank or replica cannot be
used logs once why the sidecar is off, and the worker trains on.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

import sidecar
from sidecar.common import layout, storeurl
from sidecar.common.config import job_config
from sidecar.common.identity import ENV_REGISTRY
from sidecar.common.records import BUSY_STATES
from sidecar.common.registry import unlink_quietly
from sidecar.common.request import CONFIG_TABLE, COUNTS, ProfileRequest, bound_count, parse_rank_filter
from sidecar.common.signames import parse_signal
from sidecar.rank.core import Sidecar, build_sidecar
from sidecar.rank.threads import start_once

log = logging.getLogger("sidecar")

SET_TRACE_PATH_SUFFIX = "/api/set_trace_path"
OWN_ID_PREFIX = "cosmos-"

# cosmos-rl 0.4.7 workers that build a CosmosProfiler but never reach a step boundary: no
# profiler call after the constructor, and no optimizer step (they run inference only).
NO_STEP_WORKERS = {
    "TeacherWorker": "cosmos-rl 0.4.7's TeacherWorker (role REFERENCE) calls no profiler method and steps "
                     "no optimizer, so this rank has no training step to trace; profile a policy replica, "
                     "or use `profile stacks` / `profile hang` here",
}


def calling_worker(frame: Any) -> Any:
    """The cosmos-rl worker whose constructor builds this profiler (`self` of the calling
    frame, as `PolicyWorkerBase.__init__` does), or None."""
    worker = frame.f_locals.get("self") if frame is not None else None
    return None if isinstance(worker, CosmosProfiler) else worker


def worker_role(worker: Any) -> str:
    """The worker's cosmos-rl role, as our records spell roles: "policy", "reference", ..."""
    role = getattr(worker, "role", None)
    return role.lower() if isinstance(role, str) and role else "policy"


def no_step_reason(worker: Any) -> str | None:
    """Why `worker`'s rank can never count a step (by its class), or None."""
    for cls in type(worker).__mro__ if worker is not None else ():
        if cls.__name__ in NO_STEP_WORKERS:
            return NO_STEP_WORKERS[cls.__name__]
    return None


def controller_urls(api_client: Any) -> list[str]:
    """The `/api/set_trace_path` URLs of a cosmos-rl `APIClient`, one per controller address.

    0.4.7's client answers `get_alternative_urls(suffix)`; any object with
    `base_urls` (or `base_url`) works too.
    """
    if api_client is None:
        return []
    urls: list[str] = []
    try:
        alternatives = getattr(api_client, "get_alternative_urls", None)
        if callable(alternatives):
            urls = [u for u in alternatives(SET_TRACE_PATH_SUFFIX) if isinstance(u, str) and u]
        if not urls:
            bases = getattr(api_client, "base_urls", None) or [getattr(api_client, "base_url", None)]
            urls = [urljoin(b if "://" in b else f"http://{b}", SET_TRACE_PATH_SUFFIX)
                    for b in bases if isinstance(b, str) and b]
    except Exception as exc:  # noqa: BLE001 - someone else's client object
        log.warning("[Profiler] cannot read the controller addresses of %r: %s", api_client, exc)
        return []
    return list(dict.fromkeys(urls))


def job_redis(config: Any, api_client: Any, configured: str | None = None,
              env: Mapping[str, str] | None = None) -> str | None:
    """The job's own Redis as this worker's registry, where none is configured (no COSMOS_PROFILER_DIR,
    no `[sidecar] registry`): `redis://<controller host>:<config.redis>/0`, the Redis cosmos-rl's
    controller starts and every worker connects to (the host is the api_client's first controller
    address, else COSMOS_CONTROLLER_HOST's). None where the config names no Redis port."""
    env = os.environ if env is None else env
    if env.get(ENV_REGISTRY) or configured:
        return None
    port = str(getattr(config, "redis", "") or "").strip()
    if not port.isdigit() or not 0 < int(port) < 65536:
        return None
    host = None
    try:
        ips = getattr(api_client, "remote_ips", None)
        if isinstance(ips, (list, tuple)) and ips and isinstance(ips[0], str):
            host = ips[0]
    except Exception:  # noqa: BLE001 - someone else's client object
        host = None
    if host is None and env.get("COSMOS_CONTROLLER_HOST"):
        host = env["COSMOS_CONTROLLER_HOST"].rsplit(":", 1)[0].split(";")[0].strip() or None
    return storeurl.job_url(host, int(port))


class CosmosProfiler:
    """cosmos-rl 0.4.7's profiler, sidecar-driven; see the module docstring.

    Args:
        config: cosmos-rl's `Config` (or a TOML path, or our `JobConfig`).
        parallel_dims: cosmos-rl's `ParallelDims` (`.global_rank`, `.world_size`),
            or the global rank as an int.
        replica_name: the replica this worker belongs to.
        api_client: cosmos-rl's `APIClient`; trace directories are reported to
            its controller addresses. None: nothing is reported.
    """

    def __init__(self, config, parallel_dims, replica_name, api_client):
        self.config = config
        self.replica_name = replica_name
        self.api_client = api_client
        self.initialized = False
        self.is_started = False
        self.is_finished = False
        self.profiled_times = 0
        self.thread_pool = None  # 0.4.7's; the sidecar saves and reports on threads of its own
        self.sidecar: Sidecar | None = None
        self._num_seen = 0
        self._active_key = f"{CONFIG_TABLE}.active_steps"  # where active_steps came from, for messages
        self._own_id: str | None = None  # the capture that this profiler's own calls started
        self._queued_behind: str | None = None  # a start()/start_dynamic() waiting for this request
        worker = calling_worker(sys._getframe(1))
        self.worker_class = type(worker).__name__ if worker is not None else None
        self.role = worker_role(worker)
        self.cannot_trace = no_step_reason(worker)

        self.global_rank = _global_rank(parallel_dims)
        self.enable_profile = False
        self.wait_steps, self.warmup_steps, self.active_steps = 1, 1, 1
        self.rank_filter = [0]
        self.record_shape = self.profile_memory = self.with_stack = self.with_modules = False
        self.output_dir = ""
        try:
            job, enabled = job_config(config)
        except Exception as exc:  # noqa: BLE001 - never into the worker
            log.error("[Profiler] the profiler sidecar is off for replica %s: its config is unusable: %s",
                      replica_name, exc)
            return
        sub = job.profiler.sub_profiler_config
        self.enable_profile = enabled
        self.wait_steps = sub.wait_steps
        self.warmup_steps = sub.warmup_steps
        self.active_steps = sub.active_steps
        self.rank_filter = list(sub.rank_filter) or [0]
        self.record_shape = sub.record_shape
        self.profile_memory = sub.profile_memory
        self.with_stack = sub.with_stack
        self.with_modules = sub.with_modules
        output_root = job.output_root or os.path.abspath("outputs")
        # 0.4.7's attribute, named as the layout names a rank's trace directory (`layout.rank_trace_dir`;
        # a global rank that could not be read shows as None, and the sidecar is off then)
        self.output_dir = os.path.join(output_root, layout.TRACE_DIR,
                                       layout.RANK_DIR_TEMPLATE.format(replica=replica_name, rank=self.global_rank))
        self.sidecar = self._start_sidecar(job, output_root, parallel_dims)

    def _start_sidecar(self, job: Any, output_root: str, parallel_dims: Any) -> Sidecar | None:
        if self.global_rank is None:
            log.error("[Profiler] the profiler sidecar is off for replica %s: parallel_dims has no usable "
                      "global_rank (%r)", self.replica_name, parallel_dims)
            return None
        world_size = getattr(parallel_dims, "world_size", None)
        try:
            _take_over_generic_sidecar()
            sc = build_sidecar(output_dir=output_root, replica=self.replica_name, rank=self.global_rank,
                               role=self.role, config=job, reserved_signals=checkpoint_signals(self.config),
                               registry=job_redis(self.config, self.api_client, job.sidecar.registry))
            if isinstance(world_size, int) and world_size > sc.identity.world_size:
                import dataclasses

                sc.identity = dataclasses.replace(sc.identity, world_size=world_size)
            if controller_urls(self.api_client):
                sc.on_saved.append(self._on_saved)
            sc.cosmos_owned = True
            if self.cannot_trace:
                sc.mark_cannot_trace(self.cannot_trace)
            else:
                # A worker that never calls step() (0.4.7's MultiReplicaSFTPolicyWorker) is counted at its
                # optimizer's step(); the first step() call takes over (Sidecar.enable_auto_step).
                sc.enable_auto_step()
            sc.start()
            sidecar._adopt(sc)
            return sc
        except Exception as exc:  # noqa: BLE001 - never into the worker
            log.error("[Profiler] the profiler sidecar is off for replica %r rank %s: %s",
                      self.replica_name, self.global_rank, exc)
            return None

    # -- cosmos-rl 0.4.7's methods ------------------------------------------------

    @property
    def profiler(self) -> Any:
        """The running `torch.profiler.profile`, or None (0.4.7: set while a capture runs)."""
        return self.sidecar.profiler if self.sidecar is not None else None

    def check(self) -> bool:
        """A capture is armed or running on this rank, and profiling is enabled."""
        return bool(self.enable_profile and self.sidecar is not None and self.sidecar.state in ("armed", "tracing"))

    def _validate_config(self) -> bool:
        if len(self.rank_filter) == 0:
            self.rank_filter = [0]
        if self.active_steps <= 0:
            log.error("[Profiler] active_steps must be positive, got %s; not profiling", self.active_steps)
            return False
        return True

    def check_finished(self) -> bool:
        """True once after each capture of this rank has finished."""
        self._poll_finished()
        self._start_queued()
        finished = self.is_finished
        self.is_finished = False
        return finished

    def start(self) -> None:
        """Trace with the static config, if this rank is in its `rank_filter`."""
        if not self.enable_profile or self.global_rank not in self.rank_filter:
            return
        self._start_own()

    def start_dynamic(self, active_steps, rank_filter, record_shape, profile_memory, with_stack, with_modules) -> None:
        """Trace with a profile command's settings (the config's wait and warmup steps)."""
        if not self.enable_profile or self.global_rank not in (rank_filter or [0]):
            return
        if not self.initialized:
            self.active_steps = active_steps
            self._active_key = "the profile command's active_steps"
            self.rank_filter = list(rank_filter)
            self.record_shape = record_shape
            self.profile_memory = profile_memory
            self.with_stack = with_stack
            self.with_modules = with_modules
        self._start_own()

    def stop(self) -> None:
        """End the running capture now and save what it recorded."""
        if self.sidecar is not None and self.sidecar.state == "tracing":
            self.sidecar.finish_now()
        self.is_started = False
        self._poll_finished()

    def step(self) -> None:
        if self.sidecar is None:
            return
        self.sidecar.step()
        if self.is_started or self.sidecar.num_finished != self._num_seen:
            self._poll_finished()
        if self._queued_behind is not None:
            self._start_queued()

    def get_total_steps_needed(self) -> int:
        request = self.sidecar.active_request if self.sidecar is not None else None
        if request is not None:
            return request.num_steps
        return self.wait_steps + self.warmup_steps + self.active_steps if self.check() else 0

    def should_stop(self) -> bool:
        if self.check():
            return False
        self._poll_finished()
        return True

    def stop_and_save(self) -> None:
        self.stop()

    def save(self) -> None:
        self.stop()

    def report_to_controller(self, trace_file_dir: str) -> None:
        """Tell the controller where this rank's traces are: off the calling thread, bounded."""
        urls = controller_urls(self.api_client)
        if not urls:
            return
        abs_path = os.path.abspath(trace_file_dir)
        start_once("cosmos-profiler-report", self._report, urls, abs_path)

    # -- the sidecar's additions ---------------------------------------------------------

    def close(self) -> None:
        """Stop listening (the sidecar also closes itself at exit)."""
        if self.sidecar is not None:
            self.sidecar.close()

    def _start_own(self) -> None:
        if self.sidecar is None or not self._validate_config():
            return
        if self.is_started and self.check():
            return
        if self._queued_behind is not None:
            return  # already waiting: said once
        current = self.sidecar.busy_with
        if self.sidecar.state in BUSY_STATES and (current is None or current.id != self._own_id):
            # Another capture (the CLI's, a touch, a signal) holds this rank: 0.4.7's request runs
            # after it, rather than being refused at every step and lost.
            self._queued_behind = current.id if current is not None else "?"
            log.warning("[Profiler] rank %s: this profile request waits for request %s, which is running; "
                        "it starts when that one ends", self.global_rank, self._queued_behind)
            return
        try:
            values: dict[str, Any] = dict(
                kind="trace",
                wait_steps=self.wait_steps,
                warmup_steps=self.warmup_steps,
                active_steps=self.active_steps,
                rank_filter=parse_rank_filter([self.global_rank]),
                record_shape=bool(self.record_shape),
                profile_memory=bool(self.profile_memory),
                with_stack=bool(self.with_stack),
                with_modules=bool(self.with_modules),
            )
            # cosmos-rl takes any count; the sidecar bounds the one it runs (a clamp, said; or a refusal).
            for name in COUNTS:
                key = self._active_key if name == "active_steps" else f"{CONFIG_TABLE}.{name}"
                values[name], note = bound_count(name, values[name], key)
                if note:
                    log.warning("[Profiler] rank %s: %s", self.global_rank, note)
            request = ProfileRequest(
                id=f"{OWN_ID_PREFIX}{self.replica_name[:40]}-{self.global_rank}-{self.sidecar.num_finished}",
                source="cosmos", **values)
        except Exception as exc:  # noqa: BLE001 - a bad value from the worker's command
            log.error("[Profiler] rank %s: cannot start a capture: %s", self.global_rank, exc)
            return
        if self.sidecar.request_capture(request, begin_now=True):
            self._own_id = request.id
            self.initialized = True
            self.is_started = True
            self.is_finished = False

    def _poll_finished(self) -> None:
        sc = self.sidecar
        if sc is None:
            return
        done = sc.num_finished
        if done > self._num_seen:
            self._num_seen = done
            self.profiled_times = done
            if self._own_id is None or sc.last_finished_id != self._own_id:
                return  # another capture (CLI, touch, signal): not the worker's to report as its own
            self._own_id = None
            self.is_started = False
            self.initialized = False
            self.is_finished = True
            log.info("[Profiler] stop trace for rank: %s", self.global_rank)

    def _start_queued(self) -> None:
        """Start the worker's own request that waited for another capture, once that one has ended."""
        sc = self.sidecar
        if self._queued_behind is None or sc is None or sc.state in BUSY_STATES:
            return
        log.info("[Profiler] rank %s: request %s has ended; starting this profile request", self.global_rank,
                 self._queued_behind)
        self._queued_behind = None
        self._start_own()

    def _on_saved(self, kind: str, path: Path, request: ProfileRequest) -> None:
        # The saver thread: the file is in place. Only the worker's own captures go to its controller.
        if kind == "trace" and request.source == "cosmos":
            self._report(controller_urls(self.api_client), os.path.abspath(os.path.dirname(path)))

    def _report(self, urls: list[str], trace_dir: str) -> None:
        from sidecar.rank.controller_post import REPORT_TIMEOUT_S, post_trace_path

        errors = []
        for url in urls:
            try:
                post_trace_path(url, self.replica_name, trace_dir, self.global_rank or 0, timeout=REPORT_TIMEOUT_S)
                return
            except Exception as exc:  # noqa: BLE001 - the controller is optional
                errors.append(f"{url}: {exc}")
        log.warning("[Profiler] could not report the trace path %s to the controller (%s)", trace_dir,
                    "; ".join(errors))


def checkpoint_signals(config: Any) -> dict[int, str]:
    """The signals a cosmos-rl worker will handle itself, by number, with what they mean to it.

    0.4.7's `PolicyWorkerBase.__init__` builds `DistributedSignalHandler(train.signal_to_handle)`
    right after the profiler when `train.save_ckpt_at_exit` is true (the defaults: true, SIGUSR1):
    such a signal saves a checkpoint (RL) or stops training (SFT). A config without `.train` (a TOML
    path: the stand-in, where no cosmos-rl installs that handler) reserves none."""
    train = getattr(config, "train", None)
    if train is None or not getattr(train, "save_ckpt_at_exit", False):
        return {}
    reserved: dict[int, str] = {}
    for name in getattr(train, "signal_to_handle", None) or []:
        try:
            signum = parse_signal(str(name))
        except ValueError:
            continue  # cosmos-rl itself refuses it (signal.Signals[name])
        reserved[signum] = ("cosmos-rl's checkpoint signal: train.signal_to_handle with train.save_ckpt_at_exit "
                            "= true; it saves a checkpoint (RL) or stops training (SFT)")
    return reserved


def _global_rank(parallel_dims: Any) -> int | None:
    value = parallel_dims if isinstance(parallel_dims, int) else getattr(parallel_dims, "global_rank", None)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value


def _take_over_generic_sidecar() -> None:
    """`python -m sidecar.run` installed a sidecar for the whole process before the
    worker was known; the worker's CosmosProfiler, which knows its replica and
    rank, replaces it (an idle one only: a capture in flight is left to finish)."""
    current = sidecar.current()
    if current is None or current.cosmos_owned:
        return
    if current.state in ("armed", "tracing", "saving"):
        raise RuntimeError(f"a sidecar for replica {current.replica} rank {current.rank} is busy in this process")
    log.info("[Profiler] the CosmosProfiler of this worker replaces the sidecar of replica %s", current.replica)
    current.close()
    # it never served a worker: leave no record of it behind
    unlink_quietly(current.record_path)
