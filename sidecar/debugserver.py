"""An aligned capture from torch's debug server page (`torch.distributed.debug.start_debug_server`).

    import sidecar
    from sidecar import debugserver
    from torch.distributed.debug import start_debug_server

    sc = sidecar.install()
    start_debug_server(port=25999, handlers=debugserver.handlers())

`handlers()` is torch's default handlers plus one: `/cosmos_capture`, a page that writes a trace
request for every rank of this replica through the sidecar's control path (`sidecar.fleet.control.
set_profile`, what `cosmos-profiler profile set NAME -rf all -as N` writes): every rank records the
same steps, and the traces land where `profile summary` finds them. The page runs in the debug
server's frontend process on rank 0, which writes the control file; nothing here runs in a rank's
training thread. torch is imported only when `handlers()` is called (jinja2 with it: the debug
server's own dependency).
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

ROUTE = "/cosmos_capture"
DEFAULT_ACTIVE_STEPS = 3


def handlers(replica: str | None = None, registry: str | Path | None = None) -> list[Any]:
    """torch's default debug-server handlers and the capture page, for `replica` in `registry`
    (default: this process's sidecar, `sidecar.current()`).

    Raises:
        RuntimeError: no replica or registry given and no sidecar installed.
    """
    from torch.distributed.debug._debug_handlers import default_handlers

    import sidecar

    sc = sidecar.current()
    if (replica is None or registry is None) and sc is None:
        raise RuntimeError("sidecar.install() first, or name the replica and the registry")
    name = replica if replica is not None else sc.replica  # type: ignore[union-attr]
    root = registry if registry is not None else sc.registry_root  # type: ignore[union-attr]
    return [*default_handlers(), __getattr__("CaptureHandler")(name, str(root))]


def __getattr__(name: str) -> Any:
    """`CaptureHandler`, made on first use (it subclasses torch's DebugHandler): a module attribute,
    so a frontend started with the "spawn" method unpickles it."""
    if name != "CaptureHandler":
        raise AttributeError(name)
    from torch.distributed.debug._frontend import DebugHandler, NavLink, Route

    class CaptureHandler(DebugHandler):
        """`/cosmos_capture?steps=N`: an aligned trace of every rank; without `steps`, a form."""

        def __init__(self, replica: str, registry: str) -> None:
            self.replica, self.registry = replica, registry

        def routes(self) -> list[Any]:
            return [Route(ROUTE, self._handle)]

        def nav_links(self) -> list[Any]:
            return [NavLink(ROUTE, "cosmos-profiler capture")]

        def _handle(self, req: Any) -> bytes:
            from sidecar.common.exceptions import SidecarError
            from sidecar.fleet.control import set_profile

            steps = req.get_query_arg("steps", default=None, type=int)
            if steps is None:
                body = (f'<form action="{ROUTE}"><label>Active steps <input name="steps" value="'
                        f'{DEFAULT_ACTIVE_STEPS}"></label> <button>Capture every rank of '
                        f"{html.escape(self.replica)}</button></form>")
            else:
                try:
                    done = set_profile(Path(self.registry), self.replica, rank_filter="all", active_steps=steps)
                    body = (f"<p>Requested capture <code>{html.escape(done.request_id)}</code> of replica "
                            f"{html.escape(done.replica)}: ranks {html.escape(str(done.ranks))}, steps from "
                            f"{done.start_step}.</p><pre>cosmos-profiler profile status {html.escape(self.replica)}"
                            "</pre>")
                except SidecarError as exc:
                    body = f"<p>Refused: {html.escape(str(exc))}</p>"
            return f"<!doctype html><title>cosmos-profiler capture</title>{body}".encode()

    CaptureHandler.__module__ = __name__
    globals()["CaptureHandler"] = CaptureHandler
    return CaptureHandler
