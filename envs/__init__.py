"""Environments shipped with agentrl, as examples and for tests (one file per env)."""
