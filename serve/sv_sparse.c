/* sv_sparse.c: a serving replica's embedding rows, one catalog per training server (sv_sparse.h).
 *
 * Keeping the training cluster's layout (a catalog per server, keys routed by slot) rather than
 * one merged table lets the follower replace one server's rows at a time (a rescan after that
 * server restarted swaps in a table of that server's rows only) and makes "server i's applied
 * position" mean exactly the rows of catalog i.
 *
 * DESIGN
 * - `map` and `cat` are fixed at creation. `mu` guards the list of table configs (the replica
 *   form of each followed table), which only grows.
 * - A lookup groups its keys by owning server (a counting sort over the owner of each key),
 *   looks each group up in that server's table (acquired and released around the call, so a
 *   swap meanwhile is safe) and scatters rows and flags back into the caller's order. With one
 *   server (or every key on one) the caller's buffers are used directly.
 * - The checksum adds up a hash per row, so the order rows are visited in (shards, servers)
 *   does not matter and a scan of the servers computes the same figure.
 */
#include "sv_sparse.h"

#include "pc_error.h"
#include "pc_hash.h"
#include "pc_log.h"
#include "pc_time.h"
#include "ps_ckpt.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SV_ROW_HASH_SEED UINT64_C(0x73765f726f776873) /* "sv_rowhs" */

struct sv_sparse {
    pc_cluster_map_t *map;
    size_t nsrv;
    ps_catalog_t **cat; /* nsrv */
    pthread_mutex_t mu; /* guards cfg, ncfg, cfgcap */
    ps_table_config_t *cfg;
    size_t ncfg, cfgcap;
};

/* ==== lifecycle ============================================================================= */

int sv_sparse_create(const char *map_text, sv_sparse_t **out, char *err, size_t errlen) {
    char msg[256] = "";
    if (!map_text || !out)
        return PC_EINVAL;
    sv_sparse_t *s = calloc(1, sizeof *s);
    if (!s)
        return PC_ENOMEM;
    pthread_mutex_init(&s->mu, NULL);
    int rc = pc_cmap_parse(map_text, &s->map, msg, sizeof msg);
    if (rc) {
        if (err && errlen)
            snprintf(err, errlen, "cluster map: %s", msg);
        sv_sparse_destroy(s);
        return rc;
    }
    s->nsrv = pc_cmap_nservers(s->map);
    s->cat = calloc(s->nsrv, sizeof *s->cat);
    rc = s->cat ? 0 : PC_ENOMEM;
    for (size_t i = 0; !rc && i < s->nsrv; i++)
        rc = ps_catalog_create(&s->cat[i]);
    if (rc) {
        sv_sparse_destroy(s);
        return rc;
    }
    *out = s;
    return 0;
}

