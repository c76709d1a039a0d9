"""agentrl: train tool-using LLM agents with asynchronous reinforcement learning.

Importing this package is deliberately light: nothing here imports torch, vLLM or
transformers. Heavy modules (``agentrl.models``, ``agentrl.inference``) import them
lazily, when a model is built or an engine is started.
"""

from agentrl.errors import AgentRLError, EpisodeError, InfraError

__all__ = ["AgentRLError", "EpisodeError", "InfraError", "__version__"]

__version__ = "0.1.0"
