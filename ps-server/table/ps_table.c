/* ps_table.c: the embedding table engine (see ps_table.h for the contract).
 *
 * DESIGN
 *
 * Shards. A key's 64-bit hash h = XXH3(key, PC_HASH_SEED_INDEX) picks one of 2^b shards by its
 * top b bits. Each shard owns a rwlock, an index and a slab; nothing is shared between shards, so
 * there is no global lock. A batch call first groups its keys by shard (counting sort, stable:
 * call order is kept within a shard), then takes each shard's lock once and processes its keys,
 * starting at a shard that varies between calls so concurrent callers rarely queue.
 *
 * Slab. Rows of a shard are dense: row r is row_bytes bytes at rows + r * row_bytes, its weights
 * first (dim floats, or dim 16-bit values padded to 4 bytes with row_dtype bf16/f16), then its
 * optimizer state (state_len floats, always f32), and km[r] is its packed 11-byte record
 * {key, tick, freq}. Both arrays are
 * anonymous mappings grown with mremap (no copy) and only resident where touched; big row slabs
 * ask for transparent huge pages. Removing row r moves the last row into r (swap-with-last), so
 * the slab never has holes and scans are sequential.
 *
 * Index. nbuckets buckets of 16 uint32 slots (one 64-byte line each). A key may live in bucket
 * b1 = range(h_lo32) or b2 = range(mix(h) >> 32) (two-choice cuckoo); a slot holds
 * (tag << rid_bits) | (row + 1), 0 = empty, where tag is a few bits of h (never 0, so a free
 * slot never matches) so that most non-matching slots are rejected without touching the row's key.
 * rid_bits = bit length of the slot count, so tags shrink as a shard grows (20 bits when small, at
 * least 4). Insertion takes a free slot of b1 or b2, else moves one resident of a full bucket to
 * its other bucket (index_move_one), else walks (random, bounded); when that fails or the load
 * passes 97% the index is rebuilt 1.2x larger
 * from the slab (the index is derived state). Bucket counts need not be powers of two, so the load
 * settles between 81% and 97%: the index costs 4.1-4.9 bytes per row, keys and metadata 11, in
 * all 15.1-15.9 bytes beyond the floats.
 *
 * Batches are software-pipelined within a shard group (see batch_run): bucket prefetch, tag match
 * and row prefetch (with the caller's gradient row for push), second-bucket match (every key that
 * did not match in b1), then key verification and the operation, 16 (pull, lookup) or 8 keys apart.
 * Every batch operation goes through it (pull, lookup, push, and the whole-row read_state and load
 * of replication and restores). The lock of a shard is taken once per group, never per key.
 * Verification always re-checks the candidate against the slab, so rows that moved in between
 * (eviction during the same call) are found again by a full probe; under a read lock nothing
 * moves, so a key that matched in neither bucket is absent without one. The prefetch helpers must
 * stay always_inline: GCC deletes calls to a non-inlined function that only prefetches (it deems it
 * const), which left the pipeline without row prefetches for a while.
 *
 * Row math (optimizers, the non-finite check) goes through the kernel table of ps_optim.h,
 * chosen at creation for the CPU (AVX2 + FMA or scalar).
 *
 * Stored row types (row_dtype). Everything outside the slab sees f32 rows of stride = dim +
 * state_len floats: callers, snapshots' saved images, spills and the cold tier, scans. A 16-bit
 * table converts at the slab's edge (row_weights_get / row_weights_set / row_export /
 * row_import): reads are exact, writes of outside values (loads, inserts, initial rows) round to
 * nearest, so a row that came from a 16-bit table goes back bit for bit. An optimizer step runs
 * on an f32 copy of the weights (the state is updated in place) and rounds the result
 * stochastically (pc_half.h), seeded by the key and the push's update version: small updates
 * survive on average instead of rounding away, and a replay of the same pushes gives the same
 * rows. Initial rows are the f32 initializer's rounded to nearest, wherever they are made
 * (inserts, pulls of unadmitted keys, lookups of missing keys, ps_table_initial_row).
 *
 * Clock and ages. Rows store the low 16 bits of the shard clock at their last update. Each
 * shard advances its own copy of the clock under its lock; every 8192 ticks it clamps stored
 * ages to PS_AGE_MAX, so (clock16 - tick) mod 2^16 is always the exact age below PS_AGE_MAX.
 *
 * Eviction. With capacity_rows set, inserting into a full shard first evicts one row by
 * generalized CLOCK over the frequency counters: a hand visits up to 64 rows, halving (decrementing
 * the log counter of) each one it passes; the first at zero, else the least frequent seen, goes.
 *
 * Admission. A count-min sketch (4 rows of uint8 counters, conservative update) per shard counts
 * sightings of keys that have no row; a pull inserts the key once its estimate reaches
 * admit_threshold.
 *
 * Snapshots (checkpoints). Value-changing calls hold the table's `cut` rwlock shared; a snapshot
 * takes it exclusively to place its cut between whole calls and advances the clock by one tick.
 * Until a shard has been written, the first change to a row whose tick predates the cut saves the
 * row's image (copy-on-write per row); removals are logged with their clock for the tombstones
 * of incremental snapshots. See the "snapshots" section and docs/checkpoints.md.
 *
 * Change log (the delta stream, ps_changelog.h). `log` is an atomic pointer, NULL until the
 * first follower asks (ps_table_changelog_start installs it once, by compare-and-swap; a table
 * nobody follows pays one acquire load per changing call and nothing else). Changing calls load
 * it after their change is applied and their locks released, and append only when it is there.
 * A change whose call loaded NULL is not in the log; it is in any scan that starts after the
 * install: the scan takes the shard's lock after the change released it, or, taking it first,
 * makes the install visible to the call's later load (so the change is appended). Hence a
 * follower's rule: a log installed at T holds no change before T; it starts from a scan whose
 * position was taken after the install (SCAN), never from a position older than the log's
 * base (DELTAS answers PC_ERANGE).
 */
#include "ps_table.h"
#include "ps_optim.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_half.h"
#include "pc_hash.h"
#include "pc_log.h"
#include "pc_time.h"

#include <assert.h>
#include <pthread.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ==== constants ============================================================================ */

#define BUCKET_SLOTS       16
#define MAX_LOAD_PCT       97 /* rebuild above this load */
#define GROW_NUM           6  /* rebuild size factor 6/5 = 1.2 */
#define GROW_DEN           5
#define SHRINK_LOAD_PCT    40 /* rebuild smaller below this load */
#define SETTLE_LOAD_PCT    81 /* load after a shrink */
#define MIN_BUCKETS        4u
#define MAX_RID_BITS       28u /* rows per shard < 2^28, tags >= 4 bits */
#define MAX_TAG_BITS       20u /* tags come from h bits 32..51, shards from the top 12 */
#define MAX_KICKS          256
#define REBUILD_D          8  /* rows between a rebuild's bucket prefetch and placement */
#define PIPE_D_WEIGHTS     16 /* keys between pipeline stages: pull and lookup (table.md) */
#define PIPE_D_ROWS        8  /* push, and whole-row reads and loads */
#define CLOCK_PROBES       64 /* rows a CLOCK eviction visits at most */
#define AGING_PERIOD       8192u
#define SNAPSHOT_MAX_TICKS 4096u /* a snapshot spanning more ticks fails (ages stay < 2^15) */
#define SCAN_CHUNK         4096u /* rows a snapshot writes per hold of a shard's read lock */
#define FREQ_FACTOR        8     /* log counter: increment with probability 1/(1 + freq*8) */
#define FREQ_MASK          0x7fu /* km.freq: the counter in the low 7 bits ... */
#define ROW_CLEAN          0x80u /* ... and "equal to its cold copy (or initial)" in the top bit */
#define FREQ_MAX           127u
#define SPILL_BATCH        256u  /* rows per cold put */
#define COLD_WALK_BATCH    1024u /* keys per call of the cold store's `keys` (ps_table_cold_walk) */
#define SKETCH_DEPTH       4
#define HUGE_MIN_BYTES     (4u << 20) /* slab arrays this large ask for huge pages */
#define HUGE_MIN_INDEX     (2u << 20) /* so do indexes this large */
#define NO_ROW             UINT32_MAX

/* ==== table ids ============================================================================ */

/* A table's uid: this process's run (32 random bits drawn at its first table, never 0) over a
 * count of the tables it made. Two uids of one name from the same run mean the table was
 * replaced while its server ran (a reset, a restore, a drop and create); from two runs, that
 * the server started again. */
static _Atomic uint32_t g_run_id;
static _Atomic uint32_t g_tables_made;

static uint64_t new_uid(void) {
    uint32_t run = atomic_load(&g_run_id);
    if (!run) {
        uint64_t h = pc_hash_u64(pc_time_wall_ns() ^ pc_time_mono_ns(), (uint64_t)getpid());
        uint32_t want = (uint32_t)(h ^ (h >> 32));
        want = want ? want : 1;
        if (atomic_compare_exchange_strong(&g_run_id, &run, want))
            run = want; /* (else another thread's draw is in run) */
    }
    return (uint64_t)run << 32 | (atomic_fetch_add(&g_tables_made, 1) + 1u);
}

bool ps_table_uid_same_run(uint64_t a, uint64_t b) {
    return a && b && a >> 32 == b >> 32;
}

/* ==== types ================================================================================ */

typedef struct __attribute__((packed)) ps_km {
    uint64_t key;
    uint16_t tick;
    uint8_t freq;
} ps_km_t;

typedef struct ps_removal {
    uint64_t key;
    uint32_t clock;
} ps_removal_t;

/* A spilled row waiting for its write: header then stride floats. */
typedef struct ps_spill_hdr {
    uint64_t key;
    uint32_t clock;
    uint8_t freq;
} ps_spill_hdr_t;

/* A saved row: header then stride floats. */
typedef struct ps_cow_hdr {
    uint64_t key;
    uint16_t tick;
    uint8_t freq;
} ps_cow_hdr_t;

typedef struct ps_shard {
    pthread_rwlock_t lock;
    /* index */
    uint32_t *slots;
    uint32_t nbuckets;
    uint32_t rid_bits, rid_mask, tag_mask; /* tag_mask: bits of (h >> 32) used as tag */
    /* slab */
    unsigned char *rows; /* row_bytes per row */
    ps_km_t *km;
    uint32_t count, cap;
    uint32_t rows_cap, km_cap; /* what each mapping holds (cap, or more after a failed resize) */
    /* clock, eviction, admission */
    uint32_t clock, last_aging, last_ttl, last_decay;
    uint32_t hand;
    uint64_t rng;
    uint8_t *sketch;
    uint32_t sketch_width;
    /* snapshot: copy-on-write of rows last changed before the cut (see "snapshots") */
    uint8_t cow_active, cow_failed;
    uint8_t removed_lost; /* a removal could not be logged: incrementals refused until a full */
    uint32_t lost_clock;  /* the latest clock at which a removal was lost */
    uint32_t cow_cut;     /* first clock value after the cut */
    uint32_t scan_cursor; /* rows below it are already written by the snapshot scan */
    uint8_t *cow;         /* saved records of cow_rec_bytes each */
    size_t cow_n, cow_cap;
    /* removals since the last committed snapshot, with the clock they happened at */
    ps_removal_t *removed;
    size_t removed_n, removed_cap;
    /* cold tier: victims waiting to be written before the lock is released, and a counter of
     * writes to the cold store (pull/push misses fetched without the lock compare it) */
    ps_spill_hdr_t *spill_hdr;             /* compact, scanned by promotions (see spill_find) */
    float *spill_rows;                     /* stride floats per entry */
    size_t spill_n, spill_cap, spill_hcap; /* entries; capacities of rows and headers */
    uint32_t cold_seq;
    /* counters (under the write lock) */
    uint64_t pushed, inserted, erased, ev_cap, ev_ttl, pending, dropped, nonfinite, rebuilds;
    uint64_t spilled, spill_clean, spill_refused, cold_errors;
} __attribute__((aligned(64))) ps_shard_t;

struct ps_table {
    ps_table_config_t cfg;
    ps_optim_t opt;
    uint32_t dim, state_len, stride; /* stride: floats of a row outside the slab */
    uint32_t wbytes, row_bytes;      /* a row in the slab: weights (padded to 4), then state */
    int dtype;                       /* ps_row_dtype_t of the stored weights */
    const pc_half_kernels_t *half;   /* conversions of 16-bit weights */
    uint32_t nshards;
    uint32_t shard_cap; /* rows per shard, 0 = unlimited */
    uint32_t admit;     /* admission threshold (0 = off) */
    _Atomic uint32_t clock;
    atomic_uint_least64_t looked_up, pulled; /* counted per call: readers share shards */
    /* Value-changing calls (push, erase, load, clock advance) hold `cut` shared for their whole
     * duration; a snapshot takes it exclusively to place its cut between whole calls. */
    pthread_rwlock_t cut;
    atomic_uint_least64_t version; /* push calls so far: the update version of a cut */
    int snap_active;               /* under `cut` */
    int snap_scanned, snap_full;   /* the snapshot's one scan happened; it was a full one */
    uint32_t snap_cut;             /* clock value of the cut */
    atomic_int track_removed;      /* log removals (after the first committed snapshot) */
    atomic_int snap_busy;          /* a snapshot exists (set before waiting for `cut`) */
    uint64_t uid;                  /* distinguishes tables of the same name over time */
    size_t cow_rec_bytes;
    ps_evict_fn evict_fn;
    void *evict_ctx;
    ps_changelog_t *_Atomic log; /* the delta stream's change log (owned; NULL: none yet) */
    /* cold tier (cfg.cold): the store, the freeze gate (erasers wait while frozen) */
    ps_cold_ops_t cold;
    void *cold_ctx;
    bool has_cold;
    atomic_int cold_frozen;
    pthread_mutex_t cold_mu;
    pthread_cond_t cold_cv;
    uint32_t erasers;
    atomic_uint_least64_t cold_reads, cold_hits, cold_get_errors; /* per call, readers too */
    pthread_mutex_t owner_mu; /* the owner, the job that trains the table (ps_catalog_claim) */
    char owner[PS_OWNER_MAX];
    atomic_uint_least32_t fence; /* the owner's generation fence (ps_table_fence) */
    ps_shard_t *shards;
};

/* Per-call scratch: hashes, the visiting order and pipeline candidates. Keys are visited
 * grouped by shard, starting with the first key's shard and wrapping around (so concurrent
 * callers start in different places), call order kept within a shard. */
typedef struct plan {
    uint64_t *h;     /* per key index */
    uint32_t *cand;  /* per key index: pipeline candidate row */
    uint32_t *order; /* per position: key index */
    uint32_t *defer; /* pull: positions whose key was missing under the read lock */
    uint16_t *sq;    /* per position: shard */
    size_t bytes;
    void *mem;
} plan_t;

/* ==== configuration ======================================================================== */

static const char *const k_init_names[] = {"zeros", "uniform", "normal", "trunc_normal", NULL};
static const char *const k_opt_names[] = {"sgd",  "adagrad", "rowwise_adagrad",
                                          "adam", "ftrl",    NULL};
static const char *const k_missing_names[] = {"init", "zeros", NULL};
static const char *const k_dtype_names[] = {"f32", "bf16", "f16", NULL};