void sv_sparse_destroy(sv_sparse_t *s) {
    if (!s)
        return;
    for (size_t i = 0; s->cat && i < s->nsrv; i++)
        ps_catalog_destroy(s->cat[i]);
    free(s->cat);
    free(s->cfg);
    pc_cmap_destroy(s->map);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

/* ==== tables ================================================================================ */

int sv_sparse_replica_config(const ps_table_config_t *in, ps_table_config_t *out, char *err,
                             size_t errlen) {
    char msg[256];
    if (!in || !out)
        return PC_EINVAL;
    if (in->cold) {
        if (err && errlen)
            snprintf(err, errlen,
                     "table %s is cold (cold=true): its rows live in the training servers' "
                     "RocksDB tier and are not streamed; a replica cannot hold it",
                     in->name);
        return PC_EUNSUPPORTED;
    }
    ps_table_config_t c = *in;
    c.capacity_rows = 0; /* the servers' evictions arrive as erasures */
    c.ttl_ticks = 0;
    c.admit_threshold = 0; /* rows arrive only through the stream, already admitted */
    c.admit_decay_ticks = 0;
    if (ps_table_config_check(&c, msg, sizeof msg)) {
        if (err && errlen)
            snprintf(err, errlen, "table %s: %s", in->name, msg);
        return PC_EINVAL;
    }
    *out = c;
    return 0;
}

/* Index of table `name` in s->cfg, or -1. Caller holds s->mu. */
static long find_cfg(const sv_sparse_t *s, const char *name) {
    for (size_t i = 0; i < s->ncfg; i++)
        if (strcmp(s->cfg[i].name, name) == 0)
            return (long)i;
    return -1;
}

int sv_sparse_add_table(sv_sparse_t *s, const ps_table_config_t *cfg, char *err, size_t errlen) {
    if (!s || !cfg)
        return PC_EINVAL;
    ps_table_config_t c;
    int rc = sv_sparse_replica_config(cfg, &c, err, errlen);
    if (rc)
        return rc;
    pthread_mutex_lock(&s->mu);
    if (find_cfg(s, c.name) >= 0) {
        rc = PC_EEXIST;
    } else if (s->ncfg == s->cfgcap) {
        size_t ncap = s->cfgcap ? 2 * s->cfgcap : 4;
        ps_table_config_t *p = realloc(s->cfg, ncap * sizeof *p);
        if (!p) {
            rc = PC_ENOMEM;
        } else {
            s->cfg = p;
            s->cfgcap = ncap;
        }
    }
    size_t added = 0;
    for (; !rc && added < s->nsrv; added++)
        if ((rc = ps_catalog_add(s->cat[added], &c)))
            break;
    if (rc) {
        for (size_t i = 0; i < added; i++)
            ps_catalog_drop(s->cat[i], c.name);
    } else {
        s->cfg[s->ncfg++] = c;
    }
    pthread_mutex_unlock(&s->mu);
    if (rc && err && errlen)
        snprintf(err, errlen, "table %s: %s", c.name,
                 rc == PC_EEXIST ? "the replica holds it already" : pc_strerror(rc));
    return rc;
}

/* Whether `name` is in the comma-separated list (NULL or "": every name is). */
static bool named(const char *names, const char *name) {
    if (!names || !names[0])
        return true;
    const size_t len = strlen(name);
    for (const char *p = names; *p;) {
        const char *e = strchr(p, ',');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n == len && strncmp(p, name, n) == 0)
            return true;
        p += n + (e ? 1 : 0);
    }
    return false;
}

int sv_sparse_specs_each(const char *settings, int (*fn)(void *ctx, const ps_table_config_t *cfg),
                         void *ctx, char *err, size_t errlen) {
    char line[4096];
    for (const char *p = settings; p && *p;) {
        const char *e = strchr(p, '\n');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n >= sizeof line) {
            if (err && errlen)
                snprintf(err, errlen, "a table's settings are longer than %zu bytes", sizeof line);
            return PC_EINVAL;
        }
        memcpy(line, p, n);
        line[n] = '\0';
        p += n + (e ? 1 : 0);
        if (!n)
            continue;
        ps_table_config_t cfg;
        int rc = ps_catalog_spec_parse(line, &cfg, err, errlen);
        if (!rc)
            rc = fn(ctx, &cfg);
        if (rc)
            return rc;
    }
    return 0;
}

typedef struct add_ctx {
    sv_sparse_t *s;
    const char *names;
    size_t found;
    char *err;
    size_t errlen;
} add_ctx_t;

int sv_sparse_add_unless_cold(sv_sparse_t *s, const ps_table_config_t *cfg, char *err,
                              size_t errlen) {
    if (cfg && cfg->cold) { /* one cold table among the servers' stops no replica */
        PC_WARN("serve: table %s is cold (cold=true): not replicated, its lookups answer not "
                "found",
                cfg->name);
        return 0;
    }
    return sv_sparse_add_table(s, cfg, err, errlen);
}

static int add_named(void *ctx, const ps_table_config_t *cfg) {
    add_ctx_t *a = ctx;
    if (!named(a->names, cfg->name))
        return 0;
    a->found++;
    return a->names && a->names[0] ? sv_sparse_add_table(a->s, cfg, a->err, a->errlen)
                                   : sv_sparse_add_unless_cold(a->s, cfg, a->err, a->errlen);
}

