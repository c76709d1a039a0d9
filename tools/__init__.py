"""Reusable tools for agents (typed Python functions with schemas)."""
