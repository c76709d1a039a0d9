"""Train with this folder's config.toml: python run.py [--section.key=value ...]

The same as `agentrl train config.toml ...`; see README.md next to this file.
"""

import sys
from pathlib import Path

from agentrl.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", str(Path(__file__).with_name("config.toml")), *sys.argv[1:]]))