int sv_sparse_add_tables(sv_sparse_t *s, const char *settings, const char *names, char *err,
                         size_t errlen) {
    if (!s || !settings)
        return PC_EINVAL;
    size_t wanted = 0;
    for (const char *p = names && names[0] ? names : NULL; p; p = strchr(p, ','), p = p ? p + 1 : p)
        wanted++;
    add_ctx_t a = {.s = s, .names = names, .err = err, .errlen = errlen};
    int rc = sv_sparse_specs_each(settings, add_named, &a, err, errlen);
    if (rc)
        return rc;
    const size_t found = a.found;
    if (wanted && found < wanted) {
        if (err && errlen)
            snprintf(err, errlen, "tables '%s': %zu of %zu are on the training servers", names,
                     found, wanted);
        return PC_ENOTFOUND;
    }
    return 0;
}

size_t sv_sparse_servers(const sv_sparse_t *s) {
    return s ? s->nsrv : 0;
}

size_t sv_sparse_map_text(const sv_sparse_t *s, char *buf, size_t cap) {
    return pc_cmap_format(s->map, buf, cap);
}

const pc_cluster_map_t *sv_sparse_map(const sv_sparse_t *s) {
    return s->map;
}

const char *sv_sparse_server_addr(const sv_sparse_t *s, uint32_t server) {
    return s && server < s->nsrv ? pc_cmap_addr(s->map, server) : NULL;
}

ps_catalog_t *sv_sparse_catalog(sv_sparse_t *s, uint32_t server) {
    return s && server < s->nsrv ? s->cat[server] : NULL;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(a, b);
}

size_t sv_sparse_tables(sv_sparse_t *s, char (*names)[PS_TABLE_NAME_MAX], size_t cap) {
    pthread_mutex_lock(&s->mu);
    const size_t n = s->ncfg;
    for (size_t i = 0; i < n && i < cap; i++)
        memcpy(names[i], s->cfg[i].name, PS_TABLE_NAME_MAX);
    pthread_mutex_unlock(&s->mu);
    if (cap)
        qsort(names, n < cap ? n : cap, PS_TABLE_NAME_MAX, cmp_name);
    return n;
}

int sv_sparse_table_config(sv_sparse_t *s, const char *name, ps_table_config_t *cfg) {
    if (!s || !name || !cfg)
        return PC_EINVAL;
    pthread_mutex_lock(&s->mu);
    const long i = find_cfg(s, name);
    if (i >= 0)
        *cfg = s->cfg[i];
    pthread_mutex_unlock(&s->mu);
    return i >= 0 ? 0 : PC_ENOTFOUND;
}

int sv_sparse_staging_create(sv_sparse_t *s, const char *name, ps_table_t **out) {
    ps_table_config_t cfg;
    int rc = sv_sparse_table_config(s, name, &cfg);
    return rc ? rc : ps_table_create(&cfg, out);
}

int sv_sparse_swap_in(sv_sparse_t *s, uint32_t server, ps_table_t *t) {
    if (!s || server >= s->nsrv) {
        ps_table_destroy(t);
        return PC_EINVAL;
    }
    return ps_catalog_replace(s->cat[server], t);
}

/* ==== lookups =============================================================================== */

/* Dim of table `name`, or 0 when there is none. */
static uint32_t table_dim(sv_sparse_t *s, const char *name) {
    pthread_mutex_lock(&s->mu);
    const long i = find_cfg(s, name);
    const uint32_t dim = i >= 0 ? (uint32_t)s->cfg[i].dim : 0;
    pthread_mutex_unlock(&s->mu);
    return dim;
}

/* Look keys up in server `srv`'s table. */
static int lookup_one(sv_sparse_t *s, uint32_t srv, const char *table, const uint64_t *keys,
                      size_t n, float *rows, size_t rows_len, uint8_t *found) {
    ps_table_t *t;
    int rc = ps_catalog_acquire(s->cat[srv], table, &t);
    if (rc)
        return rc;
    rc = ps_table_lookup(t, keys, n, rows, rows_len, found);
    ps_catalog_release(s->cat[srv], t);
    return rc;
}

