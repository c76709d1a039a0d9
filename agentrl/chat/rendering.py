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

The pieces are remembered per tokenizer, shared by every conversation rendered with it (a
system prompt, its tool schemas and the template's own pieces are then tokenized once for
the whole run, not once an episode), up to :data:`PIECE_CHARS` characters of text, then
forgotten and remembered anew.

Only where that holds for certain is it used (:meth:`RenderTokenizer.for_tokenizer` says
None otherwise, and the caller tokenizes whole renderings as before): a fast tokenizer
whose ``apply_chat_template`` and ``__call__`` are transformers' own, that splits special
tokens, and whose added tokens are matched on the raw text (not normalized) with no
stripping or word-boundary rule.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import re
import weakref
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from agentrl.types import Message

logger = logging.getLogger(__name__)

PIECE_CHARS = 32_000_000
"""How much piece text (characters) a tokenizer's shared memory of pieces holds before it
is cleared (the ids kept with it take a few times that in bytes)."""


class _Pieces:
    """What every :class:`RenderTokenizer` of one tokenizer shares: the split at its added
    tokens, their ids, and the pieces tokenized so far (a plain dict: reads and writes are
    atomic, so render threads of several runners may share it)."""

    def __init__(
        self, split: re.Pattern[str], token_ids: Mapping[str, int], vocab_size: int
    ) -> None:
        self.split = split
        self.token_ids = token_ids
        self.added_ids = frozenset(token_ids.values())
        self.vocab_size = vocab_size
        self.ids: dict[tuple[str, str], list[int]] = {}
        self.chars = 0

    def remember(self, key: tuple[str, str], ids: list[int]) -> None:
        size = len(key[0]) + len(key[1])
        if self.chars + size > PIECE_CHARS:
            self.ids.clear()
            self.chars = 0
        self.ids[key] = ids
        self.chars += size


_SHARED: weakref.WeakKeyDictionary[Any, tuple[Any, _Pieces | None]] = weakref.WeakKeyDictionary()
"""Per tokenizer: its set-up when analysed (vocabulary size with the added tokens,
normalizer, pre-tokenizer), and the shared pieces (None: piecewise tokenization might
differ for it)."""


T = TypeVar("T")


def per_tokenizer(
    cache: weakref.WeakKeyDictionary[Any, tuple[Any, T]],
    tokenizer: Any,
    setup: Any,
    compute: Callable[[], T],
) -> T:
    """``compute()``, remembered in ``cache`` for ``tokenizer`` while its ``setup`` (what the
    value depends on besides the model: vocabulary size, special tokens, ...) stays the
    same. The cache is weak: the value goes with the tokenizer. A tokenizer that cannot be
    weakly referred to, or a ``setup`` of None (changes cannot be told), computes anew."""
    try:
        seen, value = cache[tokenizer]
    except (KeyError, TypeError):  # TypeError: not weakly referable
        seen = None
    if setup is None or seen != setup:
        value = compute()
        if setup is not None:
            with contextlib.suppress(TypeError):
                cache[tokenizer] = (setup, value)
    return value


_TEMPLATES: dict[str, Any] = {}
"""Chat template source -> its compiled template for :meth:`RenderTokenizer.text` (None:
render it through ``apply_chat_template``)."""
_CHECKED: set[str] = set()
"""Sources whose direct rendering was compared with ``apply_chat_template``'s once."""


def _template_for(source: str) -> Any | None:
    """The chat template ``source`` compiled in the Jinja environment transformers'
    ``apply_chat_template`` compiles it in (sandboxed, its filters, globals and
    extensions; message fields read key first, :func:`_dict_keys_first`), with the
    template's globals as a plain dict; None where that cannot be had (then
    ``apply_chat_template`` renders).

    ``apply_chat_template(tokenize=False)`` of a list of messages with schema tools is this
    template's ``render(messages=, tools=, documents=None, add_generation_prompt=,
    **special_tokens_map, **kwargs)``, behind per-call bookkeeping; and Jinja builds every
    render's context from the template's globals, a ``ChainMap`` over the environment's,
    copied key by key. Rendering this way took 19 us a 4-message conversation against 30
    (the rollout loop renders every conversation twice an env turn). The first rendering
    of each template is compared with ``apply_chat_template``'s; on any difference the
    template goes back to it for good.
    """
    try:
        return _TEMPLATES[source]
    except KeyError:
        pass
    template = None
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        environment = _dict_keys_first(_compile_jinja_template(source).environment)
        template = environment.from_string(source)
        template.globals = dict(template.globals)  # our own copy: the cached one is shared
    except Exception as e:  # transformers moved it: render through apply_chat_template
        logger.info(
            "chat templates render through apply_chat_template (%s: %s)", type(e).__name__, e
        )
        template = None
    _TEMPLATES[source] = template
    return template


