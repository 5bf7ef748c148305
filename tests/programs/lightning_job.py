"""A PyTorch Lightning job on CPU that Lightning sees as a SLURM job (auto-requeue on SIGUSR1).

    SLURM_JOB_ID=... SLURM_NTASKS=1 ... python -m sidecar.run tests/programs/lightning_job.py OUT --stop-file F

Lightning's `_SignalConnector` installs its SLURM requeue handler on SIGUSR1 at `fit()` only
where SIGUSR1 has no handler yet; on the signal it saves `OUT/hpc_ckpt_1.ckpt` and runs
`scontrol requeue $SLURM_JOB_ID`. Prints READY <pid> after the first step, trains until F exists.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

try:
    import lightning.pytorch as pl
except ImportError:  # the standalone package (bin/test installs pytorch-lightning)
    import pytorch_lightning as pl


class Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        time.sleep(0.02)
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class StopOnFile(pl.Callback):
    def __init__(self, stop_file: str) -> None:
        self.stop_file = stop_file
        self.ready = False

    def on_train_batch_end(self, trainer, *args) -> None:
        if not self.ready:
            self.ready = True
            print(f"READY {os.getpid()}", flush=True)
        if os.path.exists(self.stop_file):
            trainer.should_stop = True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--stop-file", required=True)
    args = p.parse_args()
    out, stop_file = args.out, args.stop_file
    torch.set_num_threads(1)
    data = torch.utils.data.DataLoader(torch.randn(64, 16), batch_size=8)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_epochs=-1, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=out,
                         callbacks=[StopOnFile(stop_file)])
    print(f"ENVIRONMENT {type(trainer._accelerator_connector.cluster_environment).__name__}", flush=True)
    trainer.fit(Tiny(), data)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
