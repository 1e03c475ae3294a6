/* ps_tier.c: the RocksDB cold tier (see ps_tier.h).
 *
 * DESIGN
 * Column families are opened for every family the database holds (RocksDB requires it) and
 * tracked in `cfs`; attaching a table binds its family to a per-table context that the table's
 * cold hooks receive. Reads use the pinned batched MultiGet (values are decoded straight out of
 * the block cache's pinned blocks); writes are write batches without the WAL (the live database
 * is not durable state, checkpoints are). The free-space watermark is a cached statvfs reading,
 * refreshed at most every 20 ms, so spills under shard locks cost an atomic load. A write that
 * fails (RocksDB in its read-only error state after a failed flush, an I/O error) makes the tier
 * refuse spills and erases (PC_EIO) for WRITE_BACKOFF_NS, then one is tried again: each
 * insert into a full shard would otherwise queue rows that the failed write puts back, growing
 * RAM past its budget without end.
 */
#include "ps_tier.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_log.h"
#include "pc_time.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <rocksdb/c.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the record format stores little-endian floats as they are in memory"
#endif

#define REC_FORMAT       1
#define REC_HDR          8u
#define CF_PREFIX        "t."
#define FREE_CHECK_NS    20000000ull   /* watermark reading refreshed at most this often */
#define WRITE_BACKOFF_NS 1000000000ull /* writes refused this long after one failed */
#define DEF_CACHE        (256ull << 20)
#define DEF_WBUF         (64ull << 20)
#define DEF_MIN_FREE     (1ull << 30)
#define VIEW_BATCH       256u
#define CF_NAME_MAX      (PS_TABLE_NAME_MAX + sizeof CF_PREFIX)

typedef struct tier_cf tier_cf_t;

/* One open column family; `att` is the table bound to it, if any. */
typedef struct cfent {
    char name[CF_NAME_MAX];
    rocksdb_column_family_handle_t *h;
    tier_cf_t *att;
} cfent_t;

/* The context a table's cold hooks receive. */
struct tier_cf {
    ps_tier_t *tier;
    ps_table_t *t;
    rocksdb_column_family_handle_t *h;
    uint32_t stride;
};

struct ps_tier {
    pthread_mutex_t mu; /* the column family list (attach, detach, replace, views, stats) */
    char dir[PATH_MAX];
    uint64_t min_free;
    rocksdb_t *db;
    rocksdb_options_t *opts;
    rocksdb_cache_t *cache;
    rocksdb_block_based_table_options_t *bbo;
    rocksdb_readoptions_t *ro;
    rocksdb_readoptions_t *ro_walk; /* key walks: they do not fill the block cache */
    rocksdb_writeoptions_t *wo;
    rocksdb_column_family_handle_t *def; /* "default" (unused, but opened) */
    cfent_t *cfs;
    size_t ncf, cfcap;
    _Atomic uint64_t free_bytes, free_checked_ns;
    _Atomic uint64_t written_since; /* bytes written since the last reading */
    atomic_bool writable;
    _Atomic uint64_t failed_until_ns; /* a write failed: none is tried before then */
    atomic_uint_least64_t refused, rows_read, rows_written, rows_deleted, errors;
};

/* ==== records ============================================================================== */

static inline void key_encode(uint64_t key, char out[8]) {
    for (int i = 0; i < 8; i++)
        out[i] = (char)(key >> (56 - 8 * i));
}

static inline uint64_t key_decode(const char *in) {
    uint64_t k = 0;
    for (int i = 0; i < 8; i++)
        k = (k << 8) | (uint8_t)in[i];
    return k;
}

size_t ps_tier_record_bytes(const ps_table_t *t) {
    return REC_HDR + (size_t)(ps_table_dim(t) + ps_table_state_len(t)) * sizeof(float);
}

static void rec_encode(const ps_cold_row_t *r, uint32_t stride, uint8_t *out) {
    out[0] = REC_FORMAT;
    out[1] = r->freq;
    out[2] = out[3] = 0;
    memcpy(out + 4, &r->clock, 4);
    memcpy(out + REC_HDR, r->row, (size_t)stride * sizeof(float));
}

