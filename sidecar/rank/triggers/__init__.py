"""Triggers: small classes that notice a request and hand it to a callback.

Each is a `Trigger` (sidecar.rank.triggers.base): `start()`, `stop()`, and delivery
to the callbacks it was given in between. `FileTrigger` (sidecar.rank.triggers.file) watches
one control file with inotify or by polling; `SignalTrigger`
(sidecar.rank.triggers.signal) records that a signal arrived. The file trigger reads
inotify itself (sidecar.rank.triggers.inotify): no third-party watcher.
"""
