"""Environments shipped with agentrl, as examples and for tests (one file per env).

Importing this package registers each env with Gymnasium under ``agentrl/<Name>-v0``
(the toy-text adapters keep their Gymnasium version).
"""

from agentrl.env import register_env

register_env("agentrl/Calculator-v0", "envs.calculator:CalculatorEnv", max_episode_steps=8)
register_env("agentrl/GuessNumber-v0", "envs.guess_number:GuessNumberEnv", max_episode_steps=10)
register_env("agentrl/PythonPuzzle-v0", "envs.python_puzzle:PythonPuzzleEnv", max_episode_steps=8)
register_env("agentrl/Maze-v0", "envs.maze:MazeEnv", max_episode_steps=60)
register_env("agentrl/Sql-v0", "envs.sql:SqlEnv", max_episode_steps=8)
register_env("agentrl/Digits-v0", "envs.digits:DigitsEnv", max_episode_steps=1)
# Gymnasium's own toy-text envs through the adapter (agentrl.adapter.from_gym).
register_env(
    "agentrl/FrozenLake-v1", "agentrl.adapter:from_gym", env_id="FrozenLake-v1", is_slippery=False
)
register_env("agentrl/Taxi-v4", "agentrl.adapter:from_gym", env_id="Taxi-v4")