static int rec_decode(const char *v, size_t len, uint32_t stride, float *row, ps_cold_meta_t *m) {
    if (len != REC_HDR + (size_t)stride * sizeof(float) || (uint8_t)v[0] != REC_FORMAT)
        return PC_ECORRUPT;
    m->freq = (uint8_t)v[1];
    memcpy(&m->clock, v + 4, 4);
    memcpy(row, v + REC_HDR, (size_t)stride * sizeof(float));
    m->found = 1;
    return 0;
}

/* RocksDB error string -> error code (and log it): a full disk, damaged files (RocksDB's
 * "Corruption: ..." status: a checksum, a MANIFEST that does not parse), else an I/O error. */
static int db_error(ps_tier_t *tier, const char *what, char *err) {
    int rc = strstr(err, "No space") || strstr(err, "space left") ? PC_ENOSPC
             : strstr(err, "Corruption")                          ? PC_ECORRUPT
                                                                  : PC_EIO;
    PC_ERROR("tier %s: %s: %s", tier->dir, what, err);
    rocksdb_free(err);
    atomic_fetch_add(&tier->errors, 1);
    return rc;
}

/* ==== watermark ============================================================================ */

/* Free space is read with statvfs at most every 20 ms; in between, the bytes written since are
 * subtracted from the last reading (flushes and compactions later write about as much again,
 * which the watermark's margin must cover). */
static bool free_refresh(ps_tier_t *tier, bool force) {
    const uint64_t now = pc_time_mono_ns();
    if (!force &&
        now - atomic_load_explicit(&tier->free_checked_ns, memory_order_relaxed) < FREE_CHECK_NS) {
        const uint64_t fb = atomic_load_explicit(&tier->free_bytes, memory_order_relaxed);
        const uint64_t w = atomic_load_explicit(&tier->written_since, memory_order_relaxed);
        return (fb < w ? 0 : fb - w) >= tier->min_free;
    }
    uint64_t fb = pc_fs_free_bytes(tier->dir);
    atomic_store(&tier->written_since, 0);
    const bool unknown = fb == UINT64_MAX; /* statvfs failed: a full disk cannot be ruled out */
    if (unknown)
        fb = 0;
    const bool ok = fb >= tier->min_free;
    if (!ok && atomic_load(&tier->writable) && unknown)
        PC_WARN("tier %s: its free space cannot be read: cold writes refused", tier->dir);
    else if (!ok && atomic_load(&tier->writable))
        PC_WARN("tier %s: %llu bytes free, below the %llu byte watermark: cold writes refused",
                tier->dir, (unsigned long long)fb, (unsigned long long)tier->min_free);
    atomic_store(&tier->free_bytes, fb);
    atomic_store(&tier->writable, ok);
    atomic_store_explicit(&tier->free_checked_ns, now, memory_order_relaxed);
    return ok;
}

/* Whether a write failed a moment ago (writes wait WRITE_BACKOFF_NS after one). */
static bool write_failed_lately(ps_tier_t *tier) {
    return pc_time_mono_ns() < atomic_load_explicit(&tier->failed_until_ns, memory_order_relaxed);
}

bool ps_tier_writable(ps_tier_t *tier) {
    return free_refresh(tier, false) && !write_failed_lately(tier);
}

/* ==== table hooks ========================================================================== */

static int hook_get(void *ctx, const uint64_t *keys, size_t n, float *rows, ps_cold_meta_t *meta) {
    tier_cf_t *x = ctx;
    ps_tier_t *tier = x->tier;
    const size_t bytes = n * (8 + 2 * sizeof(void *) + sizeof(size_t) + sizeof(char *));
    char *kb = pc_malloc(PC_MEM_SCRATCH, bytes);
    if (!kb)
        return PC_ENOMEM;
    const char **kl = (const char **)(kb + n * 8);
    rocksdb_pinnableslice_t **vals = (rocksdb_pinnableslice_t **)(kl + n);
    size_t *ks = (size_t *)(vals + n);
    char **errs = (char **)(ks + n);
    for (size_t i = 0; i < n; i++) {
        key_encode(keys[i], kb + 8 * i);
        kl[i] = kb + 8 * i;
        ks[i] = 8;
    }
    rocksdb_batched_multi_get_cf(tier->db, tier->ro, x->h, n, kl, ks, vals, errs, false);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        meta[i] = (ps_cold_meta_t){0, 0, 0};
        if (errs[i]) {
            int e = db_error(tier, "multiget", errs[i]);
            rc = rc ? rc : e;
        }
        if (!vals[i])
            continue;
        size_t len;
        const char *v = rocksdb_pinnableslice_value(vals[i], &len);
        if (!rc && v && rec_decode(v, len, x->stride, rows + i * x->stride, &meta[i])) {
            PC_ERROR("tier %s: key %llu: bad record (%zu bytes, format %u)", tier->dir,
                     (unsigned long long)keys[i], len, len ? (unsigned)(uint8_t)v[0] : 0u);
            rc = PC_ECORRUPT;
        }
        rocksdb_pinnableslice_destroy(vals[i]);
    }
    atomic_fetch_add_explicit(&tier->rows_read, n, memory_order_relaxed);
    pc_free(PC_MEM_SCRATCH, kb, bytes);
    return rc;
}

