/* ps_ckpt.c: checkpoint directories, manifests, chains, retention, restore, export/import.
 *
 * DESIGN
 * Publishing: ckpt-<id>.tmp/ receives every row file (fsynced by the writer), then
 * MANIFEST.json (written to a temporary name, fsynced, renamed, directory fsynced), then the
 * directory is renamed to ckpt-<id> and DIR fsynced. Only names without ".tmp" (or ".abandoned":
 * ps_ckpt_rollback) whose manifest parses are checkpoints; restore additionally verifies every
 * file's size and XXH3 before it replaces a table, and falls back to older checkpoints when asked
 * for the newest.
 *
 * Chains: the checkpointer remembers the last checkpoint it wrote or restored, with each table's
 * uid and cut clock. The next checkpoint is incremental when that parent is still published and
 * the chain is shorter than full_every; per table it is incremental only when the table is the
 * same one (uid) that was cut in the parent, otherwise that table is written in full. A process
 * that has neither written nor restored starts with a full checkpoint.
 *
 * Stream positions: each table entry records the table's uid and its change log's head read
 * just before its cut (`log_position`, absent when the table kept no log), so a follower (a
 * serving replica) that restores the checkpoint continues the delta stream from there while
 * the uid still names the live table: every change after the cut is logged at or after that
 * head (appends follow their change; a change that preceded the cut may come twice, harmless).
 * Older manifests lack both: uid 0, log_position UINT64_MAX.
 *
 * Read-only checkpointers (a serving replica restoring a training server's directory) create,
 * remove and write nothing in the directory.
 *
 * Manifest numbers that may exceed 2^53 (ids, versions, sizes, checksums) are decimal strings.
 */
#include "ps_ckpt.h"
#include "ps_rowfile.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_hash.h"
#include "pc_log.h"
#include "pc_time.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MANIFEST       "MANIFEST.json"
#define COLD_DIR       "cold" /* the tier's RocksDB checkpoint inside a checkpoint */
#define MAX_COLD_FILES 65536
/* 2: sealed (pc_fs_seal: a flipped byte, a parent id, a size, a row file's checksum, is refused,
 * not followed); 1 (older, unsealed) still read */
#define MANIFEST_FORMAT 2
#define MAX_TABLES      1024
#define MAX_CHAIN       256 /* full_every is at most this: chains restore in bounded steps */
#define PBUF            (2 * PATH_MAX) /* derived paths: the directory is < PATH_MAX / 2 */
/* Every allocation through pc_alloc (counted, and failure injection reaches it in tests). */
#define CK_ALLOC(bytes)   pc_calloc(PC_MEM_SCRATCH, 1, (bytes))
#define CK_FREE(p, bytes) pc_free(PC_MEM_SCRATCH, (p), (bytes))

typedef struct tstate {
    char name[PS_TABLE_NAME_MAX];
    uint64_t uid;
    uint32_t cut;
} tstate_t;

struct ps_ckpt {
    ps_catalog_t *cat;
    char dir[PATH_MAX / 2];
    uint32_t keep, full_every;
    uint64_t last_id;    /* parent of the next incremental; 0: none */
    uint32_t since_full; /* incrementals after the last full checkpoint of that chain */
    tstate_t *ts;
    size_t nts, ts_cap;
    ps_tier_t *tier; /* borrowed, may be NULL */
    bool read_only;  /* restores only: nothing in dir is created, removed or written */
};

/* One table's entry of a manifest. */
typedef struct mtable {
    char name[PS_TABLE_NAME_MAX];
    char config[2048];
    char owner[PS_OWNER_MAX]; /* the job that trained it ("" none; absent in older manifests) */
    uint32_t fence;           /* the owner's generation fence (ps_table_fence; 0: none, older) */
    bool full;
    uint32_t cut;
    uint64_t version, rows, tombs, bytes, xxh3;
    uint64_t uid;          /* the table's ps_table_uid (0: an older manifest) */
    uint64_t log_position; /* its change-log head before the cut; UINT64_MAX: no log */
} mtable_t;

/* A file of the cold tier's RocksDB checkpoint (RocksDB checksums its own blocks; the
 * manifest pins names and sizes so a damaged or incomplete copy is refused before use). */
typedef struct cfile {
    char name[64];
    uint64_t bytes;
} cfile_t;

typedef struct manifest {
    uint64_t id, parent, created;
    uint32_t since_full;
    bool incremental;
    size_t ntables;
    mtable_t *tables;
    size_t ncold; /* files of COLD_DIR; has_cold says whether the checkpoint has one */
    bool has_cold;
    cfile_t *cold;
} manifest_t;

/* ==== paths and files ====================================================================== */

/* The names of a checkpoint's directory: published, being written (or left by a crash), or
 * abandoned by a rollback (ps_ckpt_rollback). */
typedef enum { NAME_PUBLISHED = 1, NAME_TMP, NAME_ABANDONED } name_kind_t;

static void ckpt_path(const ps_ckpt_t *c, uint64_t id, name_kind_t kind, char *buf, size_t cap) {
    static const char *const suffix[] = {"", "", ".tmp", ".abandoned"};
    snprintf(buf, cap, "%s/ckpt-%020" PRIu64 "%s", c->dir, id, suffix[kind]);
}

/* Parse "ckpt-<digits>[.tmp|.abandoned]". Returns its name_kind_t, or 0 for another name. */
static int parse_name(const char *name, uint64_t *id) {
    if (strncmp(name, "ckpt-", 5) != 0)
        return 0;
    for (int i = 5; i < 25; i++)
        if (name[i] < '0' || name[i] > '9')
            return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(name + 5, &end, 10);
    if (errno || end != name + 25 || v == 0 || v > UINT64_MAX / 2)
        return 0;
    *id = v;
    if (*end == '\0')
        return NAME_PUBLISHED;
    if (strcmp(end, ".tmp") == 0)
        return NAME_TMP;
    return strcmp(end, ".abandoned") == 0 ? NAME_ABANDONED : 0;
}

/* Ids in `dir`: published ones into ids (sorted ascending, up to cap; *n = count), the largest
 * id of any kind into *max_any (abandoned ones included: an id is never given twice). Directories
 * of kind `remove` (a name_kind_t, 0: none) are deleted: NAME_TMP, a crashed writer's; or
 * NAME_ABANDONED, once a newer checkpoint is published. */
static int scan_dir(const char *dir, uint64_t *ids, size_t cap, size_t *n, uint64_t *max_any,
                    int remove) {
    DIR *d = opendir(dir);
    if (!d)
        return errno == ENOENT ? PC_ENOTFOUND : PC_EIO;
    size_t cnt = 0;
    uint64_t mx = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t id;
        int kind = parse_name(e->d_name, &id);
        if (!kind)
            continue;
        if (id > mx)
            mx = id;
        if (kind == remove) {
            char p[PBUF];
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            PC_INFO("removing %s checkpoint %s", kind == NAME_TMP ? "unpublished" : "abandoned", p);
            pc_fs_rm_tree(p);
        } else if (kind == NAME_PUBLISHED) {
            if (cnt < cap) {
                ids[cnt] = id;
            } else if (cap) { /* full: the cap newest are kept (readdir's order is none) */
                size_t lo = 0;
                for (size_t i = 1; i < cap; i++)
                    lo = ids[i] < ids[lo] ? i : lo;
                if (id > ids[lo])
                    ids[lo] = id;
            }
            cnt++;
        }
    }
    closedir(d);
    size_t m = cnt < cap ? cnt : cap;
    for (size_t i = 1; i < m; i++) /* insertion sort: directories hold few checkpoints */
        for (size_t j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
            uint64_t x = ids[j];
            ids[j] = ids[j - 1];
            ids[j - 1] = x;
        }
    if (n)
        *n = cnt;
    if (max_any)
        *max_any = mx;
    return 0;
}

/* ==== manifests ============================================================================ */

/* Add v as a decimal string (JSON numbers are doubles); false when it could not be added. */
static bool json_u64(cJSON *o, const char *k, uint64_t v) {
    char b[24];
    snprintf(b, sizeof b, "%" PRIu64, v);
    return cJSON_AddStringToObject(o, k, b) != NULL;
}

