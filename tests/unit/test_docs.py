"""The docs cannot drift: README.md and docs/*.md are checked against the real code.

- every `cosmos-profiler ...` (`python -m sidecar ...`, `python -m cosmos_rl.cli.cli ...`) command line
  shown, and every command a table names (`| `profile set NAME` |`), parses with the real click app,
  and every `python -m sidecar.run ...` line with its real argument parser;
- every example on docs/json.md is valid against sidecar/cli/schema.json, one per command;
- every relative link points at a file that exists (and a heading in it, for `#anchor`);
- the README stays under 250 lines.

The README's quick start runs for real in tests/e2e/test_docs_quickstart.py."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import click
import pytest

from sidecar.cli import cosmos
from support.launch import ROOT

README = ROOT / "README.md"

DOCS = sorted((ROOT / "docs").glob("*.md"))

PAGES = [README, *DOCS]

MAX_README_LINES = 250

FENCE_RE = re.compile(r"^```[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)

INLINE_CODE_RE = re.compile(r"`([^`\n]+)`")

LINK_RE = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")

# Where a shell command line ends and the next (or a redirection) begins.
SHELL_STOPS = {"|", "||", "&&", ";", "&", ">", ">>", "<", "2>&1", "#"}


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def command_lines(text: str) -> list[str]:
    """Command lines in fenced blocks (`$ ` prompts dropped, `\\` continuations joined) and in
    inline code spans."""
    lines = []
    for block in FENCE_RE.findall(text):
        block = re.sub(r"\\\n\s*", " ", block)
        lines += [line.strip().removeprefix("$ ") for line in block.splitlines()]
    lines += [span.strip() for span in INLINE_CODE_RE.findall(text)]
    return lines


def shell_words(line: str) -> list[str]:
    """The words of the first command on `line`, up to a pipe, redirection or comment."""
    try:
        words = shlex.split(line, comments=False)
    except ValueError:  # an unbalanced quote: not a command line
        return []
    for i, word in enumerate(words):
        if word in SHELL_STOPS or word.startswith(("#", ">", "2>")):
            return words[:i]
    return words


def cli_args(line: str) -> list[str] | None:
    """The arguments after `cosmos-profiler` / `python -m sidecar` (or the Cosmos-RL stand-in's
    `python -m cosmos_rl.cli.cli`), or None when `line` runs none of them."""
    words = shell_words(line)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):  # VAR=value cosmos-profiler ...
        words = words[1:]
    if words[:1] == ["cosmos-profiler"]:
        return words[1:]
    if words[:3] in (["python", "-m", "sidecar"], ["python", "-m", "cosmos_rl.cli.cli"]):  # the stand-in: the same CLI
        return words[3:]
    return None


def run_args(line: str) -> list[str] | None:
    """The arguments of `-m sidecar.run` (run by python, torchrun or srun), or None."""
    words = shell_words(line)
    for i in range(len(words) - 1):
        if words[i:i + 2] == ["-m", "sidecar.run"]:
            return words[i + 2:]
    return None


def _unparsed(ctx: click.Context) -> list[str]:
    """What a group's context left for its subcommand (click 8.2 renamed protected_args)."""
    protected = ctx._protected_args if hasattr(ctx, "_protected_args") else ctx.protected_args
    return [*protected, *ctx.args]


def parse_cli(args: list[str]) -> list[str]:
    """Resolve `args` through click's parser as the CLI would (no resilient parsing): the command
    path, each option and argument converted by its type. Returns the command path; raises
    click's UsageError/BadParameter for an unknown command or option or a bad value."""
    ctx = cosmos.make_context("cosmos-profiler", list(args), resilient_parsing=False)
    command: click.Command = cosmos
    path: list[str] = []
    while isinstance(command, click.Group):
        rest = _unparsed(ctx)
        if not rest:
            raise click.UsageError(f"{' '.join(['cosmos-profiler', *path])} needs a command", ctx=ctx)
        name, command, rest = command.resolve_command(ctx, rest)
        path.append(name)
        ctx = command.make_context(name, rest, parent=ctx, resilient_parsing=False)
    return path


def table_commands(text: str) -> list[str]:
    """Commands named in the first column of a table (`| `profile set NAME` | ... |`), as command lines."""
    return [f"cosmos-profiler {span}" for span in re.findall(r"^\| `((?:replica|profile) [^`]+)`", text, re.MULTILINE)]


def shown_commands() -> list[tuple[str, str, list[str]]]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for line in command_lines(text) + table_commands(text):
            args = cli_args(line)
            if args and "--help" not in args and "--version" not in args:
                found.append((_rel(page), line, args))
    return found


SHOWN = shown_commands()


def test_docs_show_cli_commands() -> None:
    pages = {page for page, _, _ in SHOWN}
    assert {"README.md", "docs/cli.md", "docs/multi-node.md"} <= pages, pages


