"""The training loops the benchmarks time (imports torch).

- `Trainer("mlp")`: a real CPU step, an MLP of three 1024-wide layers.
- `Trainer("deep")`: sixteen 256-wide layers; many small ops per step, so
  profiler traces grow quickly and per-op costs show.
- `Trainer("small")`: two 64-wide layers, about a millisecond a step: the
  training child of the latency benchmark.
- `Trainer("work")`: four 1024-wide layers, batch 64: tens of ms of matmuls
  (which release the GIL) and a little Python per step.

`device="cuda"` puts the model and batch on the GPU (bin/gpu-check's save stall).

Every benchmark sets torch to one intra-op thread, so two-core machines give
steadier numbers; the sidecar's costs do not depend on it.
"""

from __future__ import annotations

import torch

SHAPES = {
    # name: (width, layers, batch)
    "mlp": (1024, 3, 32),
    "deep": (256, 16, 32),
    "small": (64, 2, 16),
    "work": (1024, 4, 64),
}


def describe(name: str) -> str:
    width, layers, batch = SHAPES[name]
    return f"MLP {layers}x{width}, batch {batch}"


class Trainer:
    """One model, optimizer and batch; `step()` is forward, backward, SGD step."""

    def __init__(self, name: str = "mlp", seed: int = 0, device: str = "cpu") -> None:
        torch.set_num_threads(1)
        torch.manual_seed(seed)
        width, num_layers, batch = SHAPES[name]
        layers: list[torch.nn.Module] = []
        for _ in range(num_layers):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        layers.append(torch.nn.Linear(width, 1))
        self.model = torch.nn.Sequential(*layers).to(device)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=1e-4)
        self.x = torch.randn(batch, width).to(device)
        self.y = torch.randn(batch, 1).to(device)

    def step(self) -> None:
        self.opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(self.model(self.x), self.y)
        loss.backward()
        self.opt.step()