/* Apply a write batch unless the watermark forbids it (PC_ENOSPC) or a write failed a moment ago
 * (PC_EIO). */
static int write_batch(ps_tier_t *tier, rocksdb_writebatch_t *wb, const char *what) {
    if (!free_refresh(tier, false)) {
        atomic_fetch_add(&tier->refused, 1);
        return PC_ENOSPC;
    }
    if (write_failed_lately(tier)) {
        atomic_fetch_add(&tier->refused, 1);
        return PC_EIO;
    }
    char *err = NULL;
    size_t bytes = 0;
    (void)rocksdb_writebatch_data(wb, &bytes);
    atomic_fetch_add_explicit(&tier->written_since, bytes, memory_order_relaxed);
    rocksdb_write(tier->db, tier->wo, wb, &err);
    if (!err)
        return 0;
    const int rc = db_error(tier, what, err); /* (logged) */
    PC_WARN("tier %s: cold writes refused for %llu ms after a failed write, then tried again",
            tier->dir, WRITE_BACKOFF_NS / 1000000);
    atomic_store(&tier->failed_until_ns, pc_time_mono_ns() + WRITE_BACKOFF_NS);
    return rc;
}

static int hook_put(void *ctx, const ps_cold_row_t *rows, size_t n) {
    tier_cf_t *x = ctx;
    const size_t rb = REC_HDR + (size_t)x->stride * sizeof(float);
    uint8_t *buf = pc_malloc(PC_MEM_SCRATCH, rb);
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    if (!buf || !wb) {
        pc_free(PC_MEM_SCRATCH, buf, rb);
        if (wb)
            rocksdb_writebatch_destroy(wb);
        return PC_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) { /* the batch copies key and value */
        char k[8];
        key_encode(rows[i].key, k);
        rec_encode(&rows[i], x->stride, buf);
        rocksdb_writebatch_put_cf(wb, x->h, k, 8, (const char *)buf, rb);
    }
    int rc = write_batch(x->tier, wb, "spill");
    if (!rc)
        atomic_fetch_add_explicit(&x->tier->rows_written, n, memory_order_relaxed);
    rocksdb_writebatch_destroy(wb);
    pc_free(PC_MEM_SCRATCH, buf, rb);
    return rc;
}

static int hook_del(void *ctx, const uint64_t *keys, size_t n) {
    tier_cf_t *x = ctx;
    rocksdb_writebatch_t *wb = rocksdb_writebatch_create();
    if (!wb)
        return PC_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        char k[8];
        key_encode(keys[i], k);
        rocksdb_writebatch_delete_cf(wb, x->h, k, 8);
    }
    int rc = write_batch(x->tier, wb, "delete");
    if (!rc)
        atomic_fetch_add_explicit(&x->tier->rows_deleted, n, memory_order_relaxed);
    rocksdb_writebatch_destroy(wb);
    return rc;
}

static bool hook_writable(void *ctx) {
    return ps_tier_writable(((tier_cf_t *)ctx)->tier);
}

/* A page of keys from *start on: one iterator per page (its own implicit snapshot), which
 * does not fill the block cache (a copy's walk would push the working set out). */
