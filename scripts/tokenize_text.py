#!/usr/bin/env python3
"""Turns text files into a token file in llm.c's format, the one peakbound's TokenFile
(src/peakbound/io/token_file.h) reads: a header of 256 int32 (magic 20240520, version 1,
token count) then the tokens as uint16, or magic 20240801 and uint32 tokens when the
vocabulary has more than 65536 entries. Each input file is one document.

Tokenizer: --tokenizer tokenizer.json (any Hugging Face `tokenizers` file), or
--train-vocab N to train a byte-level BPE of N entries on the inputs themselves (its
tokenizer.json is saved beside the output, or where --save-tokenizer says).

Prints one JSON line of summary on stdout (token counts, vocabulary size, end-of-text id,
the first tokens, the files written). Errors are one line on stderr, exit 1.
Needs the `tokenizers` package: scripts/tokenize_text.sh runs this in a venv that has it.
"""
import argparse
import json
import os
import struct
import sys

MAGIC_U16, MAGIC_U32, VERSION, HEADER_INTS = 20240520, 20240801, 1, 256
EOT_NAMES = ("<|endoftext|>", "<|end_of_text|>", "</s>", "<eos>", "<|eot_id|>")


class Refused(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own: usage and exit 2; here one line and exit 1
        print(f"tokenize_text: error: {message} (see --help)", file=sys.stderr)
        sys.exit(1)


def parse_args(argv):
    p = Parser(
        description="Tokenize text files into an llm.c token file (OUT.bin, and OUT.val.bin with --val-fraction).")
    p.add_argument("inputs", nargs="+", help="UTF-8 text files; each is one document")
    p.add_argument("-o", "--output", required=True,
                   help="the token file to write, e.g. data/train.bin (with --val-fraction F, OUT.bin gets the first "
                        "1-F of the tokens and OUT.val.bin the last F, OUT being the name without .bin)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--tokenizer", help="a Hugging Face tokenizer.json")
    src.add_argument("--train-vocab", type=int, metavar="N",
                     help="train a byte-level BPE of N entries (at least 257) on the inputs")
    p.add_argument("--save-tokenizer", metavar="PATH",
                   help="with --train-vocab: where to save the trained tokenizer.json "
                        "(default: tokenizer.json in the output's folder)")
    p.add_argument("--val-fraction", type=float, default=0.0, metavar="F",
                   help="hold out the last fraction F in [0, 1) of the tokens (rounded, at least one) as OUT.val.bin "
                        "(default 0: none)")
    p.add_argument("--eot", action="store_true",
                   help="put the tokenizer's end-of-text token between documents (an error if it has none)")
    p.add_argument("--first", type=int, default=32, metavar="K", help="tokens shown in the summary (default 32)")
    return p.parse_args(argv)


def load_tokenizer(args, texts, out_path):
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    except ImportError:
        raise Refused("the 'tokenizers' package is missing (run scripts/tokenize_text.sh, which installs it in a venv)")
    if args.tokenizer:
        try:
            return Tokenizer.from_file(args.tokenizer), None
        except Exception as e:  # the Rust side raises plain Exceptions
            raise Refused(f"{args.tokenizer}: not a tokenizer.json ({str(e).splitlines()[0] if str(e) else type(e).__name__})")
    if args.train_vocab < 257:
        raise Refused(f"--train-vocab must be at least 257 (256 bytes and an end-of-text token), got {args.train_vocab}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=args.train_vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    save = args.save_tokenizer or os.path.join(os.path.dirname(out_path) or ".", "tokenizer.json")
    try:
        tok.save(save)
    except Exception as e:
        raise Refused(f"{save}: cannot save the tokenizer ({e})")
    return tok, save


def eot_id(tok):
    for name in EOT_NAMES:
        i = tok.token_to_id(name)
        if i is not None:
            return i
    return None


def write_tokens(path, ids, vocab_size):
    wide = vocab_size > 65536
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = (MAGIC_U32 if wide else MAGIC_U16), VERSION, len(ids)
    if len(ids) > 2**31 - 1:
        raise Refused(f"{path}: an llm.c header holds at most 2^31 - 1 tokens, got {len(ids)}")
    try:
        with open(path, "wb") as f:
            f.write(struct.pack(f"<{HEADER_INTS}i", *header))
            f.write(struct.pack(f"<{len(ids)}{'I' if wide else 'H'}", *ids))
    except OSError as e:
        raise Refused(f"{path}: cannot write ({e.strerror})")


def main(argv):
    args = parse_args(argv)
    if not 0.0 <= args.val_fraction < 1.0:
        raise Refused(f"--val-fraction must be in [0, 1), got {args.val_fraction}")
    texts = []
    for path in args.inputs:
        try:
            with open(path, "rb") as f:
                texts.append(f.read().decode("utf-8"))
        except OSError as e:
            raise Refused(f"{path}: cannot read ({e.strerror})")
        except UnicodeDecodeError as e:
            raise Refused(f"{path}: not UTF-8 text (byte {e.start})")
    tok, saved = load_tokenizer(args, texts, args.output)
    eot = eot_id(tok)
    if args.eot and eot is None:
        raise Refused(f"--eot: the tokenizer has no end-of-text token (looked for {', '.join(EOT_NAMES)})")
    ids = []
    for i, enc in enumerate(tok.encode_batch(texts, add_special_tokens=False)):
        if args.eot and i > 0:
            ids.append(eot)
        ids.extend(enc.ids)
    if not ids:
        raise Refused("the inputs hold no tokens")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    base = args.output[:-4] if args.output.endswith(".bin") else args.output
    n_val = 0
    if args.val_fraction > 0:
        if len(ids) < 2:
            raise Refused(f"--val-fraction needs at least 2 tokens, the inputs hold {len(ids)}")
        n_val = min(max(1, int(len(ids) * args.val_fraction + 0.5)), len(ids) - 1)  # rounded half up
    train_path = base + ".bin"
    write_tokens(train_path, ids[: len(ids) - n_val], vocab)
    written = [train_path]
    if n_val:
        write_tokens(base + ".val.bin", ids[len(ids) - n_val:], vocab)
        written.append(base + ".val.bin")
    print(json.dumps({"tokens": len(ids), "train_tokens": len(ids) - n_val, "val_tokens": n_val,
                      "vocab_size": vocab, "token_bytes": 4 if vocab > 65536 else 2, "eot_id": eot,
                      "documents": len(texts), "first_tokens": ids[: args.first], "outputs": written,
                      "tokenizer": saved or args.tokenizer}))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except Refused as e:
        print(f"tokenize_text: error: {e}", file=sys.stderr)
        sys.exit(1)
