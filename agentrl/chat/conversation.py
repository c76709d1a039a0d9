"""One episode's conversation as a growing token sequence with provenance.

How a turn is appended:

* the prompt is the chat template's rendering of the first messages (with the tool
  schemas and the generation prompt);
* sampled tokens are appended exactly as the engine returned them, with their
  logprobs and versions;
* an env or tool turn is appended as a *delta*: render the conversation before it
  (``base``) and after it (``full``, with the generation prompt) and append
  ``full[len(base):]``, after closing the assistant turn the way the template does
  (the tokens the template writes after the end-of-turn token, or the end-of-turn
  token itself when the turn was cut off by the length limit).

A template is prefix preserving when ``base`` is a prefix of ``full`` (and the
assistant turn renders after the same prompt). Templates that rewrite earlier turns
(thinking models that drop old reasoning) are not; then the conversation starts a new
*segment*: the tokens so far are closed off as one training sequence, and a new
sequence starts from the full re-rendering (all of it prompt). ``segments_started``
counts how often that happened, ``reprefilled_tokens`` how many prompt tokens the new
segments cost. With ``keep_sampled`` (``model.keep_thinking``) the turns stay as sampled
instead: the delta is what the template writes after the last turn's end-of-turn token
in the new rendering (found by counting end-of-turn tokens), so a template that only
rewrites earlier turns keeps one segment.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from agentrl.chat.rendering import RenderTokenizer, decode, per_tokenizer
from agentrl.types import NO_VERSION, Message, PartialEpisode, SegmentArrays, SpanKind, TokenSpan


def as_messages(obs: Any) -> list[Message]:
    """An observation (a string or a list of chat messages) as chat messages."""
    if isinstance(obs, list):
        return [dict(m) for m in obs]
    return [{"role": "user", "content": "" if obs is None else str(obs)}]


_ARRAYS = (
    ("token_ids", np.int32),
    ("logprobs", np.float32),
    ("versions", np.int32),
    ("loss_mask", np.int8),
)
"""The parallel lists of a :class:`Segment` and their dtypes in :class:`SegmentArrays`."""


class Segment:
    """The token arrays of one training sequence, built turn by turn.

    The lists only grow through :meth:`append` (or shrink through :meth:`truncate`).
    """

    def __init__(self) -> None:
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.versions: list[int] = []
        self.loss_mask: list[int] = []
        self.spans: list[TokenSpan] = []
        # numpy copies of the lists' first tokens, and the lists they were made from
        self._done: tuple[np.ndarray, ...] = tuple(np.zeros(0, d) for _, d in _ARRAYS)
        self._done_from: tuple[list[Any], ...] = ()

    def arrays(self) -> SegmentArrays:
        """The arrays so far (fresh copies, with the spans).

        Converted incrementally: a checkpoint at every turn boundary converted the whole
        segment from Python lists each time (O(turns²) an episode); only the tokens
        appended since the last call are converted now, the rest is copied.
        """
        lists = tuple(getattr(self, name) for name, _ in _ARRAYS)
        done = self._done
        if len(self._done_from) != len(lists) or any(
            a is not b for a, b in zip(self._done_from, lists, strict=True)
        ):  # lists replaced from outside: start over
            done = tuple(np.zeros(0, d) for _, d in _ARRAYS)
        k = len(done[0])
        if k > len(lists[0]):
            done = tuple(a[: len(lists[0])] for a in done)
        elif k < len(lists[0]):
            done = tuple(
                np.concatenate((a, np.asarray(values[k:], dtype=dtype)))
                for a, values, (_, dtype) in zip(done, lists, _ARRAYS, strict=True)
            )
        self._done, self._done_from = done, lists
        return SegmentArrays(*(a.copy() for a in done), list(self.spans))

    @classmethod
    def from_arrays(cls, arrays: SegmentArrays) -> Segment:
        seg = cls()
        seg.token_ids = arrays.token_ids.tolist()
        seg.logprobs = arrays.logprobs.tolist()
        seg.versions = arrays.versions.tolist()
        seg.loss_mask = arrays.loss_mask.tolist()
        seg.spans = list(arrays.spans)
        return seg

    def truncate(self, n: int) -> None:
        """Keep the first ``n`` tokens (spans cut to match)."""
        for name, _ in _ARRAYS:
            del getattr(self, name)[n:]
        self._done = tuple(a[:n] for a in self._done)
        spans = []
        for span in self.spans:
            if span.start >= n:
                break
            spans.append(TokenSpan(span.kind, span.start, min(span.end, n), span.turn))
        self.spans = spans

    def append(
        self,
        kind: SpanKind,
        turn: int,
        ids: Sequence[int],
        logprobs: Sequence[float] = (),
        versions: Sequence[int] = (),
    ) -> None:
        if not ids:
            return
        start = len(self.token_ids)
        self.token_ids.extend(ids)
        if kind == "assistant":
            self.logprobs.extend(logprobs)
            self.versions.extend(versions)
            self.loss_mask.extend([1] * len(ids))
        else:
            self.logprobs.extend([math.nan] * len(ids))
            self.versions.extend([NO_VERSION] * len(ids))
            self.loss_mask.extend([0] * len(ids))
        last = self.spans[-1] if self.spans else None
        if last is not None and last.kind == kind and last.turn == turn:  # one span per turn
            self.spans[-1] = TokenSpan(kind, last.start, len(self.token_ids), turn)
        else:
            self.spans.append(TokenSpan(kind, start, len(self.token_ids), turn))


class Conversation:
    """Messages plus the exact token sequence the model sees.

    Args:
        tokenizer: a transformers tokenizer with a chat template.
        messages: the first messages (system prompt and first observation).
        tools: JSON schemas of the tools, rendered by the template.
        end_of_turn_ids: token ids that end an assistant turn (EOS, ``<|im_end|>``).
        template_kwargs: variables for every rendering (``model.chat_template_kwargs``).
    """

    def __init__(
        self,
        tokenizer: Any,
        messages: list[Message],
        *,
        tools: list[dict[str, Any]] | None = None,
        end_of_turn_ids: Sequence[int] = (),
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None
        self.template_kwargs = dict(template_kwargs or {})
        self.messages: list[Message] = list(messages)
        self.end_of_turn_ids = set(end_of_turn_ids) or _end_of_turn_ids(tokenizer)
        self.segments: list[Segment] = [Segment()]
        self.segments_started = 0
        self.reprefilled_tokens = 0
        self.turn = 0
        self._last_finish: str = "stop"
        self._renderer = RenderTokenizer.for_tokenizer(tokenizer)
        self.current.append("prompt", 0, self.render(self.messages, add_generation_prompt=True))

    @classmethod
    def restore(
        cls,
        tokenizer: Any,
        partial: PartialEpisode,
        *,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> Conversation:
        """The conversation of a checkpointed episode, token for token (nothing re-rendered);
        ``template_kwargs`` as in the constructor, for the turns still to come."""
        self = cls.__new__(cls)
        self.tokenizer = tokenizer
        self.tools = partial.tools
        self.template_kwargs = dict(template_kwargs or {})
        self.messages = [dict(m) for m in partial.messages]
        self.end_of_turn_ids = _end_of_turn_ids(tokenizer)
        self.segments = [Segment.from_arrays(a) for a in partial.segments]
        self.segments_started = partial.segments_started
        self.reprefilled_tokens = 0  # counted from here on (not in the checkpoint)
        self.turn = partial.turn
        self._last_finish = partial.last_finish
        self._renderer = RenderTokenizer.for_tokenizer(tokenizer)
        return self

    @property
    def last_finish(self) -> str:
        return self._last_finish

    @property
    def current(self) -> Segment:
        return self.segments[-1]

    @property
    def token_ids(self) -> list[int]:
        """What the model sees next: the current segment's tokens."""
        return self.current.token_ids

    def __len__(self) -> int:
        return len(self.current.token_ids)

    def render(self, messages: list[Message], *, add_generation_prompt: bool) -> list[int]:
        """The chat template's rendering of ``messages``, tokenized.

        Through a :class:`~agentrl.chat.rendering.RenderTokenizer` where the tokenizer
        allows it: the same ids, but only text not seen in an earlier rendering of this
        conversation is tokenized (each turn renders the whole conversation twice).
        """
        if self._renderer is not None:
            return self._renderer.render(
                messages,
                add_generation_prompt=add_generation_prompt,
                tools=self.tools,
                template_kwargs=self.template_kwargs,
            )
        out = self.tokenizer.apply_chat_template(
            messages,
            tools=self.tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=True,
            return_dict=True,
            **self.template_kwargs,
        )
        return list(out["input_ids"])

    def decode(self, token_ids: Sequence[int]) -> str:
        """The text of a sampled turn, without its end-of-turn token."""
        ids = list(token_ids)
        if ids and ids[-1] in self.end_of_turn_ids:
            ids = ids[:-1]
        return decode(self.tokenizer, ids)

    def add_sampled(
        self, token_ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]
    ) -> None:
        """Append sampled tokens of the current assistant turn (call once per piece)."""
        self.current.append("assistant", self.turn, token_ids, logprobs, versions)

    def end_assistant_turn(self, text: str, finish_reason: str) -> None:
        """Record the assistant message for the turn just sampled."""
        self.messages.append({"role": "assistant", "content": text})
        self._last_finish = finish_reason
        self.turn += 1

    def attach_tool_calls(self, tool_calls: list[dict[str, Any]]) -> None:
        """Give the last assistant message its parsed calls (templates that render them)."""
        assert self.messages and self.messages[-1]["role"] == "assistant"
        self.messages[-1] = {**self.messages[-1], "tool_calls": tool_calls}

    def delta_for(
        self, new_messages: list[Message], *, keep_sampled: bool = False
    ) -> tuple[list[int], bool]:
        """The tokens that append ``new_messages``, and whether that preserves the prefix.

        Only renderings are compared with each other, never with the sampled tokens
        (re-tokenizing sampled text may legitimately differ from what was sampled).
        When the second value is False the tokens are the full re-rendering, to be used
        as the prompt of a new segment. ``keep_sampled``: see the module doc.
        """
        renderer = self._renderer
        if renderer is not None and renderer.usable():
            kwargs = {"tools": self.tools, "template_kwargs": self.template_kwargs}
            base_text = renderer.text(self.messages, add_generation_prompt=False, **kwargs)
            full_text = renderer.text(
                self.messages + new_messages, add_generation_prompt=True, **kwargs
            )
            delta = self._piece_delta(renderer, base_text, full_text)
            if delta is not None:
                return delta, True
            base, full = renderer.encode(base_text), renderer.encode(full_text)
        else:
            base = self.render(self.messages, add_generation_prompt=False)
            full = self.render(self.messages + new_messages, add_generation_prompt=True)
        if full[: len(base)] != base and keep_sampled:
            aligned = self._align(base, full)
            if aligned is not None:
                base, full = aligned
        if full[: len(base)] != base:
            return full, False
        if not self.messages or self.messages[-1]["role"] != "assistant":
            return full[len(base) :], True
        closing = self._closing(base)
        if closing is None:
            return full, False
        return closing + full[len(base) :], True

    def _piece_delta(
        self, renderer: RenderTokenizer, base_text: str, full_text: str
    ) -> list[int] | None:
        """:meth:`delta_for`'s tokens for a prefix-preserving turn, from the renderings
        compared piece by piece (None: compare tokens instead).

        A rendering's ids are its pieces' ids, and equal pieces have equal ids, so when
        ``base``'s pieces begin ``full``'s, ``base``'s ids begin ``full``'s and the delta is
        the ids of the pieces after them. Only those, and the few after the last turn's
        end-of-turn token (the closing), are tokenized: not the turn just sampled, whose
        text every rendering holds anew (at 256 tokens a turn, most of the tokenizing).
        End-of-turn tokens are found among the added tokens between pieces, which holds
        only if every end-of-turn id is an added token's.
        """
        if not renderer.all_added(self.end_of_turn_ids):
            return None
        base, full = renderer.keys(base_text), renderer.keys(full_text)
        n = len(base)
        if n == 0 or full[:n] != base:
            return None  # the tokens may still agree: let the token comparison decide
        tail = renderer.ids(full, n)
        if tail is None or not self.messages or self.messages[-1]["role"] != "assistant":
            return tail
        last = next(
            (
                i
                for i in range(n - 1, 0, -1)
                if renderer.added_id(base[i][0]) in self.end_of_turn_ids
            ),
            None,
        )
        closing = renderer.ids(base, last) if last is not None else None
        if closing is None:
            return None
        sampled_end = self.current.token_ids[-1] if self.current.token_ids else None
        if self._last_finish == "stop" and sampled_end in self.end_of_turn_ids:
            closing = closing[1:]  # after the sampled end-of-turn token, as _closing does
        return closing + tail

    def _align(self, base: list[int], full: list[int]) -> tuple[list[int], list[int]] | None:
        """``(base, full)`` cut so that ``base`` is a prefix of ``full`` where both hold
        the same number of turns up to the last one of ``base``; None if they do not."""
        ends = [i for i, t in enumerate(base) if t in self.end_of_turn_ids]
        if not ends:
            return None
        tail = base[ends[-1] :]
        full_ends = [i for i, t in enumerate(full) if t in self.end_of_turn_ids]
        if len(full_ends) < len(ends):
            return None
        at = full_ends[len(ends) - 1]
        if full[at : at + len(tail)] != tail:
            return None
        return tail, full[at:]

    def _closing(self, base: list[int]) -> list[int] | None:
        """Tokens the template writes after the sampled content of the last assistant turn.

        ``base`` ends with that turn, so its last end-of-turn token closes it: after a
        turn that stopped on end-of-turn, append what follows it (often a newline);
        after a turn cut off by the length limit, append the end-of-turn token too.
        """
        ends = [i for i, t in enumerate(base) if t in self.end_of_turn_ids]
        if not ends:
            return None
        last = ends[-1]
        sampled_end = self.current.token_ids[-1] if self.current.token_ids else None
        if self._last_finish == "stop" and sampled_end in self.end_of_turn_ids:
            return base[last + 1 :]
        return base[last:]

    def add_messages(
        self,
        new_messages: list[Message],
        kind: SpanKind,
        max_len: int | None = None,
        *,
        keep_sampled: bool = False,
    ) -> bool:
        """Append env or tool messages; start a new segment if the template needs it.

        Returns False, changing nothing, when the result would leave no room for one
        sampled token within ``max_len`` (the caller ends the episode as truncated).
        ``keep_sampled``: see the module doc.
        """
        ids, preserving = self.delta_for(new_messages, keep_sampled=keep_sampled)
        if max_len is not None and (len(self) + len(ids) if preserving else len(ids)) >= max_len:
            return False
        self.messages.extend(new_messages)
        if preserving:
            self.current.append(kind, self.turn, ids)
        else:
            self.segments.append(Segment())
            self.segments_started += 1
            self.reprefilled_tokens += len(ids)
            self.current.append("prompt", self.turn, ids)
        return True


_EOT: weakref.WeakKeyDictionary[Any, tuple[Any, frozenset[int]]] = weakref.WeakKeyDictionary()
"""Per tokenizer: its end-of-turn ids, with what they were read from (every episode's
conversation asks; reading them took 8 us)."""


def _end_of_turn_ids(tokenizer: Any) -> set[int]:
    """The ids that end an assistant turn: the known end-of-turn tokens the tokenizer has,
    and its EOS."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    size = backend.get_vocab_size(with_added_tokens=True) if backend is not None else None
    setup = None if size is None else (size, tokenizer.eos_token, tokenizer.unk_token)
    return set(
        per_tokenizer(_EOT, tokenizer, setup, lambda: frozenset(_read_end_of_turn_ids(tokenizer)))
    )


def _read_end_of_turn_ids(tokenizer: Any) -> set[int]:
    ids = set()
    for token in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(token)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.add(tid)
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return ids