#define T ps_table_config_t
static const pc_setting_t k_table_settings[] = {
    PC_SETTING_STRING(T, name, "default", "table name ([A-Za-z0-9_.-])"),
    PC_SETTING_INT(T, dim, 1, PS_DIM_MAX, "16", "floats per row"),
    PC_SETTING_INT(T, shards, 1, 4096, "16", "lock shards, a power of two (rows/shard < 16M)"),
    PC_SETTING_INT(T, seed, 0, 9.2e18, "0", "seed of the initial rows"),
    PC_SETTING_ENUM(T, init, k_init_names, "uniform", "initial row distribution"),
    PC_SETTING_DOUBLE(T, init_scale, 0, 1e6, "0.01", "uniform bound a or normal stddev s"),
    PC_SETTING_ENUM(T, missing, k_missing_names, "init", "lookup of a missing key returns"),
    PC_SETTING_ENUM(T, optimizer, k_opt_names, "adagrad", "server-side optimizer"),
    PC_SETTING_ENUM(T, row_dtype, k_dtype_names, "f32",
                    "stored weights: f32, bf16 or f16 (optimizer state stays f32)"),
    PC_SETTING_DOUBLE(T, lr, 0, 1e6, "0.05", "learning rate (FTRL alpha)"),
    PC_SETTING_DOUBLE(T, beta1, 0, 0.999999, "0.9", "Adam beta1"),
    PC_SETTING_DOUBLE(T, beta2, 0, 0.99999999, "0.999", "Adam beta2"),
    PC_SETTING_DOUBLE(T, eps, 0, 1, "1e-8", "Adam/Adagrad epsilon"),
    PC_SETTING_DOUBLE(T, adagrad_init, 0, 1e6, "1e-6", "Adagrad initial accumulator"),
    PC_SETTING_DOUBLE(T, ftrl_beta, 0, 1e6, "1", "FTRL beta"),
    PC_SETTING_DOUBLE(T, l1, 0, 1e6, "0", "FTRL L1 strength"),
    PC_SETTING_DOUBLE(T, l2, 0, 1e6, "0", "FTRL L2 strength"),
    PC_SETTING_DOUBLE(T, weight_decay, 0, 1e6, "0", "L2 weight decay added to gradients"),
    PC_SETTING_DOUBLE(T, clip_value, 0, 1e30, "0", "clip gradient elements to +-v (0: off)"),
    PC_SETTING_DOUBLE(T, clip_norm, 0, 1e30, "0", "clip gradient row L2 norm (0: off)"),
    PC_SETTING_INT(T, admit_threshold, 0, 255, "0", "sightings before a key gets a row (0: off)"),
    PC_SETTING_INT(T, admit_width, 1024, 1 << 30, "4Mi", "admission sketch counters per row"),
    PC_SETTING_INT(T, admit_decay_ticks, 0, 1 << 30, "0", "halve sketch every N ticks (0: off)"),
    PC_SETTING_INT(T, ttl_ticks, 0, PS_AGE_MAX, "0", "expire rows idle N ticks (0: off)"),
    PC_SETTING_INT(T, capacity_rows, 0, 1e15, "0", "row budget, CLOCK eviction (0: off)"),
    PC_SETTING_BOOL(T, cold, "false", "spill rows beyond capacity_rows to the RocksDB tier"),
    PC_SETTING_INT(T, replication_lag, 0, 1e15, "0",
                   "with backups: change-log entries a backup may trail a push's answer (0: sync)"),
};
#undef T

#define N_TABLE_SETTINGS (sizeof k_table_settings / sizeof k_table_settings[0])

const pc_setting_t *ps_table_settings(size_t *n) {
    *n = N_TABLE_SETTINGS;
    return k_table_settings;
}

void ps_table_config_defaults(ps_table_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    if (pc_settings_defaults(k_table_settings, N_TABLE_SETTINGS, cfg))
        abort(); /* a default violates its own bounds: a bug in the table above */
}

int ps_table_config_parse(ps_table_config_t *cfg, const char *spec, char *err, size_t errlen) {
    ps_table_config_t tmp = *cfg;
    int rc = pc_settings_parse_list(k_table_settings, N_TABLE_SETTINGS, &tmp, spec, err, errlen);
    if (rc)
        return rc == PC_ENOTFOUND ? PC_EINVAL : rc;
    rc = ps_table_config_check(&tmp, err, errlen);
    if (rc)
        return rc;
    *cfg = tmp;
    return 0;
}

size_t ps_table_config_format(const ps_table_config_t *cfg, char *buf, size_t cap) {
    size_t len = 0;
    if (cap)
        buf[0] = '\0';
    for (size_t i = 0; i < N_TABLE_SETTINGS; i++) {
        char v[128];
        pc_settings_format(&k_table_settings[i], cfg, v, sizeof v);
        int w = snprintf(len < cap ? buf + len : NULL, len < cap ? cap - len : 0, "%s%s=%s",
                         i ? "," : "", k_table_settings[i].name, v);
        if (w > 0)
            len += (size_t)w;
    }
    return len;
}

int ps_table_config_check(const ps_table_config_t *cfg, char *err, size_t errlen) {
    char buf[64];
    for (size_t i = 0; i < N_TABLE_SETTINGS; i++) {
        /* Re-validate every field through the settings parser (bounds, choices). */
        pc_settings_format(&k_table_settings[i], cfg, buf, sizeof buf);
        if (k_table_settings[i].type == PC_SET_ENUM) {
            int v = *(const int *)((const char *)cfg + k_table_settings[i].offset);
            int nch = 0;
            while (k_table_settings[i].choices[nch])
                nch++;
            if (v < 0 || v >= nch) {
                snprintf(err ? err : buf, err ? errlen : sizeof buf, "%s: bad choice %d",
                         k_table_settings[i].name, v);
                return PC_EINVAL;
            }
            continue;
        }
        if (k_table_settings[i].type == PC_SET_STRING)
            continue;
        ps_table_config_t scratch = *cfg;
        int rc = pc_settings_set(k_table_settings, N_TABLE_SETTINGS, &scratch,
                                 k_table_settings[i].name, buf, err, errlen);
        if (rc)
            return rc;
    }
    size_t nl = strnlen(cfg->name, sizeof cfg->name);
    if (nl == 0 || nl == sizeof cfg->name) {
        snprintf(err ? err : buf, err ? errlen : sizeof buf, "name: empty or too long");
        return PC_EINVAL;
    }
    for (size_t i = 0; i < nl; i++) {
        char c = cfg->name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-')) {
            snprintf(err ? err : buf, err ? errlen : sizeof buf,
                     "name: '%s' has characters outside [A-Za-z0-9_.-]", cfg->name);
            return PC_EINVAL;
        }
    }
    if (cfg->shards & (cfg->shards - 1)) {
        snprintf(err ? err : buf, err ? errlen : sizeof buf, "shards: %lld is not a power of two",
                 (long long)cfg->shards);
        return PC_EINVAL;
    }
    /* Settings under which the optimizer divides 0 by 0 (a gradient element that stayed 0, a
     * first step) or by 0 at all: the NaN or Inf would be stored, served and checkpointed. They
     * are judged as the hot path holds them, in float (1e-50 is 0 there, 0.99999999 is 1). */
    const char *why = NULL;
    if (cfg->optimizer == PS_OPT_ADAM && !((float)cfg->eps > 0))
        why = "adam needs eps > 0 (in float: at least 1.4e-45)";
    else if (cfg->optimizer == PS_OPT_ADAM && !((float)cfg->beta2 < 1.0f))
        why = "adam needs beta2 < 1 in float (at most 0.99999994): 1 - beta2 would be 0";
    else if ((cfg->optimizer == PS_OPT_ADAGRAD || cfg->optimizer == PS_OPT_ROWWISE_ADAGRAD) &&
             !((float)cfg->eps > 0) && !((float)cfg->adagrad_init > 0))
        why = "adagrad needs eps > 0 or adagrad_init > 0 (in float: at least 1.4e-45)";
    else if (cfg->optimizer == PS_OPT_FTRL && !((float)cfg->lr > 0))
        why = "ftrl needs lr (its alpha) > 0";
    else if (cfg->optimizer == PS_OPT_FTRL &&
             !((float)cfg->ftrl_beta / (float)cfg->lr + (float)cfg->l2 > 0))
        why = "ftrl needs ftrl_beta / lr + l2 > 0 in float (a first gradient too small to square "
              "would divide by 0)";
    if (why) {
        snprintf(err ? err : buf, err ? errlen : sizeof buf, "%s", why);
        return PC_EINVAL;
    }
    return 0;
}

/* ==== small helpers ======================================================================== */

static inline uint64_t key_hash(uint64_t key) {
    return pc_hash_u64(key, PC_HASH_SEED_INDEX);
}

/* Shards come from hash bits 52..63 (at most 4096 shards), disjoint from the tag bits 32..51
 * and the bucket bits 0..31. */
static inline uint32_t shard_of(const ps_table_t *t, uint64_t h) {
    return (uint32_t)(h >> 52) & (t->nshards - 1);
}

static inline uint32_t bucket1(const ps_shard_t *s, uint64_t h) {
    return pc_hash_range((uint32_t)h, s->nbuckets);
}

static inline uint32_t bucket2(const ps_shard_t *s, uint64_t h) {
    return pc_hash_range((uint32_t)((h * UINT64_C(0x9E3779B97F4A7C15)) >> 32), s->nbuckets);
}

static inline uint32_t slot_tag(const ps_shard_t *s, uint64_t h) {
    /* Never 0, so a free slot (0) never carries a key's tag: matching needs no occupancy test. */
    const uint32_t tag = (uint32_t)(h >> 32) & s->tag_mask;
    return (tag | (tag == 0)) << s->rid_bits;
}

static inline uint64_t rng_next(ps_shard_t *s) {
    /* xorshift64*: per-shard, used under the write lock. */
    uint64_t x = s->rng;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    s->rng = x;
    return x * UINT64_C(0x2545F4914F6CDD1D);
}

static inline unsigned char *row_at(const ps_table_t *t, const ps_shard_t *s, uint32_t r) {
    return s->rows + (size_t)r * t->row_bytes;
}

static inline float *row_state(const ps_table_t *t, unsigned char *row) {
    return (float *)(void *)(row + t->wbytes);
}

/* A stored row's weights as f32 (dim floats into out): exact. */
static inline void row_weights_get(const ps_table_t *t, const unsigned char *row, float *out) {
    if (t->dtype == PS_ROW_F32)
        memcpy(out, row, (size_t)t->dim * sizeof(float));
    else if (t->dtype == PS_ROW_BF16)
        t->half->from_bf16((const uint16_t *)(const void *)row, out, t->dim);
    else
        t->half->from_f16((const uint16_t *)(const void *)row, out, t->dim);
}

/* Whether finite x is past f16's largest finite value, 65504, in magnitude. */
static inline bool f16_past_range(float x) {
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    b &= 0x7fffffffu;
    return b > 0x477fe000u && b < 0x7f800000u;
}

/* Store f32 weights into a row, rounded to nearest; f16 saturates at its largest finite (65504),
 * as the optimizer's stochastic rounding does: an initial value (init_scale up to 1e6) or a
 * loaded f32 row past the range was stored as Inf, served, and kept for good (NaN under FTRL or
 * weight decay). */
static inline void row_weights_set(const ps_table_t *t, unsigned char *row, const float *w) {
    if (t->dtype == PS_ROW_F32) {
        memcpy(row, w, (size_t)t->dim * sizeof(float));
    } else if (t->dtype == PS_ROW_BF16) {
        t->half->to_bf16(w, (uint16_t *)(void *)row, t->dim);
    } else {
        float sat[PS_DIM_MAX];
        const float *src = w;
        for (uint32_t i = 0; i < t->dim; i++)
            if (f16_past_range(w[i])) {
                for (uint32_t j = 0; j < t->dim; j++)
                    sat[j] = f16_past_range(w[j]) ? (w[j] > 0 ? 65504.f : -65504.f) : w[j];
                src = sat;
                break;
            }
        t->half->to_f16(src, (uint16_t *)(void *)row, t->dim);
    }
}

/* A row as outside the slab: stride floats, weights then state. */
static inline void row_export(const ps_table_t *t, const unsigned char *row, float *out) {
    row_weights_get(t, row, out);
    memcpy(out + t->dim, row + t->wbytes, (size_t)t->state_len * sizeof(float));
}

static inline void row_import(const ps_table_t *t, unsigned char *row, const float *src) {
    row_weights_set(t, row, src);
    memcpy(row + t->wbytes, src + t->dim, (size_t)t->state_len * sizeof(float));
}

/* The f32 initializer's row of key (dim floats), before any rounding to the stored type. */
static inline void init_f32(const ps_table_t *t, uint64_t key, float *out) {
    ps__init_row((ps_init_kind_t)t->cfg.init, (float)t->cfg.init_scale, (uint64_t)t->cfg.seed, key,
                 t->dim, out);
}

/* The initial row of key as the table stores it: init_f32's, rounded in a 16-bit table through
 * a scratch row (the accessors' own conversion). */
static void fill_initial(const ps_table_t *t, uint64_t key, float *out) {
    init_f32(t, key, out);
    if (t->dtype != PS_ROW_F32) {
        uint16_t scratch[PS_DIM_MAX]; /* a 16-bit row's weights */
        row_weights_set(t, (unsigned char *)scratch, out);
        row_weights_get(t, (const unsigned char *)scratch, out);
    }
}

/* Morris-style increment with probability 1 / (1 + freq * FREQ_FACTOR). The coin is a hash of
 * the key and the table's update version, not a stateful generator, so a restored table counts
 * exactly as the original would have. */
static inline void freq_bump(ps_km_t *km, uint64_t salt) {
    uint8_t c = km->freq & FREQ_MASK; /* a change: the row is no longer clean */
    if (c < FREQ_MAX &&
        ((pc_hash_u64(km->key, salt) >> 32) * (uint64_t)(1 + c * FREQ_FACTOR)) >> 32 == 0)
        c++;
    km->freq = c;
}

/* How a prefetched line will be used: read and kept (index buckets, key records, gradients),
 * written, or read once (a pulled row: a non-temporal hint, so rows streaming through do not
 * push the index and the key records, which every key needs, out of the caches). */
enum { PF_READ, PF_WRITE, PF_STREAM };

/* Prefetch the cache lines of `bytes` bytes at p (at most 32 lines). The hint must be a
 * literal, hence the three loops.
 *
 * The prefetch helpers are always_inline on purpose: a function whose only effect is
 * __builtin_prefetch is classified as const by GCC's interprocedural pure-const analysis when it
 * is not inlined early, and calls to a const void function are then deleted as dead code. That
 * happened to prefetch_row before (every row prefetch of the pipeline was silently dropped); the
 * table's tests cannot see it, ps-bench table can (push 0.12 -> 0.18 of the gather). */
static inline __attribute__((always_inline)) void prefetch_bytes(const void *p, uint32_t bytes,
                                                                 int use) {
    const uintptr_t a = (uintptr_t)p;
    const char *line = (const char *)(a & ~(uintptr_t)63);
    uint32_t lines = (uint32_t)((a + (uintptr_t)bytes - 1) / 64 - a / 64) + 1;
    if (lines > 32)
        lines = 32;
    if (use == PF_WRITE) {
        for (uint32_t l = 0; l < lines; l++, line += 64)
            __builtin_prefetch(line, 1, 3);
    } else if (use == PF_STREAM) {
        for (uint32_t l = 0; l < lines; l++, line += 64)
            __builtin_prefetch(line, 0, 0);
    } else {
        for (uint32_t l = 0; l < lines; l++, line += 64)
            __builtin_prefetch(line, 0, 3);
    }
}

/* Prefetch row r's record and the cache lines of its first `bytes` bytes. Records are 11 bytes
 * packed, so one in six straddles two lines: a write prefetches the whole record, a read the key
 * (one in nine straddles). A prefetch of the first byte alone left those keys demand misses at
 * stage C. A read streams the row (PF_STREAM, see docs/table.md). */
static inline __attribute__((always_inline)) void
prefetch_row(const ps_table_t *t, const ps_shard_t *s, uint32_t r, int write, uint32_t bytes) {
    prefetch_bytes(&s->km[r], write ? (uint32_t)sizeof(ps_km_t) : (uint32_t)sizeof(uint64_t),
                   write ? PF_WRITE : PF_READ);
    prefetch_bytes(row_at(t, s, r), bytes, write ? PF_WRITE : PF_STREAM);
}

