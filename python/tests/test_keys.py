"""Feature keys from Python equal the C derivation: the shared vectors (tests/data), which the C
unit test test_feature checks through pc_feature.h and libpsclient."""
import os

import numpy as np
import pytest

import emberps
from conftest import REPO

VECTORS = os.path.join(REPO, "tests", "data", "feature_keys.tsv")


def vectors():
    with open(VECTORS) as f:
        for line in f:
            if line.startswith("#") or not line.strip():
                continue
            kind, field, value, key = line.split()
            yield kind, int(field), value, int(key, 16)


def test_shared_vectors():
    n = 0
    for kind, field, value, key in vectors():
        if kind == "feature":
            got = emberps.feature_key(field, int(value, 16))
            arr = emberps.feature_keys(field, np.array([int(value, 16)] * 3, dtype=np.uint64))
            assert arr.dtype == np.uint64 and list(arr) == [key] * 3
        elif kind == "text":
            raw = b"" if value == "-" else bytes.fromhex(value)
            got = emberps.text_key(field, raw)
            try:
                assert emberps.text_key(field, raw.decode("utf-8")) == key  # str is UTF-8
            except UnicodeDecodeError:
                pass
        else:
            assert kind == "missing"
            got = emberps.missing_key(field)
        assert got == key, (kind, field, value)
        n += 1
    assert n >= 80


def test_bad_arguments():
    with pytest.raises(ValueError):
        emberps.feature_key(-1, 5)
    with pytest.raises(ValueError):
        emberps.feature_key(0, 2 ** 64)
    with pytest.raises(ValueError):
        emberps.feature_key(0, -1)
    with pytest.raises(TypeError):
        emberps.feature_keys(0, np.arange(4))  # int64, not uint64
    with pytest.raises(TypeError):
        emberps.text_key(0, 12)


def test_array_shapes():
    """An array of values gives keys of its shape: 0-d (it gave shape (1,)), 2-D, empty."""
    one = emberps.feature_key(3, 7)
    k0 = emberps.feature_key(3, np.array(7, dtype=np.uint64))
    assert k0.shape == () and int(k0) == one
    k2 = emberps.feature_key(3, np.full((2, 3), 7, dtype=np.uint64))
    assert k2.shape == (2, 3) and (k2 == one).all()
    assert emberps.feature_key(3, np.empty(0, dtype=np.uint64)).shape == (0,)
