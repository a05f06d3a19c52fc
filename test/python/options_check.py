"""cupcake.SessionOptions: the timeout is in microseconds (ready_timeout_us, as in C++ and C), and
the earlier ready_timeout_s still works for one release, as seconds, with a DeprecationWarning.
Needs neither MPI nor torch: no session is made."""

import warnings

import cupcake
from expect import check


o = cupcake.SessionOptions()
check(o.ready_timeout_us == 60e6, "default ready_timeout_us %r, expected 60e6" % o.ready_timeout_us)
o.ready_timeout_us = 2.5e6
check(o.ready_timeout_us == 2.5e6, "ready_timeout_us did not keep 2.5e6")

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    o.ready_timeout_s = 30
    check(o.ready_timeout_us == 30e6, "ready_timeout_s = 30 gave ready_timeout_us %r, expected 30e6" % o.ready_timeout_us)
    seconds = o.ready_timeout_s
    check(seconds == 30, "ready_timeout_s read back %r, expected 30" % seconds)
check(len(caught) == 2 and all(issubclass(w.category, DeprecationWarning) for w in caught),
      "expected 2 DeprecationWarnings, got %r" % [str(w.message) for w in caught])
check(str(caught[0].message) ==
      "SessionOptions.ready_timeout_s is deprecated; use ready_timeout_us (microseconds)",
      "warning text %r" % str(caught[0].message))

with warnings.catch_warnings():
    warnings.simplefilter("error")
    try:
        o.ready_timeout_s = 1
        check(False, "no DeprecationWarning raised under -W error")
    except DeprecationWarning:
        pass
print("ok: SessionOptions timeout units")
