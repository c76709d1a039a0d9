"""The process runtime every layer above leans on: threads an event loop awaits
(:mod:`~agentrl.runtime.threads`), cores kept apart from vLLM's
(:mod:`~agentrl.runtime.cores`), stopping cleanly (:mod:`~agentrl.runtime.stopping`),
background tasks whose failure is never lost (:mod:`~agentrl.runtime.background`), the
run's metrics (:mod:`~agentrl.runtime.metrics`) and timeline
(:mod:`~agentrl.runtime.tracing`), fault points for fault-injection tests
(:mod:`~agentrl.runtime.faults`), small network helpers (:mod:`~agentrl.runtime.net`) and
TCP relays that give a server which may move one stable address (:mod:`~agentrl.runtime.relay`).

Nothing here knows about episodes, models or envs: it imports only the config, the
error tree and the standard library.
"""
