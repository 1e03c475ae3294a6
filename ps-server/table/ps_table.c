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
 * Slab. Rows of a shard are dense: row r is stride = dim + state_len floats at rows + r * stride
 * (weights first), and km[r] is its packed 11-byte record {key, tick, freq}. Both arrays are
 * anonymous mappings grown with mremap (no copy) and only resident where touched; big row slabs
 * ask for transparent huge pages. Removing row r moves the last row into r (swap-with-last), so
 * the slab never has holes and scans are sequential.
 *
 * Index. nbuckets buckets of 16 uint32 slots (one 64-byte line each). A key may live in bucket
 * b1 = range(h_lo32) or b2 = range(mix(h) >> 32) (two-choice cuckoo); a slot holds
 * (tag << rid_bits) | (row + 1), 0 = empty, where tag is a few bits of h so that most non-matching
 * slots are rejected without touching the row's key. rid_bits = bit length of the slot count, so
 * tags shrink as a shard grows (20 bits when small, at least 4). Insertion takes a free slot of
 * b1 or b2, else moves residents to their other bucket (random walk, bounded); when that fails or
 * the load passes 97% the index is rebuilt 1.2x larger from the slab (the index is derived state).
 * Bucket counts need not be powers of two, so the load settles between 81% and 97%: the index
 * costs 4.1-4.9 bytes per row, keys and metadata 11, in all 15.1-15.9 bytes beyond the floats.
 *
 * Batches are software-pipelined: for key i the buckets are prefetched, for key i - D the tags
 * are matched and the candidate row and record prefetched, for key i - 2D the key is verified and
 * the operation done. Verification always re-checks the candidate against the slab, so rows that
 * moved in between (eviction during the same call) are found again by a full probe.
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
 */
#include "ps_table.h"
#include "ps_optim.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_hash.h"
#include "pc_log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ==== constants ============================================================================ */

#define BUCKET_SLOTS    16
#define MAX_LOAD_PCT    97 /* rebuild above this load */
#define GROW_NUM        6  /* rebuild size factor 6/5 = 1.2 */
#define GROW_DEN        5
#define SHRINK_LOAD_PCT 40 /* rebuild smaller below this load */
#define SETTLE_LOAD_PCT 81 /* load after a shrink */
#define MIN_BUCKETS     4u
#define MAX_RID_BITS    28u /* rows per shard < 2^28, tags >= 4 bits */
#define MAX_TAG_BITS    20u /* tags come from h bits 32..51, shards from the top 12 */
#define MAX_KICKS       256
#define PIPE_D          8  /* pipeline distance */
#define CLOCK_PROBES    64 /* rows a CLOCK eviction visits at most */
#define AGING_PERIOD    8192u
#define FREQ_FACTOR     8 /* log counter: increment with probability 1/(1 + freq*8) */
#define SKETCH_DEPTH    4
#define HUGE_MIN_BYTES  (32u << 20) /* slabs this large ask for huge pages */
#define NO_ROW          UINT32_MAX

/* ==== types ================================================================================ */

typedef struct __attribute__((packed)) ps_km {
    uint64_t key;
    uint16_t tick;
    uint8_t freq;
} ps_km_t;

typedef struct ps_shard {
    pthread_rwlock_t lock;
    /* index */
    uint32_t *slots;
    uint32_t nbuckets;
    uint32_t rid_bits, rid_mask, tag_mask; /* tag_mask: bits of (h >> 32) used as tag */
    /* slab */
    float *rows;
    ps_km_t *km;
    uint32_t count, cap;
    /* clock, eviction, admission */
    uint32_t clock, last_aging, last_ttl, last_decay;
    uint32_t hand;
    uint64_t rng;
    uint8_t *sketch;
    uint32_t sketch_width;
    /* counters (under the write lock) */
    uint64_t pulled, pushed, inserted, erased, ev_cap, ev_ttl, pending, dropped, nonfinite,
        rebuilds;
} __attribute__((aligned(64))) ps_shard_t;

struct ps_table {
    ps_table_config_t cfg;
    ps_optim_t opt;
    uint32_t dim, state_len, stride;
    uint32_t shard_bits, nshards;
    uint32_t shard_cap; /* rows per shard, 0 = unlimited */
    uint32_t admit;     /* admission threshold (0 = off) */
    _Atomic uint32_t clock;
    atomic_uint_least64_t looked_up;
    ps_evict_fn evict_fn;
    void *evict_ctx;
    ps_shard_t *shards;
};

/* Per-call scratch: hashes, shard grouping and pipeline candidates. */
typedef struct plan {
    uint64_t *h;
    uint32_t *order; /* key indexes grouped by shard, call order within a shard */
    uint32_t *cand;  /* pipeline: candidate row per key index */
    uint32_t *start; /* nshards + 1 offsets into order */
    size_t bytes;
    void *mem;
} plan_t;

/* ==== configuration ======================================================================== */

static const char *const k_init_names[] = {"zeros", "uniform", "normal", "trunc_normal", NULL};
static const char *const k_opt_names[] = {"sgd",  "adagrad", "rowwise_adagrad",
                                          "adam", "ftrl",    NULL};
