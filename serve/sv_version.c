/* sv_version.c: see sv_version.h. Directory scans by name (dense-<20 digits>, step-<digits>),
 * the watermark's text lines, and the versions' manifests through pw_jobckpt.h (the one reader
 * of the format the trainer writes). */
#include "sv_version.h"

#include "pc_error.h"
#include "pc_fs.h"
#include "pw_jobckpt.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* dir/sub/file exists as a regular file. */
static bool has_file(const char *dir, const char *sub, const char *file) {
    char p[SV_PATH_MAX * 2];
    snprintf(p, sizeof p, "%s/%s/%s", dir, sub, file);
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

sv_dir_id_t sv_dir_id(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0)
        return (sv_dir_id_t){0};
    return (sv_dir_id_t){.dev = (uint64_t)st.st_dev,
                         .ino = (uint64_t)st.st_ino,
                         .ctime_ns = (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec};
}

bool sv_dir_id_same(sv_dir_id_t a, sv_dir_id_t b) {
    return a.ino && a.ino == b.ino && a.dev == b.dev && a.ctime_ns == b.ctime_ns;
}

int sv_published_newest(const char *dir, uint64_t after, char *path, size_t cap, uint64_t *step) {
    uint64_t *v;
    const size_t n = pc_fs_numbered(dir, "dense-", &v);
    int rc = PC_ENOTFOUND;
    for (size_t i = n; i > 0 && v[i - 1] > after && rc; i--) {
        char sub[40];
        snprintf(sub, sizeof sub, "dense-%020" PRIu64, v[i - 1]);
        if (has_file(dir, sub, "watermark")) { /* written last but for the rename */
            snprintf(path, cap, "%s/%s", dir, sub);
            *step = v[i - 1];
            rc = 0;
        }
    }
    free(v);
    return rc;
}

bool sv_published_has(const char *dir, uint64_t step) {
    char sub[40];
    snprintf(sub, sizeof sub, "dense-%020" PRIu64, step);
    return has_file(dir, sub, "watermark");
}

void sv_watermark_free(sv_watermark_t *w) {
    free(w->uid);
    free(w->head);
    memset(w, 0, sizeof *w);
}

int sv_watermark_read(const char *dir, sv_watermark_t *w, char *why, size_t cap) {
    memset(w, 0, sizeof *w);
    char path[SV_PATH_MAX + 16], *text = NULL;
    snprintf(path, sizeof path, "%s/watermark", dir);
    int rc = pc_fs_read_all(path, 1u << 20, &text, NULL);
    if (rc) {
        snprintf(why, cap, "%s: %s", path, pc_strerror(rc));
        return rc;
    }
    size_t capn = 0, ln = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); !rc && line;
         line = strtok_r(NULL, "\n", &save)) {
        ln++;
        unsigned i;
        uint64_t uid, head;
        int used = 0;
        if (ln == 1) {
            if (strcmp(line, "emberps-watermark 1") != 0)
                rc = PC_EPARSE;
        } else if (strncmp(line, "table ", 6) == 0) {
            snprintf(w->table, sizeof w->table, "%s", line + 6);
        } else if (sscanf(line, "server %u %" SCNu64 " %" SCNu64 "%n", &i, &uid, &head, &used) ==
                       3 &&
                   !line[used] && i == w->n) {
            if (w->n == capn) {
                capn = capn ? 2 * capn : 16;
                uint64_t *u = realloc(w->uid, capn * sizeof *u), *h;
                if (u)
                    w->uid = u;
                if (!u || !(h = realloc(w->head, capn * sizeof *h))) {
                    rc = PC_ENOMEM;
                    break;
                }
                w->head = h;
            }
            w->uid[w->n] = uid;
            w->head[w->n++] = head;
        } else {
            rc = PC_EPARSE;
        }
        if (rc == PC_EPARSE)
            snprintf(why, cap, "%s: line %zu is not a watermark line", path, ln);
    }
    if (!rc && !w->table[0]) {
        snprintf(why, cap, "%s: no table line", path);
        rc = PC_EPARSE;
    }
    free(text);
    if (rc)
        sv_watermark_free(w);
    return rc;
}

