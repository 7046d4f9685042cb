"""Build the tokenizer of the dummy-weight model that the H200 runs serve: a byte-level BPE with exactly 32000 ids.

The model's `config.json` says vocab_size 32000 and `generation_config.json` says eos 2 / pad 0, so the tokenizer must
hold exactly 32000 ids with `<|endoftext|>`, `<|im_start|>`, `<|im_end|>` at 0, 1, 2: random weights then never emit an
id the detokenizer cannot map, and the load tests' random token-id prompts (all < 32000) are all valid. Which text maps
to which id does not matter for a dummy model; only the sizes do, so the merges are learned from whatever plain text is
at hand (this repository's sources and docs first, then the running Python's standard library) up to a byte budget.

Usage: python build_tokenizer.py OUT_DIR [--budget-mb 24]
Writes OUT_DIR/tokenizer.json and OUT_DIR/tokenizer_config.json (ChatML chat template, from model/tokenizer_config.json
beside this script). Needs the `tokenizers` package (it is not a kvgate dependency; stage.sh installs it in a venv).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

VOCAB_SIZE = 32000
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2: pad/bos, ChatML open, eos
HERE = Path(__file__).resolve().parent
SUFFIXES = {".py", ".md", ".txt", ".yaml", ".rst"}


def corpus_roots() -> list[Path]:
    """This repository first (stable across machines), then the standard library (large enough for 32000 ids)."""
    return [HERE.parents[1], Path(sysconfig.get_paths()["stdlib"])]


def corpus(budget_bytes: int) -> Iterator[str]:
    """Text files under the corpus roots in a fixed (sorted) order, until the byte budget is spent."""
    spent = 0
    for root in corpus_roots():
        for path in sorted(root.rglob("*")):
            if path.suffix not in SUFFIXES or not path.is_file() or ".venv" in path.parts or ".stage" in path.parts:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError):
                continue
            yield text
            spent += len(text)
            if spent >= budget_bytes:
                return


def train(budget_bytes: int) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(budget_bytes), trainer=trainer)
    return tokenizer


def check(tokenizer: Tokenizer) -> None:
    """Refuse to write a tokenizer that does not fit the model config."""
    size = tokenizer.get_vocab_size()
    if size != VOCAB_SIZE:
        raise SystemExit(f"tokenizer has {size} ids, the model config needs exactly {VOCAB_SIZE}: raise --budget-mb")
    ids = [tokenizer.token_to_id(token) for token in SPECIALS]
    if ids != [0, 1, 2]:
        raise SystemExit(f"special tokens landed on ids {ids}, expected [0, 1, 2]")
    sample = "<|im_start|>user\nKV blocks travel from GPU to CPU — ü 日本 🙂<|im_end|>\n"
    encoded = tokenizer.encode(sample)
    if tokenizer.decode(encoded.ids, skip_special_tokens=False) != sample:
        raise SystemExit("byte-level round trip failed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--budget-mb", type=float, default=24.0, help="plain text to learn merges from (MB)")
    args = parser.parse_args()
    tokenizer = train(int(args.budget_mb * 1_000_000))
    check(tokenizer)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(args.out_dir / "tokenizer.json"))
    shutil.copyfile(HERE / "model" / "tokenizer_config.json", args.out_dir / "tokenizer_config.json")
    config = json.loads((args.out_dir / "tokenizer_config.json").read_text())
    print(f"tokenizer: {tokenizer.get_vocab_size()} ids, eos {config['eos_token']}, written to {args.out_dir}")


if __name__ == "__main__":
    main()
