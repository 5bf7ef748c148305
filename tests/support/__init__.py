"""Shared test helpers: not tests, imported by the test modules as `support.<module>`.

    launch      the one way to start a training run: TrainProc, made by a Spawner (what
                tests/e2e/conftest.py's `spawn` fixture yields; `spawn.rank(registry)`: one ready rank),
                torchrun_cmd, base_env, free_port, PYTHON/ROOT/TRAIN/DDP
    capture     two_rank_capture: a real capture of two ranks (tests/e2e/conftest.py's `capture`);
                slowed_ddp_captures: a torchrun job with one rank slowed, captured per plan
    wait        wait_for: poll on a deadline, never a bare sleep; the one wait loop of the suite
    layout      where a test lives: is_e2e, process_starters, PROCESS_FIXTURES (conftest's rule:
                tests/unit/ starts no process, tests/e2e/ is marked e2e)
    training    training in this process: train_until (a Sidecar), driver_capture (a ProfilerDriver)
    files       read_json (None while absent or half-written), remove_tree
    records     rank records written by hand (alive/dead/remote/update_record) and read
                back by the CLI's rules (record, wait_record, wait_saved_and_idle: before the
                next request, for a busy rank refuses one)
    traces      reading traces (load_trace, profiler_steps) and writing them by hand
                (write_trace, span, step_trace, write_huge_trace)
    procs       a process's thread and file-descriptor counts, measured from outside
    threads     parked_thread: a thread standing in a known frame, for the stacks tests
    rooms       a rank room's RankContext, built for a unit test (tests/unit/test_<room>.py)
    cli         the CLI as a subprocess (run_cli) or in this process (invoke); stack_group_headers
    browser     a page rendered by headless Chromium: its DOM and console (find_browser, render)
    controller  FakeController, the one stand-in Cosmos-RL controller on 127.0.0.1: routes,
                recorded calls, misbehaviour on demand (conftest's `controller`); cosmos_status
    netfs       a real network filesystem on 127.0.0.1 (sshfs over a throwaway sshd)
    s3          moto's S3 server on 127.0.0.1 (S3Server: tests/e2e/conftest.py's
                `s3_server`), CREDENTIALS, upload_toml

The modules import each other relatively, so a benchmark can use them as
`tests.support.<module>` from the repository root. Fixtures live in tests/conftest.py (any
test) and tests/e2e/conftest.py (those that start processes).
"""
