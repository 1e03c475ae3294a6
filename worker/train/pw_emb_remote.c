/* pw_emb_remote.c: the embedding store on the ps-servers (pw_emb.h), through libpsclient. Every
 * call is libpsclient's asynchronous one; the client's I/O thread runs the callbacks. */
#include "pw_emb.h"

#include "emberps/psclient.h"
#include "pc_alloc.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_log.h"
#include "pc_settings.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct remote {
    pw_emb_t base;
    psc_t *ps;
    char table[64];
    bool zero_rows;     /* the model starts its rows at zero (LR) */
    bool order_free;    /* the claim found the servers' table with PW_EMB_ORDER_FREE's settings */
    pthread_mutex_t mu; /* why */
    char why[1024];     /* the latest failure's detail (psc_wait_detail) */
} remote_t;

/* libpsclient's callback -> the store's (ctx: the caller's done and ctx). */
typedef struct call {
    remote_t *r;
    pw_emb_done_fn done;
    void *ctx;
} call_t;

/* Keep call id's failure detail (from its callback, or instead of psc_wait); its result. */
static int keep_why(remote_t *r, uint64_t id) {
    char why[sizeof r->why];
    const int rc = psc_wait_detail(r->ps, id, why, sizeof why);
    if (rc) {
        pthread_mutex_lock(&r->mu);
        memcpy(r->why, why, sizeof why);
        pthread_mutex_unlock(&r->mu);
    }
    return rc;
}

static void call_done(void *ctx, uint64_t id, int rc) {
    call_t c = *(call_t *)ctx;
    pc_sfree(ctx);
    if (rc)
        keep_why(c.r, id);
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
    *c = (call_t){r, done, ctx};
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
    uint64_t id;
    int rc =
        psc_lookup_async(r->ps, r->table, keys, n, (uint32_t)e->dim, rows, NULL, NULL, NULL, &id);
    return rc ? rc : keep_why(r, id);
}

static void r_error(pw_emb_t *e, char *buf, size_t cap) {
    remote_t *r = (remote_t *)e;
    pthread_mutex_lock(&r->mu);
    snprintf(buf, cap, "%s", r->why);
    pthread_mutex_unlock(&r->mu);
}

static uint64_t r_reconnects(pw_emb_t *e) {
    psc_stats_t st;
    psc_stats(((remote_t *)e)->ps, &st);
    return st.reconnects;
}

static uint64_t r_map_refreshes(pw_emb_t *e) {
    psc_stats_t st;
    psc_stats(((remote_t *)e)->ps, &st);
    return st.map_refreshes;
}

static uint64_t r_unclean_slots(pw_emb_t *e) {
    return psc_map_unclean_slots(((remote_t *)e)->ps);
}

static int r_ping(pw_emb_t *e, int timeout_ms, char *why, size_t cap) {
    remote_t *r = (remote_t *)e;
    why[0] = '\0';
    size_t n = 64; /* servers; asked again with room for all when the map has more */
    psc_server_health_t *h = NULL;
    int rc;
    do {
        pc_sfree(h);
        if (!(h = pc_scalloc(PC_MEM_OTHER, n, sizeof *h)))
            return PC_ENOMEM;
        rc = psc_health(r->ps, timeout_ms, h, n);
    } while (rc > 0 && (size_t)rc > n && (n = (size_t)rc));
    for (int i = 0; i < rc; i++)
        if (h[i].rc) {
            snprintf(why, cap, "%s: %s", h[i].addr,
                     h[i].message[0] ? h[i].message : pc_strerror(h[i].rc));
            rc = PC_EUNAVAIL;
            break;
        }
    pc_sfree(h);
    return rc < 0 ? rc : 0;
}

static uint64_t r_rows(pw_emb_t *e) {
    (void)e;
    return 0;
}

