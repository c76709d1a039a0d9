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
        self._added_ids = set(token_ids.values())
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
        text = self.text(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                         template_kwargs=template_kwargs)  # fmt: skip
        return self.encode(text)

    def text(self, messages: list[Message], *, add_generation_prompt: bool,
             tools: list[dict[str, Any]] | None,
             template_kwargs: Mapping[str, Any]) -> str:  # fmt: skip
        """The chat template's rendering of ``messages``, as text."""
        text = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False,
            **template_kwargs,
        )  # fmt: skip
        return str(text)

    def encode(self, text: str) -> list[int]:
        """``tokenizer(text, add_special_tokens=False)["input_ids"]``, piece by piece."""
        if not self.usable():
            return self._whole(text)
        out = self.ids(self.keys(text))
        return self._whole(text) if out is None else out

    def usable(self) -> bool:
        """Whether pieces still tokenize as the whole text does: no special-token splitting
        switched on, and no token added since this was made (the split would miss it)."""
        tokenizer = self.tokenizer
        return not tokenizer.split_special_tokens and (
            tokenizer.backend_tokenizer.get_vocab_size(with_added_tokens=True) == self._vocab_size
        )

    def keys(self, text: str) -> list[tuple[str, str]]:
        """``text`` cut at its added tokens: ``(the added token before, the text piece)``
        for each piece (the first has ``""`` before it; a piece may be ``""``)."""
        # re.split with one group: text pieces at even indices, added tokens at odd ones.
        parts = self._split.split(text)
        return [(parts[i - 1] if i else "", parts[i]) for i in range(0, len(parts), 2)]

    def ids(self, keys: list[tuple[str, str]], start: int = 0) -> list[int] | None:
        """The ids of ``keys[start:]``: each piece's added token before it (but the first
        key's, which has none) and the piece's ids. Pieces not seen before are tokenized
        now. None where a piece does not tokenize as the module doc says (then tokenize
        the whole text)."""
        pieces = self._pieces
        token_ids = self._token_ids
        missing = list({k: None for k in keys[start:] if k[1] and k not in pieces})
        if missing:
            encoded = self._encode_batch([before + piece for before, piece in missing])
            for (before, piece), ids in zip(missing, encoded, strict=True):
                if before:
                    if not ids or ids[0] != token_ids[before]:
                        return None  # not as the module doc says: be exact
                    ids = ids[1:]
                pieces[(before, piece)] = ids
        out: list[int] = []
        for i in range(start, len(keys)):
            before, piece = keys[i]
            if i:
                out.append(token_ids[before])
            if piece:
                out.extend(pieces[(before, piece)])
        return out

    def added_id(self, content: str) -> int | None:
        """The id of the added token ``content`` (None: ``""``, before the first piece)."""
        return self._token_ids.get(content)

    def all_added(self, token_ids: set[int]) -> bool:
        """Whether every id in ``token_ids`` is an added token's (so it never occurs inside
        a piece's ids: added tokens are cut out of the text before pieces are tokenized)."""
        return token_ids <= self._added_ids

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