static int hook_keys(void *ctx, uint64_t *start, uint64_t *keys, size_t max, size_t *n) {
    tier_cf_t *x = ctx;
    ps_tier_t *tier = x->tier;
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(tier->db, tier->ro_walk, x->h);
    char k0[8];
    key_encode(*start, k0);
    size_t got = 0;
    uint64_t next = 0; /* 0: the walk reached the end */
    for (rocksdb_iter_seek(it, k0, 8); rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl;
        const char *k = rocksdb_iter_key(it, &kl);
        if (kl != 8)
            continue; /* not a row's key (none is written) */
        const uint64_t key = key_decode(k);
        if (got == max) {
            next = key;
            break;
        }
        keys[got++] = key;
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    rocksdb_iter_destroy(it);
    if (err)
        return db_error(tier, "key walk", err);
    *n = got;
    *start = next;
    return 0;
}

static const ps_cold_ops_t k_ops = {hook_get, hook_put, hook_del, hook_writable, hook_keys};

/* ==== database ============================================================================= */

static void cfs_close(ps_tier_t *tier) {
    for (size_t i = 0; i < tier->ncf; i++)
        rocksdb_column_family_handle_destroy(tier->cfs[i].h);
    tier->ncf = 0;
    if (tier->def)
        rocksdb_column_family_handle_destroy(tier->def);
    tier->def = NULL;
}

static int cfs_add(ps_tier_t *tier, const char *name, rocksdb_column_family_handle_t *h) {
    if (tier->ncf == tier->cfcap) {
        size_t ncap = tier->cfcap ? 2 * tier->cfcap : 16;
        cfent_t *c = pc_realloc(PC_MEM_OTHER, tier->cfs, tier->cfcap * sizeof *c, ncap * sizeof *c);
        if (!c)
            return PC_ENOMEM;
        tier->cfs = c;
        tier->cfcap = ncap;
    }
    cfent_t *e = &tier->cfs[tier->ncf++];
    memset(e, 0, sizeof *e);
    snprintf(e->name, sizeof e->name, "%s", name);
    e->h = h;
    return 0;
}

/* Open the database in tier->dir with all its column families. */
static int db_open(ps_tier_t *tier) {
    char *err = NULL;
    size_t ncf = 0;
    char **names = rocksdb_list_column_families(tier->opts, tier->dir, &ncf, &err);
    if (err) { /* no database yet (the list is an empty allocation then) */
        rocksdb_free(err);
        err = NULL;
        free(names);
        names = NULL;
        ncf = 0;
    }
    const char *def_only[1] = {"default"};
    const char *const *list = ncf ? (const char *const *)names : def_only;
    const size_t nl = ncf ? ncf : 1;
    const rocksdb_options_t **co = calloc(nl, sizeof *co);
    rocksdb_column_family_handle_t **hs = calloc(nl, sizeof *hs);
    int rc = co && hs ? 0 : PC_ENOMEM;
    for (size_t i = 0; !rc && i < nl; i++)
        co[i] = tier->opts;
    if (!rc) {
        tier->db = rocksdb_open_column_families(tier->opts, tier->dir, (int)nl, list, co, hs, &err);
        if (err)
            rc = db_error(tier, "open", err);
    }
    for (size_t i = 0; !rc && i < nl; i++) {
        if (strcmp(list[i], "default") == 0)
            tier->def = hs[i];
        else if ((rc = cfs_add(tier, list[i], hs[i])))
            rocksdb_column_family_handle_destroy(hs[i]);
        hs[i] = NULL;
    }
    if (rc && tier->db) {
        for (size_t i = 0; i < nl; i++)
            if (hs[i])
                rocksdb_column_family_handle_destroy(hs[i]);
        cfs_close(tier);
        rocksdb_close(tier->db);
        tier->db = NULL;
    }
    free(co);
    free(hs);
    if (names)
        rocksdb_list_column_families_destroy(names, ncf);
    return rc;
}

static void db_close(ps_tier_t *tier) {
    if (!tier->db)
        return;
    cfs_close(tier);
    rocksdb_close(tier->db);
    tier->db = NULL;
}

/* The file that marks a directory as a tier's (its live database is removed at every start). */
#define TIER_MARKER "EMBERPS-TIER"

/* Entries of a directory that are neither the tier's nor someone else's: "." and "..", and the
 * lost+found of a freshly made ext4 volume (a Kubernetes volume mounted as the tier: neither a
 * reason to refuse it nor the tier's to remove). */
static bool neutral(const char *name) {
    return !strcmp(name, ".") || !strcmp(name, "..") || !strcmp(name, "lost+found");
}

/* Empty `dir` for a new live database (made when missing), its marker kept or written. A
 * directory that holds anything without the marker or a RocksDB database (CURRENT) is not the
 * tier's: PC_EEXIST, nothing removed (a --tier-dir given the checkpoint directory, or a parent of
 * it, wiped every checkpoint). */
static int tier_dir_reset(const char *dir) {
    DIR *d = opendir(dir);
    if (!d && errno != ENOENT) {
        PC_ERROR("tier %s: %s", dir, strerror(errno));
        return PC_EIO;
    }
    bool any = false, ours = false;
    for (struct dirent *e; d && (e = readdir(d));) {
        if (neutral(e->d_name))
            continue;
        any = true;
        ours = ours || !strcmp(e->d_name, TIER_MARKER) || !strcmp(e->d_name, "CURRENT");
    }
    if (any && !ours) {
        closedir(d);
        PC_ERROR("tier %s holds files that are not a cold tier's (no " TIER_MARKER
                 " nor a RocksDB database): not removed; give the tier a directory of its own, "
                 "apart from the checkpoint directory",
                 dir);
        return PC_EEXIST;
    }
    if (d)
        rewinddir(d);
    char path[PATH_MAX];
    for (struct dirent *e; d && (e = readdir(d));) { /* the marker last of all: kept */
        if (neutral(e->d_name) || !strcmp(e->d_name, TIER_MARKER))
            continue;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) < (int)sizeof path)
            pc_fs_rm_tree(path);
    }
    if (d)
        closedir(d);
    int rc = pc_fs_mkdirs(dir);
    snprintf(path, sizeof path, "%s/" TIER_MARKER, dir);
    static const char k_text[] = "EmberPS cold tier: working storage, emptied at every start\n";
    if (!rc)
        rc = pc_fs_write_atomic(path, k_text, sizeof k_text - 1);
    return rc;
}

