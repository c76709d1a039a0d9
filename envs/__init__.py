"""Environments shipped with agentrl, as examples and for tests (one file per env).

Importing this package registers each env with Gymnasium under ``agentrl/<Name>-v0``.
"""

from agentrl.env import register_env

register_env("agentrl/Calculator-v0", "envs.calculator:CalculatorEnv", max_episode_steps=8)
