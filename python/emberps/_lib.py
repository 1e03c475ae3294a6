"""The C ABI of libpsclient (emberps/psclient.h), loaded with cffi in ABI mode.

DESIGN: the declarations below are the subset of psclient.h this package calls, copied as cffi
parses them (no preprocessor): a struct's layout must match the header of the major version
checked at load time (psc_version() >> 16 == 1, minor >= 4 for the cluster calls and keys).
The library is found, in order: $EMBERPS_LIBPSCLIENT (a path), the copy installed inside the
package (pip install ./python puts one there), the repository's build tree (python/../build/lib,
for a source checkout), then the system's (ldconfig: `cmake --install` of the project). cffi
releases the GIL around every C call, so blocking calls of several Python threads overlap.
"""
import ctypes.util
import os

import cffi

ABI_MAJOR = 1
ABI_MINOR_MIN = 4  # psc_tables, psc_health, the feature keys
ABI_MINOR_WIRE = 5  # psc_set_wire_type: compressed rows on the wire (Client(wire_dtype=...))
ABI_MINOR_UNCLEAN = 6  # psc_map_unclean_slots (Client.stats()'s unclean_slots)

CDEF = """
unsigned int psc_version(void);
const char *psc_version_string(void);
const char *psc_strerror(int err);
const char *psc_err_name(int err);

typedef struct psc psc_t;
typedef struct psc_opts {
    const char *servers;
    const char *token;
    int timeout_ms;
    int max_inflight;
    int retries;
    int connect_timeout_ms;
} psc_opts_t;
typedef struct psc_tls_opts {
    const char *ca;
    const char *cert;
    const char *key;
    const char *server_name;
} psc_tls_opts_t;
int psc_connect2(const psc_opts_t *o, const psc_tls_opts_t *tls, char *why, size_t cap,
                 psc_t **out);
void psc_close(psc_t *c);

typedef struct psc_push_result {
    uint64_t applied, skipped_nonfinite, dropped_unadmitted;
} psc_push_result_t;
typedef void (*psc_done_fn)(void *ctx, uint64_t id, int rc);
int psc_pull_async(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
                   float *rows, psc_done_fn done, void *ctx, uint64_t *id);
int psc_push_async(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
                   const float *grads, psc_push_result_t *res, psc_done_fn done, void *ctx,
                   uint64_t *id);
int psc_lookup_async(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
                     float *rows, uint8_t *found, psc_done_fn done, void *ctx, uint64_t *id);
int psc_pull(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
             float *rows);
int psc_wait_detail(psc_t *c, uint64_t id, char *buf, size_t cap);

typedef struct psc_claim {
    int action;
    uint32_t dim;
    uint64_t rows, version;
    char previous[128];
    char config[2048];
    char message[600];
} psc_claim_t;
int psc_claim(psc_t *c, const char *table, const char *job, int mode, psc_claim_t *out);

int psc_tables(psc_t *c, char *buf, size_t cap, size_t *len);
typedef struct psc_server_health {
    char addr[128];
    int rc;
    uint32_t rtt_us;
    char message[512];
} psc_server_health_t;
int psc_health(psc_t *c, int timeout_ms, psc_server_health_t *out, size_t cap);

uint64_t psc_feature_key(uint32_t field, uint64_t value);
void psc_feature_keys(uint32_t field, const uint64_t *values, size_t n, uint64_t *out);
uint64_t psc_text_key(uint32_t field, const char *value, size_t len);
uint64_t psc_missing_key(uint32_t field);
size_t psc_map_text(psc_t *c, char *buf, size_t cap);
uint64_t psc_map_unclean_slots(psc_t *c);
int psc_set_wire_type(psc_t *c, int type);
int psc_wire_type(psc_t *c);

typedef struct psc_stats {
    uint64_t calls, retries, map_refreshes, reconnects, timeouts;
} psc_stats_t;
void psc_stats(psc_t *c, psc_stats_t *out);
"""

ffi = cffi.FFI()
ffi.cdef(CDEF)

_HERE = os.path.dirname(os.path.abspath(__file__))
SONAME = "libpsclient.so.%d" % ABI_MAJOR


def _candidates():
    env = os.environ.get("EMBERPS_LIBPSCLIENT")
    if env:
        yield env, "$EMBERPS_LIBPSCLIENT"
        return
    yield os.path.join(_HERE, SONAME), "the package"
    yield os.path.join(_HERE, "..", "..", "build", "lib", SONAME), "the source tree's build"
    found = ctypes.util.find_library("psclient")
    if found:
        yield found, "the system"


def _load():
    tried = []
    for path, where in _candidates():
        if "/" in path and not os.path.exists(path):
            tried.append("%s (%s): no such file" % (path, where))
            continue
        try:
            lib = ffi.dlopen(path)
        except OSError as e:
            tried.append("%s (%s): %s" % (path, where, e))
            continue
        v = lib.psc_version()
        if v >> 16 != ABI_MAJOR or (v >> 8) & 0xFF < ABI_MINOR_MIN:
            tried.append("%s (%s): version %s, this package needs %d.%d or a later %d.x" % (
                path, where, ffi.string(lib.psc_version_string()).decode(), ABI_MAJOR,
                ABI_MINOR_MIN, ABI_MAJOR))
            continue
        return lib, path
    raise ImportError(
        "emberps: cannot load libpsclient (build it with `cmake --build build --target "
        "psclient_shared`, or set EMBERPS_LIBPSCLIENT to its path); tried: " + "; ".join(tried))


lib, LIBRARY_PATH = _load()


def err_name(rc):
    return ffi.string(lib.psc_err_name(rc)).decode()


def strerror(rc):
    return ffi.string(lib.psc_strerror(rc)).decode()
