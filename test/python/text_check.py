"""bench/python/text.py, the text loader of the time-to-accuracy harness's LSTM: a small hand-made
corpus (symbols, the split, the input/target pairs), every error message pinned (file named),
the batches tta.py makes of it (shapes, shards) when torch is installed, and the shipped license
texts' sizes when base-files has them.

  text_check.py            (PYTHONPATH must reach bench/python)

Expected values are written out by hand from the files below (symbol of byte c: 2 + c - 0x20 for
printable ASCII, 1 for a newline, 0 otherwise), not computed with the loader.
Exits 1 on the first failed check, naming it.
"""

import os
import tempfile

import text
from expect import expect_eq, expect_raises, fail


def expect_error(what, expected_message, fn, *args):
    """fn(*args) raises text.TextError with exactly this message."""
    expect_raises(what, lambda: fn(*args), text.TextError, equals=expected_message)


def write(directory, name, data):
    path = os.path.join(directory, name)
    with open(path, "wb") as f:
        f.write(data)
    return path


def check_vocabulary(tmp):
    # 20 bytes, one unknown (0x7f, 5%: the most allowed): ' ' is 2, '~' 96, 'x' (0x78) 90.
    edges = write(tmp, "edges.txt", b" ~\x7f" + b"x" * 16 + b"\n")
    c = text.load([edges])
    expect_eq("edges symbols", c.symbols, [2, 96, 0] + [90] * 16 + [1])
    expect_eq("edges unknown", c.unknown, [1])
    expect_eq("vocabulary size", text.VOCAB_SIZE, 97)


def check_slice(tmp):
    # a.txt: the 26 lowercase letters 4 times, then 'a'..'m' (117 bytes); b.txt (20 bytes, one
    # unknown: 5%): 'A', tab, 'B', newline, 'C'..'R'. Stream of 137 symbols; blocks of 3 (seq_len
    # 2): 45 blocks, the last 2 symbols ('QR') dropped; block 39 (the 40th: stream positions
    # 117-119, 'A' tab 'B') held out.
    a = write(tmp, "a.txt", b"abcdefghijklmnopqrstuvwxyz" * 4 + b"abcdefghijklm")
    b = write(tmp, "b.txt", b"A\tB\nCDEFGHIJKLMNOPQR")
    c = text.load([a, b])
    expect_eq("slice length", len(c), 137)
    expect_eq("slice sizes", c.sizes, [117, 20])
    expect_eq("slice unknown", c.unknown, [0, 1])
    expect_eq("'a' is 67", c.symbols[0], 67)   # 2 + 0x61 - 0x20
    expect_eq("'A' tab 'B' newline", c.symbols[117:121], [35, 0, 36, 1])
    train, held_out = text.split(c, 2)
    expect_eq("held out", held_out, [[35, 0, 36]])
    expect_eq("train blocks", len(train), 44)
    expect_eq("train block 0 ('abc')", train[0], [67, 68, 69])
    expect_eq("train block 38 ('klm')", train[38], [77, 78, 79])
    expect_eq("train block 39 (newline 'CD', the stream's 41st)", train[39], [1, 37, 38])
    expect_eq("train block 43 ('NOP', the last)", train[43], [48, 49, 50])
    inputs, targets = text.pairs(held_out + train[:1])
    expect_eq("inputs", inputs, [[35, 0], [67, 68]])
    expect_eq("targets", targets, [[0, 36], [68, 69]])
    return a, b


