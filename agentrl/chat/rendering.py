"""A conversation's renderings as tokens, without re-tokenizing what did not change.

Every env or tool turn renders the whole conversation twice (:meth:`Conversation.delta_for`)
and tokenizing those renderings was most of the rollout loop's CPU: byte-level BPE costs
about a microsecond a token, so a turn cost O(conversation) and an episode O(turns²).

:class:`RenderTokenizer` tokenizes a rendered text exactly as ``apply_chat_template(...,
tokenize=True)`` does, piece by piece, and remembers the pieces. It rests on how a Hugging
Face *fast* tokenizer encodes: it first cuts the text at its added tokens (the special
tokens a chat template writes, leftmost-longest), then normalizes, pre-tokenizes and
runs the model on each piece between them on its own. So the ids of a text are the ids
of its pieces, concatenated, and a piece seen in an earlier rendering (every earlier
turn) need not be tokenized again. A piece is tokenized after the added token before it
(that token's id then dropped), so it sits where it sits in the full text: not at the
start, which some pre-tokenizers treat differently (Metaspace ``prepend_scheme="first"``).

Only where that holds for certain is it used (:meth:`RenderTokenizer.for_tokenizer` says
None otherwise, and the caller tokenizes whole renderings as before): a fast tokenizer
whose ``apply_chat_template`` and ``__call__`` are transformers' own, that splits special
tokens, and whose added tokens are matched on the raw text (not normalized) with no
stripping or word-boundary rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from agentrl.types import Message


class RenderTokenizer:
    """Renders messages with a chat template and tokenizes the text piece by piece.

    One per conversation: its memory of pieces is the conversation's own text (bounded by
    the episode, let go with it). Not thread-safe (a conversation renders in one thread).
    """

    def __init__(self, tokenizer: Any, split: re.Pattern[str], token_ids: Mapping[str, int]):
        self.tokenizer = tokenizer
        self._split = split
        self._token_ids = token_ids
        self._pieces: dict[tuple[str, str], list[int]] = {}
        self._vocab_size = tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=True)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> RenderTokenizer | None:
        """A render tokenizer for ``tokenizer``, or None where piecewise tokenization might
        differ from tokenizing the whole text (see the module doc)."""
        try:
            from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast
        except ImportError:  # pragma: no cover (transformers is a dependency)
            return None
        kind = type(tokenizer)
        if not (
            isinstance(tokenizer, PreTrainedTokenizerFast)
            and kind.apply_chat_template is PreTrainedTokenizerBase.apply_chat_template
            and kind.__call__ is PreTrainedTokenizerBase.__call__
            and kind._encode_plus is PreTrainedTokenizerFast._encode_plus
            and not getattr(tokenizer, "split_special_tokens", False)
        ):
            return None
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None or backend.encode_special_tokens:
            return None
        added = backend.get_added_tokens_decoder()
        if not added:
            return None
        for token in added.values():
            if token.normalized or token.lstrip or token.rstrip or token.single_word:
                return None
        token_ids = {t.content: i for i, t in added.items()}
        if len(token_ids) != len(added) or "" in token_ids:
            return None
        # Longest first: at a given position, the alternation then takes the longest
        # token that matches there, which is the tokenizer's leftmost-longest rule.
        alternation = "|".join(re.escape(t) for t in sorted(token_ids, key=len, reverse=True))
        return cls(tokenizer, re.compile(f"({alternation})"), token_ids)

    def render(self, messages: list[Message], *, add_generation_prompt: bool,
               tools: list[dict[str, Any]] | None,
               template_kwargs: Mapping[str, Any]) -> list[int]:  # fmt: skip
        """``apply_chat_template(messages, tokenize=True, ...)["input_ids"]``, the same ids."""
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **template_kwargs,
        )
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        """``tokenizer(text, add_special_tokens=False)["input_ids"]``, piece by piece."""
        tokenizer = self.tokenizer
        if (
            tokenizer.split_special_tokens  # switched on since: no pieces then
            or tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=True)
            != self._vocab_size  # tokens added since: the split would miss them
        ):
            return self._whole(text)
        # re.split with one group: text pieces at even indices, added tokens at odd ones.
        parts = self._split.split(text)
        keys = [(parts[i - 1] if i else "", parts[i]) for i in range(0, len(parts), 2)]
        pieces = self._pieces
        missing = list({k: None for k in keys if k[1] and k not in pieces})
        if missing:
            encoded = self._encode_batch([before + piece for before, piece in missing])
            for (before, piece), ids in zip(missing, encoded, strict=True):
                if before:
                    if not ids or ids[0] != self._token_ids[before]:
                        return self._whole(text)  # not as the module doc says: be exact
                    ids = ids[1:]
                pieces[(before, piece)] = ids
        out: list[int] = []
        for i, key in enumerate(keys):
            if i:
                out.append(self._token_ids[key[0]])
            if key[1]:
                out.extend(pieces[key])
        return out

    def _whole(self, text: str) -> list[int]:
        out = self.tokenizer(text, add_special_tokens=False, padding=False, truncation=False)
        return list(out["input_ids"])

    def _encode_batch(self, texts: list[str]) -> list[list[int]]:
        """``tokenizer(texts, add_special_tokens=False)["input_ids"]``.

        Straight to the Rust tokenizer when it is set up as that call would set it (no
        truncation, no padding, special tokens split): the call's own bookkeeping costs
        more than encoding a short piece.
        """
        tokenizer = self.tokenizer
        backend = tokenizer.backend_tokenizer
        if (
            backend.truncation is None
            and backend.padding is None
            and not backend.encode_special_tokens
            and not tokenizer.split_special_tokens
        ):
            # One by one: encode_batch hands even two short pieces to its thread pool,
            # which costs more CPU than encoding them (89 us against 34 us here).
            return [backend.encode(t, add_special_tokens=False).ids for t in texts]
        out = tokenizer(texts, add_special_tokens=False, padding=False, truncation=False)
        return [list(ids) for ids in out["input_ids"]]
