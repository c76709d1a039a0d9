"""Debug recorded episodes: list, show, verify, resume, fork, export.

Works on any run directory's episode store (``agentrl rollout`` and ``agentrl train``
runs, while the run is going or after it ended or was killed). Episodes are either
ended (a trajectory) or unfinished (the latest checkpoint); both can be shown, verified,
exported and forked, and an unfinished one can be resumed. :mod:`.episodes` reads and
shows them; :mod:`.policy` picks the policy that continues one and runs it.
"""

from agentrl.replay.episodes import (
    UNFINISHED,
    Recorded,
    export,
    fork_point,
    list_episodes,
    load,
    new_episode_id,
    open_for_writing,
    records,
    restore_note,
    select,
    side_by_side,
    transcript,
    verify,
)
from agentrl.replay.policy import (
    Policy,
    RecordedRun,
    continue_episode,
    label_version,
    recorded_policy,
    recorded_run,
    sampling_version,
)

__all__ = [
    "UNFINISHED",
    "Policy",
    "Recorded",
    "RecordedRun",
    "continue_episode",
    "export",
    "fork_point",
    "label_version",
    "list_episodes",
    "load",
    "new_episode_id",
    "open_for_writing",
    "recorded_policy",
    "recorded_run",
    "records",
    "restore_note",
    "sampling_version",
    "select",
    "side_by_side",
    "transcript",
    "verify",
]
