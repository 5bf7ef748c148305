"""Print, as JSON, the public surface of whichever `cosmos_rl` this interpreter imports:
`CosmosProfiler` (constructor and method signatures, the attributes of an instance) and the
profiler config classes (fields and defaults). The golden test compares the real cosmos-rl's
with our stand-in's.

    python tests/programs/cosmos_surface.py OUTPUT_DIR
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import sys
from types import SimpleNamespace


def signature(fn) -> list[list]:
    return [[p.name, p.kind.name, None if p.default is p.empty else repr(p.default)]
            for p in inspect.signature(fn).parameters.values()]


def config_fields(cls) -> dict:
    if dataclasses.is_dataclass(cls):
        out = {}
        for f in dataclasses.fields(cls):
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            out[f.name] = default if not dataclasses.is_dataclass(default) else config_fields(type(default))
        return out
    out = {}
    for name, field in cls.model_fields.items():
        default = field.get_default(call_default_factory=True)
        out[name] = default if not hasattr(default, "model_fields") else config_fields(type(default))
    return out


def main() -> int:
    output_dir = sys.argv[1]
    import cosmos_rl.policy.config as config_module
    from cosmos_rl.utils.profiler import CosmosProfiler

    surface = {"module": CosmosProfiler.__module__, "init": signature(CosmosProfiler.__init__)}
    surface["methods"] = {
        name: signature(member) for name, member in inspect.getmembers(CosmosProfiler, inspect.isfunction)
        if not name.startswith("__")
    }
    surface["config"] = {name: config_fields(getattr(config_module, name))
                         for name in ("ProfilerConfig", "SubProfilerConfig")}
    config_class = getattr(config_module, "Config", None)
    if config_class is not None:  # the real cosmos-rl
        config = config_class.from_dict({"train": {"output_dir": output_dir}})
    else:  # the stand-in takes a TOML path
        path = f"{output_dir}/job.toml"
        with open(path, "w") as f:
            f.write(f"[train]\noutput_dir = '{output_dir}'\n")
        config = path
    profiler = CosmosProfiler(config, SimpleNamespace(global_rank=0, world_size=1), "surface-0", None)
    surface["attributes"] = sorted(k for k in vars(profiler) if not k.startswith("_"))
    surface["properties"] = sorted(k for k, v in inspect.getmembers(type(profiler)) if isinstance(v, property))
    if hasattr(profiler, "close"):
        profiler.close()
    print(json.dumps(surface, default=repr))
    return 0


if __name__ == "__main__":
    sys.exit(main())