_Static_assert((int)PW_CLAIM_CHECK == (int)PSC_CLAIM_CHECK &&
                   (int)PW_CLAIM_WARM_START == (int)PSC_CLAIM_WARM_START &&
                   (int)PW_CLAIM_FRESH == (int)PSC_CLAIM_FRESH,
               "pw_claim_mode_t is libpsclient's");

static bool r_order_free(pw_emb_t *e) {
    return ((remote_t *)e)->order_free;
}

static int r_claim(pw_emb_t *e, const char *job, int mode, const char *expect, char *msg,
                   size_t cap) {
    remote_t *r = (remote_t *)e;
    psc_claim_t *cl = pc_smalloc(PC_MEM_OTHER, sizeof *cl);
    if (!cl)
        return PC_ENOMEM;
    char diff[512];
    int rc = psc_claim(r->ps, r->table, "", PSC_CLAIM_INSPECT, cl);
    if (rc) {
        snprintf(msg, cap, "table %s: %s", r->table, cl->message);
    } else if (cl->dim != (uint32_t)e->dim) {
        rc = PC_EDIM;
        snprintf(msg, cap,
                 "table %s on the servers has dim %u; this model needs rows of %d floats (--dim, "
                 "--model)",
                 r->table, cl->dim, e->dim);
    } else if (expect && pc_settings_list_diff(expect, cl->config, diff, sizeof diff)) {
        rc = PC_EINVAL;
        snprintf(msg, cap, "table %s on the servers does not match --table: %s", r->table, diff);
    }
    if (!rc)
        r->order_free = pc_settings_list_diff(PW_EMB_ORDER_FREE, cl->config, NULL, 0) == 0;
    if (!rc && r->zero_rows && pc_settings_list_diff("init=zeros", cl->config, NULL, 0))
        PC_WARN("train: table %s on the servers starts rows at random (no init=zeros); this model "
                "starts them at zero with --local: create the table with init=zeros to match",
                r->table);
    if (!rc && (rc = psc_claim(r->ps, r->table, job, mode, cl))) {
        snprintf(msg, cap, "table %s: %s", r->table,
                 cl->message[0] ? cl->message : psc_strerror(rc)); /* (refused before sending) */
    } else if (!rc) {
        static const char *const did[] = {"claimed", "continued", "warm-started", "reset", ""};
        PC_INFO("train: table %s %s for job %s (%" PRIu64 " rows%s%s): %s", r->table,
                did[cl->action < 5 ? cl->action : 4], job, cl->rows,
                cl->previous[0] ? " of job " : "", cl->previous, cl->config);
    }
    pc_sfree(cl);
    return rc;
}

static int r_fence(pw_emb_t *e, const char *job, uint32_t epoch, char *msg, size_t cap) {
    remote_t *r = (remote_t *)e;
    psc_claim_t *cl = pc_smalloc(PC_MEM_OTHER, sizeof *cl);
    if (!cl)
        return PC_ENOMEM;
    const int rc = psc_fence(r->ps, r->table, job, epoch, cl);
    if (rc)
        snprintf(msg, cap, "table %s: %s", r->table, cl->message);
    pc_sfree(cl);
    return rc;
}

static int r_watermark(pw_emb_t *e, pw_emb_mark_t *out, size_t cap, size_t *n, char *why,
                       size_t whycap) {
    remote_t *r = (remote_t *)e;
    if (why && whycap)
        why[0] = '\0';
    *n = 0;
    char *text = NULL;
    for (size_t len = psc_map_text(r->ps, NULL, 0), tries = 0;; tries++) {
        pc_sfree(text);
        if (!(text = pc_smalloc(PC_MEM_OTHER, len + 1)))
            return PC_ENOMEM;
        const size_t need = psc_map_text(r->ps, text, len + 1);
        if (need <= len)
            break;
        if (tries == 3) { /* a map growing under every look: the next watermark reads it */
            pc_sfree(text);
            return PC_EAGAIN;
        }
        len = need; /* a longer map came between the two looks: its text was cut */
    }
    pc_cluster_map_t *map = NULL;
    int rc = pc_cmap_parse(text, &map, why, whycap);
    pc_sfree(text);
    if (rc)
        return rc;
    const size_t ns = pc_cmap_nservers(map);
    pc_cmap_destroy(map);
    if (ns > cap)
        return PC_ETOOBIG;
    for (size_t i = 0; i < ns && !rc; i++) { /* cap 0: the bounds alone (no log is started) */
        psc_stream_req_t q = {.server = (uint32_t)i, .table = r->table, .dim = (uint32_t)e->dim};
        psc_stream_t st;
        if (!(rc = psc_deltas(r->ps, &q, &st, why, whycap)))
            out[i] = (pw_emb_mark_t){.uid = st.uid, .head = st.head};
    }
    *n = rc ? 0 : ns;
    return rc;
}

