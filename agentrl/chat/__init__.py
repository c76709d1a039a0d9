"""Conversations to tokens without drift: chat templates, tool schemas, token deltas.

See :mod:`agentrl.chat.conversation`. Sampled tokens are appended exactly as the
engine returned them; env and tool turns are appended as the token delta of the
rendered conversation; nothing the model produced is ever re-tokenized.
"""

from agentrl.chat.conversation import Conversation, as_messages

__all__ = ["Conversation", "as_messages"]