static int json_get_u64(const cJSON *o, const char *k, uint64_t *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsString(x) || x->valuestring[0] < '0' || x->valuestring[0] > '9')
        return PC_ECORRUPT;
    char *end;
    errno = 0;
    unsigned long long r = strtoull(x->valuestring, &end, 10);
    if (errno || *end || end == x->valuestring)
        return PC_ECORRUPT;
    *v = r;
    return 0;
}

static int json_get_str(const cJSON *o, const char *k, char *buf, size_t cap) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsString(x) || strlen(x->valuestring) >= cap)
        return PC_ECORRUPT;
    memcpy(buf, x->valuestring, strlen(x->valuestring) + 1);
    return 0;
}

static void manifest_free(manifest_t *m) {
    CK_FREE(m->tables, (m->ntables ? m->ntables : 1) * sizeof *m->tables);
    m->tables = NULL;
    CK_FREE(m->cold, (m->ncold ? m->ncold : 1) * sizeof *m->cold);
    m->cold = NULL;
    m->ncold = 0;
}

/* List the files of a tier checkpoint directory into m->cold. */
static int cold_list(const char *dir, manifest_t *m) {
    DIR *d = opendir(dir);
    if (!d)
        return PC_EIO;
    size_t cap = 64;
    m->cold = CK_ALLOC(cap * sizeof *m->cold);
    int rc = m->cold ? 0 : PC_ENOMEM;
    struct dirent *e;
    while (!rc && (e = readdir(d))) {
        if (e->d_name[0] == '.')
            continue;
        char p[PBUF + 300];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        if (strlen(e->d_name) >= sizeof m->cold[0].name || stat(p, &st) != 0 ||
            !S_ISREG(st.st_mode) || m->ncold == MAX_COLD_FILES) {
            rc = PC_EIO;
            break;
        }
        if (m->ncold == cap) {
            cfile_t *n = pc_realloc(PC_MEM_SCRATCH, m->cold, cap * sizeof *n, 2 * cap * sizeof *n);
            if (!n) {
                rc = PC_ENOMEM;
                break;
            }
            m->cold = n;
            cap *= 2;
        }
        snprintf(m->cold[m->ncold].name, sizeof m->cold[0].name, "%s", e->d_name);
        m->cold[m->ncold++].bytes = (uint64_t)st.st_size;
    }
    closedir(d);
    if (m->cold && cap != (m->ncold ? m->ncold : 1)) { /* exact size, as manifest_free frees */
        cfile_t *n = pc_realloc(PC_MEM_SCRATCH, m->cold, cap * sizeof *n,
                                (m->ncold ? m->ncold : 1) * sizeof *n);
        if (n)
            m->cold = n;
        else
            rc = rc ? rc : PC_ENOMEM;
    }
    m->has_cold = !rc;
    return rc;
}

/* Every file the manifest lists for the cold part is there with its size. */
static int cold_verify(const char *dir, const manifest_t *m) {
    for (size_t i = 0; i < m->ncold; i++) {
        char p[PBUF + 80];
        struct stat st;
        snprintf(p, sizeof p, "%s/%s", dir, m->cold[i].name);
        if (stat(p, &st) != 0 || (uint64_t)st.st_size != m->cold[i].bytes) {
            PC_ERROR("checkpoint %" PRIu64 ": cold file %s missing or of the wrong size", m->id,
                     m->cold[i].name);
            return PC_ECORRUPT;
        }
    }
    return 0;
}

static int manifest_read(const ps_ckpt_t *c, uint64_t id, manifest_t *m) {
    char path[PBUF];
    ckpt_path(c, id, NAME_PUBLISHED, path, sizeof path);
    strncat(path, "/" MANIFEST, sizeof path - strlen(path) - 1);
    memset(m, 0, sizeof *m);
    FILE *f = fopen(path, "rb");
    if (!f)
        return errno == ENOENT ? PC_ENOTFOUND : PC_EIO;
    char *text = NULL;
    size_t len = 0, text_bytes = 0;
    int rc = 0; /* a manifest we cannot read is not a corrupt one: ENOMEM/EIO stop a restore */
    long sz = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (sz < 0 || fseek(f, 0, SEEK_SET) != 0) {
        rc = PC_EIO;
    } else if (sz > 0 && sz < (64 << 20)) {
        text_bytes = (size_t)sz + 1;
        text = CK_ALLOC(text_bytes);
        if (!text)
            rc = PC_ENOMEM;
        else if (fread(text, 1, (size_t)sz, f) != (size_t)sz)
            rc = PC_EIO;
        else {
            len = (size_t)sz;
            text[len] = '\0';
        }
    }
    fclose(f);
    if (rc) {
        CK_FREE(text, text_bytes);
        return rc;
    }
    bool sealed = false;
    const int seal = pc_fs_seal_check(text, &len, &sealed);
    cJSON *root = len && !seal ? cJSON_ParseWithLength(text, len) : NULL;
    CK_FREE(text, text_bytes);
    rc = root ? 0 : PC_ECORRUPT;
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *kind = cJSON_GetObjectItemCaseSensitive(root, "kind");
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(root, "since_full");
    const cJSON *tabs = cJSON_GetObjectItemCaseSensitive(root, "tables");
    if (!rc &&
        (!cJSON_IsNumber(fmt) || fmt->valuedouble < 1 || fmt->valuedouble > MANIFEST_FORMAT ||
         (fmt->valueint >= 2 && !sealed) || !cJSON_IsString(kind) || !cJSON_IsNumber(sf) ||
         !cJSON_IsArray(tabs) || cJSON_GetArraySize(tabs) > MAX_TABLES))
        rc = PC_ECORRUPT;
    if (!rc)
        rc = json_get_u64(root, "id", &m->id) || json_get_u64(root, "parent", &m->parent) ||
                     json_get_u64(root, "created_unix_ns", &m->created)
                 ? PC_ECORRUPT
                 : 0;
    if (!rc && (m->id != id || (m->parent && m->parent >= id)))
        rc = PC_ECORRUPT;
    if (!rc &&
        (strcmp(kind->valuestring, "incremental") != 0 && strcmp(kind->valuestring, "full") != 0))
        rc = PC_ECORRUPT;
    if (!rc && (sf->valuedouble < 0 || sf->valuedouble > MAX_CHAIN))
        rc = PC_ECORRUPT;
    if (!rc) {
        m->incremental = strcmp(kind->valuestring, "incremental") == 0;
        m->since_full = (uint32_t)sf->valueint;
        m->ntables = (size_t)cJSON_GetArraySize(tabs);
        m->tables = CK_ALLOC((m->ntables ? m->ntables : 1) * sizeof *m->tables);
        if (!m->tables) {
            m->ntables = 0;
            rc = PC_ENOMEM;
        }
    }
    for (size_t i = 0; !rc && i < m->ntables; i++) {
        const cJSON *e = cJSON_GetArrayItem(tabs, (int)i);
        mtable_t *t = &m->tables[i];
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(e, "full");
        const cJSON *cut = cJSON_GetObjectItemCaseSensitive(e, "cut_clock");
        if (json_get_str(e, "name", t->name, sizeof t->name) ||
            json_get_str(e, "config", t->config, sizeof t->config) || !cJSON_IsBool(full) ||
            !cJSON_IsNumber(cut) || json_get_u64(e, "version", &t->version) ||
            json_get_u64(e, "rows", &t->rows) || json_get_u64(e, "tombstones", &t->tombs) ||
            json_get_u64(e, "bytes", &t->bytes) || json_get_u64(e, "xxh3", &t->xxh3))
            rc = PC_ECORRUPT;
        if (!rc && cJSON_GetObjectItemCaseSensitive(e, "owner") &&
            json_get_str(e, "owner", t->owner, sizeof t->owner))
            rc = PC_ECORRUPT;
        uint64_t fence = 0; /* absent in older manifests */
        if (!rc && cJSON_GetObjectItemCaseSensitive(e, "fence") &&
            (json_get_u64(e, "fence", &fence) || fence > UINT32_MAX))
            rc = PC_ECORRUPT;
        t->fence = (uint32_t)fence;
        t->log_position = UINT64_MAX; /* uid and log_position: absent in older manifests */
        if (!rc && cJSON_GetObjectItemCaseSensitive(e, "uid") && json_get_u64(e, "uid", &t->uid))
            rc = PC_ECORRUPT;
        if (!rc && cJSON_GetObjectItemCaseSensitive(e, "log_position") &&
            json_get_u64(e, "log_position", &t->log_position))
            rc = PC_ECORRUPT;
        t->full = cJSON_IsTrue(full);
        if (!rc && (cut->valuedouble < 0 || cut->valuedouble > UINT32_MAX))
            rc = PC_ECORRUPT;
        t->cut = rc ? 0 : (uint32_t)cut->valuedouble;
    }
    const cJSON *cold = cJSON_GetObjectItemCaseSensitive(root, "cold");
    if (!rc && cold && (!cJSON_IsArray(cold) || cJSON_GetArraySize(cold) > MAX_COLD_FILES))
        rc = PC_ECORRUPT;
    if (!rc && cold) {
        m->has_cold = true;
        m->ncold = (size_t)cJSON_GetArraySize(cold);
        m->cold = CK_ALLOC((m->ncold ? m->ncold : 1) * sizeof *m->cold);
        if (!m->cold) {
            m->ncold = 0;
            rc = PC_ENOMEM;
        }
    }
    for (size_t i = 0; !rc && i < m->ncold; i++) {
        const cJSON *e = cJSON_GetArrayItem(cold, (int)i);
        if (json_get_str(e, "name", m->cold[i].name, sizeof m->cold[i].name) ||
            strchr(m->cold[i].name, '/') || m->cold[i].name[0] == '.' ||
            json_get_u64(e, "bytes", &m->cold[i].bytes))
            rc = PC_ECORRUPT;
    }
    cJSON_Delete(root);
    if (rc) {
        PC_WARN("checkpoint %" PRIu64 ": manifest unreadable (%s)", id, pc_strerror(rc));
        manifest_free(m);
    }
    return rc;
}

