"""Before a run starts and after it fails: its config and run directory, and its one error.

:func:`prepare` loads and checks the config (:func:`check_config`: the config's own
rules, the env id, the model) and chooses the run directory, refusing one that cannot
be continued before anything is written; :func:`init_run_dir` creates it. After a
failure, :func:`explain_failure` picks the one error to report and says how to go on
(``agentrl train --resume RUN_DIR``). :mod:`agentrl.run` runs what is between;
everything here is importable from there too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import os
import time
from pathlib import Path

from agentrl.config import RunConfig
from agentrl.env import check_env_config
from agentrl.errors import ConfigError, InfraError, RunDirError
from agentrl.status import Reporter

CONFIG_FILE = "config.toml"
"""The resolved config in a run directory (every key, defaults included)."""


def prepare(
    config_path: str | Path | None,
    overrides: list[str],
    *,
    resume: str | None = None,
    reporter: Reporter | None = None,
) -> tuple[RunConfig, Path]:
    """Load and check the config and choose the run directory; create nothing.

    With ``resume`` (a run directory), the config is the one recorded there, with
    ``overrides`` applied (e.g. ``--train.steps=60`` to train further). ``reporter``
    receives the warnings (default: the terminal).
    """
    if resume is not None:
        run_dir = Path(resume)
        recorded = run_dir / CONFIG_FILE
        if not recorded.is_file() or not (run_dir / "episodes.db").is_file():
            raise ConfigError(
                f"{run_dir} holds no `agentrl train` run to resume (it needs {CONFIG_FILE} "
                f"and episodes.db)"
            )
        if config_path is not None:
            raise ConfigError("give either a config file or --resume RUN_DIR, not both")
        config = RunConfig.load(recorded, overrides)
        _check_resumable(run_dir, reporter)
    else:
        if config_path is None:
            raise ConfigError("give a config file: agentrl train CONFIG.toml [--key.sub=value]")
        config = RunConfig.load(config_path, overrides)
        run_dir = Path(config.run.out or f"runs/{config.run.name}-{time.strftime('%Y%m%d-%H%M%S')}")
        if run_dir.exists() and any(run_dir.iterdir()):
            raise ConfigError(
                f"{run_dir} already holds files; continue that run with "
                f"`agentrl train --resume {run_dir}`, or set run.out to a new folder"
            )
    if config.env.remote:  # the env servers answer, and name the env when env.id is empty
        from agentrl.remote import check_servers

        config = dataclasses.replace(config, env=check_servers(config.env))
    check_config(config)
    return config, run_dir


def check_config(config: RunConfig) -> None:
    """Every check a run needs before it starts: the config's own rules, the env id
    (after ``env.imports``) and the model.

    Raises:
        ConfigError: naming the key, the value and what is allowed.
    """
    from agentrl.models import check_chat_template, resolve_model

    config.check()
    check_env_config(config.env)
    if config.model.path != "tiny":
        path = resolve_model(config.model.path)  # raises ModelNotFoundError (a ConfigError)
        if Path(path).is_dir():
            check_chat_template(path)
            from agentrl.chat.modelcheck import check_tool_calls  # the model's tool calls parse

            check_tool_calls(path, config.model, config.env)


def _check_resumable(run_dir: Path, reporter: Reporter | None) -> None:
    """Refuse, before anything is written, a run directory that cannot be continued."""
    from agentrl.store import EpisodeStore
    from agentrl.store.schema import holds_no_store

    for path in (
        run_dir,
        *(
            run_dir / n
            for n in ("episodes.db", "metrics.jsonl", "trace.json", "status.json", "checkpoints")
        ),
    ):
        if path.exists() and not os.access(path, os.W_OK):
            raise RunDirError(
                f"{path} is not writable (a read-only file system or no permission); nothing "
                f"was changed. Make {run_dir} writable, then run "
                f"`agentrl train --resume {run_dir}` again"
            )
    # corrupt, newer schema, not a store: StoreError. A run stopped while its store was
    # being made left an empty one: resuming it makes the store, as starting would have.
    if not holds_no_store(run_dir / "episodes.db"):
        EpisodeStore.open(run_dir, create=False).close()
    _warn_leftover_engine(run_dir, reporter)


def _warn_leftover_engine(run_dir: Path, reporter: Reporter | None = None) -> None:
    """Say so when the killed run's vLLM engine process still lives (it holds memory).

    A SIGKILLed `agentrl train` cannot stop its engine process, which lives on in the
    killed process's group. Killing by a recorded PID could hit an unrelated process
    that reused it, so this only tells the user (``reporter``; default: the terminal).
    """
    import json

    try:
        pid = int(json.loads((run_dir / "status.json").read_text())["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return
    try:
        os.kill(pid, 0)
        return  # the leader lives: a run still going, or an unrelated process
    except ProcessLookupError:
        pass
    except PermissionError:
        return
    try:
        os.killpg(pid, 0)
    except (ProcessLookupError, PermissionError):
        return
    (reporter or Reporter()).warn(
        f"the previous run (pid {pid}) is gone but processes of its group still run (vLLM's "
        f"engine, holding memory); if they are yours, end them with: kill -9 -{pid}"
    )


def init_run_dir(config: RunConfig, run_dir: Path, resume: bool) -> None:
    """Create ``run_dir`` and record the resolved config there (a new run only)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if not resume:
        tmp = run_dir / f".{CONFIG_FILE}.tmp"
        tmp.write_text(config.to_toml())
        os.replace(tmp, run_dir / CONFIG_FILE)


_DISK_ERRNOS = {errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM}


def explain_failure(error: BaseException, run_dir: Path) -> BaseException:
    """The one error a failed run reports: the first real cause, saying how to go on.

    Unwraps task-group exception groups; a write that failed for lack of space or
    permission becomes a :class:`RunDirError` naming the path.
    """
    leaf = error
    while isinstance(leaf, BaseExceptionGroup):
        real = [e for e in leaf.exceptions if not isinstance(e, asyncio.CancelledError)]
        leaf = (real or list(leaf.exceptions))[0]
    resume = f"agentrl train --resume {run_dir}"
    if isinstance(leaf, OSError) and leaf.errno in _DISK_ERRNOS:
        where = leaf.filename or run_dir
        return RunDirError(
            f"cannot write {where}: {leaf.strerror} ({errno.errorcode.get(leaf.errno, '?')}). "
            f"The run stopped; its episode store and last checkpoint are intact. Free space "
            f"or make {run_dir} writable, then continue with: {resume}"
        )
    if isinstance(leaf, InfraError):
        text = str(leaf).replace("RUN_DIR", str(run_dir))
        if "--resume" not in text:
            text = f"{text}. The run stopped; continue it with: {resume}"
        return InfraError(text) if text != str(leaf) else leaf
    return leaf
