"""``python -m agentrl.cli``: the ``agentrl`` command (as torchrun and accelerate start it)."""

import sys

from agentrl.cli import main

sys.exit(main())