/* Bitmask of the slots of a bucket that carry `tag` (never 0, see slot_tag) in the bits `hi`:
 * 16 compares packed into one movemask. */
static inline uint32_t bucket_match(const uint32_t *sl, uint32_t hi, uint32_t tag) {
#ifdef __SSE2__
    const __m128i vh = _mm_set1_epi32((int)hi), vt = _mm_set1_epi32((int)tag);
    const __m128i *v = (const __m128i *)sl;
    const __m128i e0 = _mm_cmpeq_epi32(_mm_and_si128(_mm_load_si128(v), vh), vt);
    const __m128i e1 = _mm_cmpeq_epi32(_mm_and_si128(_mm_load_si128(v + 1), vh), vt);
    const __m128i e2 = _mm_cmpeq_epi32(_mm_and_si128(_mm_load_si128(v + 2), vh), vt);
    const __m128i e3 = _mm_cmpeq_epi32(_mm_and_si128(_mm_load_si128(v + 3), vh), vt);
    const __m128i p = _mm_packs_epi16(_mm_packs_epi32(e0, e1), _mm_packs_epi32(e2, e3));
    return (uint32_t)_mm_movemask_epi8(p);
#else
    uint32_t mask = 0;
    for (int j = 0; j < BUCKET_SLOTS; j++)
        mask |= (uint32_t)((sl[j] & hi) == tag) << j;
    return mask;
#endif
}

static inline const uint32_t *bucket_at(const ps_shard_t *s, uint32_t b) {
    return s->slots + (size_t)b * BUCKET_SLOTS;
}

/* Candidate hints of the pipeline's stages B and B2 (real rows are < 2^28). */
#define CAND_ABSENT UINT32_MAX       /* no tag match in b1 or b2: the key has no row */
#define CAND_IN_B2  (UINT32_MAX - 1) /* no tag match in b1: look in b2 */

/* Stage B: first tag match in b1, without touching keys. A key without a match goes on to b2
 * even when b1 has room (a key may sit in b2 while its b1 has room: removals free slots, and
 * moves and walks place residents in their other bucket): stage B2 then settles its absence with
 * a prefetched line instead of stage C's full probe missing on b2. */
static inline uint32_t probe_b1(const ps_shard_t *s, uint64_t h) {
    const uint32_t *sl = bucket_at(s, bucket1(s, h));
    const uint32_t m = bucket_match(sl, ~s->rid_mask, slot_tag(s, h));
    return m ? (sl[__builtin_ctz(m)] & s->rid_mask) - 1 : CAND_IN_B2;
}

/* Stage B2: first tag match in b2. */
static inline uint32_t probe_b2(const ps_shard_t *s, uint64_t h) {
    const uint32_t *sl = bucket_at(s, bucket2(s, h));
    uint32_t m = bucket_match(sl, ~s->rid_mask, slot_tag(s, h));
    return m ? (sl[__builtin_ctz(m)] & s->rid_mask) - 1 : CAND_ABSENT;
}

/* Full probe: the row of key, or NO_ROW. */
static uint32_t find_row(const ps_shard_t *s, uint64_t key, uint64_t h) {
    const uint32_t tag = slot_tag(s, h), hi = ~s->rid_mask;
    const uint32_t b[2] = {bucket1(s, h), bucket2(s, h)};
    for (int k = 0; k < 2; k++) {
        const uint32_t *sl = bucket_at(s, b[k]);
        for (uint32_t m = bucket_match(sl, hi, tag); m; m &= m - 1) {
            uint32_t r = (sl[__builtin_ctz(m)] & s->rid_mask) - 1;
            if (s->km[r].key == key)
                return r;
        }
        if (b[1] == b[0])
            break;
    }
    return NO_ROW;
}

/* Pipeline stage C: confirm the candidate or probe again. `settled`: the index has not changed
 * since the candidate was taken (a read lock's pass), so CAND_ABSENT is final; under the write
 * lock an earlier key of the pass may have inserted or moved rows. */
static inline uint32_t resolve(const ps_shard_t *s, uint64_t key, uint64_t h, uint32_t cand,
                               bool settled) {
    if (cand < s->count && s->km[cand].key == key)
        return cand;
    if (settled && cand == CAND_ABSENT)
        return NO_ROW;
    return find_row(s, key, h);
}

/* The slot holding row r of key hash h (its row id is unique), or NULL. */
static uint32_t *slot_of_row(ps_shard_t *s, uint64_t h, uint32_t r) {
    const uint32_t b[2] = {bucket1(s, h), bucket2(s, h)};
    for (int k = 0; k < 2; k++) {
        uint32_t *sl = s->slots + (size_t)b[k] * BUCKET_SLOTS;
        for (int j = 0; j < BUCKET_SLOTS; j++)
            if (sl[j] && (sl[j] & s->rid_mask) == r + 1)
                return &sl[j];
    }
    return NULL;
}

/* ==== index ================================================================================ */

static inline int bucket_put(uint32_t *sl, uint32_t v) {
    for (int j = 0; j < BUCKET_SLOTS; j++) {
        if (!sl[j]) {
            sl[j] = v;
            return 1;
        }
    }
    return 0;
}

/* Put slot value v into full bucket b by moving one of its residents to that resident's other
 * bucket, where it has room. The 16 residents' keys, then their other buckets, are fetched
 * together: two rounds of parallel misses instead of a random walk's chain of dependent ones
 * (a walk averaged 2.5 moves, two misses each). 1 when placed; else nothing changed. */
static int index_move_one(ps_shard_t *s, uint32_t b, uint32_t v) {
    uint32_t *sl = s->slots + (size_t)b * BUCKET_SLOTS;
    uint32_t alt[BUCKET_SLOTS];
    for (int j = 0; j < BUCKET_SLOTS; j++)
        __builtin_prefetch(&s->km[(sl[j] & s->rid_mask) - 1], 0, 3);
    for (int j = 0; j < BUCKET_SLOTS; j++) {
        const uint64_t vh = key_hash(s->km[(sl[j] & s->rid_mask) - 1].key);
        const uint32_t vb1 = bucket1(s, vh);
        alt[j] = vb1 == b ? bucket2(s, vh) : vb1;
        __builtin_prefetch(bucket_at(s, alt[j]), 0, 3);
    }
    for (int j = 0; j < BUCKET_SLOTS; j++) {
        if (alt[j] != b && bucket_put(s->slots + (size_t)alt[j] * BUCKET_SLOTS, sl[j])) {
            sl[j] = v;
            return 1;
        }
    }
    return 0;
}

/* Place row r (hash h) into the index: a free slot of b1 or b2, else one resident moved aside
 * (index_move_one), else a random walk. PC_EFULL when the walk gives up; the walk is then undone,
 * so the index is exactly as before (without r) and the caller may rebuild. */
static int index_place(ps_shard_t *s, uint64_t h, uint32_t r) {
    uint32_t v = slot_tag(s, h) | (r + 1);
    uint32_t b1 = bucket1(s, h), b2 = bucket2(s, h);
    if (bucket_put(s->slots + (size_t)b1 * BUCKET_SLOTS, v) ||
        bucket_put(s->slots + (size_t)b2 * BUCKET_SLOTS, v) || index_move_one(s, b1, v) ||
        (b2 != b1 && index_move_one(s, b2, v)))
        return 0;
    uint32_t *path[MAX_KICKS];
    uint32_t b = (rng_next(s) & 1) ? b1 : b2;
    for (int k = 0; k < MAX_KICKS; k++) {
        uint32_t *sl = s->slots + (size_t)b * BUCKET_SLOTS;
        uint32_t pos = (uint32_t)(rng_next(s) >> 60); /* 0..15 */
        uint32_t victim = sl[pos];
        sl[pos] = v;
        path[k] = &sl[pos];
        v = victim;
        uint64_t vh = key_hash(s->km[(v & s->rid_mask) - 1].key);
        uint32_t vb1 = bucket1(s, vh), vb2 = bucket2(s, vh);
        uint32_t alt = b == vb1 ? vb2 : vb1;
        if (bucket_put(s->slots + (size_t)alt * BUCKET_SLOTS, v))
            return 0;
        b = alt;
    }
    for (int k = MAX_KICKS; k-- > 0;) { /* undo: each slot gets back what it held */
        uint32_t cur = *path[k];
        *path[k] = v;
        v = cur;
    }
    return PC_EFULL;
}

static uint32_t bit_length(uint64_t x) {
    return x ? 64u - (uint32_t)__builtin_clzll(x) : 0;
}

/* Rebuild the index with at least `nb` buckets from the slab. */
static int index_rebuild(ps_shard_t *s, uint32_t nb) {
    uint32_t *old = s->slots;
    uint32_t old_nb = s->nbuckets, old_bits = s->rid_bits, old_mask = s->rid_mask,
             old_tag = s->tag_mask;
    if (nb < MIN_BUCKETS)
        nb = MIN_BUCKETS;
    int rc = PC_EFULL;
    for (int attempt = 0; attempt < 8; attempt++) {
        uint64_t nslots = (uint64_t)nb * BUCKET_SLOTS;
        uint32_t bits = bit_length(nslots);
        if (bits > MAX_RID_BITS)
            break;
        uint32_t *slots = pc_vm_alloc(PC_MEM_INDEX, nslots * sizeof(uint32_t));
        if (!slots) {
            rc = PC_ENOMEM;
            break;
        }
        if (nslots * sizeof(uint32_t) >= HUGE_MIN_INDEX)
            pc_vm_advise_huge(slots, nslots * sizeof(uint32_t), 0);
        pc_vm_populate(slots, nslots * sizeof(uint32_t)); /* placement reads buckets first */
        s->slots = slots;
        s->nbuckets = nb;
        s->rid_bits = bits;
        s->rid_mask = (uint32_t)((1u << bits) - 1);
        uint32_t tag_bits = 32 - bits < MAX_TAG_BITS ? 32 - bits : MAX_TAG_BITS;
        s->tag_mask = (uint32_t)((1u << tag_bits) - 1);
        /* Rows in slab order: key records stream in, buckets are prefetched REBUILD_D rows
         * ahead of their placement (hashes kept in a ring). */
        int ok = 1;
        uint64_t ring[REBUILD_D];
        for (uint32_t r = 0; r < s->count + REBUILD_D && ok; r++) {
            if (r + 16 < s->count)
                __builtin_prefetch(&s->km[r + 16], 0, 0);
            if (r >= REBUILD_D && index_place(s, ring[r % REBUILD_D], r - REBUILD_D))
                ok = 0;
            if (r < s->count) {
                ring[r % REBUILD_D] = key_hash(s->km[r].key);
                __builtin_prefetch(bucket_at(s, bucket1(s, ring[r % REBUILD_D])), 1, 3);
            }
        }
        if (ok) {
            if (old)
                pc_vm_free(PC_MEM_INDEX, old, (size_t)old_nb * BUCKET_SLOTS * sizeof(uint32_t));
            s->rebuilds++;
            return 0;
        }
        pc_vm_free(PC_MEM_INDEX, slots, nslots * sizeof(uint32_t));
        nb = nb + nb / 8 + 1;
    }
    s->slots = old; /* the old index, with its own geometry, is still valid */
    s->nbuckets = old_nb;
    s->rid_bits = old_bits;
    s->rid_mask = old_mask;
    s->tag_mask = old_tag;
    return rc;
}

static inline uint64_t max_rows(const ps_shard_t *s) {
    return (uint64_t)s->nbuckets * BUCKET_SLOTS * MAX_LOAD_PCT / 100;
}

/* ==== slab ================================================================================= */

static size_t rows_bytes(const ps_table_t *t, uint32_t cap) {
    return (size_t)cap * t->row_bytes;
}

static int slab_resize(const ps_table_t *t, ps_shard_t *s, uint32_t cap) {
    if (cap < 16)
        cap = 16;
    const size_t nbytes = rows_bytes(t, cap), kb = (size_t)cap * sizeof(ps_km_t);
    unsigned char *rows =
        s->rows ? pc_vm_resize(PC_MEM_ROWS, s->rows, rows_bytes(t, s->rows_cap), nbytes)
                : pc_vm_alloc(PC_MEM_ROWS, nbytes);
    if (!rows)
        return PC_ENOMEM;
    s->rows = rows;
    s->rows_cap = cap;
    if (nbytes >= HUGE_MIN_BYTES)
        pc_vm_advise_huge(rows, nbytes, rows_bytes(t, s->count));
    ps_km_t *km = s->km ? pc_vm_resize(PC_MEM_KEYS, s->km, (size_t)s->km_cap * sizeof(ps_km_t), kb)
                        : pc_vm_alloc(PC_MEM_KEYS, kb);
    if (!km) {
        /* The rows back to the size that was in use, or freed when they were new (a mapping of
         * 0 bytes cannot be resized: the shard would refuse every insert for good, and leak).
         * When even that fails, each mapping keeps the size it has (rows_cap, km_cap: what a
         * later resize or the free takes) and the shard uses the smaller. */
        if (!s->km) {
            pc_vm_free(PC_MEM_ROWS, s->rows, nbytes);
            s->rows = NULL;
            s->rows_cap = 0;
        } else {
            unsigned char *back = pc_vm_resize(PC_MEM_ROWS, s->rows, nbytes, rows_bytes(t, s->cap));
            if (back) {
                s->rows = back;
                s->rows_cap = s->cap;
            }
            s->cap = s->rows_cap < s->km_cap ? s->rows_cap : s->km_cap;
        }
        return PC_ENOMEM;
    }
    if (kb >= HUGE_MIN_BYTES)
        pc_vm_advise_huge(km, kb, (size_t)s->count * sizeof(ps_km_t));
    s->km = km;
    s->km_cap = s->cap = cap;
    return 0;
}

/* ---- snapshot helpers ---------------------------------------------------------------------
 * While a snapshot is active in a shard (cow_active), a row is "pre-cut" when it was last changed
 * before the cut: its age exceeds the ticks elapsed since the cut. The first change to a pre-cut
 * row saves its image first; every change stamps the current clock, so later changes skip it. */

static inline int row_precut(const ps_shard_t *s, uint16_t tick) {
    uint16_t age = (uint16_t)((uint16_t)s->clock - tick);
    return age > s->clock - s->cow_cut;
}

static void cow_free(ps_table_t *t, ps_shard_t *s) {
    pc_free(PC_MEM_SCRATCH, s->cow, s->cow_cap * t->cow_rec_bytes);
    s->cow = NULL;
    s->cow_n = s->cow_cap = 0;
    s->cow_active = 0;
    s->scan_cursor = 0;
}

/* Save row r's image if the shard's snapshot still needs it. */
static void cow_save(ps_table_t *t, ps_shard_t *s, uint32_t r) {
    /* Rows below the scan cursor are written already (their pre-cut image is out). */
    if (!s->cow_active || r < s->scan_cursor || !row_precut(s, s->km[r].tick))
        return;
    if (s->cow_n == s->cow_cap) {
        size_t ncap = s->cow_cap ? 2 * s->cow_cap : 64;
        uint8_t *c = pc_realloc(PC_MEM_SCRATCH, s->cow, s->cow_cap * t->cow_rec_bytes,
                                ncap * t->cow_rec_bytes);
        if (!c) {
            s->cow_failed = 1; /* the snapshot reports PC_ENOMEM; the table is unaffected */
            cow_free(t, s);    /* stop copying (and let aging resume) at once */
            return;
        }
        s->cow = c;
        s->cow_cap = ncap;
    }
    uint8_t *rec = s->cow + s->cow_n++ * t->cow_rec_bytes;
    ps_cow_hdr_t h = {s->km[r].key, s->km[r].tick, (uint8_t)(s->km[r].freq & FREQ_MASK)};
    memcpy(rec, &h, sizeof h);
    row_export(t, row_at(t, s, r), (float *)(void *)(rec + sizeof h));
}