static const char *const k_missing_names[] = {"init", "zeros", NULL};

#define T ps_table_config_t
static const pc_setting_t k_table_settings[] = {
    PC_SETTING_STRING(T, name, "default", "table name ([A-Za-z0-9_.-])"),
    PC_SETTING_INT(T, dim, 1, PS_DIM_MAX, "16", "floats per row"),
    PC_SETTING_INT(T, shards, 1, 4096, "64", "lock shards (power of two); ~rows/1M for speed"),
    PC_SETTING_INT(T, seed, 0, 9.2e18, "0", "seed of the initial rows"),
    PC_SETTING_ENUM(T, init, k_init_names, "uniform", "initial row distribution"),
    PC_SETTING_DOUBLE(T, init_scale, 0, 1e6, "0.01", "uniform bound a or normal stddev s"),
    PC_SETTING_ENUM(T, missing, k_missing_names, "init", "lookup of a missing key returns"),
    PC_SETTING_ENUM(T, optimizer, k_opt_names, "adagrad", "server-side optimizer"),
    PC_SETTING_DOUBLE(T, lr, 0, 1e6, "0.01", "learning rate (FTRL alpha)"),
    PC_SETTING_DOUBLE(T, beta1, 0, 0.999999, "0.9", "Adam beta1"),
    PC_SETTING_DOUBLE(T, beta2, 0, 0.99999999, "0.999", "Adam beta2"),
    PC_SETTING_DOUBLE(T, eps, 0, 1, "1e-8", "Adam/Adagrad epsilon"),
    PC_SETTING_DOUBLE(T, adagrad_init, 0, 1e6, "0.1", "Adagrad initial accumulator"),
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
    return 0;
}

/* ==== small helpers ======================================================================== */

static inline uint64_t key_hash(uint64_t key) {
    return pc_hash_u64(key, PC_HASH_SEED_INDEX);
}

static inline uint32_t shard_of(const ps_table_t *t, uint64_t h) {
    return t->shard_bits ? (uint32_t)(h >> (64 - t->shard_bits)) : 0;
}

static inline uint32_t bucket1(const ps_shard_t *s, uint64_t h) {
    return pc_hash_range((uint32_t)h, s->nbuckets);
}

static inline uint32_t bucket2(const ps_shard_t *s, uint64_t h) {
    return pc_hash_range((uint32_t)((h * UINT64_C(0x9E3779B97F4A7C15)) >> 32), s->nbuckets);
}

