"""A character corpus for the time-to-accuracy harness's LSTM: English text that every Debian
machine has, the license texts that package base-files (Essential: yes) ships in
/usr/share/common-licenses, read by our own code.

  text.load(paths=DEFAULT_PATHS) -> Corpus      (raises TextError naming the file and problem)
  text.split(corpus, seq_len) -> (train_blocks, held_out_blocks)
  text.pairs(blocks) -> (inputs, targets)

The files (DEFAULT_PATHS, in this order; 178,875 bytes in base-files 12.4): GPL-3, GPL-2,
LGPL-2.1, LGPL-3, GFDL-1.3, MPL-1.1, MPL-2.0, Apache-2.0, Artistic, CC0-1.0, BSD. Left out: the
near-copies of a listed text (GPL-1, LGPL-2, GFDL-1.2, and the links GPL, LGPL, GFDL), whose
sentences would sit on both sides of the split.

The vocabulary is fixed, not taken from the data, so every file list has the same one: each byte
is one symbol; a newline is symbol 1, a printable ASCII byte c (0x20..0x7e) is symbol 2 + (c -
0x20), and every other byte (tab, form feed, carriage return, any non-ASCII byte) is UNKNOWN,
symbol 0. VOCAB_SIZE = 97. A file with more than MAX_UNKNOWN_FRACTION of its bytes unknown is
not text (a binary, a UTF-16 file) and is refused; the default files have 39 unknown bytes in
all (9 form feeds in LGPL-2.1, 30 tabs in Artistic).

The split is fixed, not random: the files' symbols, concatenated in list order, are cut into
consecutive blocks of seq_len + 1 symbols (a block may straddle two files; the last, shorter
remainder is dropped), and block i (from 0) is held out when (i + 1) % HELD_OUT_EVERY == 0: the
40th, 80th, ... block (the default files at seq_len 32: 5420 blocks, 135 held out, 4320 characters;
few, because a CPU evaluates an LSTM slowly: those 135 take ~1.4 s of a core, as long as six
training steps). A block gives one sequence: its first seq_len symbols are the input and
its last seq_len the targets (each position's next character). It depends on nothing but the
files' bytes and seq_len, so every run, rank, arm and interpreter sees the same split.

Pure Python (no torch), so the loader and its test run anywhere; bench/python/tta.py turns the
blocks into tensors.
"""

import os
import sys

DEFAULT_DIR = "/usr/share/common-licenses"
DEFAULT_FILES = ("GPL-3", "GPL-2", "LGPL-2.1", "LGPL-3", "GFDL-1.3", "MPL-1.1", "MPL-2.0", "Apache-2.0",
                 "Artistic", "CC0-1.0", "BSD")
DEFAULT_PATHS = tuple(os.path.join(DEFAULT_DIR, name) for name in DEFAULT_FILES)
UNKNOWN = 0
NEWLINE = 1
FIRST_PRINTABLE, LAST_PRINTABLE = 0x20, 0x7e
VOCAB_SIZE = 2 + LAST_PRINTABLE - FIRST_PRINTABLE + 1  # 97
MAX_UNKNOWN_FRACTION = 0.05
HELD_OUT_EVERY = 40  # every 40th block is held out (2.5%: the LSTM's evaluation is slow on a CPU)


class TextError(ValueError):
    """A missing, unreadable, empty or non-text corpus file, or a corpus too small to split; the
    message names the file (or the list) in the shape `FILE: problem; got X, expected Y`."""


class Corpus:
    """The symbols of the files in order: symbols is a list of ints in 0..VOCAB_SIZE-1, paths the
    files, sizes each file's byte count, unknown each file's count of UNKNOWN symbols."""

    def __init__(self, paths, symbols, sizes, unknown):
        self.paths, self.symbols, self.sizes, self.unknown = paths, symbols, sizes, unknown

    def __len__(self):
        return len(self.symbols)


# byte -> symbol, the vocabulary rule of the module's doc as a table.
_SYMBOL = bytes(NEWLINE if b == 0x0a else 2 + b - FIRST_PRINTABLE if FIRST_PRINTABLE <= b <= LAST_PRINTABLE
                else UNKNOWN for b in range(256))