_DICT_ATTRIBUTES = frozenset(dir(dict))
"""The names a plain ``dict``'s attribute lookup finds (its methods and ``object``'s): a
dict has no instance attributes and no ``__getattr__``, so any other name fails."""


def _dict_keys_first(environment: Any) -> Any:
    """``environment``, or an overlay of it whose ``getattr`` (``m.role`` in a template)
    skips the Python attribute lookup where it fails for certain: a plain ``dict`` and a
    name that is none of its attributes. The sandbox's ``getattr`` tries the attribute
    first and takes the key when that raises ``AttributeError``; chat templates read every
    message field that way, and the exception was 40% of a rendering (11.5 us against 23
    for 4 messages). The result is the same: the key, or undefined; names a dict does have
    (``m.items``, ``m.pop``) still go through the sandbox's checks. Left as it is where the
    environment is not Jinja's sandbox with its own ``getattr`` (its rules are unknown)."""
    try:
        from jinja2.sandbox import SandboxedEnvironment
    except ImportError:  # pragma: no cover (transformers needs jinja2 for templates)
        return environment
    kind = type(environment)
    if not isinstance(environment, SandboxedEnvironment) or (
        kind.getattr is not SandboxedEnvironment.getattr
    ):
        return environment
    overlay = environment.overlay()  # its own extensions and cache; filters shared
    overlay.__class__ = _keys_first_kind(kind)
    return overlay


@functools.cache
def _keys_first_kind(kind: type) -> type:
    """``kind`` (a sandboxed Jinja environment) with :func:`_dict_keys_first`'s ``getattr``."""

    def getattr(self: Any, obj: Any, attribute: str) -> Any:
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES:
            try:
                return obj[attribute]
            except KeyError:
                return self.undefined(obj=obj, name=attribute)
        return kind.getattr(self, obj, attribute)

    return type(f"DictKeysFirst{kind.__name__}", (kind,), {"getattr": getattr})


@functools.cache
def _apply_parameters() -> frozenset[str]:
    """``apply_chat_template``'s own parameters: template kwargs named so are not passed
    to the template (the direct rendering is then not used)."""
    from transformers import PreTrainedTokenizerBase

    return frozenset(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)