/* Log the removal of `key` (for incremental checkpoints' tombstones). */
static void log_removal(ps_table_t *t, ps_shard_t *s, uint64_t key) {
    /* Cold tables are always written in full (their cold part is a copy of the store). */
    if (t->cfg.cold || !atomic_load_explicit(&t->track_removed, memory_order_relaxed))
        return;
    if (s->removed_n == s->removed_cap) {
        size_t ncap = s->removed_cap ? 2 * s->removed_cap : 64;
        ps_removal_t *r =
            pc_realloc(PC_MEM_SCRATCH, s->removed, s->removed_cap * sizeof(ps_removal_t),
                       ncap * sizeof(ps_removal_t));
        if (!r) {
            s->removed_lost = 1; /* incremental snapshots fail until a full one is committed */
            s->lost_clock = s->clock;
            return;
        }
        s->removed = r;
        s->removed_cap = ncap;
    }
    s->removed[s->removed_n++] = (ps_removal_t){key, s->clock};
}

/* Remove row r: clear its slot, move the last row into its place. */
static void row_remove(ps_table_t *t, ps_shard_t *s, uint32_t r) {
    cow_save(t, s, r);
    log_removal(t, s, s->km[r].key);
    uint32_t *sl = slot_of_row(s, key_hash(s->km[r].key), r);
    if (sl)
        *sl = 0;
    uint32_t last = s->count - 1;
    if (r < s->scan_cursor && last >= s->scan_cursor)
        cow_save(t, s, last); /* an unwritten row moves into the written part: save it first */
    if (r != last) {
        memcpy(row_at(t, s, r), row_at(t, s, last), t->row_bytes);
        s->km[r] = s->km[last];
        uint64_t hl = key_hash(s->km[r].key);
        uint32_t *ls = slot_of_row(s, hl, last);
        if (ls)
            *ls = (*ls & ~s->rid_mask) | (r + 1);
    }
    s->count--;
    s->erased++;
    if (s->hand > s->count)
        s->hand = 0;
}

/* Shrink index and slab after mass removal (keeps memory proportional to rows). */
static void shard_maybe_shrink(ps_table_t *t, ps_shard_t *s) {
    uint64_t nslots = (uint64_t)s->nbuckets * BUCKET_SLOTS;
    if (s->nbuckets > MIN_BUCKETS && (uint64_t)s->count * 100 < nslots * SHRINK_LOAD_PCT) {
        uint64_t want = (uint64_t)s->count * 100 / SETTLE_LOAD_PCT / BUCKET_SLOTS + 1;
        (void)index_rebuild(s, (uint32_t)want); /* on failure the old index stays valid */
    }
    if (s->cap > 1024 && s->count < s->cap / 4)
        (void)slab_resize(t, s, s->cap / 2);
}

/* Append keys[0..n) to the change log if a follower started one (one load otherwise). Called
 * after the change is applied (an eviction: under its shard's lock, before the slot is reused). */
static void log_append(ps_table_t *t, const uint64_t *keys, size_t n) {
    ps_changelog_t *log = atomic_load_explicit(&t->log, memory_order_acquire);
    if (log)
        ps_changelog_append(log, keys, n);
}

/* A view of row r. The weights are the slab's own in an f32 table, else converted into wbuf
 * (dim floats, which must outlive the view's use). */
static void row_view(const ps_table_t *t, const ps_shard_t *s, uint32_t r, ps_row_view_t *v,
                     float *wbuf) {
    unsigned char *row = row_at(t, s, r);
    v->key = s->km[r].key;
    if (t->dtype == PS_ROW_F32) {
        v->weights = (const float *)(const void *)row;
    } else {
        row_weights_get(t, row, wbuf);
        v->weights = wbuf;
    }
    v->state = t->state_len ? row_state(t, row) : NULL;
    v->tick = s->km[r].tick;
    v->freq = s->km[r].freq & FREQ_MASK;
}

static void evict_row(ps_table_t *t, ps_shard_t *s, uint32_t r, ps_evict_reason_t why) {
    if (t->evict_fn) {
        ps_row_view_t v;
        float wbuf[PS_DIM_MAX];
        row_view(t, s, r, &v, wbuf);
        t->evict_fn(t->evict_ctx, why, &v);
    }
    const uint64_t key = s->km[r].key; /* logged before the slot is reused; a reader looks the */
    log_append(t, &key, 1);            /* key up later, after the shard lock is released */
    if (why == PS_EVICT_CAPACITY)
        s->ev_cap++;
    else
        s->ev_ttl++;
    row_remove(t, s, r);
    s->erased--; /* counted as eviction, not erase */
}

/* Generalized CLOCK over the frequency counters: the row to evict next (the shard has rows). */
static uint32_t clock_victim(ps_table_t *t, ps_shard_t *s) {
    (void)t;
    uint32_t victim = NO_ROW;
    uint32_t best = 256;
    for (int k = 0; k < CLOCK_PROBES && s->count; k++) {
        if (s->hand >= s->count)
            s->hand = 0;
        const uint8_t m = s->km[s->hand].freq, f = m & FREQ_MASK;
        if (f == 0) {
            victim = s->hand;
            break;
        }
        if (f < best) {
            best = f;
            victim = s->hand;
        }
        /* Age the counter, except on pre-cut rows while a snapshot copies: their metadata must
         * stay as at the cut (and saving each one visited would cost a copy per visit). */
        if (!(s->cow_active && row_precut(s, s->km[s->hand].tick)))
            s->km[s->hand].freq = (uint8_t)((m & ROW_CLEAN) | (f - 1));
        s->hand++;
    }
    return victim;
}

/* ---- cold tier: spills (shard write lock held) --------------------------------------------- */

/* Absolute clock of a stored tick (exact below PS_AGE_MAX), and back. */
static inline uint32_t clock_of_tick(const ps_shard_t *s, uint16_t tick) {
    const uint32_t age = (uint16_t)((uint16_t)s->clock - tick);
    return s->clock >= age ? s->clock - age : 0;
}

static inline uint16_t tick_of_clock(const ps_shard_t *s, uint32_t clock) {
    uint32_t age = clock <= s->clock ? s->clock - clock : 0;
    return (uint16_t)(s->clock - (age < PS_AGE_MAX ? age : PS_AGE_MAX));
}

bool ps_table_expired(const ps_table_t *t, uint32_t last, uint32_t now) {
    const uint32_t ttl = (uint32_t)t->cfg.ttl_ticks;
    return ttl && last <= now && now - last >= ttl;
}

static void spill_free(ps_table_t *t, ps_shard_t *s) {
    pc_free(PC_MEM_SCRATCH, s->spill_hdr, s->spill_hcap * sizeof *s->spill_hdr);
    pc_free(PC_MEM_SCRATCH, s->spill_rows, s->spill_cap * t->stride * sizeof(float));
    s->spill_hdr = NULL;
    s->spill_rows = NULL;
    s->spill_cap = s->spill_hcap = s->spill_n = 0;
}

/* Queue row r for writing to the cold store. */
static int spill_append(ps_table_t *t, ps_shard_t *s, uint32_t r) {
    const size_t rb = (size_t)t->stride * sizeof(float);
    if (s->spill_n == s->spill_cap) {
        const size_t ncap = s->spill_cap ? 2 * s->spill_cap : 16;
        if (s->spill_hcap < ncap) {
            ps_spill_hdr_t *h = pc_realloc(PC_MEM_SCRATCH, s->spill_hdr, s->spill_hcap * sizeof *h,
                                           ncap * sizeof *h);
            if (!h)
                return PC_ENOMEM;
            s->spill_hdr = h;
            s->spill_hcap = ncap;
        }
        float *w = pc_realloc(PC_MEM_SCRATCH, s->spill_rows, s->spill_cap * rb, ncap * rb);
        if (!w)
            return PC_ENOMEM;
        s->spill_rows = w;
        s->spill_cap = ncap;
    }
    s->spill_hdr[s->spill_n] = (ps_spill_hdr_t){s->km[r].key, clock_of_tick(s, s->km[r].tick),
                                                (uint8_t)(s->km[r].freq & FREQ_MASK)};
    row_export(t, row_at(t, s, r), s->spill_rows + s->spill_n * t->stride);
    s->spill_n++;
    return 0;
}

/* The newest queued spill of key, or -1. A row evicted earlier in the same lock hold is newer
 * than anything fetched from the cold store before it, and not written there yet. */
static ptrdiff_t spill_find(const ps_shard_t *s, uint64_t key) {
    for (size_t i = s->spill_n; i-- > 0;)
        if (s->spill_hdr[i].key == key)
            return (ptrdiff_t)i;
    return -1;
}

/* Make room for one insert into a full shard of a cold table: evict the CLOCK victim, queueing
 * it for a write unless it is clean. While frozen, nothing is evicted (RAM over budget); after
 * a thaw each insert evicts up to two rows until the shard is back within its budget. */
static int cold_make_room(ps_table_t *t, ps_shard_t *s) {
    if (atomic_load_explicit(&t->cold_frozen, memory_order_acquire))
        return 0;
    for (int k = 0; k < 2 && s->count >= t->shard_cap && s->count; k++) {
        const uint32_t v = clock_victim(t, s);
        if (v == NO_ROW)
            break;
        if (!(s->km[v].freq & ROW_CLEAN)) {
            if (!t->has_cold || !t->cold.writable(t->cold_ctx)) {
                s->spill_refused++;
                return k ? 0 : PC_ENOSPC;
            }
            int rc = spill_append(t, s, v);
            if (rc)
                return k ? 0 : rc;
            s->spilled++;
        } else {
            s->spill_clean++;
        }
        s->ev_cap++;
        row_remove(t, s, v);
        s->erased--; /* counted as eviction, not erase */
    }
    return 0;
}

/* Insert key (absent). src: its stride floats, or NULL for the initial row with fresh optimizer
 * state; tick and freq (freq may carry ROW_CLEAN) as given. With `room`, a full shard first
 * evicts (cold tables: spills). */
static int row_insert_ex(ps_table_t *t, ps_shard_t *s, uint64_t key, uint64_t h, const float *src,
                         uint16_t tick, uint8_t freq, int room, uint32_t *out) {
    /* Fallible steps first, so that a failure evicts nothing. A new row (room) also reserves
     * slab and index room for every spill queued: when the cold write fails, cold_flush puts
     * them back (room 0), which then allocates nothing (it could fail for memory and lose
     * them). Evictions never raise count + spill_n, so the reserve holds until the flush. */
    const uint64_t need = (uint64_t)s->count + 1 + (room ? s->spill_n : 0);
    if (need > s->cap) {
        uint64_t cap = (uint64_t)s->cap + s->cap / 2 + 16;
        cap = cap < need ? need : cap;
        if (cap > (1u << MAX_RID_BITS))
            cap = 1u << MAX_RID_BITS;
        if (cap < need)
            return PC_EFULL;
        int rc = slab_resize(t, s, (uint32_t)cap);
        if (rc)
            return rc;
    }
    if (need > max_rows(s)) {
        const uint64_t per = (uint64_t)BUCKET_SLOTS * MAX_LOAD_PCT; /* rows x 100 a bucket */
        uint64_t nb = (uint64_t)s->nbuckets * GROW_NUM / GROW_DEN + 1;
        const uint64_t nb_need = (need * 100 + per - 1) / per;
        nb = nb < nb_need ? nb_need : nb;
        if (nb > UINT32_MAX / BUCKET_SLOTS)
            return PC_EFULL;
        int rc = index_rebuild(s, (uint32_t)nb);
        if (rc)
            return rc;
    }
    if (room && t->shard_cap && s->count >= t->shard_cap) {
        if (t->cfg.cold) {
            int rc = cold_make_room(t, s);
            if (rc)
                return rc;
        } else {
            uint32_t v = clock_victim(t, s);
            if (v != NO_ROW)
                evict_row(t, s, v, PS_EVICT_CAPACITY);
        }
    }
    uint32_t r = s->count++;
    s->km[r].key = key;
    s->km[r].tick = tick;
    s->km[r].freq = freq;
    unsigned char *row = row_at(t, s, r);
    if (src) {
        row_import(t, row, src);
    } else {
        float w[PS_DIM_MAX];
        init_f32(t, key, w);
        row_weights_set(t, row, w); /* rounded as fill_initial rounds */
        if (t->state_len)
            ps__optim_init_state(&t->opt, row_state(t, row));
    }
    if (index_place(s, h, r)) {
        /* The walk was undone: r is the only row without a slot; a rebuild places it. */
        int rc = index_rebuild(s, s->nbuckets * GROW_NUM / GROW_DEN + 1);
        if (rc) {
            s->count--; /* drop r: index and slab agree again */
            return rc;
        }
    }
    s->inserted++;
    *out = r;
    return 0;
}

/* Insert key (absent) with its initial row and fresh state, changed now. */
static int row_insert(ps_table_t *t, ps_shard_t *s, uint64_t key, uint64_t h, uint32_t *out) {
    return row_insert_ex(t, s, key, h, NULL, (uint16_t)s->clock, 1, 1, out);
}

/* Write the shard's queued spills (write lock held) in batches. Readers that missed a key
 * without the lock see cold_seq move and fetch again. If a write fails, the rows not written
 * go back into RAM (over budget, still changed; of a key queued twice, its newer copy), into
 * the room their inserts reserved (row_insert_ex), and the error is returned: nothing is lost
 * (unless a row's index placement fails and the rebuild it then needs finds no memory). */
static int cold_flush(ps_table_t *t, ps_shard_t *s) {
    if (!s->spill_n)
        return 0;
    ps_cold_row_t recs[SPILL_BATCH];
    s->cold_seq++;
    int rc = 0;
    size_t i0 = 0;
    for (; i0 < s->spill_n && !rc;) {
        size_t m = s->spill_n - i0 < SPILL_BATCH ? s->spill_n - i0 : SPILL_BATCH;
        for (size_t i = 0; i < m; i++) {
            const ps_spill_hdr_t *h = &s->spill_hdr[i0 + i];
            recs[i] =
                (ps_cold_row_t){h->key, h->clock, h->freq, s->spill_rows + (i0 + i) * t->stride};
        }
        rc = t->cold.put(t->cold_ctx, recs, m);
        if (!rc)
            i0 += m;
    }
    if (rc) {
        s->cold_errors++;
        size_t lost = 0;
        for (size_t i = s->spill_n; i-- > i0;) { /* newest first: a key queued twice */
            const ps_spill_hdr_t *h = &s->spill_hdr[i];
            uint64_t hh = key_hash(h->key);
            uint32_t r;
            if (find_row(s, h->key, hh) == NO_ROW &&
                row_insert_ex(t, s, h->key, hh, s->spill_rows + i * t->stride,
                              tick_of_clock(s, h->clock), h->freq, 0, &r))
                lost++;
        }
        if (lost)
            PC_ERROR("table %s: %zu evicted rows could neither be written nor kept in RAM",
                     t->cfg.name, lost);
        else
            PC_WARN("table %s: cold write failed (%s); %zu rows kept in RAM over budget",
                    t->cfg.name, pc_strerror(rc), s->spill_n - i0);
    }
    s->spill_n = 0;
    if (s->spill_cap > 4 * SPILL_BATCH) /* a burst: give the buffers back */
        spill_free(t, s);
    return rc;
}

/* ==== admission sketch ===================================================================== */

/* Count a sighting of key (when add) and return its estimated count. */
static uint32_t sketch_count(ps_shard_t *s, uint64_t key, int add) {
    uint64_t hs = pc_hash_u64(key, PC_HASH_SEED_SKETCH);
    uint32_t a = (uint32_t)hs, b = (uint32_t)(hs >> 32) | 1;
    uint8_t *c[SKETCH_DEPTH];
    uint32_t est = 255;
    for (uint32_t i = 0; i < SKETCH_DEPTH; i++) {
        c[i] = s->sketch + (size_t)i * s->sketch_width + pc_hash_range(a + i * b, s->sketch_width);
        if (*c[i] < est)
            est = *c[i];
    }
    if (add && est < 255) {
        for (uint32_t i = 0; i < SKETCH_DEPTH; i++) /* conservative update */
            if (*c[i] == est)
                (*c[i])++;
        est++;
    }
    return est;
}

