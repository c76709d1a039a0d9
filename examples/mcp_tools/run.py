"""Train with this folder's config.toml: python run.py [--section.key=value ...]

The same as `agentrl train examples/mcp_tools/config.toml ...` from the project root;
see README.md next to this file.
"""

import os
import sys
from pathlib import Path

from agentrl.cli import main

ROOT = Path(__file__).resolve().parents[2]

if __name__ == "__main__":
    os.chdir(ROOT)  # env.imports in config.toml is relative to the project root
    sys.exit(main(["train", str(Path(__file__).with_name("config.toml")), *sys.argv[1:]]))
