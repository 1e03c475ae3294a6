/* sv_serve.h: what a ps-serve replica serves, and how it changes under load.
 *
 * A replica serves one model: a dense model (sv_model.h) and the embedding rows it reads
 * (sv_sparse.h). Two ways to get them (docs/serving.md):
 *  - live (`follow`: the training servers): the rows follow every training server's delta
 *    stream (sv_follow.h), starting from the newest version's checkpoints when there is one, and
 *    the dense model follows the models the trainer publishes (ps-worker --publish-dir): a
 *    published model is taken once the replica's rows are at least as new as the watermark it
 *    was published with, so a reply never pairs a dense model with older rows than it was
 *    trained against;
 *  - pinned: a version, a coordinated checkpoint of the job (ps-worker --ckpt-dir): its dense
 *    model and every server's checkpoint of the same cut, restored into a sparse state of its
 *    own. LoadVersion (psctl serve load / rollback) pins, Follow goes back to live.
 *
 * DESIGN
 * - Swaps without stalls. What is served is an immutable `served` object (model, sparse state,
 *   the version's positions) behind one pointer. A request acquires it (a reference count under
 *   a mutex held for two instructions) and releases it at the end; a swap builds and verifies the
 *   new object completely (files checked, rows loaded, every evaluator warmed) before it
 *   replaces the pointer, so requests never wait for a load and never see half of one; the old
 *   object, once the last request that held it let go, goes to a graveyard that sv_serve_tick
 *   frees at low priority (freeing a version's rows is no request's cost).
 * - Refusals. A version or published model that does not load (damaged files, a card of another
 *   shape: sv_model_card_compatible) is refused: counted, its reason kept for ServeStatus and
 *   logged, and the current one keeps serving.
 * - The live sparse state keeps following while a version is pinned, so Follow swaps back at
 *   once, with no reload. When the training servers' map gives slots other primaries (a
 *   failover, a resharding), the tick builds the live rows of the new layout aside (a scan of
 *   every primary) and swaps them in under the same dense model, the old rows serving until
 *   then (docs/serving.md "After a map change").
 *
 * Thread rule: every function is thread-safe except create/destroy (one owner); sv_serve_tick,
 * sv_serve_pin and sv_serve_follow serialize among themselves (one swap at a time).
 */
#ifndef SV_SERVE_H
#define SV_SERVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pw_backend.h"
#include "sv_follow.h"
#include "sv_model.h"

typedef struct sv_serve sv_serve_t;
typedef struct sv_served sv_served_t;

#define SV_SERVE_SOURCES_MAX 256 /* training servers a replica follows, at most */

typedef struct sv_serve_opts {
    const char *name;           /* the model's name (PredictRequest.model) */
    const char *follow;         /* the training servers (a map text or any host:port): live;
                                 * NULL/"": pinned versions only */
    const char *publish_dir;    /* published dense models (ps-worker --publish-dir), NULL/"" */
    const char *versions_dir;   /* the job's coordinated checkpoints (ps-worker --ckpt-dir) */
    uint64_t pin;               /* start pinned to this version's step (0: live when following,
                                 * else the newest version) */
    int evaluators;             /* model instances (one per request thread) */
    int max_batch;              /* samples per Predict */
    const sv_follow_opts_t *fo; /* the follower's settings (NULL: defaults); its timeout_ms
                                 * bounds every call to the training servers */
    const char *token;          /* the training servers' token, NULL/"" */
    const char *tls_ca, *tls_cert, *tls_key; /* TLS to them (tls_ca set: on) */
    pw_backend_t *be; /* borrowed: the device of the dense math (NULL: CPU) */
} sv_serve_opts_t;

/* Load the starting state (see above) and start following. PC_EINVAL (logged), PC_ENOTFOUND
 * (pinned with no such version), the errors of the loads and of the first connection. A live
 * replica with nothing published yet starts without a dense model: Lookup works, Predict is
 * PC_EUNAVAIL until a model arrives. */
int sv_serve_create(const sv_serve_opts_t *o, sv_serve_t **out);
void sv_serve_destroy(sv_serve_t *s); /* no request may be in flight */