int sv_sparse_lookup(sv_sparse_t *s, const char *table, const uint64_t *keys, size_t n, float *rows,
                     size_t rows_len, uint8_t *found) {
    if (!s || !table || (n && (!keys || !rows)))
        return PC_EINVAL;
    const uint32_t dim = table_dim(s, table);
    if (!dim)
        return PC_ENOTFOUND;
    if (rows_len != n * dim)
        return PC_EDIM;
    if (!n)
        return 0;
    if (s->nsrv == 1)
        return lookup_one(s, 0, table, keys, n, rows, rows_len, found);
    /* One allocation for the call's scratch: the rows first (float alignment), then per key
     * its position in the caller's order, key, owner and flag, then per server a count. */
    const size_t ns = s->nsrv;
    char *mem = malloc(n * dim * sizeof(float) + n * (sizeof(size_t) + 8 + 4 + 1) +
                       2 * (ns + 1) * sizeof(size_t) + 8);
    if (!mem)
        return PC_ENOMEM;
    float *grows = (float *)(void *)mem;
    size_t *pos = (size_t *)(void *)(mem + ((n * dim * sizeof(float) + 7) & ~(size_t)7));
    uint64_t *gkeys = (uint64_t *)(void *)(pos + n);
    size_t *start = (size_t *)(void *)(gkeys + n), *next = start + ns + 1;
    uint32_t *own = (uint32_t *)(void *)(next + ns + 1);
    uint8_t *gfound = (uint8_t *)(own + n);
    /* owner of each key; all on one server: no copies */
    bool one = true;
    for (size_t i = 0; i < n; i++) {
        own[i] = pc_cmap_key_owner(s->map, keys[i]);
        one = one && own[i] == own[0];
    }
    int rc = 0;
    if (one) {
        rc = lookup_one(s, own[0], table, keys, n, rows, rows_len, found);
        free(mem);
        return rc;
    }
    /* counting sort by owner: server srv's keys at start[srv] .. start[srv + 1] */
    memset(start, 0, 2 * (ns + 1) * sizeof *start);
    for (size_t i = 0; i < n; i++)
        start[own[i] + 1]++;
    for (size_t j = 0; j < ns; j++)
        start[j + 1] += start[j];
    for (size_t i = 0; i < n; i++) {
        const size_t at = start[own[i]] + next[own[i]]++;
        pos[at] = i;
        gkeys[at] = keys[i];
    }
    for (uint32_t srv = 0; !rc && srv < ns; srv++) {
        const size_t a = start[srv], m = start[srv + 1] - a;
        if (m)
            rc = lookup_one(s, srv, table, gkeys + a, m, grows + a * dim, m * dim, gfound + a);
    }
    if (!rc) {
        for (size_t j = 0; j < n; j++) {
            memcpy(rows + pos[j] * dim, grows + j * dim, dim * sizeof *rows);
            if (found)
                found[pos[j]] = gfound[j];
        }
    }
    free(mem);
    return rc;
}

uint64_t sv_sparse_rows(sv_sparse_t *s) {
    char(*names)[PS_TABLE_NAME_MAX] = NULL;
    size_t n = sv_sparse_tables(s, NULL, 0);
    if (n && !(names = malloc(n * sizeof *names)))
        return 0;
    const size_t got = sv_sparse_tables(s, names, n); /* (the count now: one added since?) */
    n = got < n ? got : n;
    uint64_t rows = 0;
    for (size_t srv = 0; srv < s->nsrv; srv++) {
        for (size_t i = 0; i < n; i++) {
            ps_table_t *t;
            if (ps_catalog_acquire(s->cat[srv], names[i], &t))
                continue;
            rows += ps_table_count(t);
            ps_catalog_release(s->cat[srv], t);
        }
    }
    free(names);
    return rows;
}

/* ==== checksums ============================================================================= */

