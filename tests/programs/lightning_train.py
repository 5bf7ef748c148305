"""A PyTorch Lightning `Trainer.fit` run as a new user writes it: it knows nothing of the sidecar.

    python -m sidecar.run --replica pl tests/programs/lightning_train.py --steps-file S --stop-file F

A tiny LightningModule on CPU, a synthetic dataset, gradient accumulation 2
(`accumulate_grad_batches`), no checkpoints, no logger. Trains until --max-steps
or until --stop-file exists. Works with the `lightning` package or `pytorch_lightning`.

For the tests, and nothing else: each training_step leaves a `train_forward
global_step=K` mark in a trace (K: `trainer.global_step` while that micro-batch
runs), and each batch that ends an optimizer step appends {"global_step",
"sidecar_step"} to --steps-file (the sidecar's count then, None without one).
Prints READY <pid> when training begins and DONE <global_step> at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

ACCUMULATE = 2


class RandomPoints(torch.utils.data.Dataset):
    """Random (x, class) pairs, made on demand (the same ones for the same index)."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, generator=g), torch.randint(0, 4, (), generator=g)


class TinyClassifier(pl.LightningModule):
    def __init__(self, step_sleep: float) -> None:
        super().__init__()
        self.step_sleep = step_sleep
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4))

    def training_step(self, batch, batch_idx):
        with torch.profiler.record_function(f"train_forward global_step={self.trainer.global_step}"):
            pass
        time.sleep(self.step_sleep / ACCUMULATE)  # stands in for a heavier step
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Steps(pl.Callback):
    def __init__(self, steps_file: str, stop_file: str) -> None:
        self.steps_file, self.stop_file = steps_file, stop_file

    def on_train_start(self, trainer, pl_module):
        print(f"READY {os.getpid()}", flush=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if (batch_idx + 1) % ACCUMULATE:
            return  # a micro-batch that did not step the optimizer
        import sidecar

        sc = sidecar.current()
        with open(self.steps_file, "a") as f:
            f.write(json.dumps({"global_step": trainer.global_step, "sidecar_step": sc and sc.step_num}) + "\n")
        if os.path.exists(self.stop_file):
            trainer.should_stop = True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps-file", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--step-sleep", type=float, default=0.01)
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=args.max_steps, accumulate_grad_batches=ACCUMULATE,
        enable_checkpointing=False, logger=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Steps(args.steps_file, args.stop_file)],
    )
    loader = torch.utils.data.DataLoader(RandomPoints(), batch_size=8, num_workers=0)
    trainer.fit(TinyClassifier(args.step_sleep), loader)
    print(f"DONE {trainer.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
