"""Inference clients: token ids in, token ids + behaviour logprobs + versions out.

* :class:`~agentrl.inference.base.InferenceClient`: the protocol.
* :class:`~agentrl.inference.engine.VLLMEngineClient`: in-process ``AsyncLLM`` (default).
* :class:`~agentrl.inference.server.VLLMServerClient`: a ``vllm serve`` server over HTTP,
  with :class:`~agentrl.inference.server.VLLMServer` to start one on 127.0.0.1.
* :class:`~agentrl.inference.pool.ServerPool`: several servers behind one client, with
  routing, health checks, failover and weight catch-up.

vLLM itself is imported only when an engine starts.
"""

from agentrl.inference.base import (
    Generation,
    InferenceClient,
    InferenceConfig,
    SamplingConfig,
)
from agentrl.inference.engine import VLLMEngineClient
from agentrl.inference.pool import ServerPool
from agentrl.inference.server import VLLMServer, VLLMServerClient

__all__ = [
    "Generation",
    "InferenceClient",
    "InferenceConfig",
    "SamplingConfig",
    "ServerPool",
    "VLLMEngineClient",
    "VLLMServer",
    "VLLMServerClient",
]
