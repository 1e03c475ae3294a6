/* ps_table.h: EmberPS embedding tables, in-process.
 *
 * A table maps arbitrary uint64 keys (hashed feature ids) to rows of `dim` floats plus the
 * per-row state of a server-side optimizer. Rows that were never written are a deterministic
 * function of (table seed, key), so untouched rows cost nothing and every process agrees on them.
 * The server daemon, tests and benchmarks all use this library directly.
 *
 * Batch semantics (all operations take n keys and caller buffers of n * dim floats):
 *  - pull:   rows for keys, inserting missing keys with their initial row. With admission on, a
 *            key not yet admitted is counted in a sketch and gets its initial row WITHOUT being
 *            inserted until it has been seen `admit_threshold` times.
 *  - push:   gradients for keys. Duplicate keys within one call are summed first (in call order),
 *            then ONE optimizer step is applied to the row: pushing [k, k] with g1, g2 is exactly
 *            pushing [k] with g1 + g2. A (summed) gradient with NaN or Inf is never applied: the
 *            row is skipped and counted. Missing keys are inserted (when admitted) and updated;
 *            gradients of keys not admitted are dropped and counted.
 *  - lookup: read-only rows for serving; never inserts or touches metadata. A missing key yields
 *            its initial row or zeros (config `missing`), `found` says which.
 *  - erase:  removes rows; a later pull recreates the initial row.
 * Each key is processed exactly once per occurrence; on an error that concerns only some keys
 * (out of memory while inserting, or PC_ENOSPC when a cold table cannot spill) the others are
 * still processed and the first error returned: such a call may have applied some of its keys.
 *
 * Optimizer step for a row, in order: sum duplicates -> reject non-finite -> clip each element to
 * [-clip_value, clip_value] (if > 0) -> scale to L2 norm clip_norm (if > 0 and exceeded) -> add
 * weight_decay * w -> optimizer update. Optimizers and their state per row:
 *   sgd               w -= lr * g                                            (no state)
 *   adagrad           G += g^2; w -= lr * g / (sqrt(G) + eps)                (dim floats)
 *   rowwise_adagrad   G += mean(g^2); w -= lr * g / (sqrt(G) + eps)          (1 float)
 *   adam              bias-corrected Adam with a per-row step count t        (2 * dim + 1)
 *   ftrl              FTRL-Proximal (McMahan et al. 2013), lr = alpha        (2 * dim floats)
 * Adagrad accumulators start at adagrad_init. For adam the last state word holds t as uint32.
 *
 * Stored row types (row_dtype): f32, or bf16 / f16 weights in half the bytes. The optimizer state
 * stays f32 and callers see f32 rows in every call; a 16-bit table returns its stored values
 * exactly, rounds values written into it (loads, initial rows) to nearest, and rounds each
 * optimizer step's result stochastically (unbiased, reproducible: pc_half.h).
 *
 * Metadata per row: a 16-bit "tick" (table clock value at the last push or insert) and a 7-bit
 * logarithmic frequency counter of pushes (0..127) (probabilistic increment, Morris-style; pulls
 * leave existing rows and their metadata untouched, so they never dirty a cache line). The table
 * clock is advanced by the owner (ps_table_advance_clock), in steps or seconds as it chooses; TTL,
 * incremental scans and sketch decay are expressed in clock ticks. Ages are exact up to PS_AGE_MAX
 * ticks and saturate beyond it.
 *
 * Memory: rows live in per-shard slabs (weights then optimizer state, no per-row malloc), keys and
 * metadata in a packed parallel array (11 bytes per row), the index is a two-choice bucketized
 * cuckoo hash of 4-byte slots kept at 81-97% load. ps_table_stats() reports the bytes of each.
 *
 * Thread rule: a table is thread-safe: any number of threads may call any function at once,
 * except ps_table_destroy (no other call may be in flight) and ps_table_set_evict_fn (before
 * use). Internally the table is split into `shards` by key hash, each with its own rwlock:
 * pull and lookup share it (a pull takes it alone only to insert missing keys), push, erase and
 * load take it alone.
 */
#ifndef PS_TABLE_H
#define PS_TABLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_settings.h"
#include "ps_changelog.h"

