/* pw_emb_local.c: the embedding store in process (pw_emb.h) for `ps-worker --local`: one
 * ps_table with the server's optimizers, so local training updates rows exactly as a server
 * would. Calls end before they return (synchronous); the callbacks run in the caller. The only
 * worker file that includes server headers: it lives in its own library (ember_worker_local). */
#include "pw_emb.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_log.h"
#include "ps_ckpt.h"
#include "pc_settings.h"
#include "ps_table.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct local {
    pw_emb_t base;
    ps_table_t *t;
    bool order_free; /* its config has PW_EMB_ORDER_FREE's settings */
} local_t;

static int l_pull_async(pw_emb_t *e, const uint64_t *keys, size_t n, float *rows,
                        pw_emb_done_fn done, void *ctx) {
    done(ctx, ps_table_pull(((local_t *)e)->t, keys, n, rows, n * (size_t)e->dim));
    return 0;
}

static int l_push_async(pw_emb_t *e, const uint64_t *keys, size_t n, const float *grads,
                        pw_emb_done_fn done, void *ctx) {
    ps_push_result_t pr;
    done(ctx, ps_table_push(((local_t *)e)->t, keys, n, grads, n * (size_t)e->dim, &pr));
    return 0;
}

static int l_lookup(pw_emb_t *e, const uint64_t *keys, size_t n, float *rows) {
    return ps_table_lookup(((local_t *)e)->t, keys, n, rows, n * (size_t)e->dim, NULL);
}

static uint64_t l_reconnects(pw_emb_t *e) {
    (void)e;
    return 0;
}

static bool l_order_free(pw_emb_t *e) {
    return ((local_t *)e)->order_free;
}

static uint64_t l_rows(pw_emb_t *e) {
    return ps_table_count(((local_t *)e)->t);
}

static int l_export(pw_emb_t *e, const char *path) {
    return ps_table_export(((local_t *)e)->t, NULL, path, true);
}

static void l_close(pw_emb_t *e) {
    ps_table_destroy(((local_t *)e)->t);
    pc_sfree(e);
}

static const pw_emb_ops_t k_local = {.name = "local",
                                     .synchronous = true,
                                     .pull_async = l_pull_async,
                                     .push_async = l_push_async,
                                     .lookup = l_lookup,
                                     .reconnects = l_reconnects,
                                     .order_free = l_order_free,
                                     .rows = l_rows,
                                     .export_rows = l_export,
                                     .close = l_close};

int pw_emb_local_open(const pw_emb_opts_t *o, pw_emb_t **out) {
    if (o->dim < 1)
        return PC_EINVAL;
    ps_table_config_t tc;
    char spec[600], err[256];
    ps_table_config_defaults(&tc);
    snprintf(spec, sizeof spec, "name=emb,dim=%d,seed=%llu,%s", o->dim, (unsigned long long)o->seed,
             o->table_spec ? o->table_spec : "");
    if (ps_table_config_parse(&tc, spec, err, sizeof err)) {
        PC_ERROR("train: table settings: %s", err);
        return PC_EINVAL;
    }
    if (tc.dim != o->dim) { /* a later key wins: --table=dim=N would have overridden the model's */
        PC_ERROR("train: table settings: dim=%d, but the model's rows are %d wide (--dim, or the "
                 "model's row width): leave dim out of --table",
                 (int)tc.dim, o->dim);
        return PC_EDIM;
    }
    if (o->zero_rows)
        tc.init = PS_INIT_ZEROS;
    local_t *l = pc_scalloc(PC_MEM_OTHER, 1, sizeof *l);
    if (!l)
        return PC_ENOMEM;
    l->base = (pw_emb_t){.ops = &k_local, .dim = o->dim};
    char cfg[2048];
    ps_table_config_format(&tc, cfg, sizeof cfg);
    l->order_free = pc_settings_list_diff(PW_EMB_ORDER_FREE, cfg, NULL, 0) == 0;
    int rc = ps_table_create(&tc, &l->t);
    if (rc) {
        pc_sfree(l);
        return rc;
    }
    *out = &l->base;
    return 0;
}
