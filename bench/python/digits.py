"""The handwritten digits that Debian's python3-sklearn ships (UCI's optical recognition of
handwritten digits, test part: 1797 images of 8x8 pixels), read by our own code, not sklearn's.

  digits.load(path=DEFAULT_PATH) -> Digits      (raises DigitsError naming the file and line)
  digits.split(d) -> (train_indices, held_out_indices)

File contract (sklearn/datasets/data/digits.csv.gz): gzip-compressed (or plain, told apart by the
gzip magic bytes) CSV without a header; one sample per line, 65 comma-separated integers: 64
pixels row by row, each 0..16 (the count of set pixels of a 4x4 block of the 32x32 bitmap), then
the label 0..9. Blank lines are not allowed (a truncated or hand-edited file shows up as one).

The split is fixed, not random, and stratified: a sample is held out when it is its class's 5th,
10th, 15th, ... sample in file order (the shipped file: 1442 train, 355 held out, 34-36 of each
class). It depends on nothing but the file's contents, so every run, rank, arm and interpreter
sees the same split.

Pure Python (gzip, no torch), so the loader and its test run anywhere; bench/python/tta.py turns
the samples into tensors.
"""

import gzip
import os
import sys
import zlib

DEFAULT_PATH = "/usr/lib/python3/dist-packages/sklearn/datasets/data/digits.csv.gz"
PIXELS = 64          # 8 x 8
SIDE = 8
PIXEL_MAX = 16
CLASSES = 10
HELD_OUT_EVERY = 5   # every 5th sample of each class is held out
MAX_REPORTED = 5     # problems listed in one error; the rest are counted


class DigitsError(ValueError):
    """A missing, unreadable or malformed digits file; the message names the file and, for a
    malformed one, each bad line (1-based), in the shape `FILE:LINE: problem; got X, expected Y`."""


class Digits:
    """The samples of one file: images[i] is a tuple of PIXELS ints (0..PIXEL_MAX, row by row),
    labels[i] its int label (0..CLASSES-1); path is the file they came from."""

    def __init__(self, path, images, labels):
        self.path, self.images, self.labels = path, images, labels

    def __len__(self):
        return len(self.labels)


def _read_lines(path):
    """The file's text lines (gzip or plain); DigitsError when it cannot be opened or decoded."""
    if not os.path.exists(path):
        hint = " (install python3-sklearn: scripts/install-deps.sh)" if path == DEFAULT_PATH else ""
        raise DigitsError("%s: no such file%s" % (path, hint))
    try:
        with open(path, "rb") as f:
            raw = f.read()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        text = raw.decode("ascii")
    except (OSError, EOFError, zlib.error) as e:  # gzip.BadGzipFile is an OSError
        raise DigitsError("%s: cannot read: %s" % (path, e)) from None
    except UnicodeDecodeError as e:
        raise DigitsError("%s: not a text file; got byte 0x%02x at offset %d, expected ASCII CSV"
                          % (path, raw[e.start], e.start)) from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    return lines


def _parse_line(line):
    """(pixels, label) of one line, or a problem string `...; got X, expected Y`."""
    fields = line.rstrip("\r").split(",")
    if len(fields) != PIXELS + 1:
        return "got %d fields, expected %d (%d pixels and a label)" % (len(fields), PIXELS + 1, PIXELS)
    values = []
    for column, field in enumerate(fields, start=1):
        try:
            values.append(int(field))
        except ValueError:
            return "field %d: not an integer; got %r" % (column, field)
    for column, v in enumerate(values[:PIXELS], start=1):
        if not 0 <= v <= PIXEL_MAX:
            return "field %d (pixel): out of range; got %d, expected 0..%d" % (column, v, PIXEL_MAX)
    if not 0 <= values[PIXELS] < CLASSES:
        return "field %d (label): out of range; got %d, expected 0..%d" % (PIXELS + 1, values[PIXELS], CLASSES - 1)
    return tuple(values[:PIXELS]), values[PIXELS]


def load(path=DEFAULT_PATH, limit=None):
    """Every sample of the file (the first `limit` lines when given, for small slices). Validates
    the whole file (or slice) and reports up to MAX_REPORTED bad lines together, then the count."""
    lines = _read_lines(path)
    if limit is not None:
        lines = lines[:limit]
    if not lines:
        raise DigitsError("%s: no samples; got an empty file, expected lines of %d integers" % (path, PIXELS + 1))
    images, labels, problems = [], [], []
    for number, line in enumerate(lines, start=1):
        parsed = _parse_line(line)
        if isinstance(parsed, str):
            problems.append("%s:%d: %s" % (path, number, parsed))
        else:
            images.append(parsed[0])
            labels.append(parsed[1])
    if problems:
        more = len(problems) - MAX_REPORTED
        shown = problems[:MAX_REPORTED] + (["%s: ... and %d more bad lines" % (path, more)] if more > 0 else [])
        raise DigitsError("\n".join(shown))
    return Digits(path, images, labels)


def split(digits):
    """(train, held_out): lists of sample indices in file order; a sample is held out when it is
    the k-th sample of its class in file order with k % HELD_OUT_EVERY == 0 (k counted from 1).
    Raises when nothing would be held out (no class has HELD_OUT_EVERY samples)."""
    seen = [0] * CLASSES
    train, held_out = [], []
    for i, label in enumerate(digits.labels):
        seen[label] += 1
        (held_out if seen[label] % HELD_OUT_EVERY == 0 else train).append(i)
    if not held_out:
        raise DigitsError("%s: too few samples to split; got at most %d of any class, expected >= %d of some class"
                          % (digits.path, max(seen), HELD_OUT_EVERY))
    return train, held_out


def main(argv):
    """`digits.py [FILE]`: checks FILE (default DEFAULT_PATH) and prints its sizes; exit 1 with
    the loader's message when it is unusable, 2 on a usage error."""
    if len(argv) > 2:
        print("usage: digits.py [FILE]", file=sys.stderr)
        return 2
    path = argv[1] if len(argv) == 2 else DEFAULT_PATH
    try:
        d = load(path)
        train, held_out = split(d)
    except DigitsError as e:
        print(e, file=sys.stderr)
        return 1
    print("%s: %d samples, %d train, %d held out" % (path, len(d), len(train), len(held_out)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