/* ==== batch planning ======================================================================= */

static int plan_build(const ps_table_t *t, const uint64_t *keys, size_t n, plan_t *p) {
    const uint32_t ns = t->nshards, mask = ns - 1;
    size_t bytes = n * (sizeof(uint64_t) + 3 * sizeof(uint32_t) + sizeof(uint16_t)) +
                   (size_t)(ns + 1) * sizeof(uint32_t);
    p->mem = pc_malloc(PC_MEM_SCRATCH, bytes);
    if (!p->mem)
        return PC_ENOMEM;
    p->bytes = bytes;
    p->h = p->mem;
    p->cand = (uint32_t *)(p->h + n);
    p->order = p->cand + n;
    p->defer = p->order + n;
    uint32_t *cur = p->defer + n; /* ns + 1 counters, then cursors */
    p->sq = (uint16_t *)(cur + ns + 1);
    memset(cur, 0, (size_t)(ns + 1) * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++)
        p->h[i] = key_hash(keys[i]);
    const uint32_t first = shard_of(t, p->h[0]);
    for (size_t i = 0; i < n; i++) /* count per rotated shard */
        cur[((shard_of(t, p->h[i]) - first) & mask) + 1]++;
    for (uint32_t k = 0; k < ns; k++)
        cur[k + 1] += cur[k];
    for (size_t i = 0; i < n; i++) { /* stable scatter */
        const uint32_t sh = shard_of(t, p->h[i]);
        const uint32_t q = cur[(sh - first) & mask]++;
        p->order[q] = (uint32_t)i;
        p->sq[q] = (uint16_t)sh;
    }
    return 0;
}

static void plan_free(plan_t *p) {
    pc_free(PC_MEM_SCRATCH, p->mem, p->bytes);
}

#define NO_BUF SIZE_MAX

/* Validate a batch call and plan it. Returns a negative error, 0 when there is nothing to do, or
 * 1 when *p holds a plan (free it with plan_free). A float buffer of n * dim is required unless
 * buf_len is NO_BUF. */
static int batch_begin(const ps_table_t *t, const uint64_t *keys, size_t n, const void *buf,
                       size_t buf_len, plan_t *p) {
    if (!t || (n && (!keys || (buf_len != NO_BUF && !buf))))
        return PC_EINVAL;
    if (n > PS_BATCH_MAX)
        return PC_ETOOBIG;
    if (buf_len != NO_BUF && buf_len != n * t->dim)
        return PC_EDIM;
    if (n == 0)
        return 0;
    int rc = plan_build(t, keys, n, p);
    return rc ? rc : 1;
}

/* ==== batch pipeline ======================================================================= */

/* Pull and lookup read weights; push steps the optimizer; read copies whole rows (weights and
 * state: read_state); load writes them (load_rows). */
typedef enum { OP_PULL, OP_LOOKUP, OP_PUSH, OP_READ, OP_LOAD } op_t;

/* What load_rows writes: key k's weights at weights + k * wstride, its state at
 * states + k * sstride (NULL: fresh), its tick and frequency (NULL: now, 1). */
typedef struct load_src {
    const float *weights, *states;
    size_t wstride, sstride;
    const uint16_t *ticks;
    const uint8_t *freqs;
} load_src_t;

/* Duplicate merging for push, over the whole batch in visiting order: first[q] = the earliest
 * position holding the same key as position q; acc[q] = index of that key's summed gradient in
 * sum (in rows of dim floats: the offset in floats may pass 32 bits), or UINT32_MAX when the key
 * occurs once. Equal keys share a shard, so merging never crosses
 * a lock. */
typedef struct dedup {
    uint32_t *first, *acc, *table;
    float *sum;
    size_t sum_bytes;
} dedup_t;

/* One batch call: its inputs, outputs and first error. Positions q = 0..n-1 follow the plan's
 * visiting order. */
typedef struct batch {
    ps_table_t *t;
    const uint64_t *keys;
    plan_t *p;
    uint32_t n;
    float *rows;           /* pull, lookup: n * dim out; read: n * stride */
    uint8_t *found;        /* lookup (may be NULL), read */
    const load_src_t *ld;  /* load */
    const float *grads;    /* push: n * dim in */
    dedup_t *d;            /* push */
    ps_push_result_t *res; /* push */
    uint64_t salt;         /* push: the update version, coin of the frequency counters */
    uint32_t *defer;       /* pull (cold tables: all ops): positions whose key was missing */
    uint32_t ndefer;
    bool cold; /* misses go to the cold store (cold_deferred); cand[k] keeps the
                * shard's cold_seq seen at the miss */
    int rc;
} batch_t;

/* Key index of visiting position q. */
static inline uint32_t key_at(const batch_t *b, uint32_t q) {
    return b->p->order[q];
}

/* Fill first[] for the batch; returns how many positions were merged into earlier ones. */
static uint32_t dedup_find(const batch_t *b) {
    dedup_t *d = b->d;
    uint32_t cap = 16, merged = 0;
    while (cap < 2 * b->n)
        cap <<= 1;
    memset(d->table, 0xff, cap * sizeof(uint32_t));
    for (uint32_t q = 0; q < b->n; q++) {
        const uint32_t k = key_at(b, q);
        const uint64_t key = b->keys[k];
        d->first[q] = q;
        d->acc[q] = UINT32_MAX;
        for (uint32_t i = (uint32_t)b->p->h[k] & (cap - 1);; i = (i + 1) & (cap - 1)) {
            uint32_t q0 = d->table[i];
            if (q0 == UINT32_MAX) {
                d->table[i] = q;
                break;
            }
            if (b->keys[key_at(b, q0)] == key) {
                d->first[q] = q0;
                merged++;
                break;
            }
        }
    }
    return merged;
}

/* Scratch of dedup_find for n keys into *d (sum empty). Returns the allocation (free with
 * pc_free of *bytes) or NULL. */
static void *dedup_alloc(dedup_t *d, size_t n, size_t *bytes) {
    uint32_t tcap = 16;
    while (tcap < 2 * n)
        tcap <<= 1;
    *bytes = (2 * n + tcap) * sizeof(uint32_t);
    void *mem = pc_malloc(PC_MEM_SCRATCH, *bytes);
    *d = (dedup_t){.first = mem, .sum = NULL, .sum_bytes = 0};
    if (mem) {
        d->acc = d->first + n;
        d->table = d->acc + n;
    }
    return mem;
}

/* Sum the gradients of duplicate keys (in call order) into d->sum. */
static int dedup_sum(const batch_t *b, uint32_t merged) {
    dedup_t *d = b->d;
    const uint32_t dim = b->t->dim;
    size_t need = (size_t)merged * dim * sizeof(float);
    d->sum = pc_malloc(PC_MEM_SCRATCH, need);
    if (!d->sum)
        return PC_ENOMEM;
    d->sum_bytes = need;
    uint32_t nsum = 0;
    for (uint32_t q = 0; q < b->n; q++) {
        uint32_t q0 = d->first[q];
        if (q0 == q)
            continue;
        if (d->acc[q0] == UINT32_MAX) {
            d->acc[q0] = nsum++;
            memcpy(d->sum + (size_t)d->acc[q0] * dim, b->grads + (size_t)key_at(b, q0) * dim,
                   dim * sizeof(float));
        }
        float *acc = d->sum + (size_t)d->acc[q0] * dim;
        const float *g = b->grads + (size_t)key_at(b, q) * dim;
        for (uint32_t e = 0; e < dim; e++)
            acc[e] += g[e];
    }
    return 0;
}

/* The (summed) gradient of push position q (key index k). */
static inline const float *push_grad(const batch_t *b, uint32_t q, uint32_t k) {
    const dedup_t *d = b->d;
    return d->acc[q] != UINT32_MAX ? d->sum + (size_t)d->acc[q] * b->t->dim
                                   : b->grads + (size_t)k * b->t->dim;
}

/* The optimizer step of a 16-bit row: on f32 weights, rounded back stochastically with random
 * bits from the key and the update version (a replay rounds alike). */
static __attribute__((noinline)) void step_half(const ps_table_t *t, unsigned char *row,
                                                uint64_t key, uint64_t salt, const float *g) {
    float w[PS_DIM_MAX];
    row_weights_get(t, row, w);
    ps__optim_step(&t->opt, w, row_state(t, row), g);
    const uint64_t seed = pc_hash_u64(key, salt ^ PC_HASH_SEED_ROUND);
    if (t->dtype == PS_ROW_BF16)
        t->half->to_bf16_sr(w, (uint16_t *)(void *)row, t->dim, seed);
    else
        t->half->to_f16_sr(w, (uint16_t *)(void *)row, t->dim, seed);
}

/* One optimizer step on row r (write lock held). */
static inline void push_apply(batch_t *b, ps_shard_t *s, uint32_t r, const float *g) {
    ps_table_t *t = b->t;
    unsigned char *row = row_at(t, s, r);
    cow_save(t, s, r);
    if (t->dtype == PS_ROW_F32)
        ps__optim_step(&t->opt, (float *)(void *)row, row_state(t, row), g);
    else
        step_half(t, row, s->km[r].key, b->salt, g);
    s->km[r].tick = (uint16_t)s->clock;
    freq_bump(&s->km[r], b->salt);
    s->pushed++;
    b->res->applied++;
}

/* Load key index k's row (r: its row, or NO_ROW to insert it; write lock held). A failed insert
 * is the batch's error; the other keys still load. */
static void load_row(batch_t *b, ps_shard_t *s, uint32_t k, uint32_t r) {
    ps_table_t *t = b->t;
    const load_src_t *ld = b->ld;
    if (r == NO_ROW) {
        int rc = row_insert(t, s, b->keys[k], b->p->h[k], &r);
        if (rc) {
            b->rc = b->rc ? b->rc : rc;
            return;
        }
    }
    cow_save(t, s, r);
    unsigned char *row = row_at(t, s, r);
    const uint32_t sl = t->state_len;
    row_weights_set(t, row, ld->weights + (size_t)k * ld->wstride);
    if (sl && ld->states)
        memcpy(row_state(t, row), ld->states + (size_t)k * ld->sstride, sl * sizeof(float));
    else if (sl)
        ps__optim_init_state(&t->opt, row_state(t, row));
    /* During a snapshot the row must read as changed after the cut. */
    s->km[r].tick = ld->ticks && !s->cow_active ? ld->ticks[k] : (uint16_t)s->clock;
    s->km[r].freq = ld->freqs ? (uint8_t)(ld->freqs[k] < FREQ_MAX ? ld->freqs[k] : FREQ_MAX) : 1;
}

/* Stage C: the operation itself for visiting position q (key index k), shard s locked. */
static inline __attribute__((always_inline)) void stage_op(batch_t *b, ps_shard_t *s, uint32_t q,
                                                           uint32_t k, op_t op) {
    ps_table_t *t = b->t;
    const uint64_t key = b->keys[k], h = b->p->h[k];
    const uint32_t dim = t->dim;
    if (op == OP_READ) {
        const uint32_t r = resolve(s, key, h, b->p->cand[k], true);
        float *out = b->rows + (size_t)k * t->stride;
        b->found[k] = r != NO_ROW;
        if (r != NO_ROW) {
            row_export(t, row_at(t, s, r), out);
        } else {
            memset(out, 0, t->stride * sizeof(float));
            if (b->cold) /* read from the cold store after this pass */
                b->defer[b->ndefer++] = q;
        }
        return;
    }
    if (op == OP_LOAD) {
        load_row(b, s, k, resolve(s, key, h, b->p->cand[k], false));
        return;
    }
    if (op == OP_LOOKUP) {
        float *out = b->rows + (size_t)k * dim;
        uint32_t r = resolve(s, key, h, b->p->cand[k], true);
        if (b->found)
            b->found[k] = r != NO_ROW;
        if (r != NO_ROW)
            row_weights_get(t, row_at(t, s, r), out);
        else if (b->cold)
            b->defer[b->ndefer++] = q;
        else if (t->cfg.missing == PS_MISSING_ZEROS)
            memset(out, 0, (size_t)dim * sizeof(float));
        else
            fill_initial(t, key, out);
        return;
    }
    if (op == OP_PULL) { /* under the read lock: copy, or leave the key for pull_miss */
        uint32_t r = resolve(s, key, h, b->p->cand[k], true);
        if (r != NO_ROW) {
            row_weights_get(t, row_at(t, s, r), b->rows + (size_t)k * dim);
        } else {
            b->defer[b->ndefer++] = q;
            b->p->cand[k] = s->cold_seq;
        }
        return;
    }
    const float *g = push_grad(b, q, k);
    if (!ps__grad_finite(&t->opt, g)) {
        s->nonfinite++;
        b->res->skipped_nonfinite++;
        return;
    }
    uint32_t r = resolve(s, key, h, b->p->cand[k], false);
    if (r == NO_ROW && b->cold) { /* fetched from the cold store after this pass */
        b->defer[b->ndefer++] = q;
        b->p->cand[k] = s->cold_seq;
        return;
    }
    if (r == NO_ROW) {
        if (t->admit > 1 && sketch_count(s, key, 0) < t->admit) {
            s->dropped++;
            b->res->dropped_unadmitted++;
            return;
        }
        int rc = row_insert(t, s, key, h, &r);
        if (rc) {
            if (!b->rc)
                b->rc = rc;
            return;
        }
    }
    push_apply(b, s, r, g);
}

/* A pulled key that was missing under the read lock, now under the write lock: it may have
 * been inserted meanwhile (another caller, an earlier duplicate); else count a sighting for
 * admission, insert it, and copy its row. */
static void pull_miss(batch_t *b, ps_shard_t *s, uint32_t k) {
    ps_table_t *t = b->t;
    const uint64_t key = b->keys[k], h = b->p->h[k];
    float *out = b->rows + (size_t)k * t->dim;
    uint32_t r = find_row(s, key, h);
    if (r == NO_ROW) {
        if (t->admit > 1 && sketch_count(s, key, 1) < t->admit) {
            fill_initial(t, key, out);
            s->pending++;
            return;
        }
        int rc = row_insert(t, s, key, h, &r);
        if (rc) {
            fill_initial(t, key, out);
            if (!b->rc)
                b->rc = rc;
            return;
        }
    }
    row_weights_get(t, row_at(t, s, r), out);
}

/* Pull, lookup and read share a shard (they change nothing in the main pass); push and load
 * take it alone. */
static inline void shard_lock(ps_shard_t *s, op_t op) {
    if (op == OP_PUSH || op == OP_LOAD)
        pthread_rwlock_wrlock(&s->lock);
    else
        pthread_rwlock_rdlock(&s->lock);
}

/* Run the batch one shard group at a time, each under its shard's lock, through a four-stage
 * software pipeline:
 *   A  (position qa):  prefetch bucket b1
 *   B  (D behind A):   match tags in b1 -> prefetch the candidate's row, or b2 if none matched
 *   B2 (D behind B):   match tags in b2 where needed -> prefetch the row
 *   C  (D behind B2):  verify the key against the slab and do the operation
 * Each stage runs a fixed D positions (PIPE_D_WEIGHTS or PIPE_D_ROWS) behind the one before,
 * draining included (a position is in range when its unsigned offset from q0 is below the group's
 * length): four range checks per step, no stage bookkeeping. (A pipeline flowing across groups,
 * locking ahead, measured slower here.) Push skips positions merged into an earlier duplicate. */