int ps_tier_open(const ps_tier_opts_t *o, ps_tier_t **out) {
    if (!o || !o->dir || !out || strlen(o->dir) >= PATH_MAX - 64)
        return PC_EINVAL;
    ps_tier_t *tier = pc_calloc(PC_MEM_OTHER, 1, sizeof *tier);
    if (!tier)
        return PC_ENOMEM;
    pthread_mutex_init(&tier->mu, NULL);
    snprintf(tier->dir, sizeof tier->dir, "%s", o->dir);
    tier->min_free = o->min_free_bytes ? o->min_free_bytes : DEF_MIN_FREE;
    tier->opts = rocksdb_options_create();
    tier->bbo = rocksdb_block_based_options_create();
    tier->cache = rocksdb_cache_create_lru(o->cache_bytes ? o->cache_bytes : DEF_CACHE);
    rocksdb_block_based_options_set_block_cache(tier->bbo, tier->cache);
    rocksdb_block_based_options_set_filter_policy(tier->bbo, rocksdb_filterpolicy_create_bloom(10));
    rocksdb_block_based_options_set_block_size(tier->bbo, 16 << 10);
    rocksdb_block_based_options_set_cache_index_and_filter_blocks(tier->bbo, 1);
    rocksdb_options_set_block_based_table_factory(tier->opts, tier->bbo);
    rocksdb_options_set_create_if_missing(tier->opts, 1);
    rocksdb_options_set_create_missing_column_families(tier->opts, 1);
    rocksdb_options_set_compression(tier->opts, rocksdb_no_compression); /* floats */
    rocksdb_options_set_write_buffer_size(tier->opts,
                                          o->write_buffer_bytes ? o->write_buffer_bytes : DEF_WBUF);
    rocksdb_options_set_max_background_jobs(tier->opts, 2);
    rocksdb_options_set_paranoid_checks(tier->opts, 1);
    rocksdb_options_set_info_log_level(tier->opts, 2 /* WARN */);
    tier->ro = rocksdb_readoptions_create();
    tier->ro_walk = rocksdb_readoptions_create();
    rocksdb_readoptions_set_fill_cache(tier->ro_walk, 0);
    tier->wo = rocksdb_writeoptions_create();
    rocksdb_writeoptions_disable_WAL(tier->wo, 1);
    atomic_store(&tier->writable, true);
    /* The live database is working storage: start empty (durable state is in checkpoints). */
    int rc = tier_dir_reset(tier->dir);
    if (!rc)
        rc = db_open(tier);
    if (rc) {
        ps_tier_close(tier);
        return rc;
    }
    free_refresh(tier, true);
    *out = tier;
    return 0;
}

