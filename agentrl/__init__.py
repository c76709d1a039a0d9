"""agentrl: train tool-using LLM agents with asynchronous reinforcement learning.

Importing this package is deliberately light: nothing here imports torch, vLLM or
transformers. Heavy modules (``agentrl.models``, ``agentrl.inference``) import them
lazily, when a model is built or an engine is started.
"""

from collections.abc import Mapping, Sequence
from typing import Any

from agentrl.errors import AgentRLError, EpisodeError, InfraError

__all__ = ["AgentRLError", "EpisodeError", "InfraError", "__version__", "check_env", "from_gym"]


def check_env(
    env: Any,
    *,
    tokenizer: Any = None,
    raise_on_failure: bool = True,
    example_actions: Sequence[str] = (),
    kwargs: Mapping[str, Any] | None = None,
) -> list[Any]:
    """Check an env id, instance or factory; see :func:`agentrl.check.check_env`."""
    from agentrl.check import check_env as run_checks

    return run_checks(
        env,
        tokenizer=tokenizer,
        raise_on_failure=raise_on_failure,
        example_actions=example_actions,
        kwargs=kwargs,
    )


def from_gym(env_id: str, **kwargs: Any) -> Any:
    """A Gymnasium env as a text env; see :func:`agentrl.adapter.from_gym`."""
    from agentrl.adapter import from_gym as adapt

    return adapt(env_id, **kwargs)


__version__ = "0.1.0"
