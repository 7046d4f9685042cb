"""A long prompt is kept as the client's JSON text (gateway.proxy.rawprompt): the gateway reads from it exactly what
it reads from the decoded prompt, re-emits it byte for byte, and still refuses what a full decode refuses."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import BadRequest
from gateway.policy.model import TenantPolicy
from gateway.proxy.rawprompt import HEAD_BYTES, RAW_PROMPT_BYTES, decode_request, decoded_head
from gateway.proxy.rewrite import AFFINITY_CHARS, _text_of, prompt_prefix, rewrite_request
from gateway.proxy.shape import comma_count
from gateway.reuse.admission import head_sizes, prefix_span, prefix_units, request_span
from gateway.reuse.fingerprint import canonical_parts, exact_head_parts
from gateway.routes import ROUTES
from gateway.salts import Salts
from tests.salt_vectors import UNIT_SECRET, known_salt

# Pieces whose JSON text differs from their characters: escapes, quotes, multi-byte UTF-8, astral characters.
ATOMS = ("a", "word ", "é", "😀", "\n", '"', "\\", "/", "\u2028", "\x01", "漢", "\t")
SECRET = UNIT_SECRET.encode()
SALTS = Salts(SECRET)
CHAT = ROUTES["/v1/chat/completions"]
COMPLETIONS = ROUTES["/v1/completions"]


def text(rng: random.Random, length: int) -> str:
    return "".join(rng.choice(ATOMS) for _ in range(length))


def prompt_shapes(rng: random.Random, length: int) -> list[dict[str, Any]]:
    return [
        {"prompt": text(rng, length)},
        {"messages": [{"role": "system", "content": text(rng, rng.randint(0, 300))},
                      {"role": "user", "content": text(rng, length)}]},
        {"messages": [{"role": "user", "content": [{"type": "text", "text": text(rng, 40)},
                                                   {"content": text(rng, length)}]}]},
        {"input": [{"content": text(rng, rng.randint(0, 100))}, text(rng, length)]},
        {"prompt": list(range(length))},
        {"prompt": [text(rng, length), "second"]},
        {"messages": [{"role": "user", "content": text(rng, 3)}] * (length // 4)},
    ]


def serialised(body: dict[str, Any], rng: random.Random) -> bytes:
    """The body as one of several clients would write it (escaped or raw non-ASCII, compact or spaced)."""
    if rng.random() < 0.5:
        return json.dumps(body, ensure_ascii=rng.random() < 0.5).encode()
    return json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()


def test_a_long_prompt_is_the_clients_own_json_text_and_the_rest_is_decoded() -> None:
    prompt = '"' + "caf\\u00e9 \\/ \\n " * 2000 + '"'
    body = f'{{"model": "m", "prompt": {prompt}, "stream": true}}'.encode()
    request = decode_request(body)
    assert isinstance(request["prompt"], msgspec.Raw)
    assert bytes(memoryview(request["prompt"])) == prompt.encode()
    assert request["model"] == "m" and request["stream"] is True
    assert prompt.encode() in msgspec.json.encode(request)  # re-emitted as sent, escapes and all


def test_a_short_prompt_is_decoded() -> None:
    request = decode_request(json.dumps({"prompt": "x" * (RAW_PROMPT_BYTES - 10)}).encode())
    assert request["prompt"] == "x" * (RAW_PROMPT_BYTES - 10)


@pytest.mark.parametrize("seed", range(40))
def test_the_gateway_reads_a_kept_prompt_as_it_reads_a_decoded_one(seed: int) -> None:
    rng = random.Random(seed)
    for body in prompt_shapes(rng, rng.randint(100, 3000)):
        raw = serialised(body, rng)
        kept = decode_request(raw, raw_from=0)
        whole = msgspec.json.decode(raw)
        assert prompt_prefix(kept) == prompt_prefix(whole)
        assert canonical_parts(kept) == canonical_parts(whole)
        assert msgspec.json.decode(msgspec.json.encode(kept)) == whole


def escape_run(count: int) -> str:
    return "\\ud83d\\ude00\\n\\\\\\\"\\u00e9é😀" * count  # JSON text: escapes and raw multi-byte characters


@pytest.mark.parametrize("size", HEAD_BYTES)
@pytest.mark.parametrize("offset", range(16))
def test_the_head_is_repaired_wherever_the_cut_falls_in_an_escape(size: int, offset: int) -> None:
    """The cut at `size` bytes falls at each position of escapes and multi-byte characters; the affinity prefix is
    read from the head alone (no whole decode) and equals the whole prompt's."""
    lead = size - 40 - offset  # the escapes start just before the cut
    content = "x" * lead + escape_run(40)
    raw = f'[{{"role": "user", "content": "{content}"}}]'.encode()
    kept = decode_request(b'{"messages": ' + raw + b"}", raw_from=0)["messages"]
    head = decoded_head(kept, size)
    assert head is not None
    assert len(_text_of(head)) >= AFFINITY_CHARS
    assert prompt_prefix({"messages": kept}) == prompt_prefix({"messages": msgspec.json.decode(raw)})


