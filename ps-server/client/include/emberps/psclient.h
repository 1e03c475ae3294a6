/* emberps/psclient.h: the C client of EmberPS servers' binary data plane (libpsclient).
 *
 * A client connects to every server of the cluster map, splits each batch by key slot, sends
 * the parts to their servers concurrently (at most `max_inflight` requests in flight per
 * server, the rest queued), and reassembles rows in the caller's key order. Every call has a
 * deadline. Transient failures (a server unreachable or restarting, a stale cluster map) are
 * retried with exponential backoff up to `retries` times; on PC_EWRONGSLOT the client adopts the
 * server's newer map, reconnects as needed and resends the affected keys only (not counted
 * against `retries`: only the deadline ends it).
 *
 * Errors are negative ints from EmberPS's one error table (stable values): PC_ETIMEDOUT,
 * PC_EUNAVAIL, PC_EAUTH, PC_ETLS (TLS handshake), PC_ENOTFOUND (no such table), PC_EDIM,
 * PC_EINVAL, PC_ETOOBIG, PC_ENOSPC, ... psc_err_name(rc) gives the name, psc_strerror(rc) the
 * message. Inside the project the codes are pc_error.h's enum; this header stands alone
 * (installed with libpsclient, nothing else). A code says what kind of failure;
 * psc_wait_detail (psc_connect2 for connecting) says which server and the server's own message
 * (the table, both dims, ...): log that where the error is handled.
 *
 * Thread rules: a client is thread-safe; any thread may start calls. Callbacks run on the
 * client's I/O thread: they must be short and must not wait for other calls of the same client.
 * Buffers passed to an async call (keys, rows, grads, found, result) must stay valid until the
 * call completes (callback ran or psc_wait returned); after a timeout the client no longer
 * touches them. A push that failed may have been applied on some servers (per-server parts are
 * independent); a push is never sent twice to a server that answered it.
 *
 * ABI: libpsclient.so.<PSC_VERSION_MAJOR> exports the psc_* functions below and nothing else.
 * Any change that breaks a caller built against an older header (a function's signature, a
 * public struct's layout, a removed function) raises PSC_VERSION_MAJOR, and with it the soname;
 * added functions raise PSC_VERSION_MINOR. A binding checks psc_version() >> 16 at load time.
 */
#ifndef EMBERPS_PSCLIENT_H
#define EMBERPS_PSCLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The one declaration of the library's version (CMake reads it for the soname). Minor versions:
 * 1 psc_claim; 2 psc_wait_detail; 3 psc_connect2 (TLS); 4 psc_tables, psc_health, feature keys,
 * the delta stream (psc_deltas, psc_scan); 5 compressed rows on the wire (psc_set_wire_type);
 * 6 psc_map_unclean_slots, and the map text's unclean=N (a client before 1.6 cannot parse a map
 * that carries it: it keeps its map; docs/wire.md); 7 psc_fence (generation fences). */
#define PSC_VERSION_MAJOR 1 /* the ABI version: libpsclient.so.1 */
#define PSC_VERSION_MINOR 7
#define PSC_VERSION_PATCH 0
#define PSC_VERSION_HEX   ((PSC_VERSION_MAJOR << 16) | (PSC_VERSION_MINOR << 8) | PSC_VERSION_PATCH)

/* Marks the exported functions (the shared library is built with hidden visibility). */
#if defined(__GNUC__)
#define PSC_EXTERN __attribute__((visibility("default")))
#else
#define PSC_EXTERN
#endif

/* The version of the library loaded at run time, as PSC_VERSION_HEX computes it. */
PSC_EXTERN unsigned int psc_version(void);
/* The same as "MAJOR.MINOR.PATCH"; static storage, never NULL. */
PSC_EXTERN const char *psc_version_string(void);

/* Message for an error code ("unknown error" for a value not in the table); name of a code
 * ("PC_ETIMEDOUT"; "PC_OK" for 0, "PC_UNKNOWN" otherwise). Static storage, never NULL;
 * thread-safe. */
PSC_EXTERN const char *psc_strerror(int err);
PSC_EXTERN const char *psc_err_name(int err);

typedef struct psc psc_t;

typedef struct psc_opts {
    const char *servers;    /* a cluster map text, or "host:port" of any server (its map is used) */
    const char *token;      /* NULL: none */
    int timeout_ms;         /* per call, default 10000 */
    int max_inflight;       /* per server, default 8 */
    int retries;            /* on transient errors, default 3 */
    int connect_timeout_ms; /* psc_connect's wait for every server, default 5000 */
} psc_opts_t;

