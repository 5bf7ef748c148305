"""Cosmos-RL's `CosmosProfiler` interface, built on the Sidecar.

`cosmos_rl.utils.profiler.CosmosProfiler` is this class. It keeps Cosmos-RL's
constructor shape and methods (start, start_dynamic, step, stop, check,
check_finished, should_stop, get_total_steps_needed, stop_and_save, save),
its trace paths (`dirname(train.output_dir)/profile_trace/<replica>_<rank>/
<n>_trace.json.gz`) and log lines; in addition the worker listens to its
control file and SIGUSR1, so it can be profiled with no controller. When a
controller URL is given, trace directories are reported to it with
`POST /api/set_trace_path`, off the training thread.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from typing import Any

import sidecar
from sidecar.config import JobConfig, ProfilerConfig, load_config
from sidecar.core import Sidecar, build_sidecar
from sidecar.request import ProfileRequest, defaults_from_config, parse_rank_filter

log = logging.getLogger("sidecar")


def _job_config(config: Any) -> JobConfig:
    """Accept a TOML path, our JobConfig, or a Cosmos-RL config object
    (anything with `.profiler` and `.train.output_dir`)."""
    if isinstance(config, (str, os.PathLike)):
        return load_config(config)
    if isinstance(config, JobConfig):
        return config
    profiler = getattr(config, "profiler", None)
    train = getattr(config, "train", None)
    if profiler is None or train is None:
        raise TypeError("config must be a TOML path, a JobConfig, or a Cosmos-RL Config with .profiler and .train")
    if not isinstance(profiler, ProfilerConfig):
        sub = profiler.sub_profiler_config
        names = {f.name for f in dataclasses.fields(sidecar.config.SubProfilerConfig)}
        sub_values = {k: getattr(sub, k) for k in names if hasattr(sub, k)}
        profiler = ProfilerConfig(
            enable_profiler=bool(profiler.enable_profiler),
            enable_nsys=bool(getattr(profiler, "enable_nsys", False)),
            sub_profiler_config=sidecar.config.SubProfilerConfig(**sub_values),
        )
    return JobConfig(profiler=profiler, train_output_dir=getattr(train, "output_dir", None))


class CosmosProfiler:
    """Drop-in for Cosmos-RL's profiler; see the module docstring.

    Args:
        config: a Cosmos-RL config (or TOML path / JobConfig).
        parallel_dims: an object with `.global_rank`, or the rank as an int.
        replica_name: the replica this worker belongs to.
        alternative_urls: controller base URLs (Cosmos-RL's name); the first
            is used to report trace paths. An `api_client` with `.base_url`
            or `.alternative_urls` is accepted too.
        role: "policy" or "rollout".
    """

    WAIT_STEPS = 1
    WARMUP_STEPS = 1

    def __init__(
        self,
        config: Any,
        parallel_dims: Any,
        replica_name: str,
        alternative_urls: Sequence[str] | None = None,
        api_client: Any = None,
        role: str = "policy",
    ) -> None:
        job = _job_config(config)
        self.config = config
        self.replica_name = replica_name
        self.global_rank = parallel_dims if isinstance(parallel_dims, int) else int(parallel_dims.global_rank)
        self.enable_profile = job.profiler.enable_profiler
        self.profiled_times = 0
        self.is_started = False
        self.is_finished = False
        sub = job.profiler.sub_profiler_config
        self.active_steps = sub.active_steps
        self.rank_filter = list(sub.rank_filter) or [0]
        self.record_shape = sub.record_shape
        self.profile_memory = sub.profile_memory
        self.with_stack = sub.with_stack
        self.with_modules = sub.with_modules
        urls = list(alternative_urls or [])
        if api_client is not None:
            urls += list(getattr(api_client, "alternative_urls", None) or [getattr(api_client, "base_url", "")])
        urls = [u for u in urls if u]
        if urls:
            job.sidecar = dataclasses.replace(job.sidecar, controller_url=urls[0])
        self.alternative_urls = urls
        output_dir = os.path.dirname(os.path.abspath(job.train_output_dir or "./outputs"))
        self.output_dir = os.path.join(output_dir, "profile_trace", f"{replica_name}_{self.global_rank}")
        self._defaults = defaults_from_config(sub)
        self._num_seen = 0
        self.sidecar: Sidecar = build_sidecar(
            output_dir=output_dir, replica=replica_name, rank=self.global_rank, role=role, config=job
        ).start()

    # -- Cosmos-RL's methods ------------------------------------------------

    def check(self) -> bool:
        """A capture is running (Cosmos-RL: the profiler exists and is enabled)."""
        return self.enable_profile and self.sidecar.state in ("tracing", "armed")

    def start(self) -> None:
        """Start a capture with the static config, if this rank is selected."""
        if not self.enable_profile or self.global_rank not in self.rank_filter:
            return
        self._start(self.active_steps, self.rank_filter, self.record_shape, self.profile_memory,
                    self.with_stack, self.with_modules)

    def start_dynamic(
        self,
        active_steps: int,
        rank_filter: list[int],
        record_shape: bool,
        profile_memory: bool,
        with_stack: bool,
        with_modules: bool,
    ) -> None:
        """Start a capture with settings from a profile command."""
        if not self.enable_profile or self.global_rank not in (rank_filter or [0]):
            return
        self._start(active_steps, rank_filter, record_shape, profile_memory, with_stack, with_modules)

    def step(self) -> None:
        self.sidecar.step()
        self._poll_finished()

    def stop(self) -> None:
        """Stop the running capture early, saving what it recorded."""
        if self.sidecar.state == "tracing":
            self.sidecar.finish_now()
        self.is_started = False

    def should_stop(self) -> bool:
        if self.check():
            return False
        self._poll_finished()
        return True

    def get_total_steps_needed(self) -> int:
        if self.check():
            return self.WAIT_STEPS + self.WARMUP_STEPS + self.active_steps
        return 0

    def check_finished(self) -> bool:
        """True once after each capture of this rank has been saved."""
        self._poll_finished()
        finished = self.is_finished
        self.is_finished = False
        return finished

    def stop_and_save(self) -> None:
        self.stop()

    def save(self) -> None:
        self.stop()

    def close(self) -> None:
        self.sidecar.close()

    # -- internals ------------------------------------------------------------

    def _start(self, active_steps, rank_filter, record_shape, profile_memory, with_stack, with_modules) -> None:
        if self.is_started and self.check():
            return
        if active_steps <= 0:
            raise ValueError(f"[Profiler] active_steps must be positive, got {active_steps}")
        self.active_steps = active_steps
        values = dict(self._defaults)
        values.update(
            wait_steps=self.WAIT_STEPS,
            warmup_steps=self.WARMUP_STEPS,
            active_steps=active_steps,
            rank_filter=parse_rank_filter(list(rank_filter or [0])),
            record_shape=record_shape,
            profile_memory=profile_memory,
            with_stack=with_stack,
            with_modules=with_modules,
        )
        request = ProfileRequest(id=f"cosmos-{self.global_rank}-{self.profiled_times}", **values)
        if self.sidecar.request_capture(request, begin_now=True):
            self.is_started = True
            self.is_finished = False

    def _poll_finished(self) -> None:
        done = self.sidecar.num_captures
        if done > self._num_seen:
            self._num_seen = done
            self.profiled_times = done
            self.is_started = False
            self.is_finished = True