@pytest.mark.parametrize("size", HEAD_BYTES)
def test_the_head_of_a_plain_string_prompt_is_read_from_the_head(size: int) -> None:
    body = json.dumps({"prompt": "é" * size}, ensure_ascii=False).encode()
    kept = decode_request(body, raw_from=0)["prompt"]
    head = decoded_head(kept, size)
    assert isinstance(head, str) and head[:256] == "é" * 256


def test_a_cut_between_values_goes_back_to_the_last_comma() -> None:
    ids = list(range(100_000, 103_000))
    kept = decode_request(json.dumps({"prompt": ids}).encode(), raw_from=0)["prompt"]
    head = decoded_head(kept, HEAD_BYTES[0])
    assert isinstance(head, list) and 8 < len(head) < len(ids) and head == ids[: len(head)]
    assert prompt_prefix({"prompt": kept}) == prompt_prefix({"prompt": ids})


@pytest.mark.parametrize("padding", range(60, 160))
def test_a_short_text_prefix_is_taken_from_the_head_only_past_the_items_it_reads(padding: int) -> None:
    """Messages with long names and one-word contents: the head holds about eight of them, its last one cut (at
    some paddings before its content); the prefix must still be that of the whole list."""
    messages = [{"role": "user", "name": "n" * padding, "content": f"q{index}"} for index in range(30)]
    kept = decode_request(json.dumps({"messages": messages}).encode(), raw_from=0)["messages"]
    assert prompt_prefix({"messages": kept}) == prompt_prefix({"messages": messages}) == "".join(
        f"q{index}" for index in range(8))


LONG = "y" * (RAW_PROMPT_BYTES + 10)


@pytest.mark.parametrize("body", [
    b'{"prompt": "\xff' + LONG.encode() + b'"}',  # not UTF-8
    b'{"prompt": "\xed\xa0\x80' + LONG.encode() + b'"}',  # a surrogate encoded in UTF-8
    b'{"prompt": "\xc0\xaf' + LONG.encode() + b'"}',  # an overlong encoding
    b'{"prompt": "\\ud800x' + LONG.encode() + b'"}',  # a lone surrogate escape
    b'{"prompt": "\x01' + LONG.encode() + b'"}',  # a raw control character
    b'{"prompt": "\\q' + LONG.encode() + b'"}',  # an unknown escape
    b'{"messages": [{"content": "' + LONG.encode() + b'",}]}',  # a trailing comma
    b'{"prompt": "' + LONG.encode() + b'", "temperature": 1e400}',  # out of range where the gateway decodes
])
def test_a_kept_prompt_is_refused_as_a_decoded_one_would_be(body: bytes) -> None:
    with pytest.raises(msgspec.DecodeError):
        msgspec.json.decode(body)
    with pytest.raises(BadRequest):
        decode_request(body)


def test_a_body_that_is_not_an_object_is_refused() -> None:
    with pytest.raises(BadRequest, match="must be a JSON object"):
        decode_request(b'["not", "an", "object", "' + LONG.encode() + b'"]')