/* Connect to every server of the map (and authenticate), over plain TCP: psc_connect2 with
 * tls NULL and no detail buffer (the reason of a failure is logged). It waits for the servers
 * with a role (primary or backup of some slot) in the newest map it knows (a server's answer may
 * bring a newer one than the caller's); one listed with none (a dead server a failover left in
 * the map, one added for a resharding) is connected to but not waited for, and a failure there
 * does not fail the connect (since 1.6.1; before, a dead one did). */
PSC_EXTERN int psc_connect(const psc_opts_t *o, psc_t **out);

/* TLS for the data plane (servers started with a certificate: docs/wire.md "TLS"). A separate
 * struct, not new fields of psc_opts_t: callers allocate psc_opts_t, so growing it would change
 * its layout under programs built against 1.x. A future field comes with a new struct and
 * function the same way. Paths are borrowed for the psc_connect2 call only (the files are read
 * then). */
typedef struct psc_tls_opts {
    const char *ca;   /* PEM CA bundle the servers' certificates must chain to (required) */
    const char *cert; /* PEM client certificate, for servers that ask for one (NULL: none) */
    const char *key;  /* its PEM private key (with cert) */
    /* The name every server's certificate must carry (NULL or "": each server's address from
     * the cluster map, checked against the certificate's IP addresses). */
    const char *server_name;
} psc_tls_opts_t;

/* psc_connect with TLS (tls non-NULL: every connection is TLS 1.2 or newer, the servers'
 * certificates verified against tls->ca and their names checked; NULL: plain TCP) and the reason
 * of a failure, one line naming the server, in why[0..cap) (truncated, always terminated, ""
 * on success; why may be NULL with cap 0):
 *   "127.0.0.1:7400: TLS: certificate verify failed: unable to get local issuer certificate"
 *   "127.0.0.1:7400: authentication failed: bad token"
 * Errors as psc_connect's, and PC_ETLS (-25) for a handshake that failed (an unverified server
 * certificate, a missing or refused client certificate, a server that does not speak TLS, or a
 * client speaking plaintext to a TLS server), PC_ENOTFOUND for a TLS file that does not exist.
 * (Since 1.3.) */
PSC_EXTERN int psc_connect2(const psc_opts_t *o, const psc_tls_opts_t *tls, char *why, size_t cap,
                            psc_t **out);
/* Fail calls still running with PC_ECANCELED (threads waiting in psc_wait get it, and are
 * waited for), close connections, free. NULL is a no-op. Not from a done callback (the
 * client's own thread: refused, logged). */
PSC_EXTERN void psc_close(psc_t *c);

typedef struct psc_push_result {
    uint64_t applied, skipped_nonfinite, dropped_unadmitted;
} psc_push_result_t;

/* ---- blocking calls ----
 * PC_ETOOBIG (nothing sent) for a call whose request would exceed a frame's 4 GiB body (keys
 * and, for a push, f32 gradients); servers take at most --max-body-bytes (256 MiB by default)
 * a server. */
PSC_EXTERN int psc_pull(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
                        float *rows);
PSC_EXTERN int psc_push(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
                        const float *grads, psc_push_result_t *res /* may be NULL */);
PSC_EXTERN int psc_lookup(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
                          float *rows, uint8_t *found /* may be NULL */);

/* ---- asynchronous calls ----
 * Each returns 0 and a call id, or an error (nothing started). With `done` set, the callback
 * gets the call's result and the id must not be waited for; without it, psc_wait(id) must be
 * called exactly once. */
typedef void (*psc_done_fn)(void *ctx, uint64_t id, int rc);

PSC_EXTERN int psc_pull_async(psc_t *c, const char *table, const uint64_t *keys, size_t n,
                              uint32_t dim, float *rows, psc_done_fn done, void *ctx, uint64_t *id);
PSC_EXTERN int psc_push_async(psc_t *c, const char *table, const uint64_t *keys, size_t n,
                              uint32_t dim, const float *grads, psc_push_result_t *res,
                              psc_done_fn done, void *ctx, uint64_t *id);
PSC_EXTERN int psc_lookup_async(psc_t *c, const char *table, const uint64_t *keys, size_t n,
                                uint32_t dim, float *rows, uint8_t *found, psc_done_fn done,
                                void *ctx, uint64_t *id);