#define PS_TABLE_NAME_MAX 64
#define PS_OWNER_MAX      128 /* bytes of a table owner's name, with its NUL */
#define PS_DIM_MAX        1024
#define PS_BATCH_MAX      (16u * 1024 * 1024) /* keys per call */
#define PS_AGE_MAX        16384u              /* ages saturate here (ticks) */

typedef struct ps_table ps_table_t;

typedef enum {
    PS_INIT_ZEROS,
    PS_INIT_UNIFORM,      /* uniform(-init_scale, init_scale) */
    PS_INIT_NORMAL,       /* normal(0, init_scale) */
    PS_INIT_TRUNC_NORMAL, /* normal(0, init_scale) redrawn outside +-2 init_scale */
} ps_init_kind_t;

typedef enum {
    PS_OPT_SGD,
    PS_OPT_ADAGRAD,
    PS_OPT_ROWWISE_ADAGRAD,
    PS_OPT_ADAM,
    PS_OPT_FTRL,
} ps_optim_kind_t;

/* How a table stores its weights (the optimizer state is f32 in every case). Callers always see
 * f32: 16-bit rows are converted at the table's edge (docs/table.md "Stored row types"). */
typedef enum {
    PS_ROW_F32,
    PS_ROW_BF16, /* 8 exponent bits, 7 fraction bits */
    PS_ROW_F16,  /* IEEE binary16 */
} ps_row_dtype_t;

typedef enum {
    PS_MISSING_INIT,  /* lookup of a missing key returns its initial row */
    PS_MISSING_ZEROS, /* ... returns zeros */
} ps_missing_t;

/* Table configuration. Fill with ps_table_config_defaults(), then set fields directly or with
 * ps_table_config_parse(). Fields are the settings of ps_table_settings(). */
typedef struct ps_table_config {
    char name[PS_TABLE_NAME_MAX];
    int64_t dim;
    int64_t shards;
    int64_t seed;
    int init; /* ps_init_kind_t */
    double init_scale;
    int missing;   /* ps_missing_t */
    int optimizer; /* ps_optim_kind_t */
    int row_dtype; /* ps_row_dtype_t */
    double lr, beta1, beta2, eps, adagrad_init, ftrl_beta, l1, l2;
    double weight_decay, clip_value, clip_norm;
    int64_t admit_threshold, admit_width, admit_decay_ticks;
    int64_t ttl_ticks;
    int64_t capacity_rows;
    bool cold; /* rows beyond capacity_rows go to the cold tier (see "cold tier" below) */
    /* On a server with backups (docs/server.md "Replicas and failover"): a push is answered once
     * every backup has applied the table's change log up to this many entries before the push's
     * end; 0 (sync): a push is answered only once the backups hold it. */
    int64_t replication_lag;
} ps_table_config_t;

/* The settings table behind ps_table_config_t (for --help, dumps and specs). */
const pc_setting_t *ps_table_settings(size_t *n);

void ps_table_config_defaults(ps_table_config_t *cfg);

/* Apply "dim=64,optimizer=adam,lr=0.01" to cfg. err (may be NULL) gets one line on failure. */
int ps_table_config_parse(ps_table_config_t *cfg, const char *spec, char *err, size_t errlen);

/* Format cfg as a spec list that ps_table_config_parse reads back ("name=ads,dim=64,...").
 * Returns the length needed (like snprintf). */
size_t ps_table_config_format(const ps_table_config_t *cfg, char *buf, size_t cap);

/* Check a whole configuration (bounds, shards a power of two, name charset [A-Za-z0-9_.-]). */
int ps_table_config_check(const ps_table_config_t *cfg, char *err, size_t errlen);

/* Create a table (cfg copied). PC_EINVAL for a bad config, PC_ENOMEM. */
int ps_table_create(const ps_table_config_t *cfg, ps_table_t **out);
void ps_table_destroy(ps_table_t *t);

const ps_table_config_t *ps_table_config(const ps_table_t *t);
uint32_t ps_table_dim(const ps_table_t *t);
/* Optimizer state words (4 bytes each) per row. */
uint32_t ps_table_state_len(const ps_table_t *t);
/* Number of rows held. */
uint64_t ps_table_count(const ps_table_t *t);