def test_a_number_out_of_float_range_inside_a_kept_prompt_is_left_to_the_engine() -> None:
    body = b'{"prompt": [1e400, ' + b"1, " * RAW_PROMPT_BYTES + b"2]}"
    request = decode_request(body)
    assert isinstance(request["prompt"], msgspec.Raw)
    assert prompt_prefix(request) == ""
    assert canonical_parts(request) is None


def tenant(**sections: Any) -> TenantPolicy:
    return TenantPolicy.model_validate({"tenant": "acme", "keys": [], **sections})


def test_repeated_top_level_keys_reach_upstream_once_with_a_kept_prompt() -> None:
    prompt = json.dumps(LONG)
    body = (f'{{"model": "m", "cache_salt": "mine", "prompt": {prompt}, "cache_salt": "again", "stream": false, '
            f'"stream": true, "kv_transfer_params": {{"max_load_tokens": 9}}, '
            f'"kv_transfer_params": {{"max_load_tokens": 99999}}}}').encode()
    policy = tenant(cache={"client_salt": "replace"}, offload={"max_load_tokens": 100})
    prepared = rewrite_request(body, COMPLETIONS, policy, SALTS, None)
    sent = prepared.body
    assert isinstance(prepared.request["prompt"], msgspec.Raw)
    for key in (b'"cache_salt"', b'"stream"', b'"kv_transfer_params"', b'"prompt"'):
        assert sent.count(key) == 1, key
    decoded = msgspec.json.decode(sent)
    assert decoded["cache_salt"] == known_salt(UNIT_SECRET, "acme", 1)
    assert decoded["stream"] is True and prepared.client_stream
    assert decoded["kv_transfer_params"] == {"max_load_tokens": 100}
    assert decoded["prompt"] == LONG


def test_a_chat_rewrite_with_a_kept_prompt_matches_the_decoded_one() -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "z\n" * RAW_PROMPT_BYTES}]
    body = json.dumps({"model": "m", "messages": messages, "stream": True, "vllm_xargs": {"a": 1}}).encode()
    prepared = rewrite_request(body, CHAT, tenant(), SALTS, None)
    assert isinstance(prepared.request["messages"], msgspec.Raw)
    assert prepared.dropped_fields == ("vllm_xargs",)
    assert prepared.strip_usage
    assert prepared.affinity.endswith(":be brief" + "z\n" * 124)
    sent = msgspec.json.decode(prepared.body)
    assert sent["messages"] == messages and sent["stream_options"] == {"include_usage": True}
    assert "vllm_xargs" not in sent


@pytest.mark.parametrize("body", [
    b'{"a": 1}', b"x" * 300_000, b'{"p": "' + b"," * 300_000 + b'"}',
    b"[" + b"1," * 40 + b"1]", b"[" + b"1," * 63 + b"1]", b"[" + b"1," * 64 + b"1]", b"[" + b"1," * 65 + b"1]",
])
def test_comma_count_counts_every_comma(body: bytes) -> None:
    assert comma_count(body) == body.count(b",")


@pytest.mark.parametrize("system", ["C:\\", "say \"hi\"", "\\\"", "\\\\", "[{,}]"])
def test_escaped_quotes_and_backslashes_before_the_cut_do_not_confuse_the_repair(system: str) -> None:
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "w" * 5000}]
    kept = decode_request(json.dumps({"messages": messages}).encode(), raw_from=0)["messages"]
    head = decoded_head(kept, HEAD_BYTES[0])
    assert isinstance(head, list) and head[0] == messages[0]
    assert prompt_prefix({"messages": kept}) == (system + "w" * 300)[:AFFINITY_CHARS]


def test_a_long_field_the_gateway_reads_is_decoded_and_checked() -> None:
    """Only the prompt fields are kept as text: a long `vllm_xargs` still has its transfer door refused."""
    body = json.dumps({"prompt": LONG, "vllm_xargs": {"kv_transfer_params": {"max_load_tokens": 1}, "pad": LONG}})
    with pytest.raises(BadRequest, match=r"vllm_xargs\.kv_transfer_params"):
        rewrite_request(body.encode(), COMPLETIONS, tenant(), SALTS, None)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda children: st.lists(children, max_size=12) | st.dictionaries(st.text(max_size=8), children, max_size=6),
    max_leaves=40)