void ps_tier_close(ps_tier_t *tier) {
    if (!tier)
        return;
    for (size_t i = 0; i < tier->ncf; i++)
        if (tier->cfs[i].att)
            PC_ERROR("tier %s: closed with table column family %s still attached", tier->dir,
                     tier->cfs[i].name);
    db_close(tier);
    rocksdb_readoptions_destroy(tier->ro);
    rocksdb_readoptions_destroy(tier->ro_walk);
    rocksdb_writeoptions_destroy(tier->wo);
    rocksdb_options_destroy(tier->opts);
    rocksdb_block_based_options_destroy(tier->bbo);
    rocksdb_cache_destroy(tier->cache);
    pc_free(PC_MEM_OTHER, tier->cfs, tier->cfcap * sizeof *tier->cfs);
    pthread_mutex_destroy(&tier->mu);
    pc_free(PC_MEM_OTHER, tier, sizeof *tier);
}

/* ==== tables =============================================================================== */

static cfent_t *cf_find(const ps_tier_t *tier, const char *name) {
    for (size_t i = 0; i < tier->ncf; i++)
        if (strcmp(tier->cfs[i].name, name) == 0)
            return &tier->cfs[i];
    return NULL;
}

static cfent_t *cf_of_table(const ps_tier_t *tier, const ps_table_t *t) {
    for (size_t i = 0; i < tier->ncf; i++)
        if (tier->cfs[i].att && tier->cfs[i].att->t == t)
            return &tier->cfs[i];
    return NULL;
}

static void cf_remove(ps_tier_t *tier, cfent_t *e) {
    *e = tier->cfs[--tier->ncf];
}

/* Drop column family e. One whose drop failed stays listed, with its handle: it is still in the
 * database, and the next fresh attach of its name tries the drop again (forgotten, the name could
 * not be created again until a restart). */
static int cf_drop(ps_tier_t *tier, cfent_t *e) {
    char *err = NULL;
    rocksdb_drop_column_family(tier->db, e->h, &err);
    if (err)
        return db_error(tier, "drop column family", err);
    rocksdb_column_family_handle_destroy(e->h);
    cf_remove(tier, e);
    return 0;
}

bool ps_tier_attached(const ps_tier_t *tier, const ps_table_t *t) {
    ps_tier_t *m = (ps_tier_t *)tier; /* the lock only */
    pthread_mutex_lock(&m->mu);
    bool yes = cf_of_table(tier, t) != NULL;
    pthread_mutex_unlock(&m->mu);
    return yes;
}

static int attach_locked(ps_tier_t *tier, ps_table_t *t, bool fresh);

int ps_tier_attach(ps_tier_t *tier, ps_table_t *t, bool fresh) {
    pthread_mutex_lock(&tier->mu);
    int rc = attach_locked(tier, t, fresh);
    pthread_mutex_unlock(&tier->mu);
    return rc;
}

static int attach_locked(ps_tier_t *tier, ps_table_t *t, bool fresh) {
    const ps_table_config_t *cfg = ps_table_config(t);
    if (!cfg->cold)
        return PC_EINVAL;
    if (!tier->db) /* a failed replace (replace_locked) */
        return PC_EIO;
    if (cf_of_table(tier, t))
        return 0;
    char name[CF_NAME_MAX];
    snprintf(name, sizeof name, CF_PREFIX "%s", cfg->name);
    cfent_t *e = cf_find(tier, name);
    if (e && e->att) {
        PC_ERROR("tier %s: another table %s is attached", tier->dir, cfg->name);
        return PC_EEXIST;
    }
    int rc = 0;
    if (e && fresh && (rc = cf_drop(tier, e)))
        return rc;
    if (e && fresh)
        e = NULL;
    tier_cf_t *x = pc_calloc(PC_MEM_OTHER, 1, sizeof *x);
    if (!x)
        return PC_ENOMEM;
    if (!e) {
        char *err = NULL;
        rocksdb_column_family_handle_t *h =
            rocksdb_create_column_family(tier->db, tier->opts, name, &err);
        if (err) {
            pc_free(PC_MEM_OTHER, x, sizeof *x);
            return db_error(tier, "create column family", err);
        }
        if ((rc = cfs_add(tier, name, h))) {
            rocksdb_column_family_handle_destroy(h);
            pc_free(PC_MEM_OTHER, x, sizeof *x);
            return rc;
        }
        e = &tier->cfs[tier->ncf - 1];
    }
    *x = (tier_cf_t){tier, t, e->h, ps_table_dim(t) + ps_table_state_len(t)};
    e->att = x;
    ps_table_set_cold(t, &k_ops, x);
    return 0;
}

