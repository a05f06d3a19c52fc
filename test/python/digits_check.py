"""bench/python/digits.py, the digits loader of the time-to-accuracy harness: a small hand-made
slice (values, labels, the split), every malformed-file message pinned (file and line named), and,
when python3-sklearn's file is installed, its size and class counts. One process, no torch.

  digits_check.py            (PYTHONPATH must reach bench/python)

Expected values are written out by hand from the slice below, not computed with the loader.
Exits 1 on the first failed check, naming it.
"""

import gzip
import os
import tempfile

import digits
from expect import expect_eq, expect_raises, fail


def row(label, fill=0, first=None):
    """A CSV line: 64 pixels all `fill` (the first one `first` when given), then the label."""
    pixels = [fill] * 64
    if first is not None:
        pixels[0] = first
    return ",".join(str(v) for v in pixels + [label])


def expect_error(what, path, expected_message, **kwargs):
    """digits.load(path, **kwargs) refuses the file with exactly this message."""
    expect_raises(what, lambda: digits.load(path, **kwargs), digits.DigitsError, equals=expected_message)


def write(directory, name, text, compress=True):
    path = os.path.join(directory, name)
    data = text.encode("ascii")
    with open(path, "wb") as f:
        f.write(gzip.compress(data) if compress else data)
    return path


def check_slice(tmp):
    # 12 samples: labels 0,1,2,3 cycled three times, then 1, 1; pixel 0 of sample i is i % 17.
    labels = [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 1, 1]
    text = "".join(row(l, fill=(i % 3) * 8, first=i % 17) + "\n" for i, l in enumerate(labels))
    for compress in (True, False):
        d = digits.load(write(tmp, "slice.csv.gz" if compress else "slice.csv", text, compress))
        expect_eq("slice length (compress=%s)" % compress, len(d), 14)
        expect_eq("slice labels", d.labels, labels)
        expect_eq("sample 13 pixel 0", d.images[13][0], 13)
        expect_eq("sample 13 pixels 1..63", set(d.images[13][1:]), {8})   # fill (13 % 3) * 8
        expect_eq("sample 5 pixels", len(d.images[5]), 64)
    # Class 1 appears at indices 1, 5, 9, 12, 13: its 5th sample (index 13) is held out; no other
    # class reaches 5 samples.
    train, held_out = digits.split(d)
    expect_eq("held out", held_out, [13])
    expect_eq("train", train, list(range(13)))
    expect_eq("limit", len(digits.load(os.path.join(tmp, "slice.csv"), limit=3)), 3)


def check_errors(tmp):
    missing = os.path.join(tmp, "nope.csv.gz")
    expect_error("missing", missing, "%s: no such file" % missing)
    good = row(0)
    bad = write(tmp, "bad.csv.gz", "\n".join([good, good + ",3", good.replace(",0,", ",x,", 1), good]) + "\n")
    expect_error("bad lines", bad,
                 "%s:2: got 66 fields, expected 65 (64 pixels and a label)\n"
                 "%s:3: field 2: not an integer; got 'x'" % (bad, bad))
    ranges = write(tmp, "ranges.csv", row(0, first=17) + "\n" + row(10) + "\n", compress=False)
    expect_error("ranges", ranges,
                 "%s:1: field 1 (pixel): out of range; got 17, expected 0..16\n"
                 "%s:2: field 65 (label): out of range; got 10, expected 0..9" % (ranges, ranges))
    blank = write(tmp, "blank.csv.gz", good + "\n\n" + good + "\n")
    expect_error("blank line", blank, "%s:2: got 1 fields, expected 65 (64 pixels and a label)" % blank)
    many = write(tmp, "many.csv.gz", "".join("1,2\n" for _ in range(8)))
    expect_error("many bad lines", many, "\n".join(
        ["%s:%d: got 2 fields, expected 65 (64 pixels and a label)" % (many, n) for n in range(1, 6)]
        + ["%s: ... and 3 more bad lines" % many]))
    empty = write(tmp, "empty.csv.gz", "")
    expect_error("empty", empty, "%s: no samples; got an empty file, expected lines of 65 integers" % empty)
    truncated = os.path.join(tmp, "truncated.csv.gz")
    with open(truncated, "wb") as f:
        f.write(gzip.compress((good + "\n").encode())[:20])
    try:
        digits.load(truncated)
        fail("truncated gzip", "no error", "DigitsError")
    except digits.DigitsError as e:
        if not str(e).startswith(truncated + ": cannot read: "):
            fail("truncated gzip: message", str(e), truncated + ": cannot read: ...")
    binary = write(tmp, "binary.csv", "", compress=False)
    with open(binary, "wb") as f:
        f.write(b"0,1\xff\n")
    expect_error("binary", binary, "%s: not a text file; got byte 0xff at offset 3, expected ASCII CSV" % binary)
    few = write(tmp, "few.csv", "".join(row(l) + "\n" for l in range(4)), compress=False)
    try:
        digits.split(digits.load(few))
        fail("split of 4 samples", "no error", "DigitsError")
    except digits.DigitsError as e:
        expect_eq("split of 4 samples: message", str(e),
                  "%s: too few samples to split; got at most 1 of any class, expected >= 5 of some class" % few)


def check_shipped():
    """The file python3-sklearn 1.2.1 ships: 1797 samples; class counts as `zcat | cut -d, -f65 |
    sort | uniq -c` prints them."""
    if not os.path.exists(digits.DEFAULT_PATH):
        print("note: %s absent (python3-sklearn not installed); shipped-file checks not run" % digits.DEFAULT_PATH)
        return
    d = digits.load()
    expect_eq("shipped samples", len(d), 1797)
    counts = [d.labels.count(c) for c in range(10)]
    expect_eq("shipped class counts", counts, [178, 182, 177, 183, 181, 182, 181, 179, 174, 180])
    train, held_out = digits.split(d)
    # Per class floor(count / 5) held out: 35+36+35+36+36+36+36+35+34+36.
    expect_eq("shipped held out", len(held_out), 355)
    expect_eq("shipped train", len(train), 1797 - 355)
    expect_eq("disjoint", set(train) & set(held_out), set())


def main():
    with tempfile.TemporaryDirectory() as tmp:
        check_slice(tmp)
        check_errors(tmp)
    check_shipped()
    print("ok: digits loader")


if __name__ == "__main__":
    main()