static size_t r_map_text(pw_emb_t *e, char *buf, size_t cap) {
    return psc_map_text(((remote_t *)e)->ps, buf, cap);
}

static void r_close(pw_emb_t *e) {
    psc_close(((remote_t *)e)->ps);
    pthread_mutex_destroy(&((remote_t *)e)->mu);
    pc_sfree(e);
}

static const pw_emb_ops_t k_remote = {.name = "remote",
                                      .pull_async = r_pull_async,
                                      .push_async = r_push_async,
                                      .lookup = r_lookup,
                                      .error = r_error,
                                      .reconnects = r_reconnects,
                                      .ping = r_ping,
                                      .rows = r_rows,
                                      .claim = r_claim,
                                      .fence = r_fence,
                                      .order_free = r_order_free,
                                      .watermark = r_watermark,
                                      .map_text = r_map_text,
                                      .map_refreshes = r_map_refreshes,
                                      .unclean_slots = r_unclean_slots,
                                      .close = r_close};

int pw_emb_remote_open(const pw_emb_opts_t *o, pw_emb_t **out) {
    if (!o->servers || !o->table || o->dim < 1)
        return PC_EINVAL;
    remote_t *r = pc_scalloc(PC_MEM_OTHER, 1, sizeof *r);
    if (!r)
        return PC_ENOMEM;
    r->base = (pw_emb_t){.ops = &k_remote, .dim = o->dim};
    snprintf(r->table, sizeof r->table, "%s", o->table);
    r->zero_rows = o->zero_rows;
    pthread_mutex_init(&r->mu, NULL);
    /* 10 retries, 10 ms doubling to 1.28 s (libpsclient's cap): 10 + 20 + ... + 1280 + 2 x 1280
     * = 5.1 s of refusals (pushes refused are not applied, so a retry is safe), past a slot
     * handover (at most 1 s, docs/server.md "Live resharding"), a lease lapsed through the
     * coordinator's election, and a failover (the lease, 2 s, and a tick) */
    psc_opts_t po = {
        .servers = o->servers, .token = o->token, .timeout_ms = o->timeout_ms, .retries = 10};
    psc_tls_opts_t tls = {.ca = o->tls_ca, .cert = o->tls_cert, .key = o->tls_key};
    char why[600];
    int rc = psc_connect2(&po, o->tls_ca && o->tls_ca[0] ? &tls : NULL, why, sizeof why, &r->ps);
    if (!rc && (rc = psc_set_wire_type(r->ps, o->wire_dtype)) != 0) {
        snprintf(why, sizeof why, "wire type %d: %s", o->wire_dtype, psc_strerror(rc));
        psc_close(r->ps);
    }
    if (rc) {
        PC_ERROR("train: cannot reach the servers (%s): %s", o->servers, why);
        pthread_mutex_destroy(&r->mu);
        pc_sfree(r);
        return rc;
    }
    if (o->wire_dtype != PSC_WIRE_F32)
        PC_INFO("train: rows and gradients travel as %s (--wire-dtype)",
                o->wire_dtype == PSC_WIRE_BF16 ? "bf16" : "f16");
    *out = &r->base;
    return 0;
}
