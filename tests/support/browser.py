"""A page rendered by a real browser: headless Chromium (Debian's `chromium`, which bin/test installs
best effort), its DOM after the scripts ran and its console messages."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SKIP_ENV = "COSMOS_SKIP_BROWSER"
NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Chromium logs each console message (console.error, an uncaught exception) as INFO:CONSOLE:<line>] "..."
_CONSOLE = re.compile(r":CONSOLE(?::\d+|\(\d+\))\] (.*)$")


def find_browser() -> tuple[str | None, str]:
    """(the browser's path, "") or (None, why there is none)."""
    if os.environ.get(SKIP_ENV):
        return None, f"{SKIP_ENV} is set"
    for name in NAMES:
        path = shutil.which(name)
        if path:
            return path, ""
    return None, ("no headless Chromium on PATH (" + ", ".join(NAMES) + "); bin/test installs Debian's chromium "
                  "with apt-get when it runs as root")


@dataclass
class Rendered:
    dom: str  # the DOM the browser produced (--dump-dom), after the page's scripts ran
    console: list[str]  # every console message of the page


def render(browser: str, page: Path, profile_dir: Path, timeout: float = 90.0) -> Rendered:
    """Load `page` in headless Chromium (no network needed: the page is a file) and dump its DOM."""
    done = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--enable-logging=stderr",
         "--v=0", f"--user-data-dir={profile_dir}", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0, f"{browser} exited {done.returncode}:\n{done.stderr[-3000:]}"
    console = [m[1] for line in done.stderr.splitlines() if (m := _CONSOLE.search(line))]
    return Rendered(done.stdout, console)
