"""Stack dumps grouped: which rank stands apart, and where.

`group_stacks` puts ranks whose main threads stand in the same frames together, so the rank
that hangs a collective stands apart from the ranks that wait for it. The dump format and its
reader are the shared floor's (`sidecar.common.stackdump`). Standard library only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sidecar.common.request import RankFilter

if TYPE_CHECKING:
    from sidecar.fleet.answers import RankStacks


@dataclass
class StackGroup:
    """Ranks whose thread `thread` stands in the same frames."""

    ranks: list[int]
    thread: str
    frames: list[str]  # 'File "x.py", line 3, in f' lines, innermost last
    is_main: bool = True
    steps: list[int] = field(default_factory=list)  # the distinct steps the ranks were at
    other_threads: list[str] = field(default_factory=list)  # (main groups) the ranks' other thread names

    @property
    def ranks_text(self) -> str:
        return str(RankFilter(frozenset(self.ranks)))


def group_stacks(answers: Sequence[RankStacks], by_stack: bool = True, all_threads: bool = False) -> list[StackGroup]:
    """Groups of ranks by the frames of their main thread (each rank alone when
    not `by_stack`); the biggest group first, so the odd ranks out come last.

    With `all_threads`, the main-thread groups are followed by groups of every
    other thread, by thread name then frames.
    """
    dumped = [a for a in answers if a.is_finished]
    groups: dict[Any, StackGroup] = {}
    for answer in dumped:
        main = answer.main
        frames = list(main.frames) if main is not None else []
        key = tuple(frames) if by_stack else answer.rank
        group = groups.get(key)
        if group is None:
            group = groups[key] = StackGroup([], main.name if main is not None else "(no main thread)", frames)
        group.ranks.append(answer.rank)
        if answer.step is not None and answer.step not in group.steps:
            group.steps.append(answer.step)
        for index, thread in enumerate(answer.threads):
            if index != answer.main_thread and thread.name not in group.other_threads:
                group.other_threads.append(thread.name)
    ordered = _by_size(groups.values())
    if not all_threads:
        return ordered
    others: dict[Any, StackGroup] = {}
    for answer in dumped:
        for index, thread in enumerate(answer.threads):
            if index == answer.main_thread:
                continue
            thread_key = (thread.name, thread.frames if by_stack else answer.rank)
            group = others.get(thread_key)
            if group is None:
                group = others[thread_key] = StackGroup([], thread.name, list(thread.frames), is_main=False)
            if answer.rank not in group.ranks:
                group.ranks.append(answer.rank)
    names = list(dict.fromkeys(g.thread for g in others.values()))
    for name in names:
        ordered.extend(_by_size(g for g in others.values() if g.thread == name))
    return ordered


def _by_size(groups: Any) -> list[StackGroup]:
    result = list(groups)
    for group in result:
        group.ranks.sort()
        group.steps.sort()
    return sorted(result, key=lambda g: (-len(g.ranks), g.ranks[0]))
