"""The checks test/python's scripts share. A failed check prints `FAIL: ...` naming what was
checked and exits 1. A script imports it from its own directory (the first entry of sys.path when
a script is run), so no PYTHONPATH needs to reach test/python."""

import re
import sys


def fail(what, got, expected):
    print("FAIL: %s; got %r, expected %r" % (what, got, expected))
    sys.exit(1)


def check(ok, what, rank=None):
    """`what` says what was expected; a job under mpirun passes its rank, named in the message."""
    if not ok:
        print("FAIL: %s%s" % ("" if rank is None else "rank %d: " % rank, what))
        sys.exit(1)


def expect_eq(what, got, expected):
    if got != expected:
        fail(what, got, expected)


def expect_raises(what, fn, error_type, *, equals=None, contains=None, pattern=None):
    """Calls fn(), which must raise error_type with a message that equals `equals`, contains
    `contains` or matches the regular expression `pattern` (re.search): exactly one of the three.
    Returns the exception."""
    if [equals, contains, pattern].count(None) != 2:
        raise TypeError("expect_raises: expected exactly one of equals, contains and pattern")
    try:
        fn()
    except error_type as e:
        message = str(e)
        if equals is not None:
            expect_eq(what + ": message", message, equals)
        elif contains is not None:
            check(contains in message, "%s: message %r, expected it to contain %r" % (what, message, contains))
        else:
            check(re.search(pattern, message), "%s: message\n  %s\ndoes not match\n  %s" % (what, message, pattern))
        return e
    fail(what, "no error", error_type.__name__)


def check_in_place(opt, rank=None):
    """DistributedOptimizer `opt` copies no gradient: every p.grad is the next slice of one flat
    buffer on the parameters' device, in the session's order, and the session needs no fusion
    buffer for it."""
    state = opt._cupcake
    check(state.flat.device == state.device, "the flat gradient buffer is on %s, the parameters on %s"
          % (state.flat.device, state.device), rank)
    check(state.session.fusion_bytes == 0,
          "fusion_bytes %d, expected 0 (gradients registered in place)" % state.session.fusion_bytes, rank)
    at = state.flat.data_ptr()
    for k in state.order:
        name, p = state.named[k]
        check(p.grad.data_ptr() == at, "'%s'.grad is not the next slice of the flat buffer" % name, rank)
        at += p.numel() * 4