def check_errors(tmp, a):
    missing = os.path.join(tmp, "nope.txt")
    expect_error("missing", "%s: no such file" % missing, text.load, [missing])
    license_path = os.path.join(text.DEFAULT_DIR, "NO-SUCH-LICENSE")
    expect_error("missing default file", "%s: no such file (package base-files ships it)" % license_path,
                 text.load, [license_path])
    empty = write(tmp, "empty.txt", b"")
    expect_error("empty", "%s: empty; got 0 bytes, expected text" % empty, text.load, [empty])
    binary = write(tmp, "binary.bin", b"\x1f\x7f" + b"x" * 18)   # 2 of 20 unknown: 10%
    expect_error("binary", "%s: not text; got 2 of 20 bytes outside newline and printable ASCII, expected at "
                 "most 5%%" % binary, text.load, [binary])
    expect_error("directory", "%s: cannot read: Is a directory" % tmp, text.load, [tmp])
    expect_error("several bad files", "%s: no such file\n%s: empty; got 0 bytes, expected text" % (missing, empty),
                 text.load, [missing, a, empty])
    expect_error("no files", "text: no files; expected at least one path", text.load, [])
    few = write(tmp, "few.txt", b"x" * 119)   # 39 blocks of 3
    expect_error("too little text", "%s: too little text to split; got 119 symbols, 39 blocks of 3, expected >= 40 "
                 "blocks" % few, text.split, text.load([few]), 2)
    expect_error("seq_len 0", "seq_len: out of range; got 0, expected >= 1", text.split, text.load([a]), 0)


def check_batches(a, b):
    """tta.py's TextBatches over the slice (torch needed): shapes, and each rank's shard."""
    try:
        import torch
        import tta
    except ImportError as e:
        print("note: %s; tta.py's batch checks not run" % e)
        return
    corpus = text.load([a, b])
    ranks = [tta.TextBatches(corpus, 2, 2, 1, r, 2) for r in range(2)]
    x, y = ranks[0].get(0)
    expect_eq("batch x shape", tuple(x.shape), (2, 2))
    expect_eq("batch y shape", tuple(y.shape), (2, 2))
    expect_eq("batch dtype", x.dtype, torch.int64)
    expect_eq("held-out x", ranks[0].eval_x.tolist(), [[35, 0]])
    expect_eq("held-out y", ranks[0].eval_y.tolist(), [[0, 36]])
    # 44 training blocks over 2 ranks of batch 2: 11 steps an epoch; the ranks' first two steps
    # cover 8 distinct blocks, and y is x shifted by one (block = x[0], then y).
    seen = []
    for r in ranks:
        for step in range(2):
            x, y = r.get(step)
            expect_eq("y follows x", x[:, 1:].tolist(), y[:, :-1].tolist())
            seen += [tuple(row) + (yy[-1],) for row, yy in zip(x.tolist(), y.tolist())]
    expect_eq("distinct blocks in an epoch", len(set(seen)), 8)
    try:
        tta.TextBatches(corpus, 2, 23, 1, 0, 2)
        fail("batch 23 over 44 blocks and 2 ranks", "no error", "ValueError")
    except ValueError as e:
        expect_eq("batch too large: message", str(e),
                  "--batch: too large; got 23, expected <= 22 (44 training sequences over 2 ranks)")


def check_shipped():
    """base-files 12.4's license texts: sizes as `wc -c` prints them; unknown bytes as `LC_ALL=C
    tr -d '\\n\\040-\\176' < FILE | wc -c` counts them (LGPL-2.1's form feeds, Artistic's tabs)."""
    if not all(os.path.exists(p) for p in text.DEFAULT_PATHS):
        print("note: some of %s absent; shipped-file checks not run" % ", ".join(text.DEFAULT_PATHS))
        return
    c = text.load()
    expect_eq("shipped sizes", c.sizes, [35149, 18092, 26530, 7652, 22955, 25755, 16726, 11358, 6111, 7048, 1499])
    expect_eq("shipped unknown", c.unknown, [0, 0, 9, 0, 0, 0, 0, 0, 30, 0, 0])
    train, held_out = text.split(c, 32)
    # 178,875 symbols // 33 = 5420 blocks (15 left over); every 40th held out: 135.
    expect_eq("shipped held out", len(held_out), 135)
    expect_eq("shipped train", len(train), 5285)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        check_vocabulary(tmp)
        a, b = check_slice(tmp)
        check_errors(tmp, a)
        check_batches(a, b)
    check_shipped()
    print("ok: text loader")


if __name__ == "__main__":
    main()