/* `rows` receives n * dim floats; rows_len must equal n * dim (PC_EDIM otherwise). */
int ps_table_pull(ps_table_t *t, const uint64_t *keys, size_t n, float *rows, size_t rows_len);

typedef struct ps_push_result {
    uint64_t applied;            /* rows updated (after merging duplicates) */
    uint64_t skipped_nonfinite;  /* rows whose gradient had NaN/Inf */
    uint64_t dropped_unadmitted; /* rows not admitted yet */
} ps_push_result_t;

/* grads_len must equal n * dim. `res` may be NULL. */
int ps_table_push(ps_table_t *t, const uint64_t *keys, size_t n, const float *grads,
                  size_t grads_len, ps_push_result_t *res);

/* `found` (may be NULL) receives n flags. */
int ps_table_lookup(const ps_table_t *t, const uint64_t *keys, size_t n, float *rows,
                    size_t rows_len, uint8_t *found);

/* Rows of keys[0..n) with their optimizer state, as a backup copies them (ps_table_load takes
 * them back): n x (dim + state_len) floats into rows (weights, then state), found[i] 1 or 0
 * (absent: zeros). Read-only, no admission, no insert. A cold table's keys missing from RAM are
 * read from the cold store without promoting them (as lookup reads them: idle past ttl_ticks is
 * absent); such a row changed in RAM after the miss reads as its older cold copy, and the
 * change log then holds its key after the change. PC_EINVAL, PC_ENOMEM, the cold store's
 * errors (their rows zeros, found 0). */
int ps_table_read_state(const ps_table_t *t, const uint64_t *keys, size_t n, float *rows,
                        uint8_t *found);

/* `erased` (may be NULL) receives how many keys were present (of a cold table whose store cannot
 * read them, a damaged record say, those in RAM: the erasure goes on). A cold table whose store
 * refuses a deletion (PC_ENOSPC below the free-space mark, PC_EIO) keeps those keys' rows, in
 * RAM and in the store, and returns that code: an erasure is whole per key or not done. */
int ps_table_erase(ps_table_t *t, const uint64_t *keys, size_t n, size_t *erased);

/* One row as seen by scans and the eviction callback. Pointers are valid only during the
 * callback; `state` has ps_table_state_len() words (NULL when 0). */
typedef struct ps_row_view {
    uint64_t key;
    const float *weights;
    const float *state;
    uint16_t tick;
    uint8_t freq;
} ps_row_view_t;

typedef enum { PS_EVICT_CAPACITY, PS_EVICT_TTL } ps_evict_reason_t;

/* Called for every row the table evicts (capacity or TTL), before it is removed, with the shard
 * lock held: it must not call back into the same table. */
typedef void (*ps_evict_fn)(void *ctx, ps_evict_reason_t why, const ps_row_view_t *row);

/* Install the eviction callback (ctx borrowed). Call before the table is shared. */
void ps_table_set_evict_fn(ps_table_t *t, ps_evict_fn fn, void *ctx);

/* The delta stream's change log (ps_changelog.h). Pushes, loads, erasures and evictions append
 * their keys after the change, once a log is there. A table starts without one.
 *
 * ps_table_changelog is the log (NULL: none yet), valid until the table is destroyed;
 * thread-safe.
 * ps_table_changelog_start gives the table's log, starting one of `capacity` entries when it has
 * none (once: concurrent callers all get the one installed; *started, may be NULL, is true for
 * the caller that installed it). A started log holds no change made before it: its base position
 * (the wall clock in nanoseconds) makes every earlier position, 0 included, older than its oldest.
 * Thread-safe. PC_EINVAL (capacity 0), PC_ENOMEM. */
ps_changelog_t *ps_table_changelog(const ps_table_t *t);
int ps_table_changelog_start(ps_table_t *t, size_t capacity, ps_changelog_t **out, bool *started);

/* Advance the table clock to `now` (>= current; PC_EINVAL otherwise). Expires rows older than
 * ttl_ticks (checked every ttl_ticks/16 ticks), decays the admission sketch every
 * admit_decay_ticks, and renormalizes stored ticks so ages stay exact up to PS_AGE_MAX. */
int ps_table_advance_clock(ps_table_t *t, uint32_t now);
uint32_t ps_table_clock(const ps_table_t *t);
/* Whether a row last changed at table clock `last` has expired (ttl_ticks) at clock `now`. */
bool ps_table_expired(const ps_table_t *t, uint32_t last, uint32_t now);

