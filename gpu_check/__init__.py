"""The GPU acceptance check: every CUDA path of the sidecar, proven on one GPU in one short run.

Not a benchmark: it passes or fails. `bin/gpu-check` sets up a Python with a CUDA torch and
runs `python -m gpu_check` (docs/gpu-check.md says what each line means).

    __main__          the command: options, the GPU probe, the summary line, report.txt, results.json
    checks            the checks, driving real processes: the CLI on a training job, the CUDA bench
    verify            the verdicts: pure functions of a trace, a summary, a snapshot, a hang report
    harness           lines as checks end, children in sessions of their own, one deadline
    cuda_train        the training job (a CUDA loop on a one-rank NCCL group), run by `sidecar.run`
    cuda_save_stall   benchmarks/save_stall.py's bench on CUDA trainers, in a process of its own

It reuses the benchmarks' harness (benchmarks.common, benchmarks.save_stall, benchmarks.models);
the benchmarks import nothing from here.
"""