static inline __attribute__((always_inline)) void batch_run(batch_t *b, op_t op) {
    ps_table_t *t = b->t;
    const uint64_t *h = b->p->h;
    const uint32_t *order = b->p->order;
    uint32_t *cand = b->p->cand;
    const int write = op == OP_PUSH || op == OP_LOAD;
    const uint32_t bytes = write || op == OP_READ ? t->row_bytes : t->wbytes;
    const uint32_t n = b->n;
    const uint32_t *first = op == OP_PUSH ? b->d->first : NULL;
    const uint32_t D = op == OP_PULL || op == OP_LOOKUP ? PIPE_D_WEIGHTS : PIPE_D_ROWS;
#define LIVE(q) (op != OP_PUSH || first[q] == (q))
    for (uint32_t q0 = 0, q1; q0 < n; q0 = q1) {
        const uint32_t sh = b->p->sq[q0];
        for (q1 = q0 + 1; q1 < n && b->p->sq[q1] == sh; q1++)
            ;
        ps_shard_t *s = &t->shards[sh];
        shard_lock(s, op);
        const uint32_t d0 = b->ndefer;
        const uint32_t len = q1 - q0;
        for (uint32_t i = q0; i < q1 + 3 * D; i++) {
            const uint32_t qa = i, qb = i - D, qb2 = i - 2 * D, qc = i - 3 * D;
            if (qa < q1 && LIVE(qa))
                __builtin_prefetch(bucket_at(s, bucket1(s, h[order[qa]])), 0, 3);
            if (qb - q0 < len && LIVE(qb)) {
                const uint32_t j = order[qb], c = probe_b1(s, h[j]);
                cand[j] = c;
                /* The gradient is read in shard order, not sequentially: the hardware
                 * prefetchers do not see it coming (a stall even when it is in L2). */
                if (op == OP_PUSH)
                    prefetch_bytes(push_grad(b, qb, j), t->dim * (uint32_t)sizeof(float), PF_READ);
                if (c < s->count)
                    prefetch_row(t, s, c, write, bytes);
                else if (c == CAND_IN_B2)
                    __builtin_prefetch(bucket_at(s, bucket2(s, h[j])), 0, 3);
            }
            if (qb2 - q0 < len && LIVE(qb2)) {
                const uint32_t j = order[qb2];
                if (cand[j] == CAND_IN_B2) {
                    const uint32_t c = probe_b2(s, h[j]);
                    cand[j] = c;
                    if (c < s->count)
                        prefetch_row(t, s, c, write, bytes);
                }
            }
            if (qc - q0 < len && LIVE(qc))
                stage_op(b, s, qc, order[qc], op);
        }
        if (op == OP_PULL && b->ndefer > d0 && !b->cold) { /* inserts need the shard alone */
            pthread_rwlock_unlock(&s->lock);
            pthread_rwlock_wrlock(&s->lock);
            for (uint32_t i = d0; i < b->ndefer; i++)
                pull_miss(b, s, order[b->defer[i]]);
        }
        if (op == OP_LOAD) { /* rows an insert evicted go to the cold store before others look */
            const int frc = cold_flush(t, s);
            b->rc = b->rc ? b->rc : frc;
        }
        pthread_rwlock_unlock(&s->lock);
    }
#undef LIVE
}

static void batch_init(batch_t *b, ps_table_t *t, const uint64_t *keys, plan_t *p, size_t n) {
    memset(b, 0, sizeof *b);
    b->t = t;
    b->keys = keys;
    b->p = p;
    b->n = (uint32_t)n;
    b->cold = t->cfg.cold && t->has_cold;
    b->defer = p->defer;
}

/* ---- cold tier: misses ---------------------------------------------------------------------
 * After the main pass, the keys missing from RAM (b->defer, in visiting order, so grouped by
 * shard) are fetched with one get outside the locks; then each shard group is finished under the
 * write lock: if the shard wrote to the cold store since the miss (cold_seq moved), its keys are
 * fetched again under the lock, so a row spilled or erased meanwhile is never read stale. */

/* The cold rows of deferred entries [i0, i1) could not be read: zeros out, error noted. */
static void cold_fail(batch_t *b, op_t op, uint32_t i0, uint32_t i1, int rc) {
    const uint32_t w = op == OP_READ ? b->t->stride : b->t->dim; /* floats a row has here */
    for (uint32_t i = i0; i < i1 && op != OP_PUSH; i++) {
        const uint32_t k = key_at(b, b->defer[i]);
        memset(b->rows + (size_t)k * w, 0, (size_t)w * sizeof(float));
        if (b->found)
            b->found[k] = 0;
    }
    if (!b->rc)
        b->rc = rc;
}

/* Finish deferred position q of a pull or push under the shard's write lock, given what the
 * cold store holds for its key (src: stride floats). */
static void cold_apply(batch_t *b, ps_shard_t *s, op_t op, uint32_t q, const float *src,
                       const ps_cold_meta_t *m) {
    ps_table_t *t = b->t;
    const uint32_t k = key_at(b, q), dim = t->dim;
    const uint64_t key = b->keys[k], h = b->p->h[k];
    float *out = op == OP_PULL ? b->rows + (size_t)k * dim : NULL;
    uint32_t r = find_row(s, key, h); /* an earlier duplicate or another caller may have it */
    if (r == NO_ROW) {
        const ptrdiff_t sp = spill_find(s, key); /* evicted in this very lock hold */
        ps_cold_meta_t queued;
        if (sp >= 0) {
            queued = (ps_cold_meta_t){s->spill_hdr[sp].clock, s->spill_hdr[sp].freq, 1};
            m = &queued;
            src = s->spill_rows + (size_t)sp * t->stride;
        }
        const int hit = m->found && !ps_table_expired(t, m->clock, s->clock);
        if (hit)
            atomic_fetch_add_explicit(&t->cold_hits, 1, memory_order_relaxed);
        if (!hit && t->admit > 1 && sketch_count(s, key, op == OP_PULL) < t->admit) {
            if (op == OP_PULL) {
                fill_initial(t, key, out);
                s->pending++;
            } else {
                s->dropped++;
                b->res->dropped_unadmitted++;
            }
            return;
        }
        /* Promoted rows and untouched initial rows are clean: evicting them writes nothing.
         * A row taken back from the queue is not (its write may still fail). */
        const uint16_t tick = hit ? tick_of_clock(s, m->clock) : (uint16_t)s->clock;
        const uint8_t freq = (uint8_t)((hit ? m->freq & FREQ_MASK : 1) | (sp >= 0 ? 0 : ROW_CLEAN));
        /* A queued row is copied out first: the insert's own eviction may grow (move) the
         * queue. */
        const size_t rb = (size_t)t->stride * sizeof(float);
        float *copy = hit && sp >= 0 ? pc_malloc(PC_MEM_SCRATCH, rb) : NULL;
        if (copy)
            src = memcpy(copy, src, rb);
        int rc = hit && sp >= 0 && !copy
                     ? PC_ENOMEM
                     : row_insert_ex(t, s, key, h, hit ? src : NULL, tick, freq, 1, &r);
        if (rc) {
            if (!b->rc)
                b->rc = rc;
            if (out && hit)
                memcpy(out, src, (size_t)dim * sizeof(float));
            else if (out)
                fill_initial(t, key, out);
        }
        pc_free(PC_MEM_SCRATCH, copy, rb);
        if (rc)
            return;
    }
    if (op == OP_PULL)
        row_weights_get(t, row_at(t, s, r), out);
    else
        push_apply(b, s, r, push_grad(b, q, k));
}

static void cold_deferred(batch_t *b, op_t op) {
    ps_table_t *t = b->t;
    const uint32_t n = b->ndefer, stride = t->stride, dim = t->dim;
    if (!n)
        return;
    const size_t bytes =
        (size_t)n * (sizeof(uint64_t) + sizeof(ps_cold_meta_t) + (size_t)stride * sizeof(float));
    uint64_t *ck = pc_malloc(PC_MEM_SCRATCH, bytes);
    if (!ck) {
        cold_fail(b, op, 0, n, PC_ENOMEM);
        return;
    }
    ps_cold_meta_t *cm = (ps_cold_meta_t *)(ck + n);
    float *cr = (float *)(cm + n);
    for (uint32_t i = 0; i < n; i++)
        ck[i] = b->keys[key_at(b, b->defer[i])];
    atomic_fetch_add_explicit(&t->cold_reads, n, memory_order_relaxed);
    int rc = t->cold.get(t->cold_ctx, ck, n, cr, cm);
    if (rc) {
        atomic_fetch_add_explicit(&t->cold_get_errors, 1, memory_order_relaxed);
        cold_fail(b, op, 0, n, rc);
    } else if (op == OP_LOOKUP || op == OP_READ) { /* read-only: no promotion, no lock */
        /* A row promoted and changed since the miss reads as its older cold copy: read_state's
         * callers (the delta stream) meet its key again in the change log. */
        const uint32_t w = op == OP_READ ? stride : dim;
        for (uint32_t i = 0; i < n; i++) {
            const uint32_t k = key_at(b, b->defer[i]);
            float *out = b->rows + (size_t)k * w;
            const uint32_t now = atomic_load_explicit(&t->clock, memory_order_relaxed);
            const int hit = cm[i].found && !ps_table_expired(t, cm[i].clock, now);
            if (b->found)
                b->found[k] = (uint8_t)hit;
            if (hit) {
                atomic_fetch_add_explicit(&t->cold_hits, 1, memory_order_relaxed);
                memcpy(out, cr + (size_t)i * stride, (size_t)w * sizeof(float));
            } else if (op == OP_READ) { /* absent: zeros already (stage_op) */
                continue;
            } else if (t->cfg.missing == PS_MISSING_ZEROS) {
                memset(out, 0, (size_t)dim * sizeof(float));
            } else {
                fill_initial(t, b->keys[k], out);
            }
        }
    } else {
        for (uint32_t i0 = 0, i1; i0 < n; i0 = i1) {
            const uint16_t sh = b->p->sq[b->defer[i0]];
            for (i1 = i0 + 1; i1 < n && b->p->sq[b->defer[i1]] == sh; i1++)
                ;
            ps_shard_t *s = &t->shards[sh];
            pthread_rwlock_wrlock(&s->lock);
            int grc = 0;
            if (b->p->cand[key_at(b, b->defer[i0])] != s->cold_seq) /* written since the miss */
                grc = t->cold.get(t->cold_ctx, ck + i0, i1 - i0, cr + (size_t)i0 * stride, cm + i0);
            if (grc) {
                s->cold_errors++;
                cold_fail(b, op, i0, i1, grc);
            } else {
                for (uint32_t i = i0; i < i1; i++)
                    cold_apply(b, s, op, b->defer[i], cr + (size_t)i * stride, &cm[i]);
            }
            int frc = cold_flush(t, s);
            if (frc && !b->rc)
                b->rc = frc;
            pthread_rwlock_unlock(&s->lock);
        }
    }
    pc_free(PC_MEM_SCRATCH, ck, bytes);
}

/* ==== operations =========================================================================== */

int ps_table_pull(ps_table_t *t, const uint64_t *keys, size_t n, float *rows, size_t rows_len) {
    plan_t p;
    int rc = batch_begin(t, keys, n, rows, rows_len, &p);
    if (rc <= 0)
        return rc;
    batch_t b;
    batch_init(&b, t, keys, &p, n);
    b.rows = rows;
    batch_run(&b, OP_PULL);
    if (b.cold)
        cold_deferred(&b, OP_PULL);
    atomic_fetch_add_explicit(&t->pulled, n, memory_order_relaxed);
    plan_free(&p);
    return b.rc;
}

int ps_table_lookup(const ps_table_t *t, const uint64_t *keys, size_t n, float *rows,
                    size_t rows_len, uint8_t *found) {
    plan_t p;
    int rc = batch_begin(t, keys, n, rows, rows_len, &p);
    if (rc <= 0)
        return rc;
    /* Lookup only reads shards (under their read locks); the table pointer is not const for
     * the shared pipeline code, which does not write in this mode. */
    batch_t b;
    batch_init(&b, (ps_table_t *)t, keys, &p, n);
    b.rows = rows;
    b.found = found;
    batch_run(&b, OP_LOOKUP);
    if (b.cold)
        cold_deferred(&b, OP_LOOKUP);
    atomic_fetch_add_explicit(&((ps_table_t *)t)->looked_up, n, memory_order_relaxed);
    plan_free(&p);
    return b.rc;
}

int ps_table_push(ps_table_t *t, const uint64_t *keys, size_t n, const float *grads,
                  size_t grads_len, ps_push_result_t *res) {
    ps_push_result_t local = {0, 0, 0};
    if (res)
        *res = local;
    plan_t p;
    int rc = batch_begin(t, keys, n, grads, grads_len, &p);
    if (rc <= 0)
        return rc;
    dedup_t d;
    size_t dbytes;
    void *dmem = dedup_alloc(&d, n, &dbytes);
    if (!dmem) {
        plan_free(&p);
        return PC_ENOMEM;
    }
    batch_t b;
    batch_init(&b, t, keys, &p, n);
    b.grads = grads;
    b.d = &d;
    b.res = &local;
    uint32_t merged = dedup_find(&b);
    if (merged)
        b.rc = dedup_sum(&b, merged);
    if (!b.rc) {
        pthread_rwlock_rdlock(&t->cut);
        b.salt = atomic_fetch_add_explicit(&t->version, 1, memory_order_relaxed);
        batch_run(&b, OP_PUSH);
        if (b.cold)
            cold_deferred(&b, OP_PUSH);
        pthread_rwlock_unlock(&t->cut);
        log_append(t, keys, n); /* after the rows changed: a reader meeting a key sees it */
    }
    pc_free(PC_MEM_SCRATCH, d.sum, d.sum_bytes);
    pc_free(PC_MEM_SCRATCH, dmem, dbytes);
    plan_free(&p);
    if (res)
        *res = local;
    return b.rc;
}

/* Cold tables: erasers wait while the cold store is frozen (a checkpoint copies it). */
static void erase_gate(ps_table_t *t, bool enter) {
    pthread_mutex_lock(&t->cold_mu);
    if (enter) {
        while (atomic_load(&t->cold_frozen))
            pthread_cond_wait(&t->cold_cv, &t->cold_mu);
        t->erasers++;
    } else if (--t->erasers == 0) {
        pthread_cond_broadcast(&t->cold_cv);
    }
    pthread_mutex_unlock(&t->cold_mu);
}

int ps_table_read_state(const ps_table_t *t, const uint64_t *keys, size_t n, float *rows,
                        uint8_t *found) {
    plan_t p;
    ps_table_t *tw = (ps_table_t *)(uintptr_t)t; /* OP_READ changes nothing but the locks */
    int rc = batch_begin(tw, keys, n, NULL, NO_BUF, &p);
    if (rc <= 0)
        return rc;
    batch_t b;
    batch_init(&b, tw, keys, &p, n);
    b.rows = rows;
    b.found = found;
    batch_run(&b, OP_READ);
    if (b.cold)
        cold_deferred(&b, OP_READ);
    plan_free(&p);
    return b.rc;
}

