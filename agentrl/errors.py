"""The error tree.

Two families, because they get opposite policies:

* :class:`EpisodeError` is *data*: a bad episode (env exception, tool timeout,
  malformed model output, context overflow) is recorded with its reason and the run
  goes on.
* :class:`InfraError` is *fatal*: the engine is dead, the store is broken, a weight
  sync failed. The run stops loudly, with the store intact, and the message says what
  to do next.

Bad user input (a model path that is not a model, an invalid setting) raises
:class:`ConfigError` before anything starts.
"""

from __future__ import annotations


class AgentRLError(Exception):
    """Base class of every error agentrl raises on purpose."""


class ConfigError(AgentRLError, ValueError):
    """Invalid user input: a setting, a path, a model. Raised before work starts."""


class ModelNotFoundError(ConfigError):
    """A model path or name that does not point at a loadable model."""


class EpisodeError(AgentRLError):
    """A failure that ends or changes one episode and is recorded as data."""


class ContextOverflowError(EpisodeError):
    """A prompt does not fit the model's context window.

    Attributes:
        prompt_tokens: length of the prompt that was refused.
        max_model_len: the engine's context window.
    """

    def __init__(self, prompt_tokens: int, max_model_len: int) -> None:
        super().__init__(
            f"prompt has {prompt_tokens} tokens but the engine's context window "
            f"(inference.max_model_len) is {max_model_len}; shorten the prompt or "
            f"raise inference.max_model_len"
        )
        self.prompt_tokens = prompt_tokens
        self.max_model_len = max_model_len


class RemoteEnvError(EpisodeError):
    """A call to an env server failed; the episode fails with ``kind`` and this message.

    ``kind`` is a :class:`~agentrl.types.FailureKind` value (``env_unavailable``: the
    server died, refused or dropped the session; ``env_timeout``: it did not answer
    within ``env.request_timeout_s``; ``env_protocol``: its answer was not the OpenEnv
    protocol; ``env_exception``: the env on it raised). ``url`` names the server.
    """

    def __init__(self, kind: str, message: str, url: str = "") -> None:
        super().__init__(message)
        self.kind = kind
        self.url = url


class InfraError(AgentRLError):
    """A failure of the infrastructure; fatal for the run."""


class EngineError(InfraError):
    """The inference engine failed, died, or could not be started."""


class ServerUnavailable(EngineError):
    """An inference server stopped answering (connection refused or dropped, deadline).

    ``partial`` holds what the failed request had sampled before the server went away
    (a valid prefix, ``finish_reason == "abort"``), or None if nothing was sent yet.
    A :class:`~agentrl.inference.pool.ServerPool` continues the request elsewhere.
    """

    def __init__(self, message: str, partial: object = None, url: str = "") -> None:
        super().__init__(message)
        self.partial = partial
        self.url = url


class EnvServersUnavailable(InfraError):
    """No env server (``[env] url``/``urls``) answered for ``env.reconnect_timeout_s``."""


class EngineStartupError(EngineError):
    """An inference engine or server did not come up."""


class WeightSyncError(InfraError):
    """New weights could not be loaded into the inference engine."""


class RunDirError(InfraError):
    """The run directory cannot be written (read-only, full, no permission)."""


class StoreError(InfraError):
    """The episode store cannot be read or written (corrupt, newer schema, disk full)."""


class StopRequested(AgentRLError):
    """Something watching the run asked it to stop after the current optimizer step (a
    health rule listed in ``health.stop_on``). The training loop writes a checkpoint of
    that step first, so ``agentrl train --resume RUN`` continues from it."""
