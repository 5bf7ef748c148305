"""The rank side: what runs inside the training process.

`core.Sidecar` wires the rooms together; `capture` is the state machine of one
request on one rank; `driver` drives torch.profiler; `saver`, `forkwriter` and
`compress` write the trace off the training thread; `heartbeat` keeps the rank's
record; `triggers/` watches the control file and the signal; `stall`,
`faultstacks` and `flightrec` answer "where is it stuck"; `slowdown` watches the
step time; `upload` sends traces to S3. Nothing here imports `sidecar.fleet`
(the operator side) or `sidecar.cli`; both sides meet on the shared floor
(`sidecar.layout`, `registry`, `records`, `request`, ...).
"""