int ps_table_erase(ps_table_t *t, const uint64_t *keys, size_t n, size_t *erased) {
    if (erased)
        *erased = 0;
    plan_t p;
    int rc = batch_begin(t, keys, n, NULL, NO_BUF, &p);
    if (rc <= 0)
        return rc;
    rc = 0;
    size_t count = 0;
    /* A key is counted once, at its first position (dedup_find), and a cold copy only when the
     * store holds it unexpired: which keys it holds is asked under each shard's write lock, just
     * before they are deleted there (with cold_seq moved, so that concurrent misses fetch again),
     * so two erasers of one key do not both count it. */
    const bool cold = t->cfg.cold && t->has_cold;
    const size_t cbytes =
        cold ? n * (sizeof(uint64_t) + sizeof(ps_cold_meta_t) + (size_t)t->stride * 4) : 0;
    uint64_t *ck = cold ? pc_malloc(PC_MEM_SCRATCH, cbytes) : NULL;
    ps_cold_meta_t *cm = ck ? (ps_cold_meta_t *)(ck + n) : NULL;
    float *crows = cm ? (float *)(void *)(cm + n) : NULL;
    dedup_t d;
    size_t dbytes;
    void *dmem = dedup_alloc(&d, n, &dbytes);
    batch_t b;
    batch_init(&b, t, keys, &p, n);
    b.d = &d;
    if ((cold && !ck) || !dmem) {
        pc_free(PC_MEM_SCRATCH, ck, cbytes);
        pc_free(PC_MEM_SCRATCH, dmem, dbytes);
        plan_free(&p);
        return PC_ENOMEM;
    }
    (void)dedup_find(&b);
    for (uint32_t q = 0; ck && q < n; q++)
        ck[q] = keys[p.order[q]];
    bool get_said = false;
    if (cold)
        erase_gate(t, true);
    pthread_rwlock_rdlock(&t->cut);
    for (uint32_t q0 = 0, q1; q0 < n; q0 = q1) { /* one shard group [q0, q1) at a time */
        ps_shard_t *s = &t->shards[p.sq[q0]];
        for (q1 = q0 + 1; q1 < n && p.sq[q1] == p.sq[q0]; q1++)
            ;
        pthread_rwlock_wrlock(&s->lock);
        /* the cold copies first: when the store refuses (a full disk), the group's rows stay in
         * RAM too, so no older cold copy shows through where a RAM row was removed */
        int drc = 0;
        bool known = false; /* which of the group's keys the cold store holds */
        if (cold) {
            const int grc =
                t->cold.get(t->cold_ctx, ck + q0, q1 - q0, crows + (size_t)q0 * t->stride, cm + q0);
            if (grc) { /* a damaged record, say: deleting it is what is asked */
                atomic_fetch_add_explicit(&t->cold_get_errors, 1, memory_order_relaxed);
                if (!get_said)
                    PC_WARN("table %s: erase: the cold store could not say which keys it holds "
                            "(%s): erased all the same, counted from RAM only",
                            t->cfg.name, pc_strerror(grc));
                get_said = true;
            }
            known = !grc;
            s->cold_seq++;
            if ((drc = t->cold.del(t->cold_ctx, ck + q0, q1 - q0))) {
                s->cold_errors++;
                rc = rc ? rc : drc;
            }
        }
        for (uint32_t q = q0; !drc && q < q1; q++) {
            if (d.first[q] != q) /* a repeated key: its first position counted it */
                continue;
            uint32_t k = p.order[q];
            uint32_t r = find_row(s, keys[k], p.h[k]);
            if (r != NO_ROW) {
                row_remove(t, s, r);
                count++;
            } else if (known && cm[q].found && !ps_table_expired(t, cm[q].clock, s->clock)) {
                count++;
            }
        }
        shard_maybe_shrink(t, s);
        pthread_rwlock_unlock(&s->lock);
    }
    pthread_rwlock_unlock(&t->cut);
    log_append(t, keys, n);
    if (cold)
        erase_gate(t, false);
    pc_free(PC_MEM_SCRATCH, ck, cbytes);
    pc_free(PC_MEM_SCRATCH, dmem, dbytes);
    plan_free(&p);
    if (erased)
        *erased = count;
    return rc;
}

/* ps_table_load's work (src: what to write, load_src_t); logged: the keys go to the change
 * log. */
static int load_rows(ps_table_t *t, size_t n, const uint64_t *keys, const load_src_t *src,
                     bool logged) {
    if (n && !src->weights)
        return PC_EINVAL;
    plan_t p;
    int rc = batch_begin(t, keys, n, NULL, NO_BUF, &p);
    if (rc <= 0)
        return rc;
    batch_t b;
    batch_init(&b, t, keys, &p, n);
    b.cold = false; /* a loaded row replaces what the cold store holds: nothing to fetch */
    b.ld = src;
    pthread_rwlock_rdlock(&t->cut);
    batch_run(&b, OP_LOAD);
    pthread_rwlock_unlock(&t->cut);
    if (logged)
        log_append(t, keys, n);
    plan_free(&p);
    return b.rc;
}

int ps_table_load(ps_table_t *t, size_t n, const uint64_t *keys, const float *weights,
                  const float *states, const uint16_t *ticks, const uint8_t *freqs) {
    const load_src_t src = {weights, states, t->dim, t->state_len, ticks, freqs};
    return load_rows(t, n, keys, &src, true);
}

int ps_table_load_rows_unlogged(ps_table_t *t, size_t n, const uint64_t *keys, const float *rows) {
    const size_t stride = (size_t)t->dim + t->state_len;
    const load_src_t src = {rows, rows + t->dim, stride, stride, NULL, NULL};
    return load_rows(t, n, keys, &src, false);
}

/* ==== clock, expiry, scans ================================================================= */

static void shard_advance(ps_table_t *t, ps_shard_t *s, uint32_t now) {
    const uint32_t prev = s->clock;
    /* Expiry first, while the clock still reads `prev`: removals are logged (and pre-cut rows
     * saved) as of the old clock; ages are computed against `now` (exact by the invariant). */
    const uint32_t ttl = (uint32_t)t->cfg.ttl_ticks;
    uint32_t period = ttl / 16 ? ttl / 16 : 1;
    if (ttl && now - s->last_ttl >= period) {
        for (uint32_t r = s->count; r-- > 0;) {
            uint32_t age = (uint16_t)((uint16_t)prev - s->km[r].tick) + (now - prev);
            if (age >= ttl)
                evict_row(t, s, r, PS_EVICT_TTL);
        }
        s->last_ttl = now;
        shard_maybe_shrink(t, s);
    }
    if (s->cow_active && now - s->cow_cut >= SNAPSHOT_MAX_TICKS) {
        s->cow_failed = 1; /* pre-cut rows would stop being recognizable: fail the snapshot */
        cow_free(t, s);
    }
    if (now - s->last_aging >= AGING_PERIOD && !s->cow_active) {
        /* Clamp ages at PS_AGE_MAX; ages relative to prev are exact (< 2^15) by the invariant
         * (aging may be postponed while a snapshot copies, at most SNAPSHOT_MAX_TICKS). */
        for (uint32_t r = 0; r < s->count; r++) {
            uint32_t age = (uint16_t)((uint16_t)prev - s->km[r].tick) + (now - prev);
            if (age >= PS_AGE_MAX)
                s->km[r].tick = (uint16_t)(now - PS_AGE_MAX);
        }
        s->last_aging = now;
    }
    s->clock = now;
    const uint32_t decay = (uint32_t)t->cfg.admit_decay_ticks;
    if (decay && s->sketch && now - s->last_decay >= decay) {
        size_t nc = (size_t)SKETCH_DEPTH * s->sketch_width;
        for (size_t i = 0; i < nc; i++)
            s->sketch[i] >>= 1;
        s->last_decay = now;
    }
}

int ps_table_advance_clock(ps_table_t *t, uint32_t now) {
    if (!t)
        return PC_EINVAL;
    pthread_rwlock_rdlock(&t->cut);
    /* Concurrent advances: only a larger value wins (compare-and-swap); a smaller one is
     * refused, so the clock never moves back. */
    uint32_t cur = atomic_load(&t->clock);
    while (now > cur && !atomic_compare_exchange_weak(&t->clock, &cur, now))
        ;
    int rc = now < cur ? PC_EINVAL : 0;
    if (!rc && now > cur) {
        for (uint32_t sh = 0; sh < t->nshards; sh++) {
            ps_shard_t *s = &t->shards[sh];
            pthread_rwlock_wrlock(&s->lock);
            if (now > s->clock)
                shard_advance(t, s, now);
            pthread_rwlock_unlock(&s->lock);
        }
    }
    pthread_rwlock_unlock(&t->cut);
    return rc;
}

uint32_t ps_table_clock(const ps_table_t *t) {
    return atomic_load(&((ps_table_t *)t)->clock);
}

/* Weights of up to 256 views of a 16-bit table (NULL for f32, whose views point into the
 * slab); *bytes gets the size to free. */
static float *view_weights(const ps_table_t *t, size_t *bytes) {
    *bytes = t->dtype == PS_ROW_F32 ? 0 : (size_t)256 * t->dim * sizeof(float);
    return *bytes ? pc_malloc(PC_MEM_SCRATCH, *bytes) : NULL;
}

uint32_t ps_table_key_part(uint64_t key, uint32_t parts) {
    const uint64_t h = key_hash(key);
    return parts ? (uint32_t)(((h >> 52) | (h << 12)) % parts) : 0; /* the shard bits lowest */
}

int ps_table_scan(const ps_table_t *t, uint64_t since, ps_scan_fn fn, void *ctx) {
    return ps_table_scan_part(t, since, 0, 1, fn, ctx);
}

int ps_table_scan_part(const ps_table_t *t, uint64_t since, uint32_t part, uint32_t parts,
                       ps_scan_fn fn, void *ctx) {
    if (!t || !fn || part >= parts)
        return PC_EINVAL;
    /* With power-of-two parts a key's part has its shard's bits lowest (ps_table_key_part): the
     * part's rows lie in the shards congruent to it modulo min(parts, shards), whole when parts
     * <= shards. Other counts visit every shard and test each row. */
    const bool pow2 = !(parts & (parts - 1));
    const uint32_t m = pow2 ? (parts < t->nshards ? parts : t->nshards) : 1;
    const bool test = !pow2 || parts > t->nshards;
    ps_row_view_t views[256];
    size_t wb_bytes;
    float *wb = view_weights(t, &wb_bytes);
    if (wb_bytes && !wb)
        return PC_ENOMEM;
    for (uint32_t sh = part % m; sh < t->nshards; sh += m) {
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_rdlock(&s->lock);
        /* Rows pushed at clock >= since have age <= now - since; ages saturate at
         * PS_AGE_MAX, so an older `since` means every row. A future `since` means none. */
        const uint32_t now = s->clock;
        const int every = since == PS_SCAN_ALL || (since <= now && now - since >= PS_AGE_MAX);
        const int none = !every && since > now;
        const uint32_t window = every || none ? 0 : now - (uint32_t)since;
        size_t nv = 0;
        int rc = 0;
        for (uint32_t r = 0; r < s->count && !rc && !none; r++) {
            if (!every && (uint16_t)((uint16_t)now - s->km[r].tick) > window)
                continue;
            if (test && ps_table_key_part(s->km[r].key, parts) != part)
                continue;
            row_view(t, s, r, &views[nv], wb ? wb + nv * (size_t)t->dim : NULL);
            if (++nv == 256) {
                rc = fn(ctx, views, nv);
                nv = 0;
            }
        }
        if (!rc && nv)
            rc = fn(ctx, views, nv);
        pthread_rwlock_unlock(&s->lock);
        if (rc) {
            pc_free(PC_MEM_SCRATCH, wb, wb_bytes);
            return rc;
        }
    }
    pc_free(PC_MEM_SCRATCH, wb, wb_bytes);
    return 0;
}

/* ==== snapshots ============================================================================ */

int ps_table_snapshot_begin(ps_table_t *t, bool track_removals, ps_snapshot_info_t *info) {
    if (!t || !info)
        return PC_EINVAL;
    if (atomic_exchange(&t->snap_busy, 1)) /* at once, without queueing behind a scan */
        return PC_EAGAIN;
    pthread_rwlock_wrlock(&t->cut); /* no value-changing call is in flight now */
    const uint32_t cut = atomic_load(&t->clock), next = cut + 1;
    if (track_removals)
        atomic_store(&t->track_removed, 1);
    for (uint32_t sh = 0; sh < t->nshards; sh++) {
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_wrlock(&s->lock);
        if (next > s->clock)
            shard_advance(t, s, next);
        s->cow_active = 1;
        s->cow_failed = 0;
        s->cow_cut = next;
        s->scan_cursor = 0;
        pthread_rwlock_unlock(&s->lock);
    }
    atomic_store(&t->clock, next);
    t->snap_active = 1;
    t->snap_scanned = 0;
    t->snap_full = 0;
    t->snap_cut = cut;
    info->cut_clock = cut;
    info->version = atomic_load(&t->version);
    pthread_rwlock_unlock(&t->cut);
    return 0;
}

static int emit_removed(ps_shard_t *s, uint64_t since, uint32_t cut, ps_keys_fn fn, void *ctx) {
    uint64_t keys[256];
    size_t nk = 0;
    int rc = 0;
    for (size_t i = 0; i < s->removed_n && !rc; i++) {
        const ps_removal_t *e = &s->removed[i];
        if (e->clock < since || e->clock > cut)
            continue;
        keys[nk++] = e->key;
        if (nk == 256) {
            rc = fn(ctx, keys, nk);
            nk = 0;
        }
    }
    if (!rc && nk)
        rc = fn(ctx, keys, nk);
    return rc;
}

int ps_table_snapshot_scan(ps_table_t *t, uint64_t since, ps_scan_fn rows_fn, ps_keys_fn removed_fn,
                           void *ctx) {
    if (!t || !rows_fn)
        return PC_EINVAL;
    /* Held shared for the whole scan: begin/end cannot interleave; pushes go on. */
    pthread_rwlock_rdlock(&t->cut);
    if (!t->snap_active || t->snap_scanned || (t->cfg.cold && since != PS_SCAN_ALL)) {
        pthread_rwlock_unlock(&t->cut); /* cold tables keep no removal log: full scans only */
        return PC_EINVAL;
    }
    size_t wb_bytes;
    float *wb = view_weights(t, &wb_bytes);
    if (wb_bytes && !wb) {
        pthread_rwlock_unlock(&t->cut);
        return PC_ENOMEM; /* before the scan is marked done: the caller may try again */
    }
    t->snap_scanned = 1; /* only this thread scans: the flag is ours under the protocol */
    t->snap_full = since == PS_SCAN_ALL;
    const uint32_t cut = t->snap_cut;
    ps_row_view_t views[256];
    int rc = 0;
    const int none = since != PS_SCAN_ALL && since > cut; /* a future since selects nothing */
    for (uint32_t sh = 0; sh < t->nshards && !rc; sh++) {
        ps_shard_t *s = &t->shards[sh];
        size_t nv = 0;
        /* The slab in chunks, releasing the lock in between so pushes to this shard wait for a
         * chunk, not the whole shard; writers then save what the cursor rules require. */
        for (uint32_t cursor = 0; !rc;) {
            pthread_rwlock_rdlock(&s->lock);
            if (s->cow_failed || (since != PS_SCAN_ALL && s->removed_lost))
                rc = PC_ENOMEM;
            /* Rows changed at clock >= since have age <= now - since (saturating, see scan);
             * the clock may move between chunks, so this is evaluated per chunk. */
            const uint32_t now = s->clock;
            const int every = since == PS_SCAN_ALL || (!none && now - since >= PS_AGE_MAX);
            const uint32_t window = every || none ? 0 : now - (uint32_t)since;
            /* Removals in a gap may have dropped count below the cursor: then nothing is left. */
            const uint32_t end = cursor >= s->count               ? cursor
                                 : s->count - cursor > SCAN_CHUNK ? cursor + SCAN_CHUNK
                                                                  : s->count;
            for (uint32_t r = cursor; r < end && !rc && !none; r++) {
                const uint16_t tick = s->km[r].tick;
                if (!row_precut(s, tick) || (!every && (uint16_t)((uint16_t)now - tick) > window))
                    continue;
                row_view(t, s, r, &views[nv], wb ? wb + nv * (size_t)t->dim : NULL);
                if (++nv == 256) {
                    rc = rows_fn(ctx, views, nv);
                    nv = 0;
                }
            }
            if (!rc && nv) /* views point into the slab: emit before unlocking */
                rc = rows_fn(ctx, views, nv);
            nv = 0;
            /* Only this thread writes the cursor; writers read it under the write lock. */
            cursor = end;
            if (!rc && s->cow_active)
                s->scan_cursor = end;
            const int done = rc || cursor >= s->count;
            pthread_rwlock_unlock(&s->lock);
            if (done)
                break;
        }
        pthread_rwlock_rdlock(&s->lock);
        const uint32_t now = s->clock;
        const int every = since == PS_SCAN_ALL || (!none && now - since >= PS_AGE_MAX);
        const uint32_t window = every || none ? 0 : now - (uint32_t)since;
        if (!rc && s->cow_failed)
            rc = PC_ENOMEM;
        for (size_t i = 0; i < s->cow_n && !rc && !none; i++) { /* pre-cut images */
            const uint8_t *rec = s->cow + i * t->cow_rec_bytes;
            ps_cow_hdr_t h;
            memcpy(&h, rec, sizeof h);
            if (!every && (uint16_t)((uint16_t)now - h.tick) > window)
                continue;
            const float *w = (const float *)(rec + sizeof h);
            views[nv++] =
                (ps_row_view_t){h.key, w, t->state_len ? w + t->dim : NULL, h.tick, h.freq};
            if (nv == 256) {
                rc = rows_fn(ctx, views, nv);
                nv = 0;
            }
        }
        if (!rc && nv)
            rc = rows_fn(ctx, views, nv);
        if (!rc && removed_fn && since != PS_SCAN_ALL)
            rc = emit_removed(s, since, cut, removed_fn, ctx);
        pthread_rwlock_unlock(&s->lock);
        /* This shard is written: stop saving its rows. */
        pthread_rwlock_wrlock(&s->lock);
        cow_free(t, s);
        pthread_rwlock_unlock(&s->lock);
    }
    pthread_rwlock_unlock(&t->cut);
    pc_free(PC_MEM_SCRATCH, wb, wb_bytes);
    return rc;
}

