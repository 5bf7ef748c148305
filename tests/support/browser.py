"""A page rendered by a real browser: headless Chromium (Debian's `chromium`, which bin/test installs
best effort), its DOM after the scripts ran and its console messages (`render`, `rendered_ok`,
`Elements`), or its pixels (`screenshot`)."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass
from html.parser import HTMLParser
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


class Elements(HTMLParser):
    """Every start tag of a document as (tag, attributes), and its text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data):
        self.text.append(data)

    def find(self, tag: str, css_class: str | None = None) -> list[dict[str, str]]:
        return [a for t, a in self.tags if t == tag and (css_class is None or css_class in a.get("class", "").split())]


def assert_self_contained(text: str) -> None:
    """Nothing that a browser would fetch: no src, no stylesheet links, no CSS urls or imports."""
    doc = Elements(text)
    assert not [a for _, a in doc.tags if "src" in a], "the page loads a resource"
    assert not doc.find("link") and "url(" not in text and "@import" not in text


def rendered_ok(browser: str, page: Path, tmp_path: Path) -> Elements:
    """The page in headless Chromium: no console message, its script ran, no script error; the DOM."""
    shown = render(browser, page, tmp_path / "chromium-profile")
    assert shown.console == [], shown.console
    dom = Elements(shown.dom)
    html_attrs = dom.find("html")[0]
    assert html_attrs.get("data-js") == "ready" and "data-js-error" not in html_attrs, html_attrs
    assert dom.find("pre")[0].get("hidden") is not None  # the error box stayed empty
    return dom


@dataclass
class Pixels:
    """An RGB(A) image, row by row."""

    width: int
    height: int
    channels: int
    rows: list[bytes]

    def count(self, rgb: tuple[int, int, int], x0: int, x1: int) -> int:
        """Pixels of colour `rgb` in columns [x0, x1)."""
        c, target = self.channels, bytes(rgb)
        return sum(row[x * c:x * c + 3] == target for row in self.rows for x in range(x0, x1))


def screenshot(browser: str, page: Path, out: Path, profile_dir: Path, size: tuple[int, int] = (1000, 800),
               timeout: float = 90.0) -> Pixels:
    """Headless Chromium paints `page` into the PNG `out`; its pixels."""
    done = subprocess.run(
        [browser, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--hide-scrollbars",
         f"--user-data-dir={profile_dir}", f"--window-size={size[0]},{size[1]}", f"--screenshot={out}",
         page.resolve().as_uri()],
        capture_output=True, text=True, timeout=timeout,
    )
    assert done.returncode == 0 and out.exists(), f"{browser} exited {done.returncode}:\n{done.stderr[-3000:]}"
    return read_png(out)


def read_png(path: Path) -> Pixels:
    """An 8-bit RGB or RGBA PNG, non-interlaced (what Chromium writes), decoded with the standard library."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    assert header is not None, path
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    c = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * c, [], bytearray(width * c)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - c] if i >= c else 0
            b, up_left = prev[i], prev[i - c] if i >= c else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - up_left
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - up_left)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else up_left)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return Pixels(width, height, c, rows)