void ps_tier_detach(ps_tier_t *tier, ps_table_t *t, bool drop) {
    pthread_mutex_lock(&tier->mu);
    cfent_t *e = cf_of_table(tier, t);
    if (e) {
        pc_free(PC_MEM_OTHER, e->att, sizeof *e->att);
        e->att = NULL;
        if (drop)
            (void)cf_drop(tier, e);
    }
    pthread_mutex_unlock(&tier->mu);
}

static int hook_cat_attach(void *ctx, ps_table_t *t, bool keep) {
    return ps_table_config(t)->cold ? ps_tier_attach(ctx, t, !keep) : 0;
}

static void hook_cat_detach(void *ctx, ps_table_t *t) {
    ps_tier_detach(ctx, t, true);
}

void ps_tier_bind_catalog(ps_tier_t *tier, ps_catalog_t *cat) {
    ps_catalog_hooks_t h = {hook_cat_attach, hook_cat_detach, tier};
    ps_catalog_set_hooks(cat, &h);
}

/* ==== checkpoints ========================================================================== */

int ps_tier_checkpoint(ps_tier_t *tier, const char *dir) {
    if (!free_refresh(tier, true)) {
        atomic_fetch_add(&tier->refused, 1);
        PC_ERROR("tier %s: checkpoint refused: free space below the watermark", tier->dir);
        return PC_ENOSPC;
    }
    char *err = NULL;
    pthread_mutex_lock(&tier->mu); /* no replace meanwhile */
    if (!tier->db) {               /* a failed replace (replace_locked) */
        pthread_mutex_unlock(&tier->mu);
        return PC_EIO;
    }
    rocksdb_checkpoint_t *cp = rocksdb_checkpoint_object_create(tier->db, &err);
    if (!err) {
        rocksdb_checkpoint_create(cp, dir, 0 /* always flush memtables: no WAL */, &err);
        rocksdb_checkpoint_object_destroy(cp);
    }
    pthread_mutex_unlock(&tier->mu);
    return err ? db_error(tier, "checkpoint", err) : 0;
}

static int replace_locked(ps_tier_t *tier, const char *src);

int ps_tier_replace(ps_tier_t *tier, const char *src) {
    pthread_mutex_lock(&tier->mu);
    int rc = 0;
    for (size_t i = 0; i < tier->ncf && !rc; i++) {
        if (tier->cfs[i].att) {
            PC_ERROR("tier %s: cannot replace the database while table %s is attached", tier->dir,
                     tier->cfs[i].name);
            rc = PC_EINVAL;
        }
    }
    if (!rc)
        rc = replace_locked(tier, src);
    pthread_mutex_unlock(&tier->mu);
    return rc;
}

static int replace_locked(ps_tier_t *tier, const char *src) {
    db_close(tier);
    int rc = tier_dir_reset(tier->dir);
    if (!rc)
        rc = pc_fs_clone_dir(src, tier->dir, ".sst");
    if (!rc && (rc = db_open(tier)) == PC_EIO)
        rc = PC_ECORRUPT; /* a copy that does not open: its files are damaged. RocksDB calls some
                           * damage an I/O error (a CURRENT naming a MANIFEST that is not there:
                           * "No such file"), and the copy just read every file without one */
    if (rc) {             /* leave an empty, working database rather than none */
        int orc = tier_dir_reset(tier->dir);
        if (!orc)
            orc = db_open(tier);
        if (orc) { /* none: attach and checkpoint refuse until a replace opens */
            PC_ERROR("tier %s: no database open (an empty one failed too): %s", tier->dir,
                     pc_strerror(orc));
            return PC_EIO; /* not the copy's damage, which a restore would answer with an older */
        }
    }
    return rc;
}

/* ==== views ================================================================================ */

struct ps_tier_view {
    ps_tier_t *tier;
    tier_cf_t *x;
    const rocksdb_snapshot_t *snap;
    rocksdb_readoptions_t *ro;
};