void ps_table_snapshot_end(ps_table_t *t, bool committed) {
    if (!t)
        return;
    pthread_rwlock_wrlock(&t->cut);
    for (uint32_t sh = 0; sh < t->nshards; sh++) {
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_wrlock(&s->lock);
        cow_free(t, s);
        if (committed && t->snap_active && t->snap_full && s->lost_clock <= t->snap_cut)
            s->removed_lost = 0; /* a full snapshot needs no tombstones (of removals it saw) */
        if (committed && t->snap_active) { /* tombstones up to the cut are now on disk */
            size_t keep = 0;
            for (size_t i = 0; i < s->removed_n; i++)
                if (s->removed[i].clock > t->snap_cut)
                    s->removed[keep++] = s->removed[i];
            s->removed_n = keep;
        }
        pthread_rwlock_unlock(&s->lock);
    }
    const int was_active = t->snap_active;
    t->snap_active = 0;
    pthread_rwlock_unlock(&t->cut);
    if (was_active)
        atomic_store(&t->snap_busy, 0);
}

bool ps_table_needs_full(const ps_table_t *t) {
    bool lost = false;
    for (uint32_t sh = 0; sh < t->nshards && !lost; sh++) {
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_rdlock(&s->lock);
        lost = s->removed_lost;
        pthread_rwlock_unlock(&s->lock);
    }
    return lost;
}

void ps_table_track_removals(ps_table_t *t) {
    atomic_store(&t->track_removed, 1);
}

uint64_t ps_table_uid(const ps_table_t *t) {
    return t->uid;
}

uint64_t ps_table_version(const ps_table_t *t) {
    return atomic_load(&((ps_table_t *)t)->version);
}

void ps_table_set_version(ps_table_t *t, uint64_t version) {
    atomic_store(&t->version, version);
}

size_t ps_table_owner(const ps_table_t *t, char *buf, size_t cap) {
    ps_table_t *m = (ps_table_t *)t;
    pthread_mutex_lock(&m->owner_mu);
    size_t n = (size_t)snprintf(buf, cap, "%s", m->owner);
    pthread_mutex_unlock(&m->owner_mu);
    return n;
}

int ps_table_set_owner(ps_table_t *t, const char *owner) {
    if (!owner || strlen(owner) >= PS_OWNER_MAX)
        return PC_EINVAL;
    pthread_mutex_lock(&t->owner_mu);
    if (strcmp(t->owner, owner)) /* another job: its generations count from nothing */
        atomic_store(&t->fence, 0);
    snprintf(t->owner, sizeof t->owner, "%s", owner);
    pthread_mutex_unlock(&t->owner_mu);
    return 0;
}

uint32_t ps_table_fence(const ps_table_t *t) {
    return atomic_load(&((ps_table_t *)t)->fence);
}

void ps_table_raise_fence(ps_table_t *t, uint32_t epoch) {
    uint32_t cur = atomic_load(&t->fence);
    while (cur < epoch && !atomic_compare_exchange_weak(&t->fence, &cur, epoch)) {
    }
}

/* ==== lifecycle and accessors ============================================================== */

int ps_table_create(const ps_table_config_t *cfg, ps_table_t **out) {
    char err[256] = "";
    if (!cfg || !out)
        return PC_EINVAL;
    int rc = ps_table_config_check(cfg, err, sizeof err);
    if (rc) {
        PC_WARN("table config rejected: %s", err);
        return rc;
    }
    ps_table_t *t = pc_calloc(PC_MEM_OTHER, 1, sizeof *t);
    if (!t)
        return PC_ENOMEM;
    t->cfg = *cfg;
    ps__optim_from_config(cfg, &t->opt);
    t->dim = (uint32_t)cfg->dim;
    t->state_len = ps__optim_state_len(t->opt.kind, t->dim);
    t->stride = t->dim + t->state_len;
    t->dtype = cfg->row_dtype;
    t->half = pc_half_kernels(NULL);
    t->wbytes = t->dtype == PS_ROW_F32 ? t->dim * 4u : (t->dim * 2u + 3u) & ~3u;
    t->row_bytes = t->wbytes + t->state_len * 4u;
    t->nshards = (uint32_t)cfg->shards;
    t->admit = (uint32_t)cfg->admit_threshold;
    if (cfg->capacity_rows) {
        uint64_t per = ((uint64_t)cfg->capacity_rows + t->nshards - 1) / t->nshards;
        t->shard_cap = per > UINT32_MAX ? UINT32_MAX : (uint32_t)per;
    }
    t->shards = aligned_alloc(64, t->nshards * sizeof(ps_shard_t));
    if (!t->shards) {
        pc_free(PC_MEM_OTHER, t, sizeof *t);
        return PC_ENOMEM;
    }
    memset(t->shards, 0, t->nshards * sizeof(ps_shard_t));
    uint32_t sk_width = (uint32_t)(cfg->admit_width / t->nshards);
    if (sk_width < 256)
        sk_width = 256;
    t->cow_rec_bytes = sizeof(ps_cow_hdr_t) + (size_t)t->stride * sizeof(float);
    pthread_mutex_init(&t->cold_mu, NULL);
    pthread_mutex_init(&t->owner_mu, NULL);
    pthread_cond_init(&t->cold_cv, NULL);
    t->uid = new_uid();
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&t->cut, &attr);
    for (uint32_t sh = 0; sh < t->nshards; sh++) {
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_init(&s->lock, &attr);
        s->rng = pc_hash_u64(sh, (uint64_t)cfg->seed) | 1;
        rc = index_rebuild(s, MIN_BUCKETS);
        if (!rc && t->admit > 1) {
            s->sketch_width = sk_width;
            s->sketch = pc_calloc(PC_MEM_SKETCH, SKETCH_DEPTH, sk_width);
            if (!s->sketch)
                rc = PC_ENOMEM;
        }
        if (rc) {
            t->nshards = sh + 1;
            ps_table_destroy(t);
            pthread_rwlockattr_destroy(&attr);
            return rc;
        }
        s->rebuilds = 0;
    }
    pthread_rwlockattr_destroy(&attr);
    *out = t;
    return 0;
}

void ps_table_destroy(ps_table_t *t) {
    if (!t)
        return;
    for (uint32_t sh = 0; sh < t->nshards; sh++) {
        ps_shard_t *s = &t->shards[sh];
        pc_vm_free(PC_MEM_INDEX, s->slots, (size_t)s->nbuckets * BUCKET_SLOTS * sizeof(uint32_t));
        pc_vm_free(PC_MEM_ROWS, s->rows, rows_bytes(t, s->rows_cap));
        pc_vm_free(PC_MEM_KEYS, s->km, (size_t)s->km_cap * sizeof(ps_km_t));
        pc_free(PC_MEM_SKETCH, s->sketch, (size_t)SKETCH_DEPTH * s->sketch_width);
        cow_free(t, s);
        pc_free(PC_MEM_SCRATCH, s->removed, s->removed_cap * sizeof(ps_removal_t));
        spill_free(t, s);
        pthread_rwlock_destroy(&s->lock);
    }
    pthread_rwlock_destroy(&t->cut);
    pthread_mutex_destroy(&t->cold_mu);
    pthread_mutex_destroy(&t->owner_mu);
    pthread_cond_destroy(&t->cold_cv);
    ps_changelog_destroy(atomic_load(&t->log));
    free(t->shards);
    pc_free(PC_MEM_OTHER, t, sizeof *t);
}

ps_changelog_t *ps_table_changelog(const ps_table_t *t) {
    return atomic_load_explicit(&((ps_table_t *)t)->log, memory_order_acquire);
}

int ps_table_changelog_start(ps_table_t *t, size_t capacity, ps_changelog_t **out, bool *started) {
    ps_changelog_t *log = ps_table_changelog(t), *mine;
    if (started)
        *started = false;
    if (!log) {
        /* The base: past every position an earlier log of this name gave out (those count
         * appends from their own start, far fewer than one per nanosecond). */
        const uint64_t now = pc_time_wall_ns();
        int rc = ps_changelog_create(capacity, now ? now : 1, &mine);
        if (rc)
            return rc;
        if (atomic_compare_exchange_strong_explicit(&t->log, &log, mine, memory_order_acq_rel,
                                                    memory_order_acquire)) {
            log = mine;
            if (started)
                *started = true;
        } else {
            ps_changelog_destroy(mine); /* another caller installed one first: log is it */
        }
    }
    *out = log;
    return 0;
}

void ps_table_set_evict_fn(ps_table_t *t, ps_evict_fn fn, void *ctx) {
    t->evict_fn = fn;
    t->evict_ctx = ctx;
}

void ps_table_set_cold(ps_table_t *t, const ps_cold_ops_t *ops, void *ctx) {
    t->cold = *ops;
    t->cold_ctx = ctx;
    t->has_cold = t->cfg.cold;
}

int ps_table_cold_walk(const ps_table_t *t, uint64_t *start, uint64_t max, ps_cold_key_fn fn,
                       void *ctx) {
    if (!t->cfg.cold || !t->has_cold) {
        *start = 0;
        return 0;
    }
    if (!max)
        return PC_EINVAL;
    if (!t->cold.keys)
        return PC_EUNSUPPORTED;
    uint64_t buf[COLD_WALK_BATCH];
    uint64_t visited = 0;
    for (bool first = true; visited < max && (first || *start); first = false) {
        const uint64_t at = *start;
        const size_t want =
            max - visited < COLD_WALK_BATCH ? (size_t)(max - visited) : COLD_WALK_BATCH;
        size_t n = 0;
        int rc = t->cold.keys(t->cold_ctx, start, buf, want, &n);
        if (!rc && *start && (!n || *start <= buf[n - 1]))
            rc = PC_EIO; /* a store whose walk does not move on */
        if (rc) {
            *start = at;
            return rc;
        }
        for (size_t i = 0; i < n; i++)
            if ((rc = fn(ctx, buf[i]))) {
                *start = buf[i];
                return rc;
            }
        visited += n;
    }
    return 0;
}

void ps_table_cold_freeze(ps_table_t *t, bool frozen) {
    pthread_mutex_lock(&t->cold_mu);
    /* A count: a checkpoint and an export freeze independently, and the first to thaw must not
     * let writes through under the other's copy (an export refused for the checkpoint's
     * snapshot thawed the checkpoint's freeze) */
    const int now = atomic_load(&t->cold_frozen) + (frozen ? 1 : -1);
    assert(now >= 0); /* a thaw without its freeze */
    atomic_store(&t->cold_frozen, now);
    if (frozen) {
        while (t->erasers) /* erasers in flight finish; new ones wait for the thaw */
            pthread_cond_wait(&t->cold_cv, &t->cold_mu);
    } else if (now == 0) {
        pthread_cond_broadcast(&t->cold_cv);
    }
    pthread_mutex_unlock(&t->cold_mu);
    for (uint32_t sh = 0; frozen && sh < t->nshards; sh++) {
        /* Spills are written under a shard's write lock: once each lock has been free, none
         * is in flight, and later inserts see the flag. */
        pthread_rwlock_wrlock(&t->shards[sh].lock);
        pthread_rwlock_unlock(&t->shards[sh].lock);
    }
}

const ps_table_config_t *ps_table_config(const ps_table_t *t) {
    return &t->cfg;
}
uint32_t ps_table_dim(const ps_table_t *t) {
    return t->dim;
}
uint32_t ps_table_state_len(const ps_table_t *t) {
    return t->state_len;
}

void ps_table_initial_row(const ps_table_t *t, uint64_t key, float *out) {
    fill_initial(t, key, out);
}

uint64_t ps_table_count(const ps_table_t *t) {
    uint64_t c = 0;
    for (uint32_t sh = 0; sh < t->nshards; sh++) {
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_rdlock(&s->lock);
        c += s->count;
        pthread_rwlock_unlock(&s->lock);
    }
    return c;
}

int ps_table_stats(const ps_table_t *t, ps_table_stats_t *o) {
    if (!t || !o)
        return PC_EINVAL;
    memset(o, 0, sizeof *o);
    for (uint32_t sh = 0; sh < t->nshards; sh++) {
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_rdlock(&s->lock);
        o->rows += s->count;
        o->bytes_index += (uint64_t)s->nbuckets * BUCKET_SLOTS * sizeof(uint32_t);
        o->bytes_sketch += (uint64_t)SKETCH_DEPTH * s->sketch_width;
        o->bytes_reserved += (uint64_t)(s->cap - s->count) * (t->row_bytes + sizeof(ps_km_t));
        o->pushed += s->pushed;
        o->inserted += s->inserted;
        o->erased += s->erased;
        o->evicted_capacity += s->ev_cap;
        o->evicted_ttl += s->ev_ttl;
        o->admit_pending += s->pending;
        o->admit_dropped += s->dropped;
        o->nonfinite_skipped += s->nonfinite;
        o->index_rebuilds += s->rebuilds;
        o->spilled += s->spilled;
        o->spill_clean += s->spill_clean;
        o->spill_refused += s->spill_refused;
        o->cold_errors += s->cold_errors;
        pthread_rwlock_unlock(&s->lock);
    }
    o->bytes_weights = o->rows * t->wbytes;
    o->bytes_state = o->rows * t->state_len * sizeof(float);
    o->bytes_keys = o->rows * sizeof(uint64_t);
    o->bytes_meta = o->rows * (sizeof(ps_km_t) - sizeof(uint64_t));
    o->looked_up = atomic_load_explicit(&((ps_table_t *)t)->looked_up, memory_order_relaxed);
    o->pulled = atomic_load_explicit(&((ps_table_t *)t)->pulled, memory_order_relaxed);
    o->clock = ps_table_clock(t);
    ps_table_t *m = (ps_table_t *)t; /* counters are atomics */
    o->cold_reads = atomic_load_explicit(&m->cold_reads, memory_order_relaxed);
    o->cold_hits = atomic_load_explicit(&m->cold_hits, memory_order_relaxed);
    o->cold_errors += atomic_load_explicit(&m->cold_get_errors, memory_order_relaxed);
    return 0;
}

double ps_table_stats_overhead_per_row(const ps_table_stats_t *s) {
    if (!s->rows)
        return 0.0;
    return (double)(s->bytes_keys + s->bytes_meta + s->bytes_index) / (double)s->rows;
}