@settings(max_examples=400, deadline=None)
@given(value=JSON_VALUES, ascii_only=st.booleans(), cut=st.floats(min_value=0.0, max_value=1.0))
def test_a_repaired_head_is_the_start_of_the_whole_value(value: object, ascii_only: bool, cut: float) -> None:
    """Wherever the cut falls, a repaired head's values are the whole value's, all complete but the last, whose
    text is the start of the real one; so its prefix text is the start of the whole prompt's."""
    raw = json.dumps({"prompt": value}, ensure_ascii=ascii_only).encode()
    kept = decode_request(raw, raw_from=0)["prompt"]
    size = int(cut * len(kept))
    head = decoded_head(kept, size)
    if head is None:
        return
    assert _text_of(value).startswith(_text_of(head))
    if isinstance(value, list):
        assert isinstance(head, list) and head[:-1] == value[: len(head) - 1]


# The admission key from a kept prompt's head (gateway.reuse.admission.request_span, rawprompt.exact_head): the
# span it reads must be the whole prompt's, whatever follows the cut.

def whole_span(body: bytes, prefix_chunks: int) -> str | list[int] | None:
    parts = canonical_parts(msgspec.json.decode(body))
    return prefix_span(parts, prefix_chunks) if parts is not None else None


def object_text(members: Sequence[tuple[str, object]]) -> str:
    """A JSON object with these members in this order, repeated keys included (which json.dumps cannot write)."""
    return "{" + ", ".join(f"{json.dumps(name)}: {json.dumps(value)}" for name, value in members) + "}"


def chat_text(*messages: Sequence[tuple[str, object]]) -> bytes:
    return ('{"model": "m", "messages": [' + ", ".join(object_text(message) for message in messages) + "]}").encode()


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("prefix_chunks", [1, 4, 7])
def test_the_admission_span_of_a_kept_prompt_is_the_whole_prompts(seed: int, prefix_chunks: int) -> None:
    rng = random.Random(seed)
    for body in prompt_shapes(rng, rng.randint(100, 6000)):
        raw = serialised(body, rng)
        kept = decode_request(raw, raw_from=0)
        assert request_span(kept, prefix_chunks, head_from=0) == whole_span(raw, prefix_chunks)


PLAIN = "the cache of a block is kept per tenant and " * 400