class RenderTokenizer:
    """Renders messages with a chat template and tokenizes the text piece by piece.

    One per conversation; the memory of pieces is the tokenizer's, shared (see the module
    doc). A conversation renders in one thread; several may share the memory.
    """

    def __init__(self, tokenizer: Any, shared: _Pieces):
        self.tokenizer = tokenizer
        self._split = shared.split
        self._token_ids = shared.token_ids
        self._shared = shared
        self._added_ids = shared.added_ids
        self._vocab_size = shared.vocab_size

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> RenderTokenizer | None:
        """A render tokenizer for ``tokenizer``, or None where piecewise tokenization might
        differ from tokenizing the whole text (see the module doc)."""
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if (
            backend is None
            or backend.encode_special_tokens
            or getattr(tokenizer, "split_special_tokens", False)
        ):
            return None
        vocab_size = backend.get_vocab_size(with_added_tokens=True)
        # What the remembered pieces depend on, besides the model itself
        setup = (vocab_size, repr(backend.normalizer), repr(backend.pre_tokenizer))
        # analysed once, and again when it changed since (tokens added, ...)
        shared = per_tokenizer(
            _SHARED, tokenizer, setup, lambda: cls._analyse(tokenizer, vocab_size)
        )
        return None if shared is None else cls(tokenizer, shared)

    @staticmethod
    def _analyse(tokenizer: Any, vocab_size: int) -> _Pieces | None:
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
        return _Pieces(re.compile(f"({alternation})"), token_ids, vocab_size)

    def render(
        self,
        messages: list[Message],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None,
        template_kwargs: Mapping[str, Any],
    ) -> list[int]:
        """``apply_chat_template(messages, tokenize=True, ...)["input_ids"]``, the same ids."""
        text = self.text(
            messages,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            template_kwargs=template_kwargs,
        )
        return self.encode(text)

    def text(
        self,
        messages: list[Message],
        *,
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None,
        template_kwargs: Mapping[str, Any],
    ) -> str:
        """The chat template's rendering of ``messages``, as text: what
        ``apply_chat_template(..., tokenize=False)`` returns (see :func:`_template_for`)."""
        tokenizer = self.tokenizer
        if (
            messages
            and (tools is None or all(type(t) is dict for t in tools))
            and not template_kwargs.keys() & _apply_parameters()
        ):
            source = tokenizer.get_chat_template(None, tools)
            template = _template_for(source)
            if template is not None:
                values = {**tokenizer.special_tokens_map, **template_kwargs}
                text = template.render(
                    messages=messages,
                    tools=tools,
                    documents=None,
                    add_generation_prompt=add_generation_prompt,
                    **values,
                )
                if source in _CHECKED:
                    return str(text)
                expected = self._apply(messages, add_generation_prompt, tools, template_kwargs)
                _CHECKED.add(source)
                if text == expected:
                    return str(text)
                _TEMPLATES[source] = None  # not as transformers renders it: never again
                logger.warning(
                    "rendering the chat template directly differed from apply_chat_template; "
                    "apply_chat_template renders it from now on"
                )
                return expected
        return self._apply(messages, add_generation_prompt, tools, template_kwargs)

    def _apply(
        self,
        messages: list[Message],
        add_generation_prompt: bool,
        tools: list[dict[str, Any]] | None,
        template_kwargs: Mapping[str, Any],
    ) -> str:
        text = self.tokenizer.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **template_kwargs,
        )
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
        shared = self._shared
        remembered = shared.ids
        token_ids = self._token_ids
        out: list[int] = []
        for i in range(start, len(keys)):
            key = keys[i]
            before, piece = key
            if i:
                out.append(token_ids[before])
            if not piece:
                continue
            ids = remembered.get(key)
            if ids is None:
                ids = self._encode(before + piece)
                if before:
                    if not ids or ids[0] != token_ids[before]:
                        return None  # not as the module doc says: be exact
                    ids = ids[1:]
                shared.remember(key, ids)
            out.extend(ids)
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

    def _encode(self, text: str) -> list[int]:
        """``tokenizer(text, add_special_tokens=False)["input_ids"]``.

        Straight to the Rust tokenizer when it is set up as that call would set it (no
        truncation, no padding, special tokens split): the call's own bookkeeping costs
        more than encoding a short piece. (One text at a time: ``encode_batch`` hands even
        two short pieces to its thread pool, which costs more CPU than encoding them.)
        """
        tokenizer = self.tokenizer
        backend = tokenizer.backend_tokenizer
        if (
            backend.truncation is None
            and backend.padding is None
            and not backend.encode_special_tokens
            and not tokenizer.split_special_tokens
        ):
            return backend.encode(text, add_special_tokens=False).ids  # type: ignore[no-any-return]
        out = tokenizer(text, add_special_tokens=False, padding=False, truncation=False)
        return list(out["input_ids"])


_OWN_DECODE: dict[type, bool] = {}
_INT = {int}


def decode(tokenizer: Any, ids: list[int]) -> str:
    """``tokenizer.decode(ids, skip_special_tokens=False)`` for a list of ints.

    Straight to ``_decode`` where ``decode`` is transformers' own: for a flat list of
    ints it only checks every element and copies the list first (decoding a 32-token turn
    cost 6 us against 3, a 256-token one 37 against 20).
    """
    kind = type(tokenizer)
    own = _OWN_DECODE.get(kind)
    if own is None:
        try:
            from transformers import PreTrainedTokenizerBase
        except ImportError:  # pragma: no cover (transformers is a dependency)
            own = False
        else:
            own = kind.decode is PreTrainedTokenizerBase.decode and callable(
                getattr(kind, "_decode", None)
            )
        _OWN_DECODE[kind] = own
    if own and set(map(type, ids)) <= _INT:
        return str(tokenizer._decode(ids, skip_special_tokens=False))
    return str(tokenizer.decode(ids, skip_special_tokens=False))
