"""Environments as services: agentrl envs over the OpenEnv protocol, both ways.

* :mod:`agentrl.remote.server`: ``agentrl serve-env ENV_ID --port P`` serves any
  registered text env (sync or async, with its tools, ``get_state``/``set_state``) to
  any OpenEnv client, one env instance per session.
* :mod:`agentrl.remote.pool`: :class:`EnvServerPool`, what ``[env] url``/``urls``
  train on: sessions spread over several servers, health checks, failover (a dead
  server fails only its episodes, ``env_unavailable``, and the runner retries them
  elsewhere).
* :mod:`agentrl.remote.client`: :class:`RemoteEnv`, one episode's session on a server,
  and its tools (:class:`RemoteTool`).
* :mod:`agentrl.remote.servers`: the servers as the client reaches them, and
  :func:`check_servers` (what the servers of a config serve, before a run starts).
* :mod:`agentrl.remote.protocol`: the wire format both speak.

Layer 2a (beside ``inference``): built on :mod:`agentrl.env` and :mod:`agentrl.tools`.
"""

from agentrl.remote.client import RemoteEnv, RemoteTool
from agentrl.remote.pool import EnvServerPool
from agentrl.remote.server import EnvServer, serve_env
from agentrl.remote.servers import check_servers

__all__ = ["EnvServer", "EnvServerPool", "RemoteEnv", "RemoteTool", "check_servers", "serve_env"]
