/* pw_emb.h: the worker's embedding store: where a batch's rows come from and its gradients go.
 *
 * Two implementations behind one table of functions: remote (the ps-servers, through
 * libpsclient: pw_emb_remote.c) and local (an in-process ps_table for `ps-worker --local`:
 * pw_emb_local.c, in its own library, the only worker file that includes server headers). The
 * trainer calls only this header.
 *
 * DESIGN
 * - Asynchronous by contract: pull_async / push_async return 0 once the call is started and
 *   report its end through the callback (from any thread: libpsclient's I/O thread for remote);
 *   or return an error and start nothing. A store whose calls end before they return
 *   (`synchronous`: the local one) runs its callbacks in the caller's thread; the trainer calls
 *   it from its scheduler's dispatch thread (beside the compute) and never runs ahead of it
 *   (sync only).
 * - Rows are dim floats each, in the caller's key order. Pulls of missing keys give their initial
 *   rows (and insert them); lookups never insert. A push applies the summed gradient of each key
 *   with the store's optimizer. Errors: PC_EUNAVAIL / PC_ETIMEDOUT (a server down: the caller
 *   may try again), PC_EDIM, PC_ENOTFOUND (no such table), PC_ENOMEM.
 * - Buffers are borrowed until the callback ran (blocking calls: until they return).
 * - A store on shared servers is claimed by the job before it trains (`claim`): the servers'
 *   table records which job's rows it holds, and one job does not silently train another's
 *   (docs/training.md, "Table lifecycle").
 *
 * Thread rule: pulls and pushes from one thread at a time (the scheduler's dispatch thread),
 * lookups and the rest from the trainer's; callbacks from any thread.
 */
#ifndef PW_EMB_H
#define PW_EMB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pw_emb pw_emb_t;
typedef void (*pw_emb_done_fn)(void *ctx, int rc);

/* Where one server's table stands in its delta stream (psclient.h: psc_deltas): the table's
 * identity and its change log's newest position (0: the server keeps no log of it yet). */
typedef struct pw_emb_mark {
    uint64_t uid, head;
} pw_emb_mark_t;

/* The table settings (ps_table's names) under which calls on disjoint keys commute. */
#define PW_EMB_ORDER_FREE "admit_threshold=0,ttl_ticks=0,capacity_rows=0,cold=false"