/* Scan callback: `n` views (n <= 256) from one shard, under its read lock. Return 0 to go on,
 * anything else to stop the scan with that value. */
typedef int (*ps_scan_fn)(void *ctx, const ps_row_view_t *rows, size_t n);

/* Visit every row (since == PS_SCAN_ALL) or every row pushed or inserted at clock >= since
 * (exact while now - since < PS_AGE_MAX, all rows beyond). Each shard is visited under its read
 * lock, so each row is seen exactly once and whole (weights, state and metadata of one moment);
 * rows of different shards may come from different moments. Returns 0 or what fn returned. */
#define PS_SCAN_ALL UINT64_MAX
int ps_table_scan(const ps_table_t *t, uint64_t since, ps_scan_fn fn, void *ctx);

/* ps_table_scan of the rows whose key is in part `part` of `parts` (ps_table_key_part), the
 * parts of a table's rows split for replies of bounded size. With a power of two parts each
 * part costs about 1/parts of a whole scan (the parts follow the lock shards); other counts cost
 * a whole scan each. PC_EINVAL: part >= parts. */
int ps_table_scan_part(const ps_table_t *t, uint64_t since, uint32_t part, uint32_t parts,
                       ps_scan_fn fn, void *ctx);
/* The part of `parts` key belongs to (any table: it depends on the key alone). */
uint32_t ps_table_key_part(uint64_t key, uint32_t parts);

/* Insert or overwrite rows verbatim (restore, import): weights n * dim; states n * state_len or
 * NULL for fresh optimizer state; ticks/freqs or NULL for "now"/1. Bypasses admission; capacity
 * eviction still applies. */
int ps_table_load(ps_table_t *t, size_t n, const uint64_t *keys, const float *weights,
                  const float *states, const uint16_t *ticks, const uint8_t *freqs);

/* Rows as ps_table_read_state gives them (n x (dim + state_len) floats, weights then state),
 * loaded with ticks and freqs "now" and 1, without appending the keys to the change log: a
 * backup's copy of another server's rows (ps_repl.h), which no follower of this server takes (a
 * stream carries only the slots its server is primary of). */
int ps_table_load_rows_unlogged(ps_table_t *t, size_t n, const uint64_t *keys, const float *rows);

/* ---- consistent snapshots (checkpoints) ----------------------------------------------------
 * A snapshot captures the table at a cut placed between whole value-changing calls (push, erase,
 * load, clock advance): every row as it was at the cut, weights, optimizer state and metadata
 * from the same moment, while pulls and pushes go on. Beginning one waits for the calls in
 * flight and advances the clock by one tick (the cut is the old value). Afterwards the first
 * change to a row that still has to be written copies its pre-cut image (copy-on-write per row,
 * memory proportional to the rows changed meanwhile); each shard is written in chunks of 4096
 * rows under its read lock, released between chunks (a push waits for at most one chunk). One
 * snapshot at a time. */

typedef struct ps_snapshot_info {
    uint32_t cut_clock; /* the table clock the snapshot reflects */
    uint64_t version;   /* push calls applied before the cut */
} ps_snapshot_info_t;

/* Keys callback of snapshot scans (n <= 256); nonzero stops the scan with that value. */
typedef int (*ps_keys_fn)(void *ctx, const uint64_t *keys, size_t n);

/* Place the cut. PC_EAGAIN if a snapshot is already active. With track_removals (checkpoints),
 * removals are logged from the cut on, for the tombstones of the next incremental snapshot. */
int ps_table_snapshot_begin(ps_table_t *t, bool track_removals, ps_snapshot_info_t *info);

/* Emit the rows as of the cut that changed at clock >= since (PS_SCAN_ALL: all rows) to
 * rows_fn, and, when since != PS_SCAN_ALL, the keys removed at clocks since..cut to removed_fn
 * (may be NULL). Call once per snapshot. PC_ENOMEM if a pre-cut image could not be saved (the
 * table itself is unaffected; retry with a new snapshot). */
int ps_table_snapshot_scan(ps_table_t *t, uint64_t since, ps_scan_fn rows_fn, ps_keys_fn removed_fn,
                           void *ctx);

