"""Tokenizing renderings piece by piece (agentrl.chat.rendering) gives the very ids that
tokenizing them whole does: for every family's tokenizer, for pre-tokenizers that treat
the start of the text apart (Metaspace ``prepend_scheme="first"``) and normalizers, over
random texts full of special tokens and over rendered tool conversations; and where the
tokenizer does not allow it, the conversation tokenizes whole renderings as before."""

from __future__ import annotations

import random
from typing import Any

import pytest

from agentrl.chat import Conversation
from agentrl.chat.rendering import RenderTokenizer
from tests.models.families import (
    ADD_SCHEMA,
    NAMES,
    build_tokenizer,
    family,
    sample_conversation,
)

WORDS = [
    "hello",
    " world",
    "\n",
    "  ",
    "\t",
    "é",
    "日本",
    "🙂",
    "ﬁ",
    "Ü",
    "'s",
    "123",
    "<",
    "|",
    "<think>",
    "</think>",
    "[INST]",
    "<tool_call>",
    "<|im_end|>",
    "<|eot_id|>",
]


def _other_tokenizer(pre_tokenizer: Any, normalizer: Any) -> Any:
    """A BPE tokenizer with qwen2.5's template and special tokens around the given parts."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    fam = family("qwen2.5")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=fam.special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=1,
        show_progress=False,
    )
    tok.train_from_iterator(
        [
            "hello world, what is 2 + 3? the add tool. answer: ok " * 3,
            "Ünïcödé text ﬁ ligature 日本",
        ],
        trainer=trainer,
    )
    others = [t for t in fam.special_tokens if t not in (fam.eos, fam.pad)]
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=fam.eos,
        pad_token=fam.pad,
        additional_special_tokens=others,
        chat_template=fam.template,
    )


def _tokenizers() -> dict[str, Any]:
    from tokenizers import normalizers, pre_tokenizers

    out = {name: build_tokenizer(family(name)) for name in NAMES}
    out["metaspace-first+nfkc"] = _other_tokenizer(
        pre_tokenizers.Metaspace(prepend_scheme="first"), normalizers.NFKC()
    )
    out["bytelevel-prefix-space+lowercase"] = _other_tokenizer(
        pre_tokenizers.ByteLevel(add_prefix_space=True),
        normalizers.Sequence([normalizers.NFD(), normalizers.Lowercase()]),
    )
    return out


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Any]:
    return _tokenizers()


def test_pieces_give_the_ids_of_the_whole_text(tokenizers: dict[str, Any]) -> None:
    rng = random.Random(0)
    for name, tok in tokenizers.items():
        pieces = RenderTokenizer.for_tokenizer(tok)
        assert pieces is not None, name
        specials = [t.content for t in tok.backend_tokenizer.get_added_tokens_decoder().values()]
        for _ in range(300):  # one renderer throughout: later texts reuse remembered pieces
            text = "".join(rng.choice(WORDS + specials) for _ in range(rng.randint(0, 40)))
            whole = list(tok(text, add_special_tokens=False)["input_ids"])
            assert pieces.encode(text) == whole, (name, text)


def test_renderings_are_the_template_tokens(tokenizers: dict[str, Any]) -> None:
    conv = sample_conversation()
    for name, tok in tokenizers.items():
        pieces = RenderTokenizer.for_tokenizer(tok)
        assert pieces is not None
        for end in range(2, len(conv) + 1):  # from the first user message (llama3 needs it)
            for gen in (False, True):
                expected = tok.apply_chat_template(
                    conv[:end],
                    tools=[ADD_SCHEMA],
                    add_generation_prompt=gen,
                    tokenize=True,
                    return_dict=True,
                )["input_ids"]
                got = pieces.render(
                    conv[:end], add_generation_prompt=gen, tools=[ADD_SCHEMA], template_kwargs={}
                )
                assert got == list(expected), (name, end, gen)


def test_a_tokenizer_that_may_differ_renders_whole(tokenizers: dict[str, Any]) -> None:
    from tokenizers import AddedToken

    tok = build_tokenizer(family("qwen2.5"))
    tok.add_tokens([AddedToken("<lstrip>", lstrip=True)])
    assert RenderTokenizer.for_tokenizer(tok) is None
    conv = Conversation(tok, [{"role": "user", "content": "Hi <lstrip> there"}])
    assert conv._renderer is None
    expected = tok.apply_chat_template(
        [{"role": "user", "content": "Hi <lstrip> there"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=True,
    )["input_ids"]
    assert conv.token_ids == list(expected)

    split = build_tokenizer(family("qwen2.5"))
    split.split_special_tokens = True
    assert RenderTokenizer.for_tokenizer(split) is None


def test_tokens_added_later_are_not_missed() -> None:
    tok = build_tokenizer(family("qwen2.5"))
    pieces = RenderTokenizer.for_tokenizer(tok)
    assert pieces is not None
    text = "<|im_start|>user\nsay <new_token> twice<|im_end|>\n"
    assert pieces.encode(text) == list(tok(text, add_special_tokens=False)["input_ids"])
    tok.add_tokens(["<new_token>"], special_tokens=True)
    whole = list(tok(text, add_special_tokens=False)["input_ids"])
    assert tok.convert_tokens_to_ids("<new_token>") in whole
    assert pieces.encode(text) == whole


def test_piecewise_deltas_are_the_token_deltas(
    tokenizers: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An env or tool turn's tokens from renderings compared piece by piece (the turn just
    sampled never re-tokenized) are those from comparing tokens (the renderer switched
    off): every family, turns that stopped or were cut off, keep_sampled both ways, and
    templates that rewrite earlier turns (new segments) included."""
    used = []
    original = Conversation._piece_delta

    def spy(self: Conversation, *args: Any) -> list[int] | None:
        out = original(self, *args)
        used.append(out is not None)
        return out

    monkeypatch.setattr(Conversation, "_piece_delta", spy)
    first = sample_conversation()[:2]
    call = {
        "id": "t0000c000",
        "type": "function",
        "function": {"name": "add", "arguments": {"a": 2, "b": 3}},
    }
    user = {"role": "user", "content": "go on"}
    tool = {"role": "tool", "name": "add", "content": "5", "tool_call_id": "t0000c000"}
    turns = [
        ("Let me think. <think>2 + 3</think> then", None, user),
        ("", [call], tool),
        ("Answer: 5", None, {"role": "user", "content": "And 4 + 4?"}),
        ("Answer: 8", None, {"role": "user", "content": "<|im_end|> bye"}),
    ]
    for name, tok in tokenizers.items():
        for keep in (False, True):
            for finish in ("stop", "length"):
                fast = Conversation(tok, first, tools=[ADD_SCHEMA])
                slow = Conversation(tok, first, tools=[ADD_SCHEMA])
                slow._renderer = None
                assert fast.token_ids == slow.token_ids, name
                eot = min(fast.end_of_turn_ids)
                for text, calls, reply in turns:
                    results = []
                    for conv in (fast, slow):
                        ids = tok.encode(text, add_special_tokens=False) or [eot]
                        ids += [eot] if finish == "stop" else []
                        conv.add_sampled(ids, [-0.5] * len(ids), [0] * len(ids))
                        conv.end_assistant_turn(text, finish)
                        if calls:
                            conv.attach_tool_calls(calls)
                        try:
                            results.append(conv.add_messages([reply], "env", keep_sampled=keep))
                        except Exception as e:  # a template that refuses this turn order
                            results.append(type(e))
                    where = (name, keep, finish, text)
                    assert results[0] == results[1], where
                    assert [s.token_ids for s in fast.segments] == [
                        s.token_ids for s in slow.segments
                    ], where
                    assert [s.spans for s in fast.segments] == [s.spans for s in slow.segments]
                    if not isinstance(results[0], bool):
                        break
    # both paths ran (here 100 of 128 turns by pieces), so each was compared
    assert any(used) and not all(used)


