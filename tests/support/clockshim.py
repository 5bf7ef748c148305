"""A process whose wall clock runs apart from this machine's: an LD_PRELOAD shim that shifts
CLOCK_REALTIME (clock_gettime, gettimeofday, time) by COSMOS_TEST_CLOCK_OFFSET_S seconds.

A node whose NTP broke, in a test: the files it writes still get the kernel's times.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

ENV_OFFSET = "COSMOS_TEST_CLOCK_OFFSET_S"
SHIM = r"""
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static long offset_s(void) {
    const char *s = getenv("COSMOS_TEST_CLOCK_OFFSET_S");
    return s ? atol(s) : 0;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = (int)syscall(SYS_clock_gettime, id, ts);
    if (rc == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) ts->tv_sec += offset_s();
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    if (rc == 0 && tv) { tv->tv_sec = ts.tv_sec; tv->tv_usec = ts.tv_nsec / 1000; }
    (void)tz;
    return rc;
}

time_t time(time_t *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (t) *t = ts.tv_sec;
    return ts.tv_sec;
}
"""


def build_clock_shim(directory: Path) -> Path | str:
    """Build the shim in `directory`; its path, or why it cannot be built (for a skip)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return "no C compiler (cc) to build the clock shim"
    (directory / "shim.c").write_text(SHIM)
    built = subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(directory / "shim.so"), str(directory / "shim.c")],
                           capture_output=True, text=True, timeout=120)
    if built.returncode != 0:
        return f"the clock shim did not build: {built.stderr.strip()[-500:]}"
    return directory / "shim.so"
