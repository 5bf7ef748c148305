"""A Hugging Face `Trainer` run as a new user writes it: it knows nothing of the sidecar.

    python -m sidecar.run --replica hf tests/programs/hf_train.py --steps-file S --stop-file F

A tiny GPT-2 built from a config (no download: HF_HUB_OFFLINE=1), a synthetic
dataset, gradient accumulation 2, no checkpoints, no logging integrations.
Trains until --max-steps or until --stop-file exists.

For the tests, and nothing else: each forward pass leaves a `train_forward
global_step=K` mark in a trace (K: the Trainer's `state.global_step` while that
micro-batch runs), and each step end appends {"global_step", "sidecar_step"}
to --steps-file (the sidecar's count at that moment, None without one).
Prints READY <pid> when training begins and DONE <global_step> at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

import torch  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402

SEQ_LEN = 16
VOCAB = 128


class RandomTokens(torch.utils.data.Dataset):
    """Random token sequences, made on demand (the same ones for the same index)."""

    def __len__(self) -> int:
        return 1_000_000

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids.clone()}


class Steps(TrainerCallback):
    def __init__(self, steps_file: str, stop_file: str, step_sleep: float) -> None:
        self.steps_file, self.stop_file, self.step_sleep = steps_file, stop_file, step_sleep

    def on_train_begin(self, args, state, control, **kwargs):
        print(f"READY {os.getpid()}", flush=True)

    def on_step_begin(self, args, state, control, **kwargs):
        time.sleep(self.step_sleep)  # stands in for a heavier step

    def on_step_end(self, args, state, control, **kwargs):
        import sidecar

        sc = sidecar.current()
        with open(self.steps_file, "a") as f:
            f.write(json.dumps({"global_step": state.global_step, "sidecar_step": sc and sc.step_num}) + "\n")
        if os.path.exists(self.stop_file):
            control.should_training_stop = True


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps-file", required=True)
    p.add_argument("--stop-file", required=True)
    p.add_argument("--max-steps", type=int, default=100_000)
    p.add_argument("--step-sleep", type=float, default=0.01)
    args = p.parse_args()

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=64, n_positions=SEQ_LEN, vocab_size=VOCAB))
    training_args = TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="hf_train-"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=args.max_steps,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        disable_tqdm=True,
        dataloader_num_workers=0,
        dataloader_pin_memory=False,
        remove_unused_columns=False,
    )
    trainer = Trainer(model=model, args=training_args, train_dataset=RandomTokens(),
                      callbacks=[Steps(args.steps_file, args.stop_file, args.step_sleep)])

    def mark_forward(module, inputs):
        with torch.profiler.record_function(f"train_forward global_step={trainer.state.global_step}"):
            pass

    model.register_forward_pre_hook(mark_forward)
    trainer.train()
    print(f"DONE {trainer.state.global_step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