typedef struct pw_emb_ops {
    const char *name; /* "remote", "local" */
    bool synchronous; /* calls end (callback run) before they return */
    int (*pull_async)(pw_emb_t *e, const uint64_t *keys, size_t n, float *rows, pw_emb_done_fn done,
                      void *ctx);
    int (*push_async)(pw_emb_t *e, const uint64_t *keys, size_t n, const float *grads,
                      pw_emb_done_fn done, void *ctx);
    int (*lookup)(pw_emb_t *e, const uint64_t *keys, size_t n, float *rows); /* blocking */
    /* Why the latest failed call failed, one line naming the server ("127.0.0.1:7401: wrong
     * dimension: table emb has dim 16, request 8"), into buf ("" none yet); for the caller's
     * log where it handles the failure. NULL: the codes say all (local). Thread-safe. */
    void (*error)(pw_emb_t *e, char *buf, size_t cap);
    /* Connections lost and made again so far (a server may have restarted); 0 for local. */
    uint64_t (*reconnects)(pw_emb_t *e);
    /* A round trip to every server on this store's connections, waiting at most timeout_ms:
     * 0 when every one answered, else PC_EUNAVAIL with the first that did not into why. A
     * connection to a server that restarted since it was made fails here, so reconnects counts
     * it afterwards. NULL: no servers (local). */
    int (*ping)(pw_emb_t *e, int timeout_ms, char *why, size_t cap);
    /* Whether pulls and pushes of disjoint keys give the same rows in either order: the table
     * has no admission sketch, row budget, cold tier or expiry (PW_EMB_ORDER_FREE; remote: as
     * its claim found the servers' table). A lone worker then pulls ahead of its pushes
     * (pw_pipeline.c). NULL: not known, no. */
    bool (*order_free)(pw_emb_t *e);
    /* Rows held (local), 0 when unknown. */
    uint64_t (*rows)(pw_emb_t *e);
    /* Write the table with its optimizer state to a row file (ps_ckpt.h's export), or NULL:
     * the store cannot (remote: export the servers' tables with a checkpoint). */
    int (*export_rows)(pw_emb_t *e, const char *path);
    /* Check the servers' table against this store's dim and the settings the job expects
     * (`expect`: a "name=value,..." list, may be ""), then claim it for `job` with `mode`
     * (pw_claim_mode_t). NULL: the store's table is its own (local). On failure, msg gets one
     * line for the user: PC_EDIM / PC_EINVAL (the table differs), PC_EOWNED (another job's
     * rows), PC_ENOTFOUND (no such table), transport errors. */
    int (*claim)(pw_emb_t *e, const char *job, int mode, const char *expect, char *msg, size_t cap);
    /* Fence the claimed table at generation `epoch` (> 0) for `job` (libpsclient's psc_fence):
     * the servers refuse pushes of lower epochs (PC_EFENCED), and this store's pushes carry
     * `epoch` from then on (none after a failure). msg gets the failure's line. NULL: no servers
     * (local). */
    int (*fence)(pw_emb_t *e, const char *job, uint32_t epoch, char *msg, size_t cap);
    /* The table's delta-stream marks on every server, in cluster-map order: out[0 .. *n), *n
     * the map's servers (PC_ETOOBIG when over cap). Asked after a step's pushes were
     * acknowledged, each head is at or after the log entries of every change they made (the
     * servers log a change before they answer). why gets the failure's detail line. NULL: no
     * servers (local). Thread-safe: may run beside the trainer's calls (a publisher's thread). */
    int (*watermark)(pw_emb_t *e, pw_emb_mark_t *out, size_t cap, size_t *n, char *why,
                     size_t whycap);
    /* The servers' cluster map as text into buf (snprintf-like: returns the length needed).
     * NULL: no servers (local). Thread-safe. */
    size_t (*map_text)(pw_emb_t *e, char *buf, size_t cap);
    /* Maps adopted since the first (psc_stats' map_refreshes): map_text read after it is at
     * least that new. Set when map_text is. Thread-safe. */
    uint64_t (*map_refreshes)(pw_emb_t *e);
    /* Slots whose rows went back (promoted to a backup that had not caught up, or held alone by
     * a server that restarted from its checkpoint), over the servers' map's history (psclient.h
     * psc_map_unclean_slots). NULL: no servers (local). Thread-safe. */
    uint64_t (*unclean_slots)(pw_emb_t *e);
    void (*close)(pw_emb_t *e);
} pw_emb_ops_t;

/* How a job takes a table that holds rows (libpsclient's PSC_CLAIM_* values). */
typedef enum { PW_CLAIM_CHECK, PW_CLAIM_WARM_START, PW_CLAIM_FRESH } pw_claim_mode_t;

struct pw_emb {
    const pw_emb_ops_t *ops;
    int dim;
};

typedef struct pw_emb_opts {
    int dim;        /* row width */
    int timeout_ms; /* remote: every call */
    /* remote */
    const char *servers; /* a cluster map text, or host:port of any server */
    const char *table;   /* the servers' table (created there with this dim) */
    const char *token;   /* the servers' token ("" or NULL: none) */
    /* TLS to the servers (psc_tls_opts_t): tls_ca set turns it on; tls_cert and tls_key give a
     * client certificate to servers that ask for one. Borrowed for pw_emb_remote_open. */
    const char *tls_ca, *tls_cert, *tls_key;
    int wire_dtype; /* PSC_WIRE_*: rows and gradients on the wire (0: f32) */
    /* local */
    const char *table_spec; /* ps_table settings ("optimizer=adagrad,lr=0.05,..."), dim added */
    uint64_t seed;          /* the table's initial rows */
    bool zero_rows;         /* rows start at zero (overrides the spec's init) */
} pw_emb_opts_t;

typedef int (*pw_emb_open_fn)(const pw_emb_opts_t *o, pw_emb_t **out);

/* The servers of o->servers, table o->table. PC_EUNAVAIL (logged), PC_EINVAL, PC_ENOMEM. */
int pw_emb_remote_open(const pw_emb_opts_t *o, pw_emb_t **out);
/* An in-process table (ember_worker_local). PC_EINVAL for bad settings (logged), PC_ENOMEM. */
int pw_emb_local_open(const pw_emb_opts_t *o, pw_emb_t **out);

static inline void pw_emb_close(pw_emb_t *e) {
    if (e)
        e->ops->close(e);
}

#endif