/* End the snapshot. `committed`: it is safely on disk, so removals up to its cut are forgotten. */
void ps_table_snapshot_end(ps_table_t *t, bool committed);

/* True when an incremental snapshot cannot be exact (a removal could not be logged for lack of
 * memory): the next snapshot must be a full one. */
bool ps_table_needs_full(const ps_table_t *t);

/* Start logging removals (a restored table continuing an incremental chain). */
void ps_table_track_removals(ps_table_t *t);

/* An id fixed at creation (never 0): tells two tables of the same name apart. */
uint64_t ps_table_uid(const ps_table_t *t);
/* Whether tables of uids a and b were made by the same run of a process: one of a name replaced
 * by another while its server ran (reset, restore, drop and create), not a server started
 * again. */
bool ps_table_uid_same_run(uint64_t a, uint64_t b);

/* Push calls applied so far (restore sets it to the checkpoint's). */
uint64_t ps_table_version(const ps_table_t *t);
void ps_table_set_version(ps_table_t *t, uint64_t version);

/* The job that owns the table's rows ("" none): set by ps_catalog_claim, kept in checkpoints.
 * ps_table_owner copies it (snprintf-like return); ps_table_set_owner: PC_EINVAL when it is
 * PS_OWNER_MAX bytes or longer. Both thread-safe. */
size_t ps_table_owner(const ps_table_t *t, char *buf, size_t cap);
int ps_table_set_owner(ps_table_t *t, const char *owner);

/* The owner's generation fence (ps_catalog_claim's PS_CLAIM_FENCE, docs/wire.md "Generation
 * fences"): pushes that carry a lower epoch are refused (a worker of a generation its job has
 * left behind); 0: none. Raise keeps the higher of the two; a new owner (ps_table_set_owner of
 * another name) starts at 0. Kept in checkpoints with the owner. Both thread-safe. */
uint32_t ps_table_fence(const ps_table_t *t);
void ps_table_raise_fence(ps_table_t *t, uint32_t epoch);

/* The initial row of a key (what pull would insert). out has dim floats. */
void ps_table_initial_row(const ps_table_t *t, uint64_t key, float *out);

/* ---- cold tier ---------------------------------------------------------------------------
 * A table with config `cold` keeps at most capacity_rows rows in RAM; the rest live in a cold
 * store (ps_tier.h: RocksDB) reached through the hooks below, which ps_tier installs before the
 * table is used. Capacity eviction (CLOCK over the frequency counters) then spills instead of
 * dropping: victims of a call are written in one batch per shard before the shard's lock is
 * released. A row that came from the cold store (or is an untouched initial row) and was not
 * changed since is "clean" and is dropped without a write (the cold copy, or its absence, is
 * still right). Misses of pull, push and lookup are collected over the whole call and fetched
 * with one `get` outside the shard locks; pull and push then promote the rows into RAM (a race
 * with a concurrent spill or erase of the same shard is detected and the keys fetched again
 * under the lock), lookup only reads them (serving does not disturb the training working set).
 * Cold rows idle longer than ttl_ticks read as absent. The cold store is written only by spills
 * and erase; ps_table_cold_freeze suspends both (RAM may exceed its budget meanwhile), which
 * lets a checkpoint copy the cold store exactly at a snapshot's cut.
 * Disk full: when `writable` says no, an insert that would have to spill a changed row fails
 * with PC_ENOSPC (nothing is evicted); rows already held stay readable and writable. A failed
 * `put` puts the victims back into RAM (over budget) and the call reports the error. */

/* A row handed to the cold store: stride = dim + state_len floats, weights first. */
typedef struct ps_cold_row {
    uint64_t key;
    uint32_t clock; /* table clock of the row's last change (absolute) */
    uint8_t freq;
    const float *row;
} ps_cold_row_t;

/* What `get` says of one key. */
typedef struct ps_cold_meta {
    uint32_t clock;
    uint8_t freq;
    uint8_t found;
} ps_cold_meta_t;