int ps_tier_view_open(ps_tier_t *tier, const ps_table_t *t, ps_tier_view_t **out) {
    pthread_mutex_lock(&tier->mu);
    cfent_t *e = cf_of_table(tier, t);
    ps_tier_view_t *v = e ? pc_calloc(PC_MEM_OTHER, 1, sizeof *v) : NULL;
    if (!v) {
        pthread_mutex_unlock(&tier->mu);
        return e ? PC_ENOMEM : PC_ENOTFOUND;
    }
    v->tier = tier;
    v->x = e->att;
    v->snap = rocksdb_create_snapshot(tier->db);
    v->ro = rocksdb_readoptions_create();
    rocksdb_readoptions_set_snapshot(v->ro, v->snap);
    rocksdb_readoptions_set_fill_cache(v->ro, 0);
    pthread_mutex_unlock(&tier->mu);
    *out = v;
    return 0;
}

int ps_tier_view_scan(ps_tier_view_t *v, int (*fn)(void *ctx, const ps_cold_row_t *rows, size_t n),
                      void *ctx) {
    const uint32_t stride = v->x->stride;
    float *buf = pc_malloc(PC_MEM_SCRATCH, (size_t)VIEW_BATCH * stride * sizeof(float));
    if (!buf)
        return PC_ENOMEM;
    ps_cold_row_t rows[VIEW_BATCH];
    rocksdb_iterator_t *it = rocksdb_create_iterator_cf(v->tier->db, v->ro, v->x->h);
    size_t n = 0;
    int rc = 0;
    for (rocksdb_iter_seek_to_first(it); !rc && rocksdb_iter_valid(it); rocksdb_iter_next(it)) {
        size_t kl, vl;
        const char *k = rocksdb_iter_key(it, &kl);
        const char *val = rocksdb_iter_value(it, &vl);
        ps_cold_meta_t m;
        if (kl != 8 || rec_decode(val, vl, stride, buf + n * stride, &m)) {
            PC_ERROR("tier %s: bad record in a scan", v->tier->dir);
            rc = PC_ECORRUPT;
            break;
        }
        rows[n] = (ps_cold_row_t){key_decode(k), m.clock, m.freq, buf + n * stride};
        if (++n == VIEW_BATCH) {
            rc = fn(ctx, rows, n);
            n = 0;
        }
    }
    char *err = NULL;
    rocksdb_iter_get_error(it, &err);
    if (err && !rc)
        rc = db_error(v->tier, "scan", err);
    else if (err)
        rocksdb_free(err);
    if (!rc && n)
        rc = fn(ctx, rows, n);
    rocksdb_iter_destroy(it);
    pc_free(PC_MEM_SCRATCH, buf, (size_t)VIEW_BATCH * stride * sizeof(float));
    return rc;
}

void ps_tier_view_close(ps_tier_view_t *v) {
    if (!v)
        return;
    rocksdb_readoptions_destroy(v->ro);
    rocksdb_release_snapshot(v->tier->db, v->snap);
    pc_free(PC_MEM_OTHER, v, sizeof *v);
}

/* ==== stats ================================================================================ */

static uint64_t prop_u64(ps_tier_t *tier, rocksdb_column_family_handle_t *h, const char *name) {
    char *s = rocksdb_property_value_cf(tier->db, h, name);
    uint64_t v = s ? strtoull(s, NULL, 10) : 0;
    free(s);
    return v;
}

int ps_tier_stats(ps_tier_t *tier, ps_tier_stats_t *o) {
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&tier->mu);
    for (size_t i = 0; i < tier->ncf; i++) {
        o->sst_bytes += prop_u64(tier, tier->cfs[i].h, "rocksdb.total-sst-files-size");
        if (!tier->cfs[i].att)
            continue;
        o->tables++;
        o->rows_estimate += prop_u64(tier, tier->cfs[i].h, "rocksdb.estimate-num-keys");
    }
    pthread_mutex_unlock(&tier->mu);
    o->writable = ps_tier_writable(tier);
    o->free_bytes = atomic_load(&tier->free_bytes);
    o->min_free_bytes = tier->min_free;
    o->writes_refused = atomic_load(&tier->refused);
    o->rows_read = atomic_load(&tier->rows_read);
    o->rows_written = atomic_load(&tier->rows_written);
    o->rows_deleted = atomic_load(&tier->rows_deleted);
    o->errors = atomic_load(&tier->errors);
    return 0;
}