def test_conversations_of_one_tokenizer_share_their_pieces(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A second conversation tokenizes only text the first did not (its system prompt and
    the template's pieces are remembered); the memory is cleared when full, and a
    tokenizer changed since (a token added, another normalizer) is analysed anew."""
    import agentrl.chat.rendering as rendering

    tok = build_tokenizer(family("qwen2.5"))
    encoded: list[str] = []
    original = RenderTokenizer._encode

    def spy(self: RenderTokenizer, text: str) -> list[int]:
        encoded.append(text)
        return original(self, text)

    monkeypatch.setattr(RenderTokenizer, "_encode", spy)
    system = {"role": "system", "content": "You add numbers with the add tool. " * 20}

    def first_ids(content: str) -> list[int]:
        messages = [system, {"role": "user", "content": content}]
        conv = Conversation(tok, messages, tools=[ADD_SCHEMA])
        whole = tok.apply_chat_template(
            messages,
            tools=[ADD_SCHEMA],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
        assert conv.token_ids == list(whole)
        return conv.token_ids

    first_ids("What is 2 + 3?")
    assert any("You add numbers" in t for t in encoded)
    encoded.clear()
    first_ids("What is 4 + 4?")
    assert encoded and all("You add numbers" not in t for t in encoded), encoded
    assert any("4 + 4" in t for t in encoded)

    # full: cleared at the next new piece (after the system prompt, found), so the
    # conversation after that tokenizes the system prompt again
    monkeypatch.setattr(rendering, "PIECE_CHARS", 50)
    first_ids("What is 5 + 5?")
    encoded.clear()
    first_ids("What is 6 + 6?")
    assert any("You add numbers" in t for t in encoded)
    monkeypatch.setattr(rendering, "PIECE_CHARS", 32_000_000)

    # a token added since: analysed anew, and the new token is split out
    renderer = RenderTokenizer.for_tokenizer(tok)
    tok.add_tokens(["<new_token>"], special_tokens=True)
    again = RenderTokenizer.for_tokenizer(tok)
    assert renderer is not None and again is not None
    assert again._shared is not renderer._shared
    assert tok.convert_tokens_to_ids("<new_token>") in first_ids("say <new_token>")

    # another normalizer: the pieces remembered under the old one are not reused
    from tokenizers import normalizers

    before = RenderTokenizer.for_tokenizer(tok)
    tok.backend_tokenizer.normalizer = normalizers.Lowercase()
    after = RenderTokenizer.for_tokenizer(tok)
    assert before is not None and after is not None and after._shared is not before._shared
    first_ids("What is 2 + 3? SHOUT")


def test_decode_is_the_tokenizers_decode(tokenizers: dict[str, Any]) -> None:
    """The shortcut to ``_decode`` gives what ``decode(ids, skip_special_tokens=False)``
    does (every family, special tokens and odd bytes included); a tokenizer whose class
    overrides ``decode`` gets its own."""
    from agentrl.chat.rendering import decode

    rng = random.Random(1)
    for name, tok in tokenizers.items():
        size = tok.backend_tokenizer.get_vocab_size(with_added_tokens=True)
        for n in (0, 1, 5, 64):
            ids = [rng.randrange(size) for _ in range(n)]
            assert decode(tok, ids) == tok.decode(ids, skip_special_tokens=False), (name, ids)

    tok = build_tokenizer(family("qwen2.5"))

    class Shouting(type(tok)):  # type: ignore[misc]
        def decode(self, token_ids: Any, skip_special_tokens: bool = False, **kw: Any) -> str:
            return str(super().decode(token_ids, skip_special_tokens, **kw)).upper()

    tok.__class__ = Shouting
    ids = tok.encode("hello there", add_special_tokens=False)
    assert decode(tok, ids) == "HELLO THERE"


def test_direct_renderings_are_apply_chat_templates_text(
    tokenizers: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    """RenderTokenizer.text renders the compiled template itself (not through
    apply_chat_template's bookkeeping): the very text, for every family's real template,
    with and without tools and template kwargs; and a rendering that differs sends the
    template back to apply_chat_template for good."""
    from agentrl.chat import rendering

    conv = sample_conversation()
    for name, tok in tokenizers.items():
        pieces = RenderTokenizer.for_tokenizer(tok)
        assert pieces is not None
        for kwargs in ({}, {"enable_thinking": False}):
            for tools in (None, [ADD_SCHEMA]):
                for end in range(2, len(conv) + 1):
                    for gen in (False, True):
                        expected = tok.apply_chat_template(
                            conv[:end],
                            tools=tools,
                            add_generation_prompt=gen,
                            tokenize=False,
                            **kwargs,
                        )
                        got = pieces.text(
                            conv[:end],
                            add_generation_prompt=gen,
                            tools=tools,
                            template_kwargs=kwargs,
                        )
                        assert got == expected, (name, kwargs, tools is None, end, gen)
                        source = tok.get_chat_template(None, tools)
                        assert rendering._TEMPLATES[source] is not None, name  # rendered direct

    # A template kwarg that apply_chat_template takes for itself: rendered through it.
    tok = tokenizers["qwen2.5"]
    pieces = RenderTokenizer.for_tokenizer(tok)
    assert pieces is not None
    got = pieces.text(
        conv[:2],
        add_generation_prompt=True,
        tools=None,
        template_kwargs={"continue_final_message": False},
    )
    assert got == tok.apply_chat_template(conv[:2], add_generation_prompt=True, tokenize=False)

    # A direct rendering that differs (here: made to) is caught at the template's first
    # rendering, and that template renders through apply_chat_template from then on.
    from jinja2 import Template

    source = tok.get_chat_template(None, None)
    saved = rendering._TEMPLATES[source]
    try:
        rendering._TEMPLATES[source] = Template("not the template")
        rendering._CHECKED.discard(source)
        expected = tok.apply_chat_template(conv[:2], add_generation_prompt=True, tokenize=False)
        with caplog.at_level("WARNING", logger="agentrl.chat.rendering"):
            assert (
                pieces.text(conv[:2], add_generation_prompt=True, tools=None, template_kwargs={})
                == expected
            )
        assert rendering._TEMPLATES[source] is None
        assert "differed from apply_chat_template" in caplog.text
        assert (
            pieces.text(conv[:2], add_generation_prompt=True, tools=None, template_kwargs={})
            == expected
        )
    finally:
        rendering._TEMPLATES[source] = saved


def test_direct_renderings_read_message_fields_as_the_sandbox_does() -> None:
    """The direct rendering reads a message's fields key first (no failed attribute lookup
    each time) with the sandbox's own result: a key named like a dict method is not what
    ``m.items`` gives, a missing key is undefined, a ``_`` key is read, a field of a dict
    subclass or of an object follows the sandbox, and a method that mutates is still
    refused, as apply_chat_template refuses it."""
    from jinja2.exceptions import SecurityError

    from agentrl.chat import rendering

    class Message(dict):  # type: ignore[type-arg]
        role = "attribute"  # the sandbox prefers the attribute of anything but a plain dict

    tok = build_tokenizer(family("qwen2.5"))
    tok.chat_template = (
        "{% for m in messages %}[{{ m.role }}|{{ m.items is callable }}|{{ m.keys() | list }}"
        "|{{ m.nope is defined }}|{{ m._private }}|{{ m.get('content') }}"
        "|{{ m.meta.x if m.meta is defined }}|{{ m.content.upper() }}]{% endfor %}"
        "{% if add_generation_prompt %}{{ messages.0.role }}{% endif %}"
    )
    messages = [
        {"role": "user", "content": "hi", "items": "a key", "_private": "p", "meta": {"x": 1}},
        Message(role="assistant", content="yo"),
    ]
    pieces = RenderTokenizer.for_tokenizer(tok)
    assert pieces is not None
    for gen in (False, True):
        expected = tok.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
        assert "[user|True|" in expected and "a key" not in expected  # the sandbox's reading
        assert "[attribute|" in expected
        got = pieces.text(messages, add_generation_prompt=gen, tools=None, template_kwargs={})
        assert got == expected
        # rendered directly, not sent back to apply_chat_template for differing
        assert rendering._TEMPLATES[tok.get_chat_template(None, None)] is not None

    tok.chat_template = "{% for m in messages %}{{ m.pop('role') }}{% endfor %}"
    with pytest.raises(SecurityError):
        tok.apply_chat_template(messages[:1], tokenize=False)
    with pytest.raises(SecurityError):
        pieces.text(messages[:1], add_generation_prompt=False, tools=None, template_kwargs={})
    assert messages[0]["role"] == "user"


def test_end_of_turn_ids_follow_the_tokenizer_when_it_changes() -> None:
    """A conversation's end-of-turn ids are remembered per tokenizer, and read again once
    its EOS or vocabulary changes."""
    tok = build_tokenizer(family("qwen2.5"))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    first = Conversation(tok, [{"role": "user", "content": "hi"}]).end_of_turn_ids
    assert im_end in first and tok.eos_token_id in first
    tok.add_special_tokens({"eos_token": "<|my_eos|>"})
    again = Conversation(tok, [{"role": "user", "content": "hi"}]).end_of_turn_ids
    assert tok.convert_tokens_to_ids("<|my_eos|>") in again and im_end in again
    again.add(-1)  # each conversation has its own set
    assert -1 not in Conversation(tok, [{"role": "user", "content": "hi"}]).end_of_turn_ids
