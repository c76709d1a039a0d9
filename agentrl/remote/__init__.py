"""Environments as services: agentrl envs over the OpenEnv protocol, both ways.

* :mod:`agentrl.remote.server`: ``agentrl serve-env ENV_ID --port P`` serves any
  registered text env (sync or async, with its tools, ``get_state``/``set_state``) to
  any OpenEnv client, one env instance per session.
* :mod:`agentrl.remote.client`: :class:`RemoteEnv` and :class:`EnvServerPool`, what
  ``[env] url``/``urls`` train on: sessions spread over several servers, health
  checks, failover (a dead server fails only its episodes, ``env_unavailable``, and
  the runner retries them elsewhere).
* :mod:`agentrl.remote.protocol`: the wire format both speak.

Layer 2a (beside ``inference``): built on :mod:`agentrl.env` and :mod:`agentrl.tools`.
"""

from agentrl.remote.client import EnvServerPool, RemoteEnv, RemoteTool, check_servers
from agentrl.remote.server import EnvServer, serve_env

__all__ = ["EnvServer", "EnvServerPool", "RemoteEnv", "RemoteTool", "check_servers", "serve_env"]