uint64_t sv_sparse_row_hash(uint64_t key, const float *row, uint32_t dim) {
    return pc_hash64(row, (size_t)dim * sizeof *row, pc_hash_u64(key, SV_ROW_HASH_SEED));
}

typedef struct sum_ctx {
    uint32_t dim;
    uint64_t sum, rows;
} sum_ctx_t;

static int sum_rows(void *ctx, const ps_row_view_t *rows, size_t n) {
    sum_ctx_t *x = ctx;
    for (size_t i = 0; i < n; i++)
        x->sum += sv_sparse_row_hash(rows[i].key, rows[i].weights, x->dim);
    x->rows += n;
    return 0;
}

int sv_sparse_checksum(sv_sparse_t *s, const char *table, uint64_t *sum, uint64_t *rows) {
    if (!s || !table || !sum || !rows)
        return PC_EINVAL;
    const uint32_t dim = table_dim(s, table);
    if (!dim)
        return PC_ENOTFOUND;
    sum_ctx_t x = {.dim = dim};
    for (size_t srv = 0; srv < s->nsrv; srv++) {
        ps_table_t *t;
        int rc = ps_catalog_acquire(s->cat[srv], table, &t);
        if (rc)
            return rc;
        rc = ps_table_scan(t, PS_SCAN_ALL, sum_rows, &x);
        ps_catalog_release(s->cat[srv], t);
        if (rc)
            return rc;
    }
    *sum = x.sum;
    *rows = x.rows;
    return 0;
}

/* ==== checkpoints =========================================================================== */

typedef struct copy_ctx {
    ps_table_t *dst;
    uint32_t dim;
    const pc_cluster_map_t *map; /* non-NULL: only the rows of slots `server` is primary of */
    uint32_t server;
    uint64_t keys[256];
    float *w; /* 256 x dim */
    int rc;
} copy_ctx_t;

/* Load a scanned batch's weights into the staging table (fresh optimizer state). */
static int copy_rows(void *ctx, const ps_row_view_t *rows, size_t n) {
    copy_ctx_t *x = ctx;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (x->map && pc_cmap_key_owner(x->map, rows[i].key) != x->server)
            continue;
        x->keys[m] = rows[i].key;
        memcpy(x->w + m * x->dim, rows[i].weights, x->dim * sizeof(float));
        m++;
    }
    x->rc = m ? ps_table_load(x->dst, m, x->keys, x->w, NULL, NULL, NULL) : 0;
    return x->rc;
}

int sv_sparse_copy_server(sv_sparse_t *dst, sv_sparse_t *src, uint32_t server, const char *table,
                          uint64_t *rows) {
    if (!dst || !src || !table || server >= dst->nsrv || server >= src->nsrv)
        return PC_EINVAL;
    ps_table_t *from, *to;
    int rc = ps_catalog_acquire(src->cat[server], table, &from);
    if (rc)
        return rc;
    if ((rc = ps_catalog_acquire(dst->cat[server], table, &to))) {
        ps_catalog_release(src->cat[server], from);
        return rc;
    }
    copy_ctx_t x = {.dst = to, .dim = ps_table_dim(to)};
    if (ps_table_dim(from) != x.dim)
        rc = PC_EDIM;
    else if (!(x.w = malloc(256 * (size_t)x.dim * sizeof *x.w)))
        rc = PC_ENOMEM;
    else if ((rc = ps_table_scan(from, PS_SCAN_ALL, copy_rows, &x)) && x.rc)
        rc = x.rc;
    if (rows)
        *rows = rc ? 0 : ps_table_count(to);
    free(x.w);
    ps_catalog_release(dst->cat[server], to);
    ps_catalog_release(src->cat[server], from);
    return rc;
}