@pytest.mark.parametrize(("page", "line", "args"), SHOWN, ids=[f"{page}-{i}" for i, (page, _, _) in enumerate(SHOWN)])
def test_shown_cli_command_parses(page: str, line: str, args: list[str]) -> None:
    try:
        path = parse_cli(args)
    except click.exceptions.Exit:
        return
    except click.MissingParameter:
        if len(args) == 2 and not any(a.startswith("-") for a in args):
            return  # prose naming a command (`cosmos-profiler profile set`), not a command line
        raise
    except click.ClickException as exc:
        pytest.fail(f"{page}: `{line}` does not parse: {exc.format_message()}")
    assert path, line


def test_shown_sidecar_run_lines_parse() -> None:
    from sidecar import run

    shown = [(_rel(page), line, args) for page in PAGES for line in command_lines(page.read_text())
             if (args := run_args(line))]  # an empty one is prose naming it
    assert any(page == "README.md" for page, _, _ in shown), shown
    for page, line, args in shown:
        if "--help" in args:
            continue
        try:
            ns = run.parse_args(args)
        except SystemExit as exc:
            pytest.fail(f"{page}: `{line}` does not parse: exit {exc.code}")
        assert ns.script or ns.module, line


def test_parse_cli_refuses_what_the_cli_refuses() -> None:
    """The check above is worth something only if a drifted line fails it."""
    assert parse_cli(["profile", "set", "r1", "-rf", "0-3", "--wait"]) == ["profile", "set"]
    for bad in (["profile", "sett", "r1"], ["profile", "set", "r1", "--no-such-flag"], ["profile", "set"],
                ["profile", "set", "r1", "-as", "0"], ["replica"]):
        with pytest.raises(click.ClickException):
            parse_cli(bad)


def json_examples() -> list[tuple[str, object]]:
    """docs/json.md's examples: (`cosmos-profiler ...` command, its JSON), with the parts the page
    leaves out (a `"... rank 1, the same fields"` string in a list, a `"..."` key) dropped."""
    def strip(value: object) -> object:
        if isinstance(value, list):
            return [strip(v) for v in value if not (isinstance(v, str) and v.startswith("..."))]
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k != "..."}
        return value

    text = (ROOT / "docs" / "json.md").read_text()
    return [(cmd, strip(json.loads(body)))
            for cmd, body in re.findall(r"```console\n\$ cosmos-profiler (.*?)\n(\{.*?\n\})\n```", text, re.DOTALL)]


def test_json_examples_match_the_schema() -> None:
    """Every example on docs/json.md is valid against sidecar/cli/schema.json, and every command of
    the schema has one."""
    from support.schema import load_schema, violations

    root = load_schema()
    examples = json_examples()
    shown = {" ".join(cmd.split()[:2]) for cmd, value in examples if "error" not in value}
    assert shown == set(root["commands"]), f"commands without an example: {set(root['commands']) - shown}"
    for cmd, value in examples:
        schema = {"$ref": "#/$defs/error"} if "error" in value else root["commands"][" ".join(cmd.split()[:2])]
        assert not violations(value, schema, root), (cmd, violations(value, schema, root)[:5])


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives `page`'s headings: lower case, punctuation dropped, spaces to '-'."""
    text = FENCE_RE.sub("", page.read_text())
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
            for title in re.findall(r"^#{1,6} (.+)$", text, re.MULTILINE)}


