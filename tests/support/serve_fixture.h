/* serve_fixture.h: a served model's versions on disk, built in process with no server process,
 * for the tests of ps-serve's API (tests/unit/serve/test_serve_api.c, tests/fuzz/fuzz_serve_api.c).
 *
 * Two training servers are two catalogs holding a DLRM-shaped table (SF_TABLE, rows of SF_DIM),
 * keys split between them by an even 2-server cluster map (pc_cmap_key_owner), each with its own
 * checkpoint directory (ps_ckpt). A version (sf_version) is what a trainer's rank 0 writes at a
 * coordinated checkpoint: both servers checkpointed now, then DIR/step-<S>/ (pw_jobckpt_write)
 * with a DLRM model created from a card (seeded per version, so versions score differently),
 * the card, and a manifest naming both checkpoints, their directories and the map.
 *
 * DESIGN
 * - Deterministic: the Criteo lines (sf_line) and every row come from fixed seeds. The rows of
 *   most keys of the lines are loaded (about 1 in 5 is left out: the replica answers the table's
 *   initial row for it, as the training server would); a version may add rows for other keys
 *   (the row counts of versions differ, the lines' rows do not), so rows looked up in the
 *   fixture's catalogs now are the rows of every version.
 * - Failures abort (the fuzz target has no test framework): the fixture is not what is tested.
 *
 * Thread rule: one owner; sf_lookup may run on several threads once the versions are written.
 */
#ifndef SERVE_FIXTURE_H
#define SERVE_FIXTURE_H

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"
#include "pw_backend.h"
#include "pw_jobckpt.h"
#include "pw_model_card.h"
#include "pw_parse.h"

#define SF_TABLE  "emb"
#define SF_DIM    16
#define SF_NLINES 48
#define SF_BATCH  64 /* the card's max_batch, the replica's max_batch */

typedef struct sf {
    char root[64], versions[128], srv[2][128];
    char map[512];
    pc_cluster_map_t *cmap;
    ps_catalog_t *cat[2];
    ps_ckpt_t *ck[2];
    pw_model_card_t card;
    uint64_t rng;
    char lines[SF_NLINES][512];
} sf_t;

#define SF_CHECK(x)                                                                            \
    do {                                                                                       \
        int rc_ = (x);                                                                         \
        if (rc_) {                                                                             \
            fprintf(stderr, "serve_fixture: %s: %s (%s:%d)\n", #x, pc_strerror(rc_), __FILE__, \
                    __LINE__);                                                                 \
            abort();                                                                           \
        }                                                                                      \
    } while (0)

static inline uint64_t sf_rand(uint64_t *s) {
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}

static inline float sf_weight(uint64_t *s) {
    return (float)((double)(sf_rand(s) >> 11) * 0x1p-53 - 0.5) * 0.4f;
}

/* Criteo line i: a label, 13 counts (some empty), 26 categorical values from a small vocabulary
 * per field (some empty: the field's missing key). */
static inline void sf_line(size_t i, char *buf, size_t cap) {
    uint64_t r = 1000 + i;
    size_t len = (size_t)snprintf(buf, cap, "%d", (int)(sf_rand(&r) & 1));
    for (int d = 0; d < PW_CRITEO_DENSE; d++) {
        const uint64_t v = sf_rand(&r);
        if (v % 7 == 0)
            len += (size_t)snprintf(buf + len, cap - len, "\t");
        else
            len += (size_t)snprintf(buf + len, cap - len, "\t%d", (int)(v % 300) - 3);
    }
    for (int c = 0; c < PW_CRITEO_CAT; c++) {
        const uint64_t v = sf_rand(&r);
        if (v % 11 == 0)
            len += (size_t)snprintf(buf + len, cap - len, "\t");
        else
            len += (size_t)snprintf(buf + len, cap - len, "\t%08x", (unsigned)(v % 23) * 2654435u);
    }
}

/* Load a random row for each of keys[0..n) into its owner's catalog. */
static inline void sf_load_rows(sf_t *f, const uint64_t *keys, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float w[SF_DIM];
        for (int e = 0; e < SF_DIM; e++)
            w[e] = sf_weight(&f->rng);
        ps_catalog_t *c = f->cat[pc_cmap_key_owner(f->cmap, keys[i])];
        ps_table_t *t;
        SF_CHECK(ps_catalog_acquire(c, SF_TABLE, &t));
        SF_CHECK(ps_table_load(t, 1, &keys[i], w, NULL, NULL, NULL));
        ps_catalog_release(c, t);
    }
}

/* The training servers' rows of keys (ps_table_lookup's contract, found may be NULL). */
static inline void sf_lookup(sf_t *f, const uint64_t *keys, size_t n, float *rows, uint8_t *found) {
    for (size_t i = 0; i < n; i++) {
        ps_catalog_t *c = f->cat[pc_cmap_key_owner(f->cmap, keys[i])];
        ps_table_t *t;
        SF_CHECK(ps_catalog_acquire(c, SF_TABLE, &t));
        SF_CHECK(
            ps_table_lookup(t, &keys[i], 1, rows + i * SF_DIM, SF_DIM, found ? &found[i] : NULL));
        ps_catalog_release(c, t);
    }
}