typedef struct ps_cold_ops {
    /* Rows of n keys into rows (n * stride floats) and meta. Any thread, no table lock may be
     * assumed held or not. 0, or an error for the whole call (PC_EIO, PC_ECORRUPT). */
    int (*get)(void *ctx, const uint64_t *keys, size_t n, float *rows, ps_cold_meta_t *meta);
    /* Write n rows (replacing older copies); called with a shard lock held. */
    int (*put)(void *ctx, const ps_cold_row_t *rows, size_t n);
    /* Delete n keys (absent keys are fine); called with a shard lock held. */
    int (*del)(void *ctx, const uint64_t *keys, size_t n);
    /* Whether writes are allowed now (free-space watermark). Cheap; called under shard locks. */
    bool (*writable)(void *ctx);
    /* Up to max keys the store holds at or after *start, in key order, into keys (*n of them);
     * *start becomes the key to go on from, 0 when no key is left (the page reached the end, or
     * UINT64_MAX). Any thread, no lock held. 0, PC_EIO, PC_ENOMEM. */
    int (*keys)(void *ctx, uint64_t *start, uint64_t *keys, size_t max, size_t *n);
} ps_cold_ops_t;

/* Install the cold store (ops copied, ctx borrowed); only for tables with config `cold`, before
 * the table is shared. A cold table without a store refuses to evict changed rows (PC_ENOSPC). */
void ps_table_set_cold(ps_table_t *t, const ps_cold_ops_t *ops, void *ctx);

/* Walk the keys a cold table's cold store holds from *start on, in key order, at most max (> 0,
 * else PC_EINVAL) of them: fn(ctx, key) for each, a nonzero return stopping the walk before that
 * key (*start is then that key) and returned. *start ends as the key to go on from, 0 when no key
 * is left. Not a snapshot (the store is read in batches): a key written after the walk passed its
 * place is not seen, so a caller that needs every row (a backup's copy) takes the changes made
 * meanwhile from the change log. A key may also be in RAM (a promoted row). Any other table: no
 * keys, *start 0. The store's errors (PC_EIO, PC_ENOMEM; *start unmoved), PC_EUNSUPPORTED (a
 * store without the `keys` hook). No lock is held while fn runs. */
typedef int (*ps_cold_key_fn)(void *ctx, uint64_t key);
int ps_table_cold_walk(const ps_table_t *t, uint64_t *start, uint64_t max, ps_cold_key_fn fn,
                       void *ctx);

/* Suspend (true) or resume (false) writes to the cold store. Returns once no spill or erase is
 * writing to it any more. Freezes nest: writes resume at the thaw of the last freeze (each
 * freeze is thawed once). */
void ps_table_cold_freeze(ps_table_t *t, bool frozen);

typedef struct ps_table_stats {
    uint64_t rows;
    /* memory, exact bytes */
    uint64_t bytes_weights;  /* rows * dim * 4 (2 for 16-bit rows, padded to 4 bytes a row) */
    uint64_t bytes_state;    /* rows * state_len * 4 */
    uint64_t bytes_keys;     /* rows * 8 */
    uint64_t bytes_meta;     /* rows * 3 (tick, freq) */
    uint64_t bytes_index;    /* index slots allocated */
    uint64_t bytes_sketch;   /* admission sketches */
    uint64_t bytes_reserved; /* slab capacity allocated beyond rows (virtual, untouched) */
    /* operations (rows) */
    uint64_t pulled, pushed, looked_up, inserted, erased;
    uint64_t evicted_capacity, evicted_ttl;
    uint64_t admit_pending; /* pulls of keys not admitted yet */
    uint64_t admit_dropped; /* pushes of keys not admitted yet (gradients dropped) */
    uint64_t nonfinite_skipped;
    uint64_t index_rebuilds;
    /* cold tier (rows) */
    uint64_t cold_reads;    /* keys looked for in the cold store */
    uint64_t cold_hits;     /* ... and found there */
    uint64_t spilled;       /* changed rows written to it by eviction */
    uint64_t spill_clean;   /* clean rows evicted without a write */
    uint64_t spill_refused; /* inserts refused because the store was not writable */
    uint64_t cold_errors;   /* failed get / put / del calls */
    uint32_t clock;
} ps_table_stats_t;

int ps_table_stats(const ps_table_t *t, ps_table_stats_t *out);

/* Overhead bytes per row beyond weights and optimizer state: (keys + meta + index) / rows. */
double ps_table_stats_overhead_per_row(const ps_table_stats_t *s);

#endif