/* Periodic work of the owner's loop (every 100 ms or so): free the objects no one holds any
 * more (at nice 19), follow the servers' map (start, restart or swap in the live rows of a new
 * layout), ask for tables created since (sv_follow_opts_t.tables_poll_ms: a new layout with
 * them), and take a newer published dense model whose watermark the rows reached. */
void sv_serve_tick(sv_serve_t *s);

/* ---- requests ---- */
/* What is served now (never NULL after create): hold it for the whole request. */
sv_served_t *sv_serve_acquire(sv_serve_t *s);
void sv_serve_release(sv_serve_t *s, sv_served_t *x);
/* Its dense model (NULL: none yet) and that model's training step. */
sv_model_t *sv_served_model(const sv_served_t *x);
bool sv_served_pinned(const sv_served_t *x);
/* Rows of keys from its sparse state (ps_table_lookup's contract: rows n x dim, found may be
 * NULL); *dim (may be NULL) gets the table's. PC_ENOTFOUND (no such table), PC_EDIM
 * (rows_len), PC_ENOMEM. */
int sv_served_lookup(sv_served_t *x, const char *table, const uint64_t *keys, size_t n, float *rows,
                     size_t rows_len, uint8_t *found);
/* Its sparse state (borrowed while x is held): checksums and counts (sv_sparse.h). */
sv_sparse_t *sv_served_sparse(sv_served_t *x);
/* The table's row width, 0 when the replica has no such table. */
uint32_t sv_served_dim(sv_served_t *x, const char *table);
/* The sparse watermark: per training server the delta-stream position the rows were read at
 * (live: applied so far, read before the rows; pinned: the version's). Returns the count. */
size_t sv_served_positions(sv_served_t *x, uint64_t *pos, size_t cap);
const char *sv_serve_name(const sv_serve_t *s);

/* ---- administration ---- */
/* Pin version `step` (0: the newest): load, verify, warm, swap. *loaded its step. On failure
 * nothing changes: why gets the reason. PC_ENOTFOUND, PC_ECORRUPT, PC_EDIM, PC_ESTATE (no
 * versions directory). */
int sv_serve_pin(sv_serve_t *s, uint64_t step, uint64_t *loaded, char *why, size_t cap);
/* Back to live (PC_ESTATE when not following). *model_step: the dense model now served. */
int sv_serve_follow(sv_serve_t *s, uint64_t *model_step, char *why, size_t cap);

typedef struct sv_source_status {
    char server[PC_ADDR_MAX + PS_TABLE_NAME_MAX + 2]; /* "host:port/table" */
    char state[16];                                   /* "following", "scanning", "down" */
    uint64_t uid, position, head, lag_entries, rows_applied, rescans;
    double lag_ms;
    char error[256];
} sv_source_status_t;

typedef struct sv_serve_status {
    uint64_t model_step;
    bool pinned, has_model;
    uint64_t rows, predictions, swaps, refused;
    uint64_t map_version; /* of the layout the live rows follow (0: not following) */
    uint64_t relayouts;   /* new layouts swapped in after the servers' map changed */
    char last_refusal[256];
    size_t nsources; /* live sources described in the caller's array (up to its cap) */
} sv_serve_status_t;

/* The state; src (may be NULL with cap 0) gets up to cap sources. */
void sv_serve_status(sv_serve_t *s, sv_serve_status_t *st, sv_source_status_t *src, size_t cap);
/* Count scored samples (for status and metrics). */
void sv_serve_count(sv_serve_t *s, uint64_t samples);

typedef struct sv_version_info {
    uint64_t step;
    uint64_t created_unix_ns;
    bool loaded;
} sv_version_info_t;
/* The versions of versions_dir, oldest first: up to cap, returns how many exist. */
size_t sv_serve_versions(sv_serve_t *s, sv_version_info_t *out, size_t cap);

/* Append the replica's metrics (Prometheus text) to buf at len, up to cap; returns the length
 * needed. */
size_t sv_serve_render_metrics(sv_serve_t *s, char *buf, size_t cap, size_t len);

#endif
