"""The rank side: what runs inside the training process.

`core.Sidecar` wires the rooms together; `capture` is the state machine of one
request on one rank; `intake` takes requests in and answers stacks and hang
requests at once; `runner` runs a capture at step boundaries through `driver`
(torch.profiler); `saver`, `forkwriter` and `compress` write the trace off the
training thread; `heartbeat` keeps the rank's record (`recordfields`: its parts);
`triggers/` watches the control file and the signal (`signalowner`: whether the
signal is still ours); `autostep` counts steps from the optimizer hook; `stall`,
`faulthandler_stacks`, `flightrec` and `dumps` answer "where is it stuck"; `slowdown`
and `watches` watch the step time; `upload` sends traces to S3; `pointer` leaves
the registry's address in the per-user default. Nothing here imports
`sidecar.fleet` (the operator side) or `sidecar.cli`; both sides meet on the
shared floor (`sidecar.common.layout`, `registry`, `records`, `request`, ...).
"""
