"""The operator side: what the CLI runs on a login node. Never imports torch.

`replicas` finds replicas and their live ranks (registry or controller);
`control` builds requests (`sidecar.common.request.ControlRequest`, written by
`sidecar.common.registry.write_request`) and picks start steps; `follow` waits for
ranks to answer (`follow_set`: `profile set --wait`, a slowdown watch's stages too);
`answers` holds what they answered; `hang` finds the rank that hangs
a collective; `stackgroups` groups ranks by identical stack; `signal_stacks` asks a
rank for a faulthandler dump; `controller` speaks Cosmos-RL's controller
protocol; `defaults` holds the defaults the CLI's options show (cheap to
import). Nothing here imports `sidecar.rank` (the training-process side) or
`sidecar.cli`; both sides meet on the shared floor. Everything here returns data:
the words the CLI prints are `sidecar.cli.render`'s.
"""
