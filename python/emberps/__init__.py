"""emberps: Python access to EmberPS parameter servers.

    import emberps
    with emberps.Client(servers="127.0.0.1:7400") as c:
        rows = c.pull("emb", emberps.feature_keys(3, values))   # (n, dim) float32

Client: pull, push, lookup (and *_async futures), claim, tables, health (emberps.client).
feature_key, text_key, missing_key: the keys the C worker derives (emberps.keys).
EmberError: every failure, with the library's code, its name and the server's detail.
emberps.torch (imported on use, needs PyTorch): EmbeddingBag backed by the servers.
Docs: docs/python.md.
"""
from ._lib import LIBRARY_PATH, ffi, lib
from .client import Client, as_keys
from .errors import CODES, EmberError
from .keys import feature_key, missing_key, text_key

__version__ = "0.4.0"
LIBRARY_VERSION = ffi.string(lib.psc_version_string()).decode()


def feature_keys(field, values):
    """feature_key over a numpy uint64 array of values (one C loop)."""
    return feature_key(field, values)


__all__ = ["Client", "EmberError", "CODES", "feature_key", "feature_keys", "text_key",
           "missing_key", "as_keys", "LIBRARY_PATH", "LIBRARY_VERSION"]