def test_relative_links_exist() -> None:
    broken = []
    for page in PAGES:
        for target in LINK_RE.findall(page.read_text()):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # a URL
            file_part, _, anchor = target.partition("#")
            path = (page.parent / file_part).resolve() if file_part else page
            if not path.exists():
                broken.append(f"{_rel(page)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in anchors(path):
                broken.append(f"{_rel(page)}: {target} (no such heading)")
    assert not broken, broken


def test_readme_is_short() -> None:
    num_lines = len(README.read_text().splitlines())
    assert num_lines < MAX_README_LINES, f"README.md has {num_lines} lines; keep it under {MAX_README_LINES}"


ARCHITECTURE = ROOT / "docs" / "architecture.md"

SOURCE_PATH_RE = re.compile(r"\b((?:tests|bin|rank|fleet|cosmos|traces|cli|triggers)/[a-z0-9_/]*[a-z_]+\.py|[a-z_]+\.py)\b")


def _modules() -> list[Path]:
    """Every module of the package, but a folder's `__init__`/`__main__`."""
    return sorted(p for p in (ROOT / "sidecar").rglob("*.py") if not p.name.startswith("__"))


def test_architecture_names_only_files_that_exist() -> None:
    """A path the page names (`rank/driver.py`, `tests/e2e/test_imports.py`) is a file of the repository."""
    missing = []
    for name in sorted(set(SOURCE_PATH_RE.findall(ARCHITECTURE.read_text()))):
        candidates = [ROOT / name, ROOT / "sidecar" / name, ROOT / "sidecar" / "rank" / name,
                      ROOT / "tests" / name, ROOT / "benchmarks" / name]
        if "/" not in name:
            candidates += list((ROOT / "sidecar").rglob(name))
        if not any(path.is_file() for path in candidates):
            missing.append(name)
    assert not missing, f"docs/architecture.md names files that do not exist: {missing}"


MAP_SECTION = "## Three places code runs, three folders"
BOX_LINE_RE = re.compile(r"^\s*│(.*)│\s*$")
MAP_PATH_RE = re.compile(r"(?<![\w/.])((?:[a-z_]+/)*[a-z_0-9]+)\.py\b")
NAME_RE = re.compile(r"[a-z_][a-z0-9_]*")


def map_blocks(page: str) -> list[str]:
    """The fenced blocks of the map: the folder tree and the boxes."""
    section = page.split(f"{MAP_SECTION}\n", 1)[1].split("\n## ", 1)[0]
    return FENCE_RE.findall(section)


def _rooms(block: str) -> dict[str, str]:
    """Each folder's part of a map block: a box's `│ rank/ ...│` line and the box lines below it, or
    an unboxed `common/, ...` line and the indented lines below it; folder -> its text."""
    rooms: dict[str, str] = {}
    folder, boxed = None, False
    for line in block.splitlines():
        box = BOX_LINE_RE.match(line)
        inner = box.group(1) if box else line
        head = re.match(r"^ ?([a-z_]+)/ " if box else r"^  ([a-z_]+)/,", inner)
        if head:
            folder, boxed = head.group(1), bool(box)
            inner = inner[head.end():]
        elif not (folder and boxed == bool(box) and inner.startswith("   ")):
            folder = None
        if folder:
            rooms[folder] = rooms.get(folder, "") + "\n" + inner
    return rooms


def placed_modules(page: str) -> set[str]:
    """The modules the map places, as paths under sidecar/ without `.py` (`rank/driver`, `run`):
    a path (`run.py`, `rank/driver.py`) in a map block, or a name standing as an entry of its own
    folder's room (`driver (torch.profiler) · flightrec`, `triggers/ base · file`). A word in
    prose or in parentheses, or in another folder's room, places nothing."""
    placed = set()
    for block in map_blocks(page):
        placed |= set(MAP_PATH_RE.findall(block))
        for folder, text in _rooms(block).items():
            while re.search(r"\([^()]*\)", text):
                text = re.sub(r"\([^()]*\)", " ", text)
            for line in text.splitlines():
                sub = ""
                for piece in re.split(r"[·,]", line):
                    piece = piece.strip()
                    nested = re.match(r"^([a-z_]+)/\s+", piece)  # `triggers/ base`: the rest of the line
                    if nested:
                        sub, piece = f"{nested.group(1)}/", piece[nested.end():]
                    if NAME_RE.fullmatch(piece):
                        placed.add(f"{folder}/{sub}{piece}")
    return placed


def test_architecture_maps_every_module() -> None:
    """Every module of sidecar/ has a room on the map: named in its own folder's box, or by its path."""
    placed = placed_modules(ARCHITECTURE.read_text())
    unmapped = [str(p.relative_to(ROOT)) for p in _modules()
                if p.relative_to(ROOT / "sidecar").with_suffix("").as_posix() not in placed]
    assert not unmapped, f"docs/architecture.md does not place these modules: {unmapped}"


def test_the_map_places_a_module_only_in_its_own_folder() -> None:
    page = f"""{MAP_SECTION}
```
sidecar/
└── run.py      the script in front
```
```
  ┌──────────────────────────────────────────────────┐
  │ fleet/   hang (reads the state of each rank) ·   │
  │          control · log, render (text and JSON)   │
  │          triggers/ base · file (inotify)         │
  └───────┬──────────────────────────────────────────┘
          │ config
  common/, the shared floor (imports nothing):
    config (every key) · exit
    clock
```
The rank state, rank/dumps and rank/stall.py, in prose.
## Next
"""
    assert placed_modules(page) == {"run", "fleet/hang", "fleet/control", "fleet/log", "fleet/render",
                                    "fleet/triggers/base", "fleet/triggers/file", "common/config",
                                    "common/exit", "common/clock"}


def test_architecture_map_boxes_line_up() -> None:
    """Every line of a box on the map ends in its right border, in the column of the box's corner."""
    crooked = []
    for block in map_blocks(ARCHITECTURE.read_text()):
        width = 0
        for line in block.splitlines():
            if line[:2] != "  " or line[2:3] not in ("┌", "│", "└"):
                continue
            line = line.rstrip()
            width = len(line) if line[2] == "┌" else width
            if len(line) != width or line[-1] not in "┐│┘":
                crooked.append(line)
    assert not crooked, "box lines whose right border is out of line:\n" + "\n".join(crooked)
