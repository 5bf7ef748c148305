"""The rank side: what runs inside the training process.

`core.Sidecar` builds the rooms around one `context.RankContext` and keeps the hot path
(`hotpath`: what `step()` reads); `capture` is the state machine of one request on one rank
and its one owner (`CaptureOwner`, the only lock on it); `intake` takes requests in and answers
stacks and hang requests at once; `runner` runs a capture at step boundaries through `driver`
(torch.profiler); `saver` names and saves files off the training thread (`exporter` writes a
capture's file, with `forkwriter` and `compress`) and tells the controller and S3 uploads
(`controller_post`, `upload`); `publisher` builds and writes the rank's record, kept fresh by
`heartbeat`; `triggers/` watches the control file and the signal (`signalowner`: whether the
signal is still ours); `autostep` counts steps from the optimizer hook; `stall`,
`faulthandler_stacks`, `flightrec` and `dumps` answer "where is it stuck"; `slowdown`
and `watches` watch the step time; `pointer` leaves the registry's address in the per-user
default; `threads` is the one way to run a thread. Nothing here imports `sidecar.fleet` (the
operator side) or `sidecar.cli`; both sides meet on the shared floor
(`sidecar.common.layout`, `registry`, `records`, `request`, ...).
"""
