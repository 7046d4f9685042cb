"""Build the tiny Llama model directory that the real vLLM serves with ``--load-format dummy``.

Only a ``config.json`` and tokenizer files are needed: vLLM fills the weights with seeded random values,
so no weights file exists and nothing is downloaded. The tokenizer is a byte-level BPE trained here, by a
small deterministic trainer, on a built-in corpus, and written in the Hugging Face ``tokenizers`` JSON format.

Facts that shape it:
- The alphabet is printable ASCII plus tab, newline, carriage return and space. The random model can then
  only emit whole ASCII characters, never a partial UTF-8 sequence (which would decode to U+FFFD).
  Other input bytes become ``<unk>``.
- ``vocab_size`` in the config equals the tokenizer's length, so every id the model can sample decodes.
- A chat template is included, so ``/v1/chat/completions`` works.

The output directory name carries a hash of its content: a change to this builder yields a new directory,
and an existing one is reused as is. Run by hand: ``python -m tests.realvllm.tooling.make_model [DIR]``.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import re
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from tests.realvllm.tooling.install_vllm import cache_home

SERVED_MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 2048

UNK, BOS, EOS, PAD, TURN_START, TURN_END = "<unk>", "<s>", "</s>", "<|pad|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (UNK, BOS, EOS, PAD, TURN_START, TURN_END)

# Bytes the tokenizer knows: tab, newline, carriage return and printable ASCII (space included).
ALPHABET_BYTES = (9, 10, 13, *range(32, 127))

MAX_MERGES = 400
MIN_PAIR_COUNT = 2

TRAINING_CORPUS = (
    "A gateway sits in front of the inference servers and checks every request.",
    "Each tenant has its own cache salt, so one tenant never reads another tenant's cached prefix.",
    "The prompt is split into blocks of tokens; a full block can be reused when the prefix matches.",
    "Streaming responses arrive as server-sent events, one small chunk of text at a time.",
    "system user assistant tool: answer briefly, in plain words, and stop when done.",
    "Numbers 0 1 2 3 4 5 6 7 8 9 10 42 128 2048 and marks . , ; : ! ? - _ / ( ) [ ] { } < > = + * # @ ' \"",
    "Tabs\tand\nnew lines\r\nare part of the alphabet too.",
    "the quick brown fox jumps over the lazy dog while the cat sleeps in the warm sun.",
)

# Lays the chat as <|im_start|>role\ncontent<|im_end|>\n per message, then opens the assistant turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% endif %}"
    "{{ '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Tiny Llama shape: fast on 2 CPU cores, still a real architecture for vLLM's model runner.
MODEL_SHAPE: dict[str, object] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "max_position_embeddings": 4096,
}

# Rough stand-in for the byte-level pre-tokenizer's split: a word with its leading space, digit runs,
# punctuation runs, whitespace runs. Training only needs plausible words; encoding uses the real regex.
WORD_PATTERN = re.compile(r" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+")


def byte_to_char_table() -> dict[int, str]:
    """The byte-level mapping of the ``tokenizers`` library: visible Latin-1 bytes stand for themselves,
    every other byte is shifted to code points from 256 upwards, in byte order."""
    visible = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {byte: chr(byte) for byte in visible}
    shifted = (byte for byte in range(256) if byte not in table)
    for offset, byte in enumerate(shifted):
        table[byte] = chr(256 + offset)
    return table


def to_symbols(word: str, table: dict[int, str]) -> tuple[str, ...]:
    return tuple(table[byte] for byte in word.encode("ascii"))


def merge_pair(symbols: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    merged: list[str] = []
    index = 0
    while index < len(symbols):
        if index + 1 < len(symbols) and (symbols[index], symbols[index + 1]) == pair:
            merged.append(symbols[index] + symbols[index + 1])
            index += 2
        else:
            merged.append(symbols[index])
            index += 1
    return tuple(merged)


def train_bpe(corpus: Iterable[str], table: dict[int, str]) -> list[tuple[str, str]]:
    """Greedy BPE: repeatedly merge the most frequent adjacent pair (ties broken by the pair itself,
    so the result is deterministic) until pairs are rare or the merge budget is spent."""
    words: Counter[tuple[str, ...]] = Counter()
    for text in corpus:
        for word in WORD_PATTERN.findall(text):
            words[to_symbols(word, table)] += 1
    merges: list[tuple[str, str]] = []
    while len(merges) < MAX_MERGES:
        pairs: Counter[tuple[str, str]] = Counter()
        for symbols, count in words.items():
            for pair in itertools.pairwise(symbols):
                pairs[pair] += count
        if not pairs:
            break
        best, best_count = min(pairs.items(), key=lambda item: (-item[1], item[0]))
        if best_count < MIN_PAIR_COUNT:
            break
        merges.append(best)
        rewritten: Counter[tuple[str, ...]] = Counter()
        for symbols, count in words.items():
            rewritten[merge_pair(symbols, best)] += count
        words = rewritten
    return merges


def build_vocab(table: dict[int, str], merges: Sequence[tuple[str, str]]) -> dict[str, int]:
    ordered = [*SPECIAL_TOKENS, *(table[byte] for byte in ALPHABET_BYTES), *(a + b for a, b in merges)]
    vocab: dict[str, int] = {}
    for token in ordered:
        vocab.setdefault(token, len(vocab))
    return vocab


def tokenizer_json(vocab: dict[str, int], merges: Sequence[tuple[str, str]]) -> dict[str, object]:
    """The ``tokenizer.json`` document (tokenizers format 1.0) for a byte-level BPE."""
    byte_level = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    added_tokens = [
        {
            "id": vocab[token],
            "content": token,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for token in SPECIAL_TOKENS
    ]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added_tokens,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", **byte_level},
        # trim_offsets off: offsets keep their leading space, which is what the text really contains.
        "post_processor": {"type": "ByteLevel", **byte_level, "trim_offsets": False},
        "decoder": {"type": "ByteLevel", **byte_level},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": UNK,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }


def model_files() -> dict[str, str]:
    """Every file of the model directory, by name, as text."""
    table = byte_to_char_table()
    merges = train_bpe(TRAINING_CORPUS, table)
    vocab = build_vocab(table, merges)
    ids = {"bos_token_id": vocab[BOS], "eos_token_id": vocab[EOS], "pad_token_id": vocab[PAD]}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "unk_token": UNK,
        "pad_token": PAD,
        "additional_special_tokens": [TURN_START, TURN_END],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": MAX_MODEL_LEN,
        "chat_template": CHAT_TEMPLATE,
    }
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **MODEL_SHAPE,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "vocab_size": len(vocab),
        "torch_dtype": "bfloat16",
        **ids,
    }
    generation_config = {"bos_token_id": vocab[BOS], "eos_token_id": vocab[EOS]}
    documents = {
        "tokenizer.json": tokenizer_json(vocab, merges),
        "tokenizer_config.json": tokenizer_config,
        "config.json": config,
        "generation_config.json": generation_config,
    }
    return {name: json.dumps(document, indent=1) + "\n" for name, document in documents.items()}


def content_digest(files: dict[str, str]) -> str:
    digest = hashlib.sha256()
    for name in sorted(files):
        digest.update(name.encode() + b"\0" + files[name].encode() + b"\0")
    return digest.hexdigest()[:12]


def default_models_dir() -> Path:
    return cache_home() / "kvgate" / "models"


def ensure_model(models_dir: Path | None = None) -> Path:
    """Return the model directory, writing it first if this exact content does not exist yet."""
    files = model_files()
    parent = models_dir or default_models_dir()
    target = parent / f"{SERVED_MODEL_NAME}-{content_digest(files)}"
    if target.is_dir():
        return target
    parent.mkdir(parents=True, exist_ok=True)
    # Written beside the target and renamed into place, so a concurrent reader never sees half a model.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=parent))
    for name, text in files.items():
        (staging / name).write_text(text)
    try:
        os.rename(staging, target)
    except OSError:
        if not target.is_dir():
            raise
        # Another process won the race with identical content; ours is redundant.
        for child in staging.iterdir():
            child.unlink()
        staging.rmdir()
    return target


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    print(ensure_model(Path(args[0]) if args else None))
    return 0


if __name__ == "__main__":
    sys.exit(main())
