/* pw_emb_remote.c: the embedding store on the ps-servers (pw_emb.h), through libpsclient. Every
 * call is libpsclient's asynchronous one; the client's I/O thread runs the callbacks. */
#include "pw_emb.h"

#include "emberps/psclient.h"
#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_log.h"

#include <stdio.h>
#include <stdlib.h>

typedef struct remote {
    pw_emb_t base;
    psc_t *ps;
    char table[64];
} remote_t;

/* libpsclient's callback -> the store's (ctx: the caller's done and ctx). */
typedef struct call {
    pw_emb_done_fn done;
    void *ctx;
} call_t;

static void call_done(void *ctx, uint64_t id, int rc) {
    (void)id;
    call_t c = *(call_t *)ctx;
    pc_sfree(ctx);
    c.done(c.ctx, rc);
}

/* Start a pull (into rows) or, with grads, a push of n keys; done(ctx, rc) comes from the
 * client's I/O thread. */
static int start(pw_emb_t *e, const uint64_t *keys, size_t n, float *rows, const float *grads,
                 pw_emb_done_fn done, void *ctx) {
    remote_t *r = (remote_t *)e;
    call_t *c = pc_smalloc(PC_MEM_OTHER, sizeof *c);
    if (!c)
        return PC_ENOMEM;
    *c = (call_t){done, ctx};
    const uint32_t dim = (uint32_t)e->dim;
    uint64_t id;
    int rc = grads ? psc_push_async(r->ps, r->table, keys, n, dim, grads, NULL, call_done, c, &id)
                   : psc_pull_async(r->ps, r->table, keys, n, dim, rows, call_done, c, &id);
    if (rc)
        pc_sfree(c);
    return rc;
}

static int r_pull_async(pw_emb_t *e, const uint64_t *keys, size_t n, float *rows,
                        pw_emb_done_fn done, void *ctx) {
    return start(e, keys, n, rows, NULL, done, ctx);
}

static int r_push_async(pw_emb_t *e, const uint64_t *keys, size_t n, const float *grads,
                        pw_emb_done_fn done, void *ctx) {
    return start(e, keys, n, NULL, grads, done, ctx);
}

static int r_lookup(pw_emb_t *e, const uint64_t *keys, size_t n, float *rows) {
    remote_t *r = (remote_t *)e;
    return psc_lookup(r->ps, r->table, keys, n, (uint32_t)e->dim, rows, NULL);
}

static uint64_t r_reconnects(pw_emb_t *e) {
    psc_stats_t st;
    psc_stats(((remote_t *)e)->ps, &st);
    return st.reconnects;
}

static uint64_t r_rows(pw_emb_t *e) {
    (void)e;
    return 0;
}

static void r_close(pw_emb_t *e) {
    psc_close(((remote_t *)e)->ps);
    pc_sfree(e);
}

static const pw_emb_ops_t k_remote = {.name = "remote",
                                      .pull_async = r_pull_async,
                                      .push_async = r_push_async,
                                      .lookup = r_lookup,
                                      .reconnects = r_reconnects,
                                      .rows = r_rows,
                                      .close = r_close};

int pw_emb_remote_open(const pw_emb_opts_t *o, pw_emb_t **out) {
    if (!o->servers || !o->table || o->dim < 1)
        return PC_EINVAL;
    remote_t *r = pc_scalloc(PC_MEM_OTHER, 1, sizeof *r);
    if (!r)
        return PC_ENOMEM;
    r->base = (pw_emb_t){.ops = &k_remote, .dim = o->dim};
    snprintf(r->table, sizeof r->table, "%s", o->table);
    psc_opts_t po = {.servers = o->servers, .timeout_ms = o->timeout_ms};
    int rc = psc_connect(&po, &r->ps);
    if (rc) {
        PC_ERROR("train: cannot reach the servers (%s): %s", o->servers, pc_strerror(rc));
        pc_sfree(r);
        return rc;
    }
    *out = &r->base;
    return 0;
}