def symbol_text(symbol):
    """The character of a symbol ('\\n', a printable ASCII character, or '?' for UNKNOWN)."""
    return "\n" if symbol == NEWLINE else chr(FIRST_PRINTABLE + symbol - 2) if symbol > NEWLINE else "?"


def _read(path):
    """The file's symbols; TextError when it cannot be read, is empty or is not text."""
    if not os.path.exists(path):
        hint = " (package base-files ships it)" if os.path.dirname(path) == DEFAULT_DIR else ""
        raise TextError("%s: no such file%s" % (path, hint))
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise TextError("%s: cannot read: %s" % (path, e.strerror or e)) from None
    if not raw:
        raise TextError("%s: empty; got 0 bytes, expected text" % path)
    symbols = raw.translate(_SYMBOL)
    unknown = symbols.count(UNKNOWN)
    if unknown > MAX_UNKNOWN_FRACTION * len(raw):
        raise TextError("%s: not text; got %d of %d bytes outside newline and printable ASCII, expected at most %g%%"
                        % (path, unknown, len(raw), 100 * MAX_UNKNOWN_FRACTION))
    return symbols, unknown


def load(paths=DEFAULT_PATHS):
    """The corpus of `paths` (a non-empty sequence), in order. Every file is checked; the problems
    of all bad files are reported together, one line each."""
    paths = list(paths)
    if not paths:
        raise TextError("text: no files; expected at least one path")
    symbols, sizes, unknown, problems = bytearray(), [], [], []
    for path in paths:
        try:
            s, u = _read(path)
        except TextError as e:
            problems.append(str(e))
            continue
        symbols += s
        sizes.append(len(s))
        unknown.append(u)
    if problems:
        raise TextError("\n".join(problems))
    return Corpus(paths, list(symbols), sizes, unknown)


def split(corpus, seq_len):
    """(train, held_out): lists of blocks (lists of seq_len + 1 symbols) in corpus order, per the
    module's doc. Raises when the corpus has fewer than HELD_OUT_EVERY blocks (nothing held out)."""
    if seq_len < 1:
        raise TextError("seq_len: out of range; got %d, expected >= 1" % seq_len)
    block = seq_len + 1
    count = len(corpus.symbols) // block
    if count < HELD_OUT_EVERY:
        raise TextError("%s: too little text to split; got %d symbols, %d blocks of %d, expected >= %d blocks"
                        % (",".join(corpus.paths), len(corpus.symbols), count, block, HELD_OUT_EVERY))
    train, held_out = [], []
    for i in range(count):
        (held_out if (i + 1) % HELD_OUT_EVERY == 0 else train).append(corpus.symbols[i * block:(i + 1) * block])
    return train, held_out


def pairs(blocks):
    """(inputs, targets): per block, its first seq_len symbols and its last seq_len (the next
    character of each input position)."""
    return [b[:-1] for b in blocks], [b[1:] for b in blocks]


def main(argv):
    """`text.py [--seq-len N] [FILE...]`: checks the files (default DEFAULT_PATHS) and prints the
    corpus's sizes and split; exit 1 with the loader's message when unusable, 2 on a usage error."""
    args, seq_len = argv[1:], 128
    if args[:1] == ["--seq-len"]:
        if len(args) < 2 or not args[1].isdigit():
            print("usage: text.py [--seq-len N] [FILE...]", file=sys.stderr)
            return 2
        seq_len, args = int(args[1]), args[2:]
    if any(a.startswith("-") for a in args):
        print("usage: text.py [--seq-len N] [FILE...]", file=sys.stderr)
        return 2
    try:
        corpus = load(args or DEFAULT_PATHS)
        train, held_out = split(corpus, seq_len)
    except TextError as e:
        print(e, file=sys.stderr)
        return 1
    print("%d files, %d bytes (%d unknown), vocabulary %d; blocks of %d: %d train, %d held out (%d characters to "
          "predict)"
          % (len(corpus.paths), len(corpus), sum(corpus.unknown), VOCAB_SIZE, seq_len + 1, len(train),
             len(held_out), len(held_out) * seq_len))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