int sv_sparse_carry_table(sv_sparse_t *dst, sv_sparse_t *src, const char *table, uint64_t *rows) {
    if (!dst || !src || !table)
        return PC_EINVAL;
    const uint32_t dim = table_dim(dst, table);
    if (!dim || !table_dim(src, table))
        return PC_ENOTFOUND;
    if (table_dim(src, table) != dim)
        return PC_EDIM;
    ps_table_t **st = calloc(dst->nsrv, sizeof *st);
    copy_ctx_t x = {.dim = dim, .map = dst->map};
    int rc = st && (x.w = malloc(256 * (size_t)dim * sizeof *x.w)) ? 0 : PC_ENOMEM;
    uint64_t n = 0;
    /* each destination server's rows: a scan of every source catalog keeping that server's
     * slots (servers x servers scans of a server's share each: a rare event's cost) */
    for (uint32_t d = 0; !rc && d < dst->nsrv; d++) {
        if ((rc = sv_sparse_staging_create(dst, table, &st[d])))
            break;
        x.dst = st[d];
        x.server = d;
        for (size_t i = 0; !rc && i < src->nsrv; i++) {
            ps_table_t *from;
            if ((rc = ps_catalog_acquire(src->cat[i], table, &from)))
                break;
            if ((rc = ps_table_scan(from, PS_SCAN_ALL, copy_rows, &x)) && x.rc)
                rc = x.rc;
            ps_catalog_release(src->cat[i], from);
        }
        n += rc ? 0 : ps_table_count(st[d]);
    }
    for (uint32_t d = 0; st && d < dst->nsrv; d++) {
        if (rc)
            ps_table_destroy(st[d]);
        else
            rc = sv_sparse_swap_in(dst, d, st[d]); /* both exist: cannot fail */
    }
    if (rows)
        *rows = rc ? 0 : n;
    free(x.w);
    free(st);
    return rc;
}

/* Restore server i's checkpoint aside and copy each of the replica's tables into staged[t]
 * (replica config); starts for them in st[t]. */
static int load_one(sv_sparse_t *s, uint32_t i, const char *dir, uint64_t id, uint64_t *restored,
                    char (*names)[PS_TABLE_NAME_MAX], size_t nt, ps_table_t **staged,
                    sv_sparse_start_t *st, char *err, size_t errlen) {
    ps_catalog_t *tmp = NULL;
    ps_ckpt_t *ck = NULL;
    ps_ckpt_table_info_t *info = NULL;
    size_t ninfo = 0;
    int rc = ps_catalog_create(&tmp);
    const ps_ckpt_opts_t o = {.dir = dir, .keep = 1, .full_every = 1, .read_only = true};
    if (!rc)
        rc = ps_ckpt_create(tmp, &o, &ck);
    if (!rc && (rc = ps_ckpt_restore(ck, id, restored))) {
        if (id)
            snprintf(err, errlen, "%s: checkpoint %" PRIu64 " of server %u does not restore: %s",
                     dir, id, i, pc_strerror(rc));
        else
            snprintf(err, errlen, "%s: no checkpoint of server %u restores: %s", dir, i,
                     pc_strerror(rc));
    }
    if (!rc && !(rc = ps_ckpt_tables(dir, *restored, NULL, 0, &ninfo))) {
        info = calloc(ninfo ? ninfo : 1, sizeof *info);
        rc = info ? ps_ckpt_tables(dir, *restored, info, ninfo, &ninfo) : PC_ENOMEM;
        if (rc)
            snprintf(err, errlen, "%s: checkpoint %" PRIu64 ": its tables: %s", dir, *restored,
                     pc_strerror(rc));
    }
    for (size_t t = 0; !rc && t < nt; t++) {
        ps_table_t *src;
        if ((rc = ps_catalog_acquire(tmp, names[t], &src))) {
            snprintf(err, errlen, "%s: checkpoint %" PRIu64 " has no table %s", dir, *restored,
                     names[t]);
            break;
        }
        ps_table_config_t cfg;
        sv_sparse_table_config(s, names[t], &cfg);
        /* a replicated server's checkpoint also holds its backup slots' rows: its stream
         * never carries their changes or erasures, and lookups route them elsewhere */
        copy_ctx_t x = {.dim = (uint32_t)cfg.dim, .map = s->map, .server = i};
        if (ps_table_dim(src) != x.dim) {
            rc = PC_EDIM;
            snprintf(err, errlen,
                     "%s: checkpoint %" PRIu64 ": table %s has dim %u, the servers' %u", dir,
                     *restored, names[t], ps_table_dim(src), x.dim);
        }
        if (!rc && !(x.w = malloc(256 * (size_t)x.dim * sizeof *x.w)))
            rc = PC_ENOMEM;
        if (!rc && !(rc = ps_table_create(&cfg, &staged[t]))) {
            x.dst = staged[t];
            rc = ps_table_scan(src, PS_SCAN_ALL, copy_rows, &x);
            if (rc)
                snprintf(err, errlen, "%s: table %s: loading its rows: %s", dir, names[t],
                         pc_strerror(rc));
        }
        free(x.w);
        ps_catalog_release(tmp, src);
        st[t] = (sv_sparse_start_t){.server = i, .uid = 0, .position = UINT64_MAX};
        memcpy(st[t].table, names[t], PS_TABLE_NAME_MAX);
        for (size_t k = 0; k < ninfo; k++) {
            if (strcmp(info[k].name, names[t]) == 0) {
                st[t].uid = info[k].uid;
                st[t].position = info[k].log_position;
            }
        }
    }
    free(info);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(tmp);
    return rc;
}