/* Write MANIFEST.json into `tmpdir`, sealed, atomically (pc_fs_write_atomic: a temporary
 * name, fsync, rename, fsync of the directory). Every item is checked as it is added: a
 * manifest missing one would be published and then refused by every reader (PC_ECORRUPT), and
 * every later incremental would chain on it. */
static int manifest_write(const char *tmpdir, const manifest_t *m) {
    cJSON *root = cJSON_CreateObject(), *tabs = cJSON_AddArrayToObject(root, "tables");
    bool ok = root && tabs;
#define ADD(x) (ok = ok && (x))
    ADD(cJSON_AddNumberToObject(root, "format", MANIFEST_FORMAT) != NULL);
    ADD(json_u64(root, "id", m->id));
    ADD(json_u64(root, "parent", m->parent));
    ADD(cJSON_AddStringToObject(root, "kind", m->incremental ? "incremental" : "full") != NULL);
    ADD(cJSON_AddNumberToObject(root, "since_full", m->since_full) != NULL);
    ADD(json_u64(root, "created_unix_ns", m->created));
    for (size_t i = 0; ok && i < m->ntables; i++) {
        const mtable_t *t = &m->tables[i];
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddItemToArray(tabs, e)) {
            cJSON_Delete(e);
            ok = false;
            break;
        }
        ADD(cJSON_AddStringToObject(e, "name", t->name) != NULL);
        ADD(cJSON_AddStringToObject(e, "config", t->config) != NULL);
        ADD(cJSON_AddStringToObject(e, "owner", t->owner) != NULL);
        ADD(json_u64(e, "fence", t->fence));
        ADD(cJSON_AddBoolToObject(e, "full", t->full) != NULL);
        ADD(cJSON_AddNumberToObject(e, "cut_clock", t->cut) != NULL);
        ADD(json_u64(e, "version", t->version));
        ADD(json_u64(e, "rows", t->rows));
        ADD(json_u64(e, "tombstones", t->tombs));
        ADD(json_u64(e, "bytes", t->bytes));
        ADD(json_u64(e, "xxh3", t->xxh3));
        ADD(json_u64(e, "uid", t->uid));
        if (t->log_position != UINT64_MAX)
            ADD(json_u64(e, "log_position", t->log_position));
        char file[PS_TABLE_NAME_MAX + 8];
        snprintf(file, sizeof file, "t-%s.rows", t->name);
        ADD(cJSON_AddStringToObject(e, "file", file) != NULL);
    }
    if (m->has_cold) {
        cJSON *cold = ok ? cJSON_AddArrayToObject(root, "cold") : NULL;
        ok = ok && cold;
        for (size_t i = 0; ok && i < m->ncold; i++) {
            cJSON *e = cJSON_CreateObject();
            if (!e || !cJSON_AddItemToArray(cold, e)) {
                cJSON_Delete(e);
                ok = false;
                break;
            }
            ADD(cJSON_AddStringToObject(e, "name", m->cold[i].name) != NULL);
            ADD(json_u64(e, "bytes", m->cold[i].bytes));
        }
    }
#undef ADD
    char *json = ok ? cJSON_Print(root) : NULL; /* incomplete: publish nothing */
    cJSON_Delete(root);
    /* the text, a newline, then the seal of both */
    const size_t jlen = json ? strlen(json) + 1 : 0, tlen = jlen + PC_FS_SEAL_LEN;
    char *text = json ? CK_ALLOC(tlen + 1) : NULL;
    if (text) {
        memcpy(text, json, jlen - 1);
        text[jlen - 1] = '\n';
        pc_fs_seal(text, jlen, tlen + 1);
    }
    cJSON_free(json);
    if (!text)
        return PC_ENOMEM; /* an item could not be built: publish nothing */
    char final[PBUF + 32];
    snprintf(final, sizeof final, "%s/%s", tmpdir, MANIFEST);
    const int rc = pc_fs_write_atomic(final, text, tlen);
    CK_FREE(text, tlen + 1);
    return rc;
}

/* ==== lifecycle ============================================================================ */

int ps_ckpt_create(ps_catalog_t *cat, const ps_ckpt_opts_t *o, ps_ckpt_t **out) {
    if (!cat || !o || !o->dir || !out || o->keep < 1 || o->full_every < 1 ||
        o->full_every > MAX_CHAIN || strlen(o->dir) >= sizeof((ps_ckpt_t *)0)->dir)
        return PC_EINVAL;
    if (!o->read_only && mkdir(o->dir, 0755) == 0) { /* new: its entry made durable too */
        if (pc_fs_fsync_parent(o->dir)) {
            PC_ERROR("checkpoint dir %s: cannot make its creation durable (fsync of its parent)",
                     o->dir);
            return PC_EIO;
        }
    } else if (!o->read_only && errno != EEXIST) {
        PC_ERROR("checkpoint dir %s: %s", o->dir, strerror(errno));
        return PC_EIO;
    } else if (!o->read_only && access(o->dir, W_OK | X_OK) != 0) {
        /* (mkdir says EEXIST before EROFS or EACCES: a read-only mount is found here, at
         * start, not by every checkpoint failing and the exit losing every push) */
        PC_ERROR("checkpoint dir %s: not writable: %s", o->dir, strerror(errno));
        return PC_EIO;
    }
    ps_ckpt_t *c = CK_ALLOC(sizeof *c);
    if (!c)
        return PC_ENOMEM;
    c->cat = cat;
    snprintf(c->dir, sizeof c->dir, "%s", o->dir);
    c->keep = o->keep;
    c->full_every = o->full_every;
    c->tier = o->tier;
    c->read_only = o->read_only;
    size_t n;
    uint64_t mx;
    if (!c->read_only) /* leftovers of a crashed writer: the writer's to remove */
        scan_dir(c->dir, NULL, 0, &n, &mx, NAME_TMP);
    *out = c;
    return 0;
}