static inline uint32_t slot_tag(const ps_shard_t *s, uint64_t h) {
    return ((uint32_t)(h >> 32) & s->tag_mask) << s->rid_bits;
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

static inline float *row_ptr(const ps_table_t *t, const ps_shard_t *s, uint32_t r) {
    return s->rows + (size_t)r * t->stride;
}

static inline void freq_bump(ps_shard_t *s, ps_km_t *km) {
    uint8_t c = km->freq;
    if (c == 255)
        return;
    if (((rng_next(s) >> 32) * (uint64_t)(1 + c * FREQ_FACTOR)) >> 32 == 0)
        km->freq = (uint8_t)(c + 1);
}

static inline void prefetch_row(const ps_table_t *t, const ps_shard_t *s, uint32_t r, int write,
                                uint32_t floats) {
    const char *p = (const char *)row_ptr(t, s, r);
    __builtin_prefetch(&s->km[r], write, 3);
    const char *end = p + (size_t)floats * sizeof(float);
    uint32_t lines = 0;
    for (const char *q = (const char *)((uintptr_t)p & ~(uintptr_t)63); q < end && lines < 32;
         q += 64, lines++) {
        if (write)
            __builtin_prefetch(q, 1, 3);
        else
            __builtin_prefetch(q, 0, 3);
    }
}

static inline void prefetch_buckets(const ps_shard_t *s, uint64_t h) {
    __builtin_prefetch(s->slots + (size_t)bucket1(s, h) * BUCKET_SLOTS, 0, 3);
    __builtin_prefetch(s->slots + (size_t)bucket2(s, h) * BUCKET_SLOTS, 0, 3);
}

/* First row whose tag matches in b1 then b2, without touching keys (pipeline stage B). */
static inline uint32_t probe_tag(const ps_shard_t *s, uint64_t h) {
    const uint32_t tag = slot_tag(s, h), hi = ~s->rid_mask;
    const uint32_t b[2] = {bucket1(s, h), bucket2(s, h)};
    for (int k = 0; k < 2; k++) {
        const uint32_t *sl = s->slots + (size_t)b[k] * BUCKET_SLOTS;
        for (int j = 0; j < BUCKET_SLOTS; j++) {
            uint32_t v = sl[j];
            if (v && (v & hi) == tag)
                return (v & s->rid_mask) - 1;
        }
    }
    return NO_ROW;
}

/* Full probe: the row of key, or NO_ROW. */
static uint32_t find_row(const ps_shard_t *s, uint64_t key, uint64_t h) {
    const uint32_t tag = slot_tag(s, h), hi = ~s->rid_mask;
    const uint32_t b[2] = {bucket1(s, h), bucket2(s, h)};
    for (int k = 0; k < 2; k++) {
        const uint32_t *sl = s->slots + (size_t)b[k] * BUCKET_SLOTS;
        for (int j = 0; j < BUCKET_SLOTS; j++) {
            uint32_t v = sl[j];
            if (v && (v & hi) == tag) {
                uint32_t r = (v & s->rid_mask) - 1;
                if (s->km[r].key == key)
                    return r;
            }
        }
        if (b[1] == b[0])
            break;
    }
    return NO_ROW;
}

/* Pipeline stage C: confirm the stage-B candidate or probe again. */
static inline uint32_t resolve(const ps_shard_t *s, uint64_t key, uint64_t h, uint32_t cand) {
    if (cand < s->count && s->km[cand].key == key)
        return cand;
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

/* Place row r (hash h) into the index. PC_EFULL when the random walk gives up: then one row
 * (possibly another) is missing from the index and the caller must rebuild. */
static int index_place(ps_shard_t *s, uint64_t h, uint32_t r) {
    uint32_t v = slot_tag(s, h) | (r + 1);
    uint32_t b1 = bucket1(s, h), b2 = bucket2(s, h);
    if (bucket_put(s->slots + (size_t)b1 * BUCKET_SLOTS, v) ||
        bucket_put(s->slots + (size_t)b2 * BUCKET_SLOTS, v))
        return 0;
    uint32_t b = (rng_next(s) & 1) ? b1 : b2;
    for (int k = 0; k < MAX_KICKS; k++) {
        uint32_t *sl = s->slots + (size_t)b * BUCKET_SLOTS;
        uint32_t pos = (uint32_t)(rng_next(s) >> 60); /* 0..15 */
        uint32_t victim = sl[pos];
        sl[pos] = v;
        v = victim;
        uint64_t vh = key_hash(s->km[(v & s->rid_mask) - 1].key);
        uint32_t vb1 = bucket1(s, vh), vb2 = bucket2(s, vh);
        uint32_t alt = b == vb1 ? vb2 : vb1;
        if (bucket_put(s->slots + (size_t)alt * BUCKET_SLOTS, v))
            return 0;
        b = alt;
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
    for (int attempt = 0; attempt < 8; attempt++) {
        uint64_t nslots = (uint64_t)nb * BUCKET_SLOTS;
        uint32_t bits = bit_length(nslots);
        if (bits > MAX_RID_BITS)
            break;
        uint32_t *slots = pc_vm_alloc(PC_MEM_INDEX, nslots * sizeof(uint32_t));
        if (!slots) {
            s->slots = old;
            return PC_ENOMEM;
        }
        s->slots = slots;
        s->nbuckets = nb;
        s->rid_bits = bits;
        s->rid_mask = (uint32_t)((1u << bits) - 1);
        uint32_t tag_bits = 32 - bits < MAX_TAG_BITS ? 32 - bits : MAX_TAG_BITS;
        s->tag_mask = (uint32_t)((1u << tag_bits) - 1);
        int ok = 1;
        for (uint32_t r = 0; r < s->count; r++) {
            if (r + 16 < s->count)
                __builtin_prefetch(&s->km[r + 16], 0, 0);
            if (index_place(s, key_hash(s->km[r].key), r)) {
                ok = 0;
                break;
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
    s->slots = old;
    s->nbuckets = old_nb;
    s->rid_bits = old_bits;
    s->rid_mask = old_mask;
    s->tag_mask = old_tag;
    return PC_EFULL;
}

static inline uint64_t max_rows(const ps_shard_t *s) {
    return (uint64_t)s->nbuckets * BUCKET_SLOTS * MAX_LOAD_PCT / 100;
}

/* ==== slab ================================================================================= */

static size_t rows_bytes(const ps_table_t *t, uint32_t cap) {
    return (size_t)cap * t->stride * sizeof(float);
}

static int slab_resize(const ps_table_t *t, ps_shard_t *s, uint32_t cap) {
    if (cap < 16)
        cap = 16;
    size_t ob = rows_bytes(t, s->cap), nbytes = rows_bytes(t, cap);
    float *rows =
        s->rows ? pc_vm_resize(PC_MEM_ROWS, s->rows, ob, nbytes) : pc_vm_alloc(PC_MEM_ROWS, nbytes);
    if (!rows)
        return PC_ENOMEM;
    s->rows = rows;
    if (nbytes >= HUGE_MIN_BYTES)
        pc_vm_advise_huge(rows, nbytes);
    ps_km_t *km = s->km ? pc_vm_resize(PC_MEM_KEYS, s->km, (size_t)s->cap * sizeof(ps_km_t),
                                       (size_t)cap * sizeof(ps_km_t))
                        : pc_vm_alloc(PC_MEM_KEYS, (size_t)cap * sizeof(ps_km_t));
    if (!km) {
        /* Keep the arrays consistent: shrink rows back when it was a growth. */
        float *back = pc_vm_resize(PC_MEM_ROWS, s->rows, nbytes, ob);
        if (back)
            s->rows = back;
        else
            s->cap = cap < s->cap ? cap : s->cap; /* rows array is larger: still valid */
        return PC_ENOMEM;
    }
    s->km = km;
    s->cap = cap;
    return 0;
}

/* Remove row r: clear its slot, move the last row into its place. */
static void row_remove(ps_table_t *t, ps_shard_t *s, uint32_t r) {
    uint32_t *sl = slot_of_row(s, key_hash(s->km[r].key), r);
    if (sl)
        *sl = 0;
    uint32_t last = s->count - 1;
    if (r != last) {
        memcpy(row_ptr(t, s, r), row_ptr(t, s, last), (size_t)t->stride * sizeof(float));
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

static void row_view(const ps_table_t *t, const ps_shard_t *s, uint32_t r, ps_row_view_t *v) {
    const float *row = row_ptr(t, s, r);
    v->key = s->km[r].key;
    v->weights = row;
    v->state = t->state_len ? row + t->dim : NULL;
    v->tick = s->km[r].tick;
    v->freq = s->km[r].freq;
}

static void evict_row(ps_table_t *t, ps_shard_t *s, uint32_t r, ps_evict_reason_t why) {
    if (t->evict_fn) {
        ps_row_view_t v;
        row_view(t, s, r, &v);
        t->evict_fn(t->evict_ctx, why, &v);
    }
    if (why == PS_EVICT_CAPACITY)
        s->ev_cap++;
    else
        s->ev_ttl++;
    row_remove(t, s, r);
    s->erased--; /* counted as eviction, not erase */
}

/* Generalized CLOCK over the frequency counters. */
static void evict_one(ps_table_t *t, ps_shard_t *s) {
    uint32_t victim = NO_ROW;
    uint32_t best = 256;
    for (int k = 0; k < CLOCK_PROBES && s->count; k++) {
        if (s->hand >= s->count)
            s->hand = 0;
        uint8_t f = s->km[s->hand].freq;
        if (f == 0) {
            victim = s->hand;
            break;
        }
        if (f < best) {
            best = f;
            victim = s->hand;
        }
        s->km[s->hand].freq = (uint8_t)(f - 1);
        s->hand++;
    }
    if (victim != NO_ROW)
        evict_row(t, s, victim, PS_EVICT_CAPACITY);
}

/* Insert key (absent) with its initial row and fresh state. */
static int row_insert(ps_table_t *t, ps_shard_t *s, uint64_t key, uint64_t h, uint32_t *out) {
    if (t->shard_cap && s->count >= t->shard_cap)
        evict_one(t, s);
    if (s->count == s->cap) {
        uint64_t cap = (uint64_t)s->cap + s->cap / 2 + 16;
        if (cap > (1u << MAX_RID_BITS))
            cap = 1u << MAX_RID_BITS;
        if (cap <= s->count)
            return PC_EFULL;
        int rc = slab_resize(t, s, (uint32_t)cap);
        if (rc)
            return rc;
    }
    if ((uint64_t)s->count + 1 > max_rows(s)) {
        int rc = index_rebuild(s, s->nbuckets * GROW_NUM / GROW_DEN + 1);
        if (rc)
            return rc;
    }
    uint32_t r = s->count++;
    s->km[r].key = key;
    s->km[r].tick = (uint16_t)s->clock;
    s->km[r].freq = 1;
    float *row = row_ptr(t, s, r);
    ps__init_row((ps_init_kind_t)t->cfg.init, (float)t->cfg.init_scale, (uint64_t)t->cfg.seed, key,
                 t->dim, row);
    if (t->state_len)
        ps__optim_init_state(&t->opt, row + t->dim);
    if (index_place(s, h, r)) {
        int rc = index_rebuild(s, s->nbuckets * GROW_NUM / GROW_DEN + 1);
        if (rc) {
            /* The new row may be unindexed: drop it so index and slab agree. */
            uint32_t *sl = slot_of_row(s, h, r);
            if (sl)
                *sl = 0;
            s->count--;
            return rc;
        }
    }
    s->inserted++;
    *out = r;
    return 0;
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
    size_t bytes = n * (sizeof(uint64_t) + 2 * sizeof(uint32_t)) +
                   (size_t)(2 * t->nshards + 1) * sizeof(uint32_t);
    p->mem = pc_malloc(PC_MEM_SCRATCH, bytes);
    if (!p->mem)
        return PC_ENOMEM;
    p->bytes = bytes;
    p->h = p->mem;
    p->order = (uint32_t *)(p->h + n);
    p->cand = p->order + n;
    p->start = p->cand + n;
    uint32_t *cur = p->start + t->nshards + 1; /* running cursor per shard */
    memset(p->start, 0, (size_t)(t->nshards + 1) * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) {
        p->h[i] = key_hash(keys[i]);
        p->start[shard_of(t, p->h[i]) + 1]++;
    }
    for (uint32_t k = 0; k < t->nshards; k++)
        p->start[k + 1] += p->start[k];
    memcpy(cur, p->start, t->nshards * sizeof(uint32_t));
    for (size_t i = 0; i < n; i++) /* stable: call order kept within a shard */
        p->order[cur[shard_of(t, p->h[i])]++] = (uint32_t)i;
    return 0;
}

static void plan_free(plan_t *p) {
    pc_free(PC_MEM_SCRATCH, p->mem, p->bytes);
}

static int check_batch(const ps_table_t *t, const void *keys, size_t n, const void *buf,
                       size_t len) {
    if (!t || (n && (!keys || !buf)))
        return PC_EINVAL;
    if (n > PS_BATCH_MAX)
        return PC_ETOOBIG;
    if (len != n * t->dim)
        return PC_EDIM;
    return 0;
}

/* ==== operations =========================================================================== */

int ps_table_pull(ps_table_t *t, const uint64_t *keys, size_t n, float *rows, size_t rows_len) {
    int rc = check_batch(t, keys, n, rows, rows_len);
    if (rc || n == 0)
        return rc;
    plan_t p;
    if ((rc = plan_build(t, keys, n, &p)))
        return rc;
    const uint32_t dim = t->dim;
    const size_t rowsz = (size_t)dim * sizeof(float);
    uint32_t first = shard_of(t, p.h[0]);
    for (uint32_t si = 0; si < t->nshards; si++) {
        uint32_t sh = (first + si) & (t->nshards - 1);
        const uint32_t *idx = p.order + p.start[sh];
        const uint32_t m = p.start[sh + 1] - p.start[sh];
        if (!m)
            continue;
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_wrlock(&s->lock);
        for (uint32_t i = 0; i < m + 2 * PIPE_D; i++) {
            if (i < m)
                prefetch_buckets(s, p.h[idx[i]]);
            if (i >= PIPE_D && i - PIPE_D < m) {
                uint32_t j = idx[i - PIPE_D];
                uint32_t c = probe_tag(s, p.h[j]);
                p.cand[j] = c;
                if (c != NO_ROW)
                    prefetch_row(t, s, c, 0, dim);
            }
            if (i < 2 * PIPE_D || i - 2 * PIPE_D >= m)
                continue;
            uint32_t k = idx[i - 2 * PIPE_D];
            float *out = rows + (size_t)k * dim;
            uint32_t r = resolve(s, keys[k], p.h[k], p.cand[k]);
            if (r == NO_ROW) {
                if (t->admit > 1 && sketch_count(s, keys[k], 1) < t->admit) {
                    ps__init_row((ps_init_kind_t)t->cfg.init, (float)t->cfg.init_scale,
                                 (uint64_t)t->cfg.seed, keys[k], dim, out);
                    s->pending++;
                    continue;
                }
                int irc = row_insert(t, s, keys[k], p.h[k], &r);
                if (irc) {
                    ps__init_row((ps_init_kind_t)t->cfg.init, (float)t->cfg.init_scale,
                                 (uint64_t)t->cfg.seed, keys[k], dim, out);
                    if (!rc)
                        rc = irc;
                    continue;
                }
            }
            memcpy(out, row_ptr(t, s, r), rowsz);
            freq_bump(s, &s->km[r]);
        }
        s->pulled += m;
        pthread_rwlock_unlock(&s->lock);
    }
    plan_free(&p);
    return rc;
}

int ps_table_lookup(const ps_table_t *t, const uint64_t *keys, size_t n, float *rows,
                    size_t rows_len, uint8_t *found) {
    int rc = check_batch(t, keys, n, rows, rows_len);
    if (rc || n == 0)
        return rc;
    plan_t p;
    if ((rc = plan_build(t, keys, n, &p)))
        return rc;
    const uint32_t dim = t->dim;
    const size_t rowsz = (size_t)dim * sizeof(float);
    uint32_t first = shard_of(t, p.h[0]);
    for (uint32_t si = 0; si < t->nshards; si++) {
        uint32_t sh = (first + si) & (t->nshards - 1);
        const uint32_t *idx = p.order + p.start[sh];
        const uint32_t m = p.start[sh + 1] - p.start[sh];
        if (!m)
            continue;
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_rdlock(&s->lock);
        for (uint32_t i = 0; i < m + 2 * PIPE_D; i++) {
            if (i < m)
                prefetch_buckets(s, p.h[idx[i]]);
            if (i >= PIPE_D && i - PIPE_D < m) {
                uint32_t j = idx[i - PIPE_D];
                uint32_t c = probe_tag(s, p.h[j]);
                p.cand[j] = c;
                if (c != NO_ROW)
                    prefetch_row(t, s, c, 0, dim);
            }
            if (i < 2 * PIPE_D || i - 2 * PIPE_D >= m)
                continue;
            uint32_t k = idx[i - 2 * PIPE_D];
            float *out = rows + (size_t)k * dim;
            uint32_t r = resolve(s, keys[k], p.h[k], p.cand[k]);
            if (found)
                found[k] = r != NO_ROW;
            if (r != NO_ROW)
                memcpy(out, row_ptr(t, s, r), rowsz);
            else if (t->cfg.missing == PS_MISSING_ZEROS)
                memset(out, 0, rowsz);
            else
                ps__init_row((ps_init_kind_t)t->cfg.init, (float)t->cfg.init_scale,
                             (uint64_t)t->cfg.seed, keys[k], dim, out);
        }
        pthread_rwlock_unlock(&s->lock);
    }
    atomic_fetch_add_explicit(&((ps_table_t *)t)->looked_up, n, memory_order_relaxed);
    plan_free(&p);
    return 0;
}

/* Duplicate merging for push: first[pos] = first position (within the shard group) holding
 * the same key; acc[pos] = offset of the summed gradient in `sum` (or UINT32_MAX). */
typedef struct dedup {
    uint32_t *first, *acc, *table;
    float *sum;
    uint32_t tcap, nsum;
} dedup_t;

static int dedup_run(dedup_t *d, const uint64_t *keys, const uint64_t *h, const uint32_t *idx,
                     uint32_t m, const float *grads, uint32_t dim) {
    uint32_t cap = 16;
    while (cap < 2 * m)
        cap <<= 1;
    d->tcap = cap;
    d->nsum = 0;
    memset(d->table, 0xff, cap * sizeof(uint32_t));
    for (uint32_t pos = 0; pos < m; pos++) {
        uint64_t key = keys[idx[pos]];
        uint32_t b = (uint32_t)h[idx[pos]] & (cap - 1);
        d->first[pos] = pos;
        d->acc[pos] = UINT32_MAX;
        for (;; b = (b + 1) & (cap - 1)) {
            uint32_t q = d->table[b];
            if (q == UINT32_MAX) {
                d->table[b] = pos;
                break;
            }
            if (keys[idx[q]] == key) {
                d->first[pos] = q;
                if (d->acc[q] == UINT32_MAX) {
                    d->acc[q] = d->nsum++ * dim;
                    memcpy(d->sum + d->acc[q], grads + (size_t)idx[q] * dim, dim * sizeof(float));
                }
                float *acc = d->sum + d->acc[q];
                const float *g = grads + (size_t)idx[pos] * dim;
                for (uint32_t e = 0; e < dim; e++)
                    acc[e] += g[e];
                break;
            }
        }
    }
    return 0;
}

int ps_table_push(ps_table_t *t, const uint64_t *keys, size_t n, const float *grads,
                  size_t grads_len, ps_push_result_t *res) {
    ps_push_result_t local = {0, 0, 0};
    int rc = check_batch(t, keys, n, grads, grads_len);
    if (rc || n == 0) {
        if (res)
            *res = local;
        return rc;
    }
    plan_t p;
    if ((rc = plan_build(t, keys, n, &p)))
        return rc;
    /* Dedup scratch sized for the largest shard group. */
    uint32_t mmax = 0;
    for (uint32_t sh = 0; sh < t->nshards; sh++)
        if (p.start[sh + 1] - p.start[sh] > mmax)
            mmax = p.start[sh + 1] - p.start[sh];
    uint32_t tcap = 16;
    while (tcap < 2 * mmax)
        tcap <<= 1;
    size_t dbytes = (size_t)mmax * 2 * sizeof(uint32_t) + (size_t)tcap * sizeof(uint32_t);
    dedup_t d;
    void *dmem = pc_malloc(PC_MEM_SCRATCH, dbytes);
    if (!dmem) {
        plan_free(&p);
        return PC_ENOMEM;
    }
    d.first = dmem;
    d.acc = d.first + mmax;
    d.table = d.acc + mmax;
    d.sum = NULL;
    size_t sum_bytes = 0;

    const uint32_t dim = t->dim, stride = t->stride;
    uint32_t first = shard_of(t, p.h[0]);
    for (uint32_t si = 0; si < t->nshards; si++) {
        uint32_t sh = (first + si) & (t->nshards - 1);
        const uint32_t *idx = p.order + p.start[sh];
        const uint32_t m = p.start[sh + 1] - p.start[sh];
        if (!m)
            continue;
        /* Merge duplicates before taking the lock. The sum buffer grows on demand. */
        if (!d.sum || sum_bytes < (size_t)m * dim * sizeof(float)) {
            pc_free(PC_MEM_SCRATCH, d.sum, sum_bytes);
            sum_bytes = (size_t)mmax * dim * sizeof(float);
            d.sum = pc_malloc(PC_MEM_SCRATCH, sum_bytes);
            if (!d.sum) {
                sum_bytes = 0;
                rc = PC_ENOMEM;
                break;
            }
        }
        dedup_run(&d, keys, p.h, idx, m, grads, dim);

        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_wrlock(&s->lock);
        const uint16_t tick = (uint16_t)s->clock;
        uint32_t applied = 0;
        for (uint32_t i = 0; i < m + 2 * PIPE_D; i++) {
            if (i < m && d.first[i] == i)
                prefetch_buckets(s, p.h[idx[i]]);
            if (i >= PIPE_D && i - PIPE_D < m && d.first[i - PIPE_D] == i - PIPE_D) {
                uint32_t j = idx[i - PIPE_D];
                uint32_t c = probe_tag(s, p.h[j]);
                p.cand[j] = c;
                if (c != NO_ROW)
                    prefetch_row(t, s, c, 1, stride);
            }
            if (i < 2 * PIPE_D || i - 2 * PIPE_D >= m)
                continue;
            uint32_t pos = i - 2 * PIPE_D;
            if (d.first[pos] != pos)
                continue; /* merged into an earlier occurrence */
            uint32_t k = idx[pos];
            const float *g =
                d.acc[pos] != UINT32_MAX ? d.sum + d.acc[pos] : grads + (size_t)k * dim;
            if (!ps__grad_finite(g, dim)) {
                s->nonfinite++;
                local.skipped_nonfinite++;
                continue;
            }
            uint32_t r = resolve(s, keys[k], p.h[k], p.cand[k]);
            if (r == NO_ROW) {
                if (t->admit > 1 && sketch_count(s, keys[k], 0) < t->admit) {
                    s->dropped++;
                    local.dropped_unadmitted++;
                    continue;
                }
                int irc = row_insert(t, s, keys[k], p.h[k], &r);
                if (irc) {
                    if (!rc)
                        rc = irc;
                    continue;
                }
            }
            float *row = row_ptr(t, s, r);
            ps__optim_step(&t->opt, row, row + dim, g);
            s->km[r].tick = tick;
            freq_bump(s, &s->km[r]);
            applied++;
        }
        s->pushed += applied;
        local.applied += applied;
        pthread_rwlock_unlock(&s->lock);
    }
    pc_free(PC_MEM_SCRATCH, d.sum, sum_bytes);
    pc_free(PC_MEM_SCRATCH, dmem, dbytes);
    plan_free(&p);
    if (res)
        *res = local;
    return rc;
}

int ps_table_erase(ps_table_t *t, const uint64_t *keys, size_t n, size_t *erased) {
    if (erased)
        *erased = 0;
    if (!t || (n && !keys))
        return PC_EINVAL;
    if (n > PS_BATCH_MAX)
        return PC_ETOOBIG;
    if (n == 0)
        return 0;
    plan_t p;
    int rc = plan_build(t, keys, n, &p);
    if (rc)
        return rc;
    size_t count = 0;
    for (uint32_t sh = 0; sh < t->nshards; sh++) {
        const uint32_t m = p.start[sh + 1] - p.start[sh];
        if (!m)
            continue;
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_wrlock(&s->lock);
        for (uint32_t i = 0; i < m; i++) {
            uint32_t k = p.order[p.start[sh] + i];
            uint32_t r = find_row(s, keys[k], p.h[k]);
            if (r != NO_ROW) {
                row_remove(t, s, r);
                count++;
            }
        }
        shard_maybe_shrink(t, s);
        pthread_rwlock_unlock(&s->lock);
    }
    plan_free(&p);
    if (erased)
        *erased = count;
    return 0;
}

int ps_table_load(ps_table_t *t, size_t n, const uint64_t *keys, const float *weights,
                  const float *states, const uint16_t *ticks, const uint8_t *freqs) {
    if (!t || (n && (!keys || !weights)))
        return PC_EINVAL;
    if (n > PS_BATCH_MAX)
        return PC_ETOOBIG;
    if (n == 0)
        return 0;
    plan_t p;
    int rc = plan_build(t, keys, n, &p);
    if (rc)
        return rc;
    const uint32_t dim = t->dim, sl = t->state_len;
    for (uint32_t sh = 0; sh < t->nshards && !rc; sh++) {
        const uint32_t m = p.start[sh + 1] - p.start[sh];
        if (!m)
            continue;
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_wrlock(&s->lock);
        for (uint32_t i = 0; i < m; i++) {
            uint32_t k = p.order[p.start[sh] + i];
            uint32_t r = find_row(s, keys[k], p.h[k]);
            if (r == NO_ROW && (rc = row_insert(t, s, keys[k], p.h[k], &r)))
                break;
            float *row = row_ptr(t, s, r);
            memcpy(row, weights + (size_t)k * dim, dim * sizeof(float));
            if (sl && states)
                memcpy(row + dim, states + (size_t)k * sl, sl * sizeof(float));
            else if (sl)
                ps__optim_init_state(&t->opt, row + dim);
            s->km[r].tick = ticks ? ticks[k] : (uint16_t)s->clock;
            s->km[r].freq = freqs ? freqs[k] : 1;
        }
        pthread_rwlock_unlock(&s->lock);
    }
    plan_free(&p);
    return rc;
}

/* ==== clock, expiry, scans ================================================================= */

static void shard_advance(ps_table_t *t, ps_shard_t *s, uint32_t now) {
    const uint32_t prev = s->clock;
    if (now - s->last_aging >= AGING_PERIOD) {
        /* Clamp ages at PS_AGE_MAX; ages relative to prev are exact (< 2^15) by the invariant. */
        for (uint32_t r = 0; r < s->count; r++) {
            uint32_t age = (uint16_t)((uint16_t)prev - s->km[r].tick) + (now - prev);
            if (age >= PS_AGE_MAX)
                s->km[r].tick = (uint16_t)(now - PS_AGE_MAX);
        }
        s->last_aging = now;
    } else if (now - prev >= PS_AGE_MAX) {
        for (uint32_t r = 0; r < s->count; r++)
            s->km[r].tick = (uint16_t)(now - PS_AGE_MAX);
    }
    s->clock = now;
    const uint32_t ttl = (uint32_t)t->cfg.ttl_ticks;
    uint32_t period = ttl / 16 ? ttl / 16 : 1;
    if (ttl && now - s->last_ttl >= period) {
        for (uint32_t r = s->count; r-- > 0;) {
            uint16_t age = (uint16_t)((uint16_t)now - s->km[r].tick);
            if (age >= ttl)
                evict_row(t, s, r, PS_EVICT_TTL);
        }
        s->last_ttl = now;
        shard_maybe_shrink(t, s);
    }
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
    uint32_t cur = atomic_load(&t->clock);
    if (now < cur)
        return PC_EINVAL;
    if (now == cur)
        return 0;
    atomic_store(&t->clock, now);
    for (uint32_t sh = 0; sh < t->nshards; sh++) {
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_wrlock(&s->lock);
        if (now > s->clock)
            shard_advance(t, s, now);
        pthread_rwlock_unlock(&s->lock);
    }
    return 0;
}

uint32_t ps_table_clock(const ps_table_t *t) {
    return atomic_load(&((ps_table_t *)t)->clock);
}

int ps_table_scan(const ps_table_t *t, uint64_t since, ps_scan_fn fn, void *ctx) {
    if (!t || !fn)
        return PC_EINVAL;
    ps_row_view_t views[256];
    for (uint32_t sh = 0; sh < t->nshards; sh++) {
        ps_shard_t *s = &t->shards[sh];
        pthread_rwlock_rdlock(&s->lock);
        uint32_t now = s->clock;
        int all =
            since == PS_SCAN_ALL || since > now ? since == PS_SCAN_ALL : now - since >= PS_AGE_MAX;
        uint32_t window = since == PS_SCAN_ALL || since > now ? 0 : now - (uint32_t)since;
        size_t nv = 0;
        int rc = 0;
        for (uint32_t r = 0; r < s->count && !rc; r++) {
            if (!all) {
                if (since > now)
                    continue; /* nothing updated at a future clock */
                uint16_t age = (uint16_t)((uint16_t)now - s->km[r].tick);
                if (age > window)
                    continue;
            }
            row_view(t, s, r, &views[nv++]);
            if (nv == 256) {
                rc = fn(ctx, views, nv);
                nv = 0;
            }
        }
        if (!rc && nv)
            rc = fn(ctx, views, nv);
        pthread_rwlock_unlock(&s->lock);
        if (rc)
            return rc;
    }
    return 0;
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
    t->nshards = (uint32_t)cfg->shards;
    t->shard_bits = bit_length(t->nshards) - 1;
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
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
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
        pc_vm_free(PC_MEM_ROWS, s->rows, rows_bytes(t, s->cap));
        pc_vm_free(PC_MEM_KEYS, s->km, (size_t)s->cap * sizeof(ps_km_t));
        pc_free(PC_MEM_SKETCH, s->sketch, (size_t)SKETCH_DEPTH * s->sketch_width);
        pthread_rwlock_destroy(&s->lock);
    }
    free(t->shards);
    pc_free(PC_MEM_OTHER, t, sizeof *t);
}

void ps_table_set_evict_fn(ps_table_t *t, ps_evict_fn fn, void *ctx) {
    t->evict_fn = fn;
    t->evict_ctx = ctx;
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
    ps__init_row((ps_init_kind_t)t->cfg.init, (float)t->cfg.init_scale, (uint64_t)t->cfg.seed, key,
                 t->dim, out);
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
        o->bytes_reserved += (uint64_t)(s->cap - s->count) * (t->stride * 4 + sizeof(ps_km_t));
        o->pulled += s->pulled;
        o->pushed += s->pushed;
        o->inserted += s->inserted;
        o->erased += s->erased;
        o->evicted_capacity += s->ev_cap;
        o->evicted_ttl += s->ev_ttl;
        o->admit_pending += s->pending;
        o->admit_dropped += s->dropped;
        o->nonfinite_skipped += s->nonfinite;
        o->index_rebuilds += s->rebuilds;
        pthread_rwlock_unlock(&s->lock);
    }
    o->bytes_weights = o->rows * t->dim * sizeof(float);
    o->bytes_state = o->rows * t->state_len * sizeof(float);
    o->bytes_keys = o->rows * sizeof(uint64_t);
    o->bytes_meta = o->rows * (sizeof(ps_km_t) - sizeof(uint64_t));
    o->looked_up = atomic_load_explicit(&((ps_table_t *)t)->looked_up, memory_order_relaxed);
    o->clock = ps_table_clock(t);
    return 0;
}

double ps_table_stats_overhead_per_row(const ps_table_stats_t *s) {
    if (!s->rows)
        return 0.0;
    return (double)(s->bytes_keys + s->bytes_meta + s->bytes_index) / (double)s->rows;
}