/* ---- table lifecycle ----
 * A training job claims its table on every server before it trains it, so that two jobs do not
 * silently train one table's rows. Modes: PSC_CLAIM_CHECK refuses a table whose rows another
 * job (or a client that claimed nothing) trained, with PC_EOWNED; PSC_CLAIM_WARM_START takes
 * such a table over with its rows; PSC_CLAIM_FRESH replaces its rows by new ones (with job "",
 * the table is left without an owner: an operator's reset); PSC_CLAIM_INSPECT changes nothing
 * and only describes the table (job may be ""). A job that owns the table already (a restarted
 * worker, every worker of one job) continues. */
enum { PSC_CLAIM_CHECK = 0, PSC_CLAIM_WARM_START = 1, PSC_CLAIM_FRESH = 2, PSC_CLAIM_INSPECT = 3 };
/* What the claim did: the strongest across servers (reset > warm-started > new > continued). */
enum {
    PSC_CLAIMED_NEW = 0,
    PSC_CLAIMED_CONTINUED = 1,
    PSC_CLAIMED_WARM_STARTED = 2,
    PSC_CLAIMED_RESET = 3,
    PSC_CLAIMED_NONE = 4
};

typedef struct psc_claim {
    int action;             /* PSC_CLAIMED_* */
    uint32_t dim;           /* the table's */
    uint64_t rows, version; /* rows and push calls before the claim, summed over servers */
    char previous[128];     /* the owner before the claim ("" none) */
    char config[2048];      /* the table's settings, "name=emb,dim=16,optimizer=adagrad,..." */
    char message[600];      /* on failure: psc_wait_detail's line (the server's address first) */
} psc_claim_t;

/* Claim `table` for `job` (at most 127 bytes) on every server with a role (as psc_tables);
 * blocking. Errors: PC_EOWNED (the
 * message names the owner), PC_ENOTFOUND (no such table on some server), PC_ESTATE (servers
 * disagree on the table's settings, or a cold table cannot be reset), PC_EINVAL, the transport's
 * errors. Claims are not retried. Thread-safe. */
PSC_EXTERN int psc_claim(psc_t *c, const char *table, const char *job, int mode, psc_claim_t *out);

/* ---- generation fences (since 1.7; docs/wire.md "Generation fences") ----
 * A job whose group of workers re-forms (a worker lost, restarted, taken over) fences its table
 * at the new generation's epoch (> 0, rising with each generation): every server with a role
 * keeps the higher epoch, and refuses pushes stamped with a lower one with PC_EFENCED, so a
 * worker the group left behind (stopped, cut off, then back) cannot push into the rows the new
 * generation trains or restored. The claim is of PSC_CLAIM_FENCE's kind: `job` must own the
 * table already (else PC_EOWNED, the message naming the owner). On success, every push this
 * client starts from then on carries `epoch`; on failure, none (pushes are not fenced: a server
 * that did not take the fence must not refuse the job's own pushes). Pushes without an epoch (a
 * client that never fenced) are never refused for it. Blocking; thread-safe. */
enum { PSC_CLAIM_FENCE = 4 };
PSC_EXTERN int psc_fence(psc_t *c, const char *table, const char *job, uint32_t epoch,
                         psc_claim_t *out);

/* ---- compressed rows on the wire (since 1.5; docs/wire.md "Compressed rows") ----
 * Pulls, lookups and pushes may travel as 16-bit floats: half the bytes of rows and gradients.
 * The caller still gives and gets fp32: the client converts (rounding to nearest, ties to even;
 * NaN and Inf kept; fp16 saturates to +-Inf beyond +-65504, and its smallest normal is 6.1e-5,
 * below which precision falls off: bf16 keeps fp32's range with 8 bits of precision, fp16 has 11
 * bits over a narrow range). The servers convert at their end, their tables and optimizers
 * staying fp32. A pushed fp16 gradient over 65504 in magnitude arrives as Inf and is skipped
 * (counted in skipped_nonfinite). Servers older than this (wire v1 only) refuse such calls with
 * PC_EUNSUPPORTED (psc_wait_detail says so), never with wrong rows. */
enum { PSC_WIRE_F32 = 0, PSC_WIRE_BF16 = 1, PSC_WIRE_F16 = 2 };

/* The element type of the rows and gradients of every pull, push and lookup this client starts
 * from now on (calls already started keep theirs); PSC_WIRE_F32 (the default) is the exact
 * format. PC_EINVAL for another value. Thread-safe. (Since 1.5.) */
