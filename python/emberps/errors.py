"""EmberPS errors as Python exceptions.

Every failure of a call is an `EmberError` carrying the library's code (`code`, a negative int),
its stable name (`name`, "PC_EDIM") and the detail line of the call (`detail`: which server and
what it said). The codes come from the C library's one error table at import time, so this
module declares none of them: `emberps.errors.PC_EDIM` is read from libpsclient.
"""
from ._lib import err_name, lib, strerror


class EmberError(Exception):
    """A failed EmberPS call: `code` (int < 0), `name` ("PC_ETIMEDOUT"), `detail` (one line)."""

    def __init__(self, code, detail=""):
        self.code = code
        self.name = err_name(code)
        self.detail = detail or strerror(code)
        super().__init__("%s: %s" % (self.name, self.detail))

    def __reduce__(self):
        # pickled (multiprocessing, DataLoader workers) and copied from its code and detail:
        # args holds the message only, which is not a code
        return (EmberError, (self.code, self.detail))


def _codes():
    out = {}
    for rc in range(-1, -256, -1):
        name = err_name(rc)
        if name == "PC_UNKNOWN":
            break
        out[name] = rc
    return out


CODES = _codes()
globals().update(CODES)


def check(rc, detail=""):
    """Raise EmberError for rc < 0; return rc otherwise."""
    if rc < 0:
        raise EmberError(rc, detail)
    return rc