void ps_ckpt_destroy(ps_ckpt_t *c) {
    if (!c)
        return;
    CK_FREE(c->ts, c->ts_cap * sizeof *c->ts);
    CK_FREE(c, sizeof *c);
}

/* ==== writing ============================================================================== */

typedef struct wctx {
    ps_rowfile_w_t *w;
    uint64_t *tombs;
    size_t ntombs, cap;
    uint64_t *ram_keys; /* export of a cold table: keys written from RAM (sorted later) */
    size_t nram, ram_cap;
    bool collect;
} wctx_t;

static int grow_u64(uint64_t **a, size_t *cap, size_t need) {
    if (need <= *cap)
        return 0;
    size_t ncap = (*cap ? 2 * *cap : 1024) + need;
    uint64_t *t = pc_realloc(PC_MEM_SCRATCH, *a, *cap * sizeof *t, ncap * sizeof *t);
    if (!t)
        return PC_ENOMEM;
    *a = t;
    *cap = ncap;
    return 0;
}

static int on_rows(void *ctx, const ps_row_view_t *rows, size_t n) {
    wctx_t *x = ctx;
    if (x->collect) {
        int rc = grow_u64(&x->ram_keys, &x->ram_cap, x->nram + n);
        if (rc)
            return rc;
        for (size_t i = 0; i < n; i++)
            x->ram_keys[x->nram++] = rows[i].key;
    }
    return ps_rowfile_add_rows(x->w, rows, n);
}