@pytest.mark.parametrize("body", [
    json.dumps({"model": "m", "messages": [{"role": "system", "content": "Answer briefly."},
                                           {"role": "user", "content": PLAIN}], "stream": True}),
    json.dumps({"model": "m", "messages": [{"role": "user", "content": PLAIN}]}, indent=2),
    json.dumps({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": PLAIN}]}]}),
    json.dumps({"model": "m", "messages": [{"role": "user", "content": PLAIN + 'a "quoted" C:\\ end\\'},
                                           {"role": "user", "content": "next"}]}),
    json.dumps({"model": "m", "prompt": "é" + PLAIN}, ensure_ascii=False),
    json.dumps({"model": "m", "prompt": list(range(100_000, 103_000))}),
    json.dumps({"model": "m", "input": [PLAIN, "second"]}),
])
@pytest.mark.parametrize("prefix_chunks", [1, 4, 16])
def test_the_span_of_a_long_prompt_is_read_from_its_head(body: str, prefix_chunks: int) -> None:
    """The shapes clients send: the head alone shows the span (no whole decode), and it is the whole prompt's."""
    request = decode_request(body.encode(), raw_from=0)
    found = exact_head_parts(request, head_sizes(prefix_chunks)[0])
    assert found is not None
    parts, exact = found
    assert exact >= prefix_units(parts.ids is not None, prefix_chunks)
    assert request_span(request, prefix_chunks, head_from=0) == whole_span(body.encode(), prefix_chunks)


AFTER_CUT = [
    # a repeated content key: the engine reads the second one
    chat_text([("role", "user"), ("content", "a" * 9000), ("content", "b" * 9000)]),
    # the role after a long content: the canonical text puts it first
    chat_text([("content", "a" * 9000), ("role", "assistant")]),
    # a content part after a long one, then a repeated content key
    chat_text([("role", "user"), ("content", [{"type": "text", "text": "a" * 9000}, {"text": "c"}]),
               ("content", "b" * 9000)]),
    # a part's repeated text key
    ('{"messages": [{"role": "user", "content": [' + object_text([("type", "text"), ("text", "a" * 9000),
                                                               ("text", "b")]) + "]}]}").encode(),
    # more escaped quotes after the cut than the check reads: then a repeated key
    chat_text([("role", "user"), ("content", "a" * 2000 + '"' * 100 + "a" * 5000), ("content", "b" * 9000)]),
]


@pytest.mark.parametrize("body", AFTER_CUT)
@pytest.mark.parametrize("prefix_chunks", [1, 4])
def test_what_follows_the_cut_in_an_open_object_sends_the_span_to_the_whole_decode(
    body: bytes, prefix_chunks: int
) -> None:
    request = decode_request(body, raw_from=0)
    assert exact_head_parts(request, head_sizes(prefix_chunks)[0]) is None  # it cuts the first long value
    assert request_span(request, prefix_chunks, head_from=0) == whole_span(body, prefix_chunks)


@pytest.mark.parametrize("pad", range(2860, 3000, 3))
def test_a_cut_in_a_role_written_after_the_content_ends_the_exact_span_at_the_cut(pad: int) -> None:
    """The second message's role comes after its content and is long, so at some pads the first head cuts it a
    few characters in: the canonical text then puts the cut role before a content that is whole, and only the
    text before the cut is the whole prompt's."""
    body = chat_text([("role", "user"), ("content", "c" * 50)], [("content", "d" * pad), ("role", "r" * 6000)])
    request = decode_request(body, raw_from=0)
    assert request_span(request, 4, head_from=0) == whole_span(body, 4)


@pytest.mark.parametrize("ending", ["\\", "\\\\", 'x\\"', '\\"\\\\', "\\" * 70])
def test_backslashes_before_the_closing_quote_are_read_as_json_reads_them(ending: str) -> None:
    body = chat_text([("role", "user"), ("content", "a" * 9000 + ending)], [("role", "user"), ("content", "q")])
    repeated = chat_text([("role", "user"), ("content", "a" * 9000 + ending), ("content", "b" * 9000)])
    for raw in (body, repeated):
        assert request_span(decode_request(raw, raw_from=0), 4, head_from=0) == whole_span(raw, 4)


MEMBER_TEXT = st.text(alphabet=st.sampled_from(["a", "b", " ", '"', "\\", "é", "😀", "\n", "\uffff"]), max_size=3000)
MEMBERS = st.lists(
    st.tuples(st.sampled_from(["role", "content", "name", "text", "type"]),
              MEMBER_TEXT | st.lists(st.dictionaries(st.sampled_from(["type", "text"]), MEMBER_TEXT), max_size=3)),
    max_size=5)


@settings(max_examples=300, deadline=None)
@given(messages=st.lists(MEMBERS, min_size=1, max_size=4), cut=st.floats(min_value=0.0, max_value=1.0))
def test_an_exact_head_reads_the_start_of_the_whole_prompt(
    messages: list[list[tuple[str, object]]], cut: float
) -> None:
    """Any member order, repeated keys, quotes and backslashes, the mark's own character in the text: wherever the
    cut falls, the canonical text of an exact head up to its mark starts the whole prompt's."""
    body = chat_text(*messages)
    request = decode_request(body, raw_from=0)
    found = exact_head_parts(request, int(cut * len(request["messages"])))
    whole = canonical_parts(msgspec.json.decode(body))
    if found is None or whole is None:
        return
    parts, exact = found
    assert str(whole.whole()).startswith(str(parts.head(exact)))