int sv_sparse_load_checkpoints(sv_sparse_t *s, const char *const *dirs, const uint64_t *ids,
                               size_t n, uint64_t *restored, sv_sparse_start_t **starts,
                               size_t *nstarts, char *err, size_t errlen) {
    char msg[512] = "";
    if (!s || !dirs || n != s->nsrv || (starts && !nstarts)) {
        snprintf(msg, sizeof msg, "checkpoints: one directory per server (%zu) is needed",
                 s ? s->nsrv : 0);
        if (err && errlen)
            snprintf(err, errlen, "%s", msg);
        return PC_EINVAL;
    }
    const size_t nt = sv_sparse_tables(s, NULL, 0);
    char(*names)[PS_TABLE_NAME_MAX] = calloc(nt ? nt : 1, sizeof *names);
    ps_table_t **staged = calloc(n * (nt ? nt : 1), sizeof *staged);
    sv_sparse_start_t *st = calloc(n * (nt ? nt : 1), sizeof *st);
    int rc = names && staged && st ? 0 : PC_ENOMEM;
    if (!rc)
        sv_sparse_tables(s, names, nt);
    const uint64_t t0 = pc_time_mono_ns();
    for (size_t i = 0; !rc && i < n; i++) {
        uint64_t got = 0;
        if (!dirs[i] || !dirs[i][0]) {
            rc = PC_EINVAL;
            snprintf(msg, sizeof msg, "checkpoints: no directory for server %zu", i);
            break;
        }
        rc = load_one(s, (uint32_t)i, dirs[i], ids ? ids[i] : 0, &got, names, nt, staged + i * nt,
                      st + i * nt, msg, sizeof msg);
        if (restored)
            restored[i] = got;
    }
    uint64_t rows = 0;
    for (size_t i = 0; i < n && staged; i++) {
        for (size_t t = 0; t < nt; t++) {
            ps_table_t *x = staged[i * nt + t];
            if (rc) {
                ps_table_destroy(x);
                continue;
            }
            rows += ps_table_count(x);
            const int src = sv_sparse_swap_in(s, (uint32_t)i, x); /* both exist: cannot fail */
            if (src && !rc)
                rc = src;
        }
    }
    if (!rc) {
        if (starts) {
            *starts = st;
            *nstarts = n * nt;
            st = NULL;
        }
        PC_INFO("serve: loaded %" PRIu64 " rows of %zu tables from %zu servers' checkpoints "
                "in %.3f s",
                rows, nt, n, pc_time_sec_since(t0));
    } else if (err && errlen) {
        snprintf(err, errlen, "%s", msg[0] ? msg : pc_strerror(rc));
    }
    free(names);
    free(staged);
    free(st);
    return rc;
}