/* ---- versions ---------------------------------------------------------------------------------
 */
size_t sv_versions_list(const char *dir, uint64_t *steps, uint64_t *created_ns, size_t cap) {
    uint64_t *all;
    const size_t na = pc_fs_numbered(dir, "step-", &all);
    size_t n = 0;
    for (size_t i = 0; i < na; i++) {
        char sub[40];
        snprintf(sub, sizeof sub, "step-%020" PRIu64, all[i]);
        if (!has_file(dir, sub, "model") || !has_file(dir, sub, "card") ||
            !has_file(dir, sub, "manifest"))
            continue;
        if (n < cap) {
            steps[n] = all[i];
            if (created_ns) {
                char p[SV_PATH_MAX + 64];
                snprintf(p, sizeof p, "%s/%s/manifest", dir, sub);
                struct stat st;
                created_ns[n] = stat(p, &st) == 0 ? (uint64_t)st.st_mtim.tv_sec * 1000000000u +
                                                        (uint64_t)st.st_mtim.tv_nsec
                                                  : 0;
            }
        }
        n++;
    }
    free(all);
    return n;
}

void sv_version_free(sv_version_t *v) {
    free(v->map);
    for (size_t i = 0; v->ckpt_dirs && i < v->nservers; i++)
        free(v->ckpt_dirs[i]);
    free(v->ckpt_dirs);
    free(v->ckpt_ids);
    memset(v, 0, sizeof *v);
}

bool sv_version_replaced(const sv_version_t *v) {
    return !sv_dir_id_same(v->id, sv_dir_id(v->dir));
}

int sv_version_read(const char *dir, uint64_t step, sv_version_t *v, char *why, size_t cap) {
    memset(v, 0, sizeof *v);
    if (!step) {
        uint64_t *all = NULL;
        size_t n = sv_versions_list(dir, NULL, NULL, 0);
        if (n && (all = calloc(n, sizeof *all)))
            n = sv_versions_list(dir, all, NULL, n);
        step = n && all ? all[n - 1] : 0;
        free(all);
        if (!step) {
            snprintf(why, cap, "%s holds no version (step-S/ with model, card, manifest)", dir);
            return PC_ENOTFOUND;
        }
    }
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    if (!ck)
        return PC_ENOMEM;
    snprintf(v->dir, sizeof v->dir, "%s/step-%020" PRIu64, dir, step);
    v->id = sv_dir_id(v->dir); /* before the manifest: a replacement after it shows */
    int rc = pw_jobckpt_read(dir, step, ck, NULL, 0);
    if (rc) {
        snprintf(why, cap, "version %" PRIu64 " of %s: %s", step, dir,
                 rc == PC_ENOTFOUND ? "no such version" : pc_strerror(rc));
        free(ck);
        return rc;
    }
    v->step = step;
    v->nservers = ck->nservers;
    v->ckpt_ids = calloc(ck->nservers ? ck->nservers : 1, sizeof *v->ckpt_ids);
    v->ckpt_dirs = calloc(ck->nservers ? ck->nservers : 1, sizeof *v->ckpt_dirs);
    rc = v->ckpt_ids && v->ckpt_dirs ? 0 : PC_ENOMEM;
    for (size_t i = 0; !rc && i < ck->nservers; i++) {
        const char *d = pw_jobckpt_server_dir(ck, i);
        v->ckpt_ids[i] = ck->servers[i];
        if (!d[0]) {
            snprintf(why, cap,
                     "version %" PRIu64 ": server %zu's checkpoint directory is not recorded "
                     "(a checkpoint of an older trainer, or a server that did not say)",
                     step, i);
            rc = PC_ECORRUPT;
        } else if (!(v->ckpt_dirs[i] = strdup(d))) {
            rc = PC_ENOMEM;
        }
    }
    const char *map = rc ? "" : ck->map;
    if (!rc && map[0] && !(v->map = strdup(map)))
        rc = PC_ENOMEM;
    free(ck);
    if (rc)
        sv_version_free(v);
    return rc;
}