static int on_tombs(void *ctx, const uint64_t *keys, size_t n) {
    wctx_t *x = ctx;
    int rc = grow_u64(&x->tombs, &x->cap, x->ntombs + n);
    if (rc)
        return rc;
    memcpy(x->tombs + x->ntombs, keys, n * sizeof *keys);
    x->ntombs += n;
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Cold rows of an export: those not written from RAM (RAM holds the newer copy). */
typedef struct cold_wctx {
    wctx_t *x;
    const ps_table_t *t;
    uint32_t cut, dim;
    bool with_state;
} cold_wctx_t;

static int on_cold_rows(void *ctx, const ps_cold_row_t *rows, size_t n) {
    cold_wctx_t *c = ctx;
    ps_row_view_t v[256];
    size_t nv = 0;
    for (size_t i = 0; i < n; i++) {
        /* RAM's rows, and expired ones: the cut's clock advance (cut + 1) dropped those from
         * RAM, and lookups read them as absent (an export wrote them; its import brought the
         * stale weights back) */
        if (bsearch(&rows[i].key, c->x->ram_keys, c->x->nram, sizeof(uint64_t), cmp_u64) ||
            ps_table_expired(c->t, rows[i].clock, c->cut + 1))
            continue;
        /* Ticks are clock values mod 2^16, ages saturating at PS_AGE_MAX (as in RAM). */
        uint32_t age = rows[i].clock <= c->cut ? c->cut - rows[i].clock : 0;
        uint16_t tick = (uint16_t)(c->cut - (age < PS_AGE_MAX ? age : PS_AGE_MAX));
        v[nv++] = (ps_row_view_t){rows[i].key, rows[i].row,
                                  c->with_state ? rows[i].row + c->dim : NULL, tick, rows[i].freq};
    }
    return nv ? ps_rowfile_add_rows(c->x->w, v, nv) : 0;
}

/* Write the active snapshot of `t` (cut `info`) into `path`: rows changed since `since`,
 * tombstones unless PS_SCAN_ALL, and with `cold` (exports of cold tables) the cold rows that
 * RAM did not hold. On failure the file is removed; the snapshot stays active either way, for
 * the caller to end. *e receives the table's manifest entry. */
static int write_snapshot(ps_table_t *t, const ps_snapshot_info_t *info, ps_tier_view_t *cold,
                          const char *path, uint64_t since, bool with_state, mtable_t *e) {
    const ps_table_config_t *cfg = ps_table_config(t);
    ps_rowfile_meta_t meta = {.dim = ps_table_dim(t),
                              .state_len = with_state ? ps_table_state_len(t) : 0,
                              .optimizer = (uint32_t)cfg->optimizer,
                              .cut_clock = info->cut_clock,
                              .flags = since == PS_SCAN_ALL ? 0 : PS_ROWFILE_INCREMENTAL,
                              .version = info->version};
    wctx_t x = {.collect = cold != NULL};
    int rc = 0;
    if (ps_table_config_format(cfg, meta.config, sizeof meta.config) >= sizeof meta.config)
        rc = PC_EINVAL;
    if (!rc)
        rc = ps_rowfile_create(path, &meta, &x.w);
    if (!rc)
        rc = ps_table_snapshot_scan(t, since, on_rows, since == PS_SCAN_ALL ? NULL : on_tombs, &x);
    if (!rc && cold) {
        qsort(x.ram_keys, x.nram, sizeof *x.ram_keys, cmp_u64);
        cold_wctx_t cx = {&x, t, info->cut_clock, ps_table_dim(t), with_state};
        rc = ps_tier_view_scan(cold, on_cold_rows, &cx);
    }
    if (!rc)
        rc = ps_rowfile_add_tombs(x.w, x.tombs, x.ntombs);
    pc_free(PC_MEM_SCRATCH, x.tombs, x.cap * sizeof *x.tombs);
    pc_free(PC_MEM_SCRATCH, x.ram_keys, x.ram_cap * sizeof *x.ram_keys);
    if (!rc) {
        memset(e, 0, sizeof *e);
        snprintf(e->name, sizeof e->name, "%s", cfg->name);
        memcpy(e->config, meta.config, sizeof e->config);
        ps_table_owner(t, e->owner, sizeof e->owner);
        e->fence = ps_table_fence(t);
        e->full = since == PS_SCAN_ALL;
        e->cut = info->cut_clock;
        e->version = info->version;
        rc = ps_rowfile_finish(x.w, &e->rows, &e->tombs, &e->bytes, &e->xxh3);
    } else if (x.w) {
        ps_rowfile_abort(x.w);
    }
    return rc;
}

static const tstate_t *find_state(const ps_ckpt_t *c, const char *name) {
    for (size_t i = 0; i < c->nts; i++)
        if (strcmp(c->ts[i].name, name) == 0)
            return &c->ts[i];
    return NULL;
}

/* After a publish: keep the newest `keep` checkpoints and their chains, delete the rest, and the
 * checkpoints a rollback abandoned (a newer one is published: ids stay unique). */
static void retain(ps_ckpt_t *c) {
    uint64_t ids[4096];
    size_t n;
    if (scan_dir(c->dir, ids, 4096, &n, NULL, NAME_ABANDONED) || n > 4096 || n <= c->keep)
        return;
    bool *need = CK_ALLOC(n * sizeof *need);
    if (!need)
        return;
    for (size_t i = n - c->keep; i < n; i++) {
        uint64_t id = ids[i];
        while (id) { /* mark the chain */
            size_t j = 0;
            while (j < n && ids[j] != id)
                j++;
            if (j == n || need[j])
                break;
            need[j] = true;
            manifest_t m;
            if (manifest_read(c, id, &m)) {
                CK_FREE(need, n * sizeof *need); /* cannot tell what a chain needs: keep all */
                return;
            }
            id = m.incremental ? m.parent : 0;
            manifest_free(&m);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (need[i])
            continue;
        /* Unpublish first (atomic), then delete: a crash in between leaves a .tmp directory,
         * which restore ignores and the next checkpointer removes. */
        char p[PBUF], q[PBUF];
        ckpt_path(c, ids[i], NAME_PUBLISHED, p, sizeof p);
        ckpt_path(c, ids[i], NAME_TMP, q, sizeof q);
        if (rename(p, q) == 0)
            pc_fs_rm_tree(q);
    }
    CK_FREE(need, n * sizeof *need);
    pc_fs_fsync_path(c->dir);
}

/* A rollback (ps_ckpt_rollback): published checkpoints newer than `id` belong to the abandoned
 * run, and a later "restore the newest" must not bring them back. Each is renamed to
 * ckpt-<id>.abandoned (atomic: unpublished, its id still taken, its files there for an operator who
 * restored the wrong one), then removed by the next published checkpoint (retain). */
static int abandon_newer(ps_ckpt_t *c, uint64_t id) {
    uint64_t ids[4096];
    size_t n;
    if (scan_dir(c->dir, ids, 4096, &n, NULL, 0)) {
        PC_ERROR("checkpoints newer than the restored %" PRIu64 " in %s could not be listed: a "
                 "restore of the newest may take one of them",
                 id, c->dir);
        return PC_EIO;
    }
    bool any = false;
    int rc = 0;
    for (size_t i = n < 4096 ? n : 4096; i > 0; i--) { /* the newest first */
        if (ids[i - 1] <= id)
            break;
        char p[PBUF], q[PBUF];
        ckpt_path(c, ids[i - 1], NAME_PUBLISHED, p, sizeof p);
        ckpt_path(c, ids[i - 1], NAME_ABANDONED, q, sizeof q);
        if (rename(p, q) == 0) {
            PC_WARN("checkpoint %" PRIu64 " is newer than the restored %" PRIu64
                    ": abandoned (%s, removed by the next checkpoint)",
                    ids[i - 1], id, q);
            any = true;
        } else {
            PC_ERROR("checkpoint %" PRIu64 " is newer than the restored %" PRIu64
                     " and could not be abandoned (%s): a restore of the newest would take it",
                     ids[i - 1], id, strerror(errno));
            rc = PC_EIO;
        }
    }
    if (any && pc_fs_fsync_path(c->dir)) {
        PC_ERROR("checkpoints newer than the restored %" PRIu64 " were abandoned, but %s could "
                 "not be fsynced: a power loss may bring them back",
                 id, c->dir);
        rc = PC_EIO;
    }
    return rc;
}

/* The tables of one checkpoint, cut together. */
typedef struct cutset {
    size_t n, begun;
    ps_table_t **tabs;
    ps_snapshot_info_t *info;
    bool *cold;
    uint64_t *log_pos; /* each table's change-log head just before its cut (UINT64_MAX: none) */
} cutset_t;

/* Acquire every table and place all cuts together: cold tables are frozen first, every table
 * is cut, the tier is copied (nothing writes to it while frozen, so it is exactly the cold state
 * at the cuts), then the cold tables thaw. Their RAM rows follow from the snapshots. */
static int cut_all(ps_ckpt_t *c, const char *tmp, char (*names)[PS_TABLE_NAME_MAX], size_t nt,
                   cutset_t *cs) {
    int rc = 0;
    bool any_cold = false;
    for (size_t i = 0; i < nt; i++) {
        ps_table_t *t;
        if (ps_catalog_acquire(c->cat, names[i], &t))
            continue; /* dropped meanwhile */
        cs->tabs[cs->n] = t;
        cs->cold[cs->n] = ps_table_config(t)->cold;
        if (cs->cold[cs->n] && !(c->tier && ps_tier_attached(c->tier, t))) {
            PC_ERROR("checkpoint: cold table %s is not attached to this checkpointer's tier",
                     names[i]);
            rc = rc ? rc : PC_EINVAL;
        }
        any_cold |= cs->cold[cs->n];
        cs->n++;
    }
    if (rc)
        return rc;
    for (size_t i = 0; i < cs->n; i++)
        if (cs->cold[i])
            ps_table_cold_freeze(cs->tabs[i], true);
    for (; cs->begun < cs->n && !rc; cs->begun++) {
        ps_table_t *t = cs->tabs[cs->begun];
        ps_changelog_t *log = ps_table_changelog(t);
        uint64_t oldest, head = UINT64_MAX;
        if (log) /* before the cut: every change after it is logged at or after head */
            ps_changelog_bounds(log, &oldest, &head);
        cs->log_pos[cs->begun] = head;
        rc = ps_table_snapshot_begin(t, !cs->cold[cs->begun], &cs->info[cs->begun]);
    }
    if (rc)
        cs->begun--; /* the failed one is not active */
    if (!rc && any_cold) {
        char cold[PBUF + 8];
        snprintf(cold, sizeof cold, "%s/" COLD_DIR, tmp);
        rc = ps_tier_checkpoint(c->tier, cold);
    }
    for (size_t i = 0; i < cs->n; i++)
        if (cs->cold[i])
            ps_table_cold_freeze(cs->tabs[i], false);
    return rc;
}

int ps_ckpt_write(ps_ckpt_t *c, ps_ckpt_result_t *res) {
    const uint64_t t0 = pc_time_mono_ns();
    uint64_t mx;
    size_t npub;
    if (c->read_only)
        return PC_ESTATE;
    int rc = scan_dir(c->dir, NULL, 0, &npub, &mx, NAME_TMP);
    if (rc)
        return rc;
    manifest_t m = {.id = mx + 1, .created = pc_time_wall_ns()};
    char parent_path[PBUF], tmp[PBUF], final[PBUF];
    ckpt_path(c, c->last_id, NAME_PUBLISHED, parent_path, sizeof parent_path);
    struct stat st;
    m.incremental = c->last_id && c->since_full + 1 < c->full_every &&
                    stat(parent_path, &st) == 0 && S_ISDIR(st.st_mode);
    m.parent = m.incremental ? c->last_id : 0;
    m.since_full = m.incremental ? c->since_full + 1 : 0;
    ckpt_path(c, m.id, NAME_TMP, tmp, sizeof tmp);
    ckpt_path(c, m.id, NAME_PUBLISHED, final, sizeof final);
    if (mkdir(tmp, 0755) != 0) {
        int e = errno;
        PC_ERROR("checkpoint %s: mkdir: %s", tmp, strerror(e));
        return e == ENOSPC ? PC_ENOSPC : PC_EIO;
    }
    char(*names)[PS_TABLE_NAME_MAX] = CK_ALLOC(MAX_TABLES * sizeof *names);
    cutset_t cs = {.tabs = CK_ALLOC(MAX_TABLES * sizeof *cs.tabs),
                   .info = CK_ALLOC(MAX_TABLES * sizeof *cs.info),
                   .cold = CK_ALLOC(MAX_TABLES * sizeof *cs.cold),
                   .log_pos = CK_ALLOC(MAX_TABLES * sizeof *cs.log_pos)};
    m.tables = CK_ALLOC(MAX_TABLES * sizeof *m.tables);
    tstate_t *ts = CK_ALLOC(MAX_TABLES * sizeof *ts);
    if (!names || !cs.tabs || !cs.info || !cs.cold || !cs.log_pos || !m.tables || !ts) {
        rc = PC_ENOMEM;
        goto done;
    }
    size_t nt = ps_catalog_list(c->cat, names, MAX_TABLES);
    if (nt > MAX_TABLES) {
        PC_ERROR("checkpoint: %zu tables, at most %d supported", nt, MAX_TABLES);
        rc = PC_ETOOBIG;
        goto done;
    }
    rc = cut_all(c, tmp, names, nt, &cs);
    if (!rc) { /* the tier's copy, when a cold table made one */
        char cold[PBUF + 8];
        snprintf(cold, sizeof cold, "%s/" COLD_DIR, tmp);
        if (stat(cold, &st) == 0)
            rc = cold_list(cold, &m);
    }
    for (size_t i = 0; i < cs.n && !rc; i++) {
        ps_table_t *t = cs.tabs[i];
        const char *name = ps_table_config(t)->name;
        /* Cold tables are written in full: their cold part is a whole copy anyway. */
        const tstate_t *prev = m.incremental && !cs.cold[i] ? find_state(c, name) : NULL;
        /* A table that lost a removal's tombstone (no memory to log it) is written whole */
        uint64_t since = prev && prev->uid == ps_table_uid(t) && !ps_table_needs_full(t)
                             ? (uint64_t)prev->cut + 1
                             : PS_SCAN_ALL;
        char path[PBUF + PS_TABLE_NAME_MAX + 8];
        snprintf(path, sizeof path, "%s/t-%s.rows", tmp, name);
        mtable_t *e = &m.tables[m.ntables];
        rc = write_snapshot(t, &cs.info[i], NULL, path, since, true, e);
        if (rc)
            break;
        e->uid = ps_table_uid(t);
        e->log_position = cs.log_pos[i];
        ts[m.ntables] = (tstate_t){.uid = ps_table_uid(t), .cut = e->cut};
        memcpy(ts[m.ntables].name, e->name, sizeof ts[m.ntables].name);
        m.ntables++;
    }
    if (!rc)
        rc = manifest_write(tmp, &m);
    if (!rc && rename(tmp, final) != 0)
        rc = PC_EIO;
    if (!rc && (rc = pc_fs_fsync_path(c->dir)))
        rename(final, tmp); /* not known durable: unpublish, the tmp is removed below */
done:
    for (size_t i = 0; i < cs.n; i++) {
        if (i < cs.begun)
            ps_table_snapshot_end(cs.tabs[i], rc == 0);
        ps_catalog_release(c->cat, cs.tabs[i]);
    }
    if (!rc) {
        CK_FREE(c->ts, c->ts_cap * sizeof *c->ts);
        c->ts = ts;
        c->nts = m.ntables;
        c->ts_cap = MAX_TABLES;
        ts = NULL;
        c->last_id = m.id;
        c->since_full = m.since_full;
        if (res) {
            *res = (ps_ckpt_result_t){.id = m.id, .parent = m.parent, .incremental = m.incremental};
            for (size_t i = 0; i < m.ntables; i++) {
                res->rows += m.tables[i].rows;
                res->tombstones += m.tables[i].tombs;
                res->bytes += m.tables[i].bytes;
            }
            for (size_t i = 0; i < m.ncold; i++)
                res->bytes += m.cold[i].bytes;
            res->seconds = pc_time_sec_since(t0);
        }
        PC_INFO("checkpoint %" PRIu64 " published (%s, %zu tables%s)", m.id,
                m.incremental ? "incremental" : "full", m.ntables, m.has_cold ? ", cold tier" : "");
        retain(c);
    } else {
        PC_ERROR("checkpoint %" PRIu64 " failed: %s; previous checkpoints untouched", m.id,
                 pc_strerror(rc));
        pc_fs_rm_tree(tmp);
    }
    CK_FREE(names, MAX_TABLES * sizeof *names);
    CK_FREE(cs.tabs, MAX_TABLES * sizeof *cs.tabs);
    CK_FREE(cs.info, MAX_TABLES * sizeof *cs.info);
    CK_FREE(cs.cold, MAX_TABLES * sizeof *cs.cold);
    CK_FREE(cs.log_pos, MAX_TABLES * sizeof *cs.log_pos);
    CK_FREE(m.tables, MAX_TABLES * sizeof *m.tables);
    CK_FREE(m.cold, (m.ncold ? m.ncold : 1) * sizeof *m.cold);
    CK_FREE(ts, MAX_TABLES * sizeof *ts);
    return rc;
}

/* ==== restore ============================================================================== */

/* A table's row file in one checkpoint of its chain: where it is, and what its manifest entry
 * holds it to (restore_check; the settings by their hash, so that a chain costs no copy of
 * them per link). */
typedef struct link {
    uint64_t id; /* the checkpoint whose t-<name>.rows it is */
    uint64_t version, rows, tombs, bytes, xxh3, config_xxh3;
    uint32_t cut;
    bool full;
} link_t;

static uint64_t config_hash(const char *config, size_t cap) {
    return pc_hash64(config, strnlen(config, cap), 0);
}

typedef struct rctx {
    ps_table_t *t;
    const ps_rowfile_meta_t *meta; /* filled by the reader before any callback */
    const char *name;
    const link_t *want; /* the manifest's entry for this file */
    int checked;
} rctx_t;

/* Before the first row or tombstone of a file is applied: the file must be what its manifest
 * entry and the table say (counts, size, checksum, cut, version), or nothing is loaded from it:
 * another self-consistent row file put in its place is refused. */
static int restore_check(rctx_t *x) {
    if (x->checked)
        return 0;
    const ps_rowfile_meta_t *m = x->meta;
    /* (the config too: the table is rebuilt from the manifest's, which no checksum covers, and
     * the file's header is checksummed: a manifest whose settings changed is refused) */
    if (m->dim != ps_table_dim(x->t) || m->state_len != ps_table_state_len(x->t) ||
        m->cut_clock != x->want->cut || m->version != x->want->version ||
        ((m->flags & PS_ROWFILE_INCREMENTAL) != 0) == x->want->full ||
        config_hash(m->config, sizeof m->config) != x->want->config_xxh3 ||
        m->rows != x->want->rows || m->tombs != x->want->tombs || m->bytes != x->want->bytes ||
        m->checksum != x->want->xxh3) {
        PC_ERROR("checkpoint table %s: row file does not match its manifest", x->name);
        return PC_ECORRUPT;
    }
    x->checked = 1;
    return 0;
}

static int on_restore_tombs(void *ctx, const uint64_t *keys, size_t n) {
    rctx_t *x = ctx;
    int rc = restore_check(x);
    return rc ? rc : ps_table_erase(x->t, keys, n, NULL);
}

static int on_restore_rows(void *ctx, size_t n, const uint64_t *keys, const float *w,
                           const float *s, const uint16_t *ticks, const uint8_t *freqs) {
    rctx_t *x = ctx;
    int rc = restore_check(x);
    return rc ? rc : ps_table_load(x->t, n, keys, w, s, ticks, freqs);
}

static int cmp_mtable_name(const void *a, const void *b) {
    return strcmp((*(const mtable_t *const *)a)->name, (*(const mtable_t *const *)b)->name);
}

/* The chains of every table of manifest m: from m's checkpoint back to each table's full entry
 * (MAX_CHAIN + 1 links at most), in one walk that reads each manifest of the chain once (a walk
 * per table read the chain's manifests once per table, each of them with every table: restoring
 * 300 tables over 100 checkpoints took 42 s). level[k][i] is table i's k-th link back from m,
 * nlinks[i] its count; *nlevels the levels allocated (free with chains_free). */
static int chains_of(ps_ckpt_t *c, const manifest_t *m, link_t **level, size_t *nlevels,
                     uint32_t *nlinks) {
    const size_t nt = m->ntables;
    size_t open = nt;
    uint64_t id = m->id;
    int rc = 0;
    *nlevels = 0;
    for (size_t k = 0; open && !rc; k++) {
        manifest_t cur = {0};
        const manifest_t *mk = m;
        if (k == MAX_CHAIN + 1)
            rc = PC_ECORRUPT;
        else if (k && (rc = manifest_read(c, id, &cur)) == 0)
            mk = &cur;
        const size_t nk = mk->ntables ? mk->ntables : 1;
        const mtable_t **byname = rc ? NULL : CK_ALLOC(nk * sizeof *byname);
        if (!rc && (!byname || !(level[k] = CK_ALLOC(nt * sizeof **level))))
            rc = PC_ENOMEM;
        if (!rc) {
            *nlevels = k + 1;
            for (size_t i = 0; i < mk->ntables; i++)
                byname[i] = &mk->tables[i];
            qsort(byname, mk->ntables, sizeof *byname, cmp_mtable_name);
            for (size_t i = 1; !rc && i < mk->ntables; i++)
                if (!cmp_mtable_name(&byname[i - 1], &byname[i]))
                    rc = PC_ECORRUPT; /* a name twice: which entry is the table's? */
        }
        for (size_t i = 0; !rc && i < nt; i++) {
            if (nlinks[i] != k || (k && level[k - 1][i].full)) /* its chain ended (full) */
                continue;
            const mtable_t *want = &m->tables[i], **at = bsearch(&want, byname, mk->ntables,
                                                                 sizeof *byname, cmp_mtable_name);
            if (!at) { /* a table missing from its chain */
                rc = PC_ECORRUPT;
                break;
            }
            const mtable_t *e = *at;
            level[k][i] = (link_t){.id = id,
                                   .version = e->version,
                                   .rows = e->rows,
                                   .tombs = e->tombs,
                                   .bytes = e->bytes,
                                   .xxh3 = e->xxh3,
                                   .config_xxh3 = config_hash(e->config, sizeof e->config),
                                   .cut = e->cut,
                                   .full = e->full};
            nlinks[i] = (uint32_t)k + 1;
            open -= e->full;
        }
        CK_FREE(byname, nk * sizeof *byname);
        const uint64_t parent = mk->parent;
        manifest_free(&cur);
        if (!rc && open && !parent)
            rc = PC_ECORRUPT;
        id = parent;
    }
    return rc;
}

static void chains_free(link_t **level, size_t nlevels, size_t nt) {
    for (size_t k = 0; k < nlevels; k++)
        CK_FREE(level[k], nt * sizeof **level);
}

/* Rebuild table te->name as of checkpoint `target` into *out from its chain: table i's links of
 * level (nc of them, chains_of). */
static int restore_table(ps_ckpt_t *c, const manifest_t *target, const mtable_t *te,
                         link_t *const *level, size_t i, uint32_t nc, ps_table_t **out) {
    int rc = 0;
    ps_table_config_t cfg;
    ps_table_config_defaults(&cfg);
    char err[256];
    if (ps_table_config_parse(&cfg, te->config, err, sizeof err) ||
        strcmp(cfg.name, te->name) != 0) {
        PC_ERROR("checkpoint %" PRIu64 " table %s: bad settings", target->id, te->name);
        rc = PC_ECORRUPT;
    }
    ps_table_t *t = NULL;
    if (!rc)
        rc = ps_table_create(&cfg, &t);
    if (!rc && (rc = ps_catalog_attach(c->cat, t, true))) { /* cold rows: the restored tier */
        ps_table_destroy(t);
        t = NULL;
    }
    /* Apply base first; before each file the clock is where it was right after that file's
     * cut, so the file's ticks mean the same ages they meant when it was written. */
    for (size_t k = nc; !rc && k-- > 0;) {
        const link_t *l = &level[k][i];
        char path[PBUF + PS_TABLE_NAME_MAX + 8];
        ckpt_path(c, l->id, NAME_PUBLISHED, path, sizeof path);
        snprintf(path + strlen(path), sizeof path - strlen(path), "/t-%s.rows", te->name);
        if (l->cut + 1 > ps_table_clock(t))
            rc = ps_table_advance_clock(t, l->cut + 1);
        ps_rowfile_meta_t meta;
        rctx_t x = {.t = t, .meta = &meta, .name = te->name, .want = l};
        if (!rc)
            rc = ps_rowfile_read(path, &meta, on_restore_tombs, on_restore_rows, &x);
        if (!rc)
            rc = restore_check(&x); /* a file without rows or tombstones */
    }
    if (rc) {
        ps_catalog_discard(c->cat, t);
        return rc;
    }
    ps_table_set_version(t, te->version);
    ps_table_set_owner(t, te->owner);
    ps_table_raise_fence(t, te->fence);
    ps_table_track_removals(t);
    *out = t;
    return 0;
}

/* Verify every file of checkpoint `id`'s chains and rebuild its tables, then swap them in. */
static int restore_one(ps_ckpt_t *c, uint64_t id) {
    manifest_t m;
    int rc = manifest_read(c, id, &m);
    if (rc)
        return rc;
    const size_t cap = m.ntables ? m.ntables : 1;
    ps_table_t **tabs = CK_ALLOC(cap * sizeof *tabs);
    tstate_t *ts = CK_ALLOC(cap * sizeof *ts);
    uint32_t *nlinks = CK_ALLOC(cap * sizeof *nlinks);
    link_t *level[MAX_CHAIN + 1];
    size_t nlevels = 0;
    if (!tabs || !ts || !nlinks)
        rc = PC_ENOMEM;
    if (!rc) /* the row files' chains, verified before the tier's database is touched */
        rc = chains_of(c, &m, level, &nlevels, nlinks);
    if (!rc && m.has_cold) { /* the tier's database becomes the checkpoint's copy, then the
                              * tables are built (the cold ones attached to it) */
        char cold[PBUF + 8];
        ckpt_path(c, id, NAME_PUBLISHED, cold, sizeof cold);
        strncat(cold, "/" COLD_DIR, sizeof cold - strlen(cold) - 1);
        if (!c->tier) {
            PC_ERROR("checkpoint %" PRIu64 " has cold tables: restore it with a tier", id);
            rc = PC_EINVAL;
        }
        if (!rc)
            rc = cold_verify(cold, &m);
        if (!rc)
            rc = ps_tier_replace(c->tier, cold);
    }
    for (size_t i = 0; i < m.ntables && !rc; i++) {
        rc = restore_table(c, &m, &m.tables[i], level, i, nlinks[i], &tabs[i]);
        if (!rc) {
            ts[i].uid = ps_table_uid(tabs[i]);
            ts[i].cut = m.tables[i].cut;
            memcpy(ts[i].name, m.tables[i].name, sizeof ts[i].name);
        }
    }
    if (!rc) /* every install's room first: none fails midway for memory */
        rc = ps_catalog_reserve(c->cat, m.ntables);
    if (!rc) {
        for (size_t i = 0; i < m.ntables; i++) {
            int prc = ps_catalog_set(c->cat, tabs[i]); /* never a moment without the table */
            tabs[i] = NULL;
            if (prc && !rc) {
                PC_ERROR("restore %" PRIu64 ": table %s could not be installed (%s); the "
                         "catalog is partly restored",
                         id, m.tables[i].name, pc_strerror(prc));
                rc = prc;
            }
        }
    }
    if (!rc) {
        CK_FREE(c->ts, c->ts_cap * sizeof *c->ts);
        c->ts = ts;
        c->nts = m.ntables;
        c->ts_cap = cap;
        ts = NULL;
        c->last_id = id;
        c->since_full = m.since_full;
    }
    for (size_t i = 0; tabs && i < m.ntables; i++)
        ps_catalog_discard(c->cat, tabs[i]);
    chains_free(level, nlevels, m.ntables);
    CK_FREE(nlinks, cap * sizeof *nlinks);
    CK_FREE(tabs, cap * sizeof *tabs);
    CK_FREE(ts, cap * sizeof *ts);
    manifest_free(&m);
    return rc;
}

int ps_ckpt_restore(ps_ckpt_t *c, uint64_t id, uint64_t *restored) {
    if (id) {
        int rc = restore_one(c, id);
        if (!rc && restored)
            *restored = id;
        return rc;
    }
    uint64_t ids[4096];
    size_t n = 0;
    int rc = 0;
    /* A checkpoint that is gone while it is read (the writer's retention removed it: a serving
     * replica reads a training server's directory) is no damage: the directory is read again,
     * a few times at most, for the newer ones the writer published meanwhile. */
    for (int scans = 0, again = 1; again && scans < 8; scans++) {
        again = 0;
        if ((rc = scan_dir(c->dir, ids, 4096, &n, NULL, 0)))
            return rc;
        n = n < 4096 ? n : 4096;
        for (size_t i = n; i-- > 0;) {
            rc = restore_one(c, ids[i]);
            if (!rc) {
                PC_INFO("restored checkpoint %" PRIu64, ids[i]);
                if (restored)
                    *restored = ids[i];
                return 0;
            }
            if (rc != PC_ECORRUPT && rc != PC_ENOTFOUND)
                return rc; /* out of memory, I/O error: not a reason to go back in time */
            char p[PBUF];
            ckpt_path(c, ids[i], NAME_PUBLISHED, p, sizeof p);
            if (rc == PC_ENOTFOUND && access(p, F_OK) != 0 && c->read_only) {
                again = 1; /* removed meanwhile: the writer went on */
                break;
            }
            PC_WARN("checkpoint %" PRIu64 " does not restore (%s), trying an older one", ids[i],
                    pc_strerror(rc));
        }
    }
    /* A directory of damaged checkpoints is not an empty one, whatever was wrong with them (a
     * file missing answers PC_ENOTFOUND): the caller must not start empty tables over them. */
    return n ? PC_ECORRUPT : PC_ENOTFOUND;
}

int ps_ckpt_rollback(ps_ckpt_t *c, uint64_t id, uint64_t *restored) {
    if (c->read_only)
        return PC_ESTATE;
    const int rc = ps_ckpt_restore(c, id, restored);
    return !rc && id ? abandon_newer(c, id) : rc;
}

int ps_ckpt_list(const char *dir, ps_ckpt_entry_t *out, size_t cap, size_t *n) {
    uint64_t ids[4096];
    size_t cnt;
    int rc = scan_dir(dir, ids, 4096, &cnt, NULL, 0);
    if (rc)
        return rc;
    ps_ckpt_t tmp = {0};
    snprintf(tmp.dir, sizeof tmp.dir, "%s", dir);
    size_t k = 0;
    for (size_t i = 0; i < cnt && i < 4096; i++) {
        manifest_t m;
        if (manifest_read(&tmp, ids[i], &m))
            continue;
        if (k < cap) {
            ps_ckpt_entry_t *e = &out[k];
            *e = (ps_ckpt_entry_t){.id = m.id,
                                   .parent = m.parent,
                                   .incremental = m.incremental,
                                   .created_unix_ns = m.created,
                                   .tables = (uint32_t)m.ntables};
            for (size_t j = 0; j < m.ntables; j++) {
                e->rows += m.tables[j].rows;
                e->tombstones += m.tables[j].tombs;
                e->bytes += m.tables[j].bytes;
            }
        }
        k++;
        manifest_free(&m);
    }
    *n = k;
    return 0;
}

/* The row files of m's own entries are there with their manifest sizes (a cheap check; restore
 * verifies the checksums). */
static int files_present(const ps_ckpt_t *c, const manifest_t *m) {
    for (size_t i = 0; i < m->ntables; i++) {
        char path[PBUF + PS_TABLE_NAME_MAX + 8];
        struct stat st;
        ckpt_path(c, m->id, NAME_PUBLISHED, path, sizeof path);
        snprintf(path + strlen(path), sizeof path - strlen(path), "/t-%s.rows", m->tables[i].name);
        if (stat(path, &st) != 0 || (uint64_t)st.st_size != m->tables[i].bytes)
            return PC_ECORRUPT;
    }
    return 0;
}

int ps_ckpt_tables(const char *dir, uint64_t id, ps_ckpt_table_info_t *out, size_t cap, size_t *n) {
    if (!dir || !n || (cap && !out) || strlen(dir) >= sizeof((ps_ckpt_t *)0)->dir)
        return PC_EINVAL;
    ps_ckpt_t tmp = {0};
    snprintf(tmp.dir, sizeof tmp.dir, "%s", dir);
    uint64_t ids[4096];
    size_t cnt = 1;
    ids[0] = id;
    int rc = id ? 0 : scan_dir(dir, ids, 4096, &cnt, NULL, 0);
    if (rc)
        return rc;
    cnt = cnt < 4096 ? cnt : 4096;
    rc = PC_ENOTFOUND;
    for (size_t i = cnt; i-- > 0;) { /* id 0: the newest first, then older ones */
        manifest_t m;
        rc = manifest_read(&tmp, ids[i], &m);
        if (!rc && (rc = files_present(&tmp, &m)))
            manifest_free(&m);
        if (rc == PC_ENOTFOUND && id)
            return rc;
        if (rc == PC_ENOTFOUND || rc == PC_ECORRUPT)
            continue;
        if (rc)
            return rc;
        for (size_t j = 0; j < m.ntables && j < cap; j++) {
            ps_ckpt_table_info_t *e = &out[j];
            memset(e, 0, sizeof *e);
            snprintf(e->name, sizeof e->name, "%s", m.tables[j].name);
            snprintf(e->config, sizeof e->config, "%s", m.tables[j].config);
            e->uid = m.tables[j].uid;
            e->log_position = m.tables[j].log_position;
            e->rows = m.tables[j].rows;
            e->version = m.tables[j].version;
        }
        *n = m.ntables;
        manifest_free(&m);
        return 0;
    }
    return id ? rc : PC_ENOTFOUND;
}

/* ==== export / import ====================================================================== */

int ps_table_export(ps_table_t *t, ps_tier_t *tier, const char *path, bool with_state) {
    if (!t || !path)
        return PC_EINVAL;
    const bool cold = ps_table_config(t)->cold;
    if (cold && !(tier && ps_tier_attached(tier, t))) {
        PC_ERROR("export: cold table %s needs its tier", ps_table_config(t)->name);
        return PC_EINVAL;
    }
    char tmp[PBUF];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return PC_EINVAL;
    /* Cut the table and (frozen meanwhile) take a consistent view of its cold rows. */
    ps_tier_view_t *view = NULL;
    ps_snapshot_info_t info;
    if (cold)
        ps_table_cold_freeze(t, true);
    int rc = ps_table_snapshot_begin(t, false, &info);
    if (!rc && cold && (rc = ps_tier_view_open(tier, t, &view)))
        ps_table_snapshot_end(t, false);
    if (cold)
        ps_table_cold_freeze(t, false);
    if (rc)
        return rc;
    mtable_t e;
    rc = write_snapshot(t, &info, view, tmp, PS_SCAN_ALL, with_state, &e);
    ps_table_snapshot_end(t, false);
    ps_tier_view_close(view);
    if (!rc && rename(tmp, path) != 0)
        rc = PC_EIO;
    if (rc) {
        unlink(tmp);
        return rc;
    }
    return pc_fs_fsync_parent(path);
}

typedef struct ictx {
    ps_catalog_t *cat;
    const char *name;
    ps_rowfile_meta_t *meta;
    ps_table_t *t;
} ictx_t;

/* Create the table from the file's settings on first use. */
static int import_table(ictx_t *x) {
    if (x->t)
        return 0;
    ps_table_config_t cfg;
    ps_table_config_defaults(&cfg);
    char err[256];
    if (ps_table_config_parse(&cfg, x->meta->config, err, sizeof err)) {
        PC_ERROR("import: bad table settings in file: %s", err);
        return PC_ECORRUPT;
    }
    if (x->name && snprintf(cfg.name, sizeof cfg.name, "%s", x->name) >= (int)sizeof cfg.name)
        return PC_EINVAL;
    if (x->meta->flags & PS_ROWFILE_INCREMENTAL) {
        PC_ERROR("import: the file is an incremental checkpoint part, not a whole table");
        return PC_EINVAL;
    }
    int rc = ps_table_create(&cfg, &x->t);
    if (!rc && (rc = ps_catalog_attach(x->cat, x->t, false))) { /* cold tables: to the tier */
        ps_table_destroy(x->t);
        x->t = NULL;
    }
    if (!rc && (x->meta->dim != ps_table_dim(x->t) ||
                (x->meta->state_len && x->meta->state_len != ps_table_state_len(x->t))))
        rc = PC_ECORRUPT;
    if (!rc) /* ticks in the file are ages against the clock right after its cut */
        rc = ps_table_advance_clock(x->t, x->meta->cut_clock + 1);
    return rc;
}

static int on_import_tombs(void *ctx, const uint64_t *keys, size_t n) {
    (void)keys;
    (void)n;
    return import_table(ctx); /* refuses incremental files before anything is loaded */
}

static int on_import_rows(void *ctx, size_t n, const uint64_t *keys, const float *w, const float *s,
                          const uint16_t *ticks, const uint8_t *freqs) {
    ictx_t *x = ctx;
    int rc = import_table(x);
    return rc ? rc : ps_table_load(x->t, n, keys, w, s, ticks, freqs);
}

int ps_table_import(ps_catalog_t *cat, const char *path, const char *name) {
    if (!cat || !path)
        return PC_EINVAL;
    ps_rowfile_meta_t meta;
    ictx_t x = {.cat = cat, .name = name, .meta = &meta};
    int rc = ps_rowfile_read(path, &meta, on_import_tombs, on_import_rows, &x);
    if (!rc)
        rc = import_table(&x); /* a file without rows */
    if (rc) {
        ps_catalog_discard(cat, x.t);
        return rc;
    }
    return ps_catalog_put(cat, x.t);
}
