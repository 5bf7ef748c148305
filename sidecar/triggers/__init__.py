"""Triggers: small classes that notice a request and hand it to a callback.

Each has `start()` and `stop()`. `FileTrigger` (sidecar.triggers.file) watches
one control file with inotify or by polling; `SignalTrigger`
(sidecar.triggers.signal) records that a signal arrived. Only the file trigger
imports watchdog.
"""