/* The fixture in a fresh temporary directory: servers, rows, the model card; no version yet. */
static inline void sf_create(sf_t *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->root, sizeof f->root, "/tmp/sv_api.XXXXXX");
    if (!mkdtemp(f->root))
        abort();
    snprintf(f->versions, sizeof f->versions, "%s/versions", f->root);
    const char *addrs[2] = {"127.0.0.1:7400", "127.0.0.1:7401"};
    SF_CHECK(pc_cmap_create_even(1, 2, addrs, &f->cmap));
    if (pc_cmap_format(f->cmap, f->map, sizeof f->map) >= sizeof f->map)
        abort();
    f->rng = 42;
    for (int i = 0; i < 2; i++) {
        snprintf(f->srv[i], sizeof f->srv[i], "%s/server%d", f->root, i);
        SF_CHECK(ps_catalog_create(&f->cat[i]));
        ps_table_config_t c;
        ps_table_config_defaults(&c);
        SF_CHECK(ps_table_config_parse(&c, "name=" SF_TABLE ",dim=16,optimizer=adagrad,seed=11",
                                       NULL, 0));
        SF_CHECK(ps_catalog_add(f->cat[i], &c));
        ps_ckpt_opts_t o = {.dir = f->srv[i], .keep = 8, .full_every = 1};
        SF_CHECK(ps_ckpt_create(f->cat[i], &o, &f->ck[i]));
    }
    pw_sample_t *s = malloc(sizeof *s);
    if (!s)
        abort();
    char err[200];
    for (size_t i = 0; i < SF_NLINES; i++) {
        sf_line(i, f->lines[i], sizeof f->lines[i]);
        SF_CHECK(pw_parse_line(PW_FMT_CRITEO, NULL, f->lines[i], strlen(f->lines[i]), s, err,
                               sizeof err));
        uint64_t keys[PW_CRITEO_CAT];
        size_t n = 0;
        for (size_t j = 0; j < s->nkeys; j++)
            if (s->keys[j] % 5 != 0) /* the rest: never trained, the initial row */
                keys[n++] = s->keys[j];
        sf_load_rows(f, keys, n);
    }
    free(s);
    pw_train_config_t tc;
    pw_train_config_defaults(&tc);
    snprintf(tc.model, sizeof tc.model, "dlrm");
    tc.dim = SF_DIM;
    tc.batch = SF_BATCH;
    snprintf(tc.table_name, sizeof tc.table_name, SF_TABLE);
    SF_CHECK(pw_model_card_from_config(&tc, PW_FMT_CRITEO, &f->card));
}

/* Version `step`: `extra` rows for new keys, both servers checkpointed, then step-<S>/ with a
 * model of weights from `seed`. */
static inline void sf_version(sf_t *f, uint64_t step, uint64_t seed, size_t extra) {
    for (size_t i = 0; i < extra; i++) {
        const uint64_t k = sf_rand(&f->rng);
        sf_load_rows(f, &k, 1);
    }
    pw_jobckpt_t *ck = calloc(1, sizeof *ck);
    if (!ck)
        abort();
    ck->step = step;
    ck->nservers = 2;
    for (int i = 0; i < 2; i++) {
        ps_ckpt_result_t res;
        SF_CHECK(ps_ckpt_write(f->ck[i], &res));
        ck->servers[i] = res.id;
        SF_CHECK(pw_jobckpt_server_dir_set(ck, (size_t)i, f->srv[i]));
    }
    snprintf(ck->map, sizeof ck->map, "%s", f->map);
    pw_model_card_t card = f->card;
    card.model.seed = seed;
    pw_model_t *m;
    SF_CHECK(pw_model_create(&card.model, pw_backend_cpu(), &m));
    const float state[1] = {0};
    SF_CHECK(pw_jobckpt_write(f->versions, ck, state, 1, m, &card, 16));
    pw_model_destroy(m);
    free(ck);
}

/* The path of a file of version `step`. */
static inline void sf_version_file(const sf_t *f, uint64_t step, const char *name, char *buf,
                                   size_t cap) {
    snprintf(buf, cap, "%s/step-%020" PRIu64 "/%s", f->versions, step, name);
}

static inline void sf_destroy(sf_t *f) {
    for (int i = 0; i < 2; i++) {
        ps_ckpt_destroy(f->ck[i]);
        ps_catalog_destroy(f->cat[i]);
    }
    pc_cmap_destroy(f->cmap);
    if (f->root[0])
        pc_fs_rm_tree(f->root);
    memset(f, 0, sizeof *f);
}

#endif
