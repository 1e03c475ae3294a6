"""Feature keys: the 64-bit table keys ps-worker derives from a sample's categorical values.

The derivation is libpsclient's (psc_feature_key and friends, the C worker's own functions), so a
Python caller names exactly the rows a C worker trains: key = XXH3(value XOR (field + 1) *
0x9E3779B97F4A7C15, seed "feature_"); a text value is first hashed to a number with the same
seed; an empty field gets the key of the value 2^40. A stable format (docs/python.md).
"""
import numpy as np

from ._lib import ffi, lib

FIELDS_MAX = 1024  # fields the parsers number (pc_feature.h); the functions take any uint32


def _field(field):
    if not isinstance(field, (int, np.integer)) or not 0 <= int(field) < 2 ** 32:
        raise ValueError("field must be an int in [0, 2^32), got %r" % (field,))
    return int(field)


def feature_key(field, value):
    """The key of numeric categorical `value` (a Criteo hex value as int, a libsvm index) of
    `field`. `value` may be an int in [0, 2^64) or a numpy array of uint64 (-> array of keys)."""
    f = _field(field)
    if isinstance(value, np.ndarray):
        if value.dtype != np.uint64:
            raise TypeError("values must be a numpy uint64 array, got %s" % value.dtype)
        vals = np.ascontiguousarray(value).reshape(-1)  # (ascontiguousarray makes 0-d 1-d)
        out = np.empty(value.shape, dtype=np.uint64)  # the values' shape, 0-d included
        lib.psc_feature_keys(f, ffi.from_buffer("uint64_t[]", vals), vals.size,
                             ffi.from_buffer("uint64_t[]", out.reshape(-1), require_writable=True))
        return out
    if not isinstance(value, (int, np.integer)) or not 0 <= int(value) < 2 ** 64:
        raise ValueError("value must be an int in [0, 2^64), got %r" % (value,))
    return int(lib.psc_feature_key(f, int(value)))


def text_key(field, value):
    """The key of a categorical value given as text (str, UTF-8 encoded) or bytes."""
    f = _field(field)
    if isinstance(value, str):
        value = value.encode("utf-8")
    if not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError("value must be str or bytes, got %s" % type(value).__name__)
    b = bytes(value)
    return int(lib.psc_text_key(f, b, len(b)))


def missing_key(field):
    """The key of `field` left empty (one per field)."""
    return int(lib.psc_missing_key(_field(field)))
