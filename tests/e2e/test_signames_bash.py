"""Real-time signal names as we spell them are what bash's `kill -s` accepts (a bash subprocess)."""

import signal
import subprocess

from sidecar.common.signames import signal_name


def test_real_time_names_are_what_bash_kill_accepts():
    name = signal_name(signal.SIGRTMIN + 3)
    assert name == "SIGRTMIN+3"
    # bash's own `kill -l` maps the name back to the same number
    out = subprocess.run(["bash", "-c", f"kill -l {name}"], capture_output=True, text=True, check=True).stdout
    assert int(out) == signal.SIGRTMIN + 3