PSC_EXTERN int psc_set_wire_type(psc_t *c, int type);
/* The client's element type (PSC_WIRE_*). (Since 1.5.) */
PSC_EXTERN int psc_wire_type(psc_t *c);

/* Wait for call `id` (started without a callback) and return its result. */
PSC_EXTERN int psc_wait(psc_t *c, uint64_t id);

/* psc_wait that also says why call `id` failed: one line naming the server, copied into
 * buf[0..cap) (truncated, always terminated; "" when the call succeeded; buf may be NULL with
 * cap 0). The first failure that decided the result is given, with the server's own message:
 *   "127.0.0.1:7401: wrong dimension: table emb has dim 16, request 8"
 *   "127.0.0.1:7401: not found: no table nope"
 *   "127.0.0.1:7401: service unavailable: connection refused (failing for 0.3 s) (gave up after
 *    4 attempts)"
 *   "timed out after 5000 ms; no answer from 127.0.0.1:7401 (connected)"
 * Two uses: instead of psc_wait for a call started without a callback (it waits and takes the
 * result the same way; psc_wait must not be called for it too), or from inside the done
 * callback of call `id` itself (on the I/O thread), where it returns at once. PC_EINVAL for an
 * unknown id, a result already taken, a call with a callback asked from anywhere else, or a
 * wait from a done callback for another call still running (it would never end; logged). The
 * blocking calls (psc_pull, psc_claim, ...) from a done callback are refused the same way before
 * they send anything. (Since 1.2.) */
PSC_EXTERN int psc_wait_detail(psc_t *c, uint64_t id, char *buf, size_t cap);

/* ---- the cluster (since 1.4) ---- */

/* Every table's settings text, one line each ("name=emb,dim=16,optimizer=adagrad,...\n"), in
 * name order, as the servers with a role hold them (a server with none is not asked: psc_connect);
 * blocking. The text is terminated in buf[0..cap) and
 * *len gets its length; PC_ETOOBIG (and the length needed in *len) when cap <= the length.
 * PC_ESTATE when the servers do not hold the same tables with the same settings; the
 * transport's errors. Thread-safe. */
PSC_EXTERN int psc_tables(psc_t *c, char *buf, size_t cap, size_t *len);

/* One server's answer to psc_health. */
typedef struct psc_server_health {
    char addr[128];    /* "host:port", from the cluster map */
    int rc;            /* 0: it answered; PC_ETIMEDOUT, PC_EUNAVAIL, PC_EAUTH, PC_ETLS: why not */
    uint32_t rtt_us;   /* the round trip of its answer (0 when none) */
    char message[512]; /* "" or why not, one line */
} psc_server_health_t;

/* Ask every server of the map for a round trip (PING), waiting at most timeout_ms; out[i] gets
 * the map's i-th server (up to cap of them). Returns the number of servers in the map (more
 * than cap: the rest are not described), or PC_EINVAL / PC_ECANCELED. A server that does not
 * answer is a result (its rc), not an error of the call. Thread-safe. */
PSC_EXTERN int psc_health(psc_t *c, int timeout_ms, psc_server_health_t *out, size_t cap);

/* ---- the delta stream (since 1.4; docs/wire.md "The delta stream") ----
 * A follower of a table (a serving replica, a backup) reads each server's changes in order: the
 * keys changed since a position, each with its row as the server holds it now (found 0: the key
 * is gone, erased or evicted). When it fell too far behind (PC_ERANGE) or the table was replaced
 * (PC_ESTATE: another uid), it scans the table again in parts and continues from the position
 * the scan returned. Rows a pull created and nothing changed since are not in the stream: they
 * are the table's deterministic initial rows, which a follower computes itself. */
typedef struct psc_stream_req {
    uint32_t server;   /* the server asked: its index in the cluster map (psc_map_text) */
    const char *table; /* its table */
    uint32_t dim;      /* the table's dim (a bounds query, cap 0: may be 0, any dim) */
    uint64_t uid;      /* the table followed (psc_stream_t.uid); 0: whatever table has the name */
    uint64_t from;     /* psc_deltas: the position to read from (0 at first) */
    uint32_t part;     /* psc_scan: this part of `parts` (keys by slot hash) */
    uint32_t parts;
    uint32_t cap;   /* rows the buffers hold (psc_deltas returns at most this many; 0: the
                     * bounds query below, buffers may be NULL) */
    uint64_t *keys; /* cap keys */
    uint8_t *found; /* cap flags */
    float *rows;    /* cap x dim */
} psc_stream_req_t;

typedef struct psc_stream {
    uint64_t uid;          /* the table's identity (a new one when it is replaced or reset) */
    uint64_t from, next;   /* the positions read: [from, next); scan: next = where to go on */
    uint64_t head, oldest; /* the server's log: the next position, the oldest still held; both
                            * 0: the table keeps no log (none started yet, or the server
                            * starts none) */
    uint32_t n;            /* rows in the buffers */
} psc_stream_t;

/* The changes of q->table at server q->server from q->from: up to q->cap keys with found and
 * rows; out->next is where to continue (out->n == 0 and next == head: caught up). A server
 * starts a table's change log when a follower first asks for it: the first psc_deltas (or
 * psc_scan) of a table starts it, and psc_deltas answers PC_ERANGE then (the log holds nothing
 * from before: scan first); a started log's positions begin far above 0, so a position from
 * before it (0 included) is PC_ERANGE too. Errors: PC_ERANGE (q->from is not held: older than
 * the oldest position, or the log just started: scan again), PC_ESTATE (the table was replaced
 * since uid), PC_EUNSUPPORTED (the server keeps no change logs), PC_ENOTFOUND, PC_EDIM,
 * PC_EINVAL (bad arguments, a server index the map does not have), the transport's. why (may
 * be NULL with cap 0) gets the detail line. Blocking; thread-safe.
 *
 * Bounds query (since 1.4): q->cap 0 (keys, found, rows may be NULL; dim 0 accepts any) reads
 * no rows, never answers PC_ERANGE and starts no log: out->uid is the table's, out->head and
 * out->oldest its log's bounds (n 0, from = next = q->from), both 0 when it keeps no log
 * (PC_ESTATE still when q->uid names a table replaced since; uid 0 asks about any). A
 * trainer stamps what it publishes (a dense model) with the heads of every server as a sparse
 * watermark: a head H says the rows of that server include every change before H; a head 0
 * says there is no log, so any follower that starts later scans the table after now, and its
 * rows are newer than the watermark. */
PSC_EXTERN int psc_deltas(psc_t *c, const psc_stream_req_t *q, psc_stream_t *out, char *why,
                          size_t cap);
/* Every row of q->table at q->server whose key is in part q->part of q->parts; out->next is the
 * position to follow with psc_deltas. PC_ETOOBIG (a part holds more than cap rows, or than a
 * reply may carry: use more parts), PC_EUNSUPPORTED (a cold table), the errors of psc_deltas. */
PSC_EXTERN int psc_scan(psc_t *c, const psc_stream_req_t *q, psc_stream_t *out, char *why,
                        size_t cap);

/* ---- feature keys (since 1.4) ----
 * The keys ps-worker derives from a sample's categorical values, so that a caller in another
 * language names the same rows (a stable format: docs/data.md, docs/python.md). Pure functions. */
/* The key of value `value` (a Criteo 8-hex-digit value, a libsvm/libffm index) of `field`. */
PSC_EXTERN uint64_t psc_feature_key(uint32_t field, uint64_t value);
/* out[i] = psc_feature_key(field, values[i]) for i < n. */
PSC_EXTERN void psc_feature_keys(uint32_t field, const uint64_t *values, size_t n, uint64_t *out);
/* The key of a categorical value given as bytes (CSV columns): value[0..len), not terminated. */
PSC_EXTERN uint64_t psc_text_key(uint32_t field, const char *value, size_t len);
/* The key of `field` left empty (one per field). */
PSC_EXTERN uint64_t psc_missing_key(uint32_t field);

/* The cluster map the client uses now, as text (snprintf-like return). */
PSC_EXTERN size_t psc_map_text(psc_t *c, char *buf, size_t cap);
/* Since 1.6: slots of the cluster whose rows went back (promoted to a backup that had not caught
 * up, or held alone by a server that restarted from its checkpoint), over the history of the map
 * the client uses now (its `unclean=N`; docs/server.md "Which backup is promoted"). It only grows:
 * when it does, rows of those slots may have gone back to older values (or their initial ones), and
 * acknowledged pushes to them may be gone. Thread-safe. */
PSC_EXTERN uint64_t psc_map_unclean_slots(psc_t *c);

typedef struct psc_stats {
    uint64_t calls, retries, map_refreshes, reconnects, timeouts;
} psc_stats_t;
PSC_EXTERN void psc_stats(psc_t *c, psc_stats_t *out);

#ifdef __cplusplus
}
#endif

#endif
