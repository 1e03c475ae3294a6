/* psclient.c: libpsclient (see emberps/psclient.h; wire format in pc_wire.h, docs/wire.md).
 *
 * DESIGN
 * One I/O thread runs a libuv loop that owns every connection, part and timer. Callers hand
 * calls over through a mutex-protected queue and a uv_async wake-up, and wait (psc_wait) first
 * yielding the CPU for up to WAIT_SPIN_NS, then on a condition variable. While a caller yields,
 * the I/O thread polls its loop (yielding between polls) instead of sleeping in epoll, so an
 * answer needs no wake-up of a sleeping thread: on one core shared by both threads that wake-up
 * cost a 26-key lookup ~40 us, as much as the loopback round trip itself. A call is split into
 * parts, one per server owning some of its keys (positions kept
 * in `idx`, so replies scatter back into the caller's order). A server sends at most
 * max_inflight parts at once; the rest wait in its queue. Parts that fail transiently (server
 * unreachable, PC_EUNAVAIL, PC_EWRONGSLOT) collect their positions in the call's retry set; when
 * the call's last part is back, the retry set is re-split under the current map after a backoff
 * (10 ms doubling), up to `retries` times; at once, and not counted, when the client's map is
 * newer than the one the parts went out under (the keys have new owners). A push part whose
 * connection broke after it was sent is not retried (it may have been applied): the call fails with
 * PC_EUNAVAIL. Maps: the client adopts a newer map from a HELLO, a wrong slot's reply, or a MAP
 * answer; it asks for one (MAP) when a server is lost (its other servers: map_ask_others, which
 * connects to them when none is connected) and when any reply's
 * header names a map version newer than its own (that server), so a client whose calls never meet a
 * wrong slot (a delta-stream follower) still learns of a failover or a resharding. A call ends
 * exactly once (result, error, deadline or close); parts still out after that resolve without
 * touching the caller's buffers, and the call is freed when none is left and its result has been
 * taken (callback run or psc_wait returned). Replies: a reply is read into its server's body buffer
 * (kept between replies), except the rows of a PULL or LOOKUP part whose positions in the call are
 * consecutive (any call to one server): those are read straight into the caller's array
 * (direct_start), with no copy; plain_buf checks before every read that the call has not ended (it
 * may, by deadline, between two reads of one body) and sends the rest into the body buffer if it
 * has. The same object file goes into libpsclient.a (the project's programs) and libpsclient.so
 * (for outside users and bindings): compiled with hidden visibility, it exports what psclient.h
 * marks PSC_EXTERN; the shared library's version script (psclient.map) hides ember_common's pc_*.
 * TLS (psc_connect2, pc_tls.h): the context is made by psc_connect2 on the caller's thread
 * before the I/O thread starts, and freed by psc_close after it ended; every session lives on the
 * I/O thread only. A TLS connection reads the socket straight into its session (pc_tls_inbuf),
 * and reads the plaintext into the same header and body buffers a plain connection
 * reads into (plain_buf), handled by the same code (input). It counts as connected (state 2)
 * only once its handshake is done: HELLO and the queued parts go out then. Frames are
 * encrypted as they are sent (send_frame, pc_tls_seal), each frame's ciphertext one write. A failed
 * handshake marks the server dead with PC_ETLS (a verify failure does not heal by retrying), and
 * a failure before the HELLO answer is psc_connect's result with its reason (connect_why) once
 * no other server it waits for is still to answer (connect_check: an answer may bring a newer map
 * in which the failed server has no role, a dead one a failover left listed, which is no error).
 * Compressed rows (psc_set_wire_type, docs/wire.md): a call takes the client's wire type when it
 * starts. Its parts' gradients are converted from the caller's fp32 as the frame is built, and
 * rows in bf16/f16 are read into the server's body buffer (never straight into the caller's
 * array) and converted into the caller's positions by pc_half.h's fastest kernels. A reply must
 * carry the type asked for; a server of wire v1 refuses a typed batch with PC_EINVAL ("malformed
 * batch"), which the client reports as PC_EUNSUPPORTED naming the type.
 * Dead servers: every connection is watched by the kernel (pc_wire_watch_peer, dead_peer_ms): a
 * server that stops acknowledging (its host lost power, a cut that drops packets) ends its
 * connection within twice the call timeout, as a lost connection.
 */
#include "emberps/psclient.h"
#include "psclient_repl.h"

#include "pc_alloc.h"
#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_feature.h"
#include "pc_half.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pc_tls.h"
#include "pc_wire.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define MAX_REPLY         (1u << 31) /* bytes of one reply body the client accepts */
#define BACKOFF_MS        10
#define BACKOFF_DOUBLINGS 7           /* the backoff grows to 1.28 s at most */
#define MAP_ASK_NS        50000000ull /* map_ask_others: at most every 50 ms */
/* ... and its connections to the map's other servers at most every second (see there) */
#define MAP_CONNECT_NS 1000000000ull
/* map_ask_newer: at most every 10 ms (a resharding writes a version a controller tick, 20 ms:
 * a follower sees each) */
#define MAP_NEWER_NS     10000000ull
#define RECONNECT_MAX    8           /* connection attempts per server before its parts fail */
#define WAIT_SPIN_NS     200000L     /* psc_wait yields this long before sleeping */
#define DEAD_PEER_MIN_MS 2000u       /* dead_peer_ms at least */
#define BODY_KEEP        (16u << 20) /* a server's reply buffer is kept for the next reply up to this */
#define PSC_WHY_MAX      (PC_ADDR_MAX + PC_WIRE_MSG_MAX + 96) /* a call's failure detail */

#define STR_(x)        #x
#define STR(x)         STR_(x)
#define VERSION_STRING STR(PSC_VERSION_MAJOR) "." STR(PSC_VERSION_MINOR) "." STR(PSC_VERSION_PATCH)

_Static_assert(PSC_WIRE_F32 == (int)PC_WIRE_F32 && PSC_WIRE_BF16 == (int)PC_WIRE_BF16 &&
                   PSC_WIRE_F16 == (int)PC_WIRE_F16,
               "psclient.h's wire types are pc_wire.h's");

typedef struct call call_t;
typedef struct server server_t;

typedef struct part {
    call_t *call;
    server_t *srv;
    uint32_t n;
    uint32_t *idx;   /* positions in the call */
    uint64_t fid;    /* frame id once sent */
    uint64_t t_sent; /* when (PING: its round trip) */
    uint32_t sidx;   /* the server's index in the map the call was split under */
    bool sent;
    struct part *next;
} part_t;

struct call {
    uint64_t id;
    uint8_t op;
    uint8_t dtype; /* PULL, PUSH, LOOKUP: pc_wire_dtype_t of rows and gradients on the wire */
    char table[PC_WIRE_NAME_MAX + 1];
    const uint64_t *keys;
    size_t n;
    uint32_t dim;
    float *rows;
    const float *grads;
    uint8_t *found;
    psc_push_result_t *res;
    psc_push_result_t acc;
    const char *job; /* CLAIM: the job, mode (and a fence's epoch) and the caller's result */
    int mode;
    uint32_t epoch; /* CLAIM of PSC_CLAIM_FENCE: its epoch; PUSH: the client's (psc_fence) */
    psc_claim_t *claim;
    bool claimed; /* CLAIM: a server's reply is in *claim */
    char *text;   /* TABLES: the caller's buffer (text_cap bytes), *text_len bytes in it */
    size_t text_cap, *text_len;
    bool listed;                 /* TABLES: a server's list is in text */
    psc_server_health_t *health; /* PING (psc_health): a result per server, health_cap of them */
    size_t health_cap, *nhealth; /* (the caller's, as the buffers: written until the call ends) */
    int timeout_ms;              /* 0: the client's */
    int target; /* DELTAS, SCAN: the one server asked (its map index); -1: by keys, or all */
    const psc_stream_req_t *stream; /* DELTAS, SCAN: the caller's request, and its result */
    uint32_t stream_flags;          /* PC_STREAM_* (psclient_repl.h) */
    uint64_t stream_map;            /* PC_STREAM_SAME_MAP: the header's map version */
    uint64_t stream_start;          /* PC_STREAM_COLD: the page's first key */
    psc_stream_t *stream_out;
    psc_done_fn done;
    void *ctx;
    int rc, attempts;  /* attempts: rounds with a transient failure other than a wrong slot */
    int slot_rounds;   /* rounds refused for wrong slots only, under no newer map (backoff) */
    bool other_failed; /* this round: a part failed transiently, not for a wrong slot */
    uint64_t map_sent; /* the map version its parts were last split under */
    bool why_final;    /* why explains rc (else: the latest transient failure, or nothing) */
    char why[PSC_WHY_MAX];
    uint32_t parts_left;
    uint32_t *retry; /* positions to send again */
    size_t nretry, retry_cap;
    bool started, consumed;
    atomic_bool finished; /* written by the I/O thread under mu; waiters may poll it */
    int timers_open;
    uv_timer_t deadline, backoff;
    struct call *next_live, *next_submit;
};

struct server {
    psc_t *c;
    char addr[PC_ADDR_MAX];
    uv_tcp_t tcp;
    uv_connect_t creq;
    int state; /* 0 closed, 1 connecting, 2 connected, 3 closing (server_drop) */
    bool dead, hello_done, was_connected;
    /* Connect phase: this server's HELLO answer is still to come (hello_wait: a server of the map
     * psc_connect was given; connect_check counts those with a role in the newest map), then its
     * result (hello_rc, 0 or why in hello_why). */
    bool hello_wait;
    int hello_rc;
    char hello_why[PC_WIRE_MSG_MAX];
    int dead_rc;   /* why dead: PC_EAUTH or PC_EINVAL (HELLO refused), PC_ETLS (handshake),
                    * PC_EINVAL (not an IPv4 address); s->msg says more */
    pc_tls_t *tls; /* TLS: this connection's session (I/O thread) */
    int failures;
    uint64_t down_ns; /* since when connecting fails (0: it did not, or it answered since) */
    char msg[PC_WIRE_MSG_MAX]; /* the failure part_done is told about, set just before */
    part_t *qhead, *qtail, *inflight;
    int ninflight;
    uint8_t hdr[PC_WIRE_HDR];
    size_t hdr_have;
    pc_wire_hdr_t h;
    uint8_t *body; /* the reply's body (body_cap bytes, kept between replies) */
    size_t body_cap, body_have;
    part_t *cur;     /* the part whose rows are read straight into the caller's (direct) */
    uint8_t *direct; /* where body bytes [0, direct_len) go instead of body (or NULL) */
    size_t direct_len;
    struct server *next_all;
};

struct psc {
    psc_opts_t o;
    char token[256];
    pthread_t thread;
    uv_loop_t loop;
    uv_async_t wake;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    call_t *live, *submit_head, *submit_tail;
    atomic_bool stopping;    /* set under mu (ordering with submissions), read anywhere */
    bool unmapped_due;       /* a refresh may have left servers out: close_unmapped at the next wake
                              * (I/O thread; not inside the read callback that brought the map) */
    atomic_int spinners;     /* callers yielding in psc_wait now: the I/O thread polls (io_main) */
    int waiters;             /* callers inside psc_wait (mu): psc_close frees after they left */
    atomic_int wire;         /* PSC_WIRE_*: the element type new calls use (psc_set_wire_type) */
    atomic_uint push_epoch;  /* the generation epoch new pushes carry (psc_fence; 0: none) */
    pc_cluster_map_t *map;   /* I/O thread; map_text under mu for readers */
    uint64_t map_asked_ns;   /* when the other servers were last asked for their map */
    uint64_t map_connect_ns; /* when map_ask_others last connected to them */
    uint64_t newer_asked_ns; /* when a server was last asked for a newer map it named */
    char *map_text;
    server_t **srv; /* by map index */
    size_t nsrv;
    long sole;     /* the index of the server owning every slot of map, or -1 */
    server_t *all; /* every server object, also those left by a map change */
    atomic_uint_least64_t next_id, next_fid;
    atomic_uint_least64_t calls, retries, refreshes, reconnects, timeouts;
    atomic_uint_least64_t unclean; /* the current map's pc_cmap_unclean (psc_map_unclean_slots) */
    int hello_pending;             /* servers psc_connect still waits for (connect_check) */
    bool connect_phase;            /* psc_connect waits: connect_check decides */
    bool connect_done;             /* it decided (connect_rc) */
    int connect_rc;
    char connect_why[PSC_WHY_MAX]; /* why connect_rc, "<addr>: <message>" (under mu) */
    bool placeholder;              /* the map is a stand-in until a server sends its own */
    pc_tls_ctx_t *tls;             /* NULL: plain TCP */
    char tls_name[256];            /* the name servers' certificates carry ("": their address) */
};

static void call_finish(psc_t *c, call_t *k, int rc);
static void close_unmapped(psc_t *c);
static void server_pump(server_t *s);
static void call_dispatch(psc_t *c, call_t *k, const uint32_t *idx, size_t n);
static void on_backoff(uv_timer_t *t);

/* Whether server s has a role in the current map (the placeholder's one server does). I/O
 * thread. */
static bool has_role_now(const psc_t *c, const server_t *s) {
    if (c->placeholder)
        return true;
    const int i = c->map ? pc_cmap_find(c->map, s->addr) : -1;
    return i >= 0 && pc_cmap_has_role(c->map, (uint32_t)i);
}

/* The connect phase's decision (I/O thread, or before it starts; caller holds mu): done once no
 * server it waits for that has a role in the newest map still waits for its HELLO answer; then the
 * first of those that failed is the connect's error. A failure is not decided on at once: a dead
 * server a failover left in the caller's map (with its old role) answers first, and another
 * server's answer then brings the map in which it has none. */
static void connect_check(psc_t *c) {
    if (!c->connect_phase || c->connect_done)
        return;
    int waiting = 0;
    const server_t *failed = NULL;
    for (const server_t *s = c->all; s; s = s->next_all) {
        if (!s->hello_wait && !s->hello_rc)
            continue;
        if (!has_role_now(c, s))
            continue;
        if (s->hello_wait)
            waiting++;
        else if (!failed)
            failed = s;
    }
    c->hello_pending = waiting;
    if (waiting)
        return;
    c->connect_done = true;
    if (failed) {
        c->connect_rc = failed->hello_rc;
        snprintf(c->connect_why, sizeof c->connect_why, "%s: %s", failed->addr, failed->hello_why);
    }
    pthread_cond_broadcast(&c->cv);
}

/* Server s's HELLO was answered (rc 0), refused or failed (rc, text): noted for connect_check
 * when psc_connect waits for it. */
static void hello_settled(server_t *s, int rc, const char *text) {
    psc_t *c = s->c;
    pthread_mutex_lock(&c->mu);
    if (s->hello_wait) {
        s->hello_wait = false;
        s->hello_rc = rc;
        snprintf(s->hello_why, sizeof s->hello_why, "%s", rc && text ? text : "");
        connect_check(c);
    }
    pthread_mutex_unlock(&c->mu);
}

/* ==== maps and servers ===================================================================== */

static server_t *server_get(psc_t *c, const char *addr) {
    for (server_t *s = c->all; s; s = s->next_all)
        if (strcmp(s->addr, addr) == 0)
            return s;
    server_t *s = pc_scalloc(PC_MEM_CLIENT, 1, sizeof *s);
    if (!s)
        return NULL;
    s->c = c;
    snprintf(s->addr, sizeof s->addr, "%s", addr);
    s->next_all = c->all;
    c->all = s;
    return s;
}

/* Adopt `m` (taking it) if it is newer than the current map. */
static void map_adopt(psc_t *c, pc_cluster_map_t *m) {
    if (c->map && !c->placeholder && pc_cmap_version(m) <= pc_cmap_version(c->map)) {
        pc_cmap_destroy(m);
        return;
    }
    size_t n = pc_cmap_nservers(m);
    server_t **srv = pc_scalloc(PC_MEM_CLIENT, n, sizeof *srv);
    size_t len = pc_cmap_format(m, NULL, 0);
    char *text = pc_smalloc(PC_MEM_CLIENT, len + 1);
    if (!srv || !text) {
        pc_sfree(srv);
        pc_sfree(text);
        pc_cmap_destroy(m);
        return;
    }
    pc_cmap_format(m, text, len + 1);
    for (size_t i = 0; i < n; i++) {
        srv[i] = server_get(c, pc_cmap_addr(m, i));
        if (!srv[i] && c->map && !c->placeholder) { /* out of memory: the map in use stays (a
                                                     * call routed to a server without its object
                                                     * crashed); the first map's connect fails */
            pc_sfree(srv);
            pc_sfree(text);
            pc_cmap_destroy(m);
            return;
        }
    }
    const bool refresh = c->map && !c->placeholder;
    c->placeholder = false;
    const uint32_t owner0 = pc_cmap_slot_owner(m, 0);
    c->sole = pc_cmap_server_slots(m, owner0) == PC_NSLOTS ? (long)owner0 : -1;
    pc_cmap_destroy(c->map);
    pc_sfree(c->srv);
    c->map = m;
    c->srv = srv;
    c->nsrv = n;
    pthread_mutex_lock(&c->mu);
    pc_sfree(c->map_text);
    c->map_text = text;
    connect_check(c); /* a server it waits for may have no role now */
    pthread_mutex_unlock(&c->mu);
    atomic_store(&c->unclean, pc_cmap_unclean(m));
    if (refresh) {
        c->unmapped_due = true;
        uv_async_send(&c->wake);
    }
    if (refresh) /* after the text: who sees the count sees this map (psc_map_text) */
        atomic_fetch_add(&c->refreshes, 1);
}

static void map_adopt_text(psc_t *c, const uint8_t *text, size_t len) {
    char *t = pc_smalloc(PC_MEM_CLIENT, len + 1);
    if (!t)
        return;
    memcpy(t, text, len);
    t[len] = '\0';
    pc_cluster_map_t *m;
    char err[128];
    if (pc_cmap_parse(t, &m, err, sizeof err) == 0)
        map_adopt(c, m);
    else
        PC_WARN("psclient: a server sent a bad cluster map: %s", err);
    pc_sfree(t);
}

/* ==== parts ================================================================================ */

static void part_free(part_t *p) {
    if (p->srv && p->srv->cur == p) { /* its reply is being read: the rest goes to body */
        p->srv->cur = NULL;
        p->srv->direct = NULL;
    }
    pc_sfree(p->idx);
    pc_sfree(p);
}

/* Record why call k failed at server s (its text in s->msg): the failure that decides the
 * call's result (final), or else the latest transient one (retried), which a timeout reports. */
static void call_note(call_t *k, const server_t *s, bool final) {
    if (k->why_final)
        return;
    const int n = snprintf(k->why, sizeof k->why, "%s: %s", s->addr, s->msg);
    if (final && k->attempts > 0 && n > 0 && (size_t)n < sizeof k->why)
        snprintf(k->why + n, sizeof k->why - (size_t)n, " (gave up after %d attempts)",
                 k->attempts + 1);
    k->why_final = final;
}

/* Whether call k is split by key (PULL, PUSH, LOOKUP); the others go to every server. */
static bool keyed(const call_t *k) {
    return k->op == PC_OP_PULL || k->op == PC_OP_PUSH || k->op == PC_OP_LOOKUP;
}

/* PING (psc_health): server p->srv answered (rc 0) or failed (its text in p->srv->msg). */
static void health_note(call_t *k, const part_t *p, int rc) {
    if (k->finished || p->sidx >= k->health_cap)
        return;
    psc_server_health_t *e = &k->health[p->sidx];
    e->rc = rc;
    e->rtt_us = rc ? 0 : (uint32_t)((pc_time_mono_ns() - p->t_sent) / 1000);
    snprintf(e->message, sizeof e->message, "%s", rc ? p->srv->msg : "");
}

/* A part is back (or given up). Transient failures queue its positions for a retry; a failure
 * is explained by p->srv->msg. A PING's failure is that server's result, not the call's. */
static void part_done(psc_t *c, part_t *p, int rc, bool transient) {
    call_t *k = p->call;
    if (k->op == PC_OP_PING && rc) {
        health_note(k, p, rc);
        rc = 0;
    }
    if (!k->finished && rc) {
        /* a wrong slot is retried whatever the attempts (the server's newer map is on its way;
         * the deadline bounds it); other transient failures `retries` times */
        if (transient && keyed(k) && (rc == PC_EWRONGSLOT || k->attempts < c->o.retries)) {
            call_note(k, p->srv, false);
            k->other_failed |= rc != PC_EWRONGSLOT;
            if (k->nretry + p->n > k->retry_cap) {
                size_t cap = (k->retry_cap ? 2 * k->retry_cap : 64) + p->n;
                uint32_t *r = pc_srealloc(PC_MEM_CLIENT, k->retry, cap * sizeof *r);
                if (!r)
                    k->rc = k->rc ? k->rc : PC_ENOMEM;
                else {
                    k->retry = r;
                    k->retry_cap = cap;
                }
            }
            if (k->nretry + p->n <= k->retry_cap) {
                memcpy(k->retry + k->nretry, p->idx, p->n * sizeof *p->idx);
                k->nretry += p->n;
            }
        } else if (!k->rc) {
            k->rc = rc;
            call_note(k, p->srv, true);
        }
    }
    part_free(p);
    if (--k->parts_left > 0)
        return;
    if (k->finished) { /* ended earlier (deadline, close): nothing more to do */
        call_finish(c, k, k->rc);
        return;
    }
    if (k->rc || !k->nretry) {
        call_finish(c, k, k->rc);
        return;
    }
    /* positions refused under an older map than the client has now (a PC_EWRONGSLOT reply
     * brought it: a handover, a promotion) go to their new owners at once, without counting as
     * an attempt (map versions only grow); other failures back off, and count as an attempt
     * unless every one was a wrong slot (a server that has not adopted the newer map yet) */
    const bool newer = c->map && pc_cmap_version(c->map) > k->map_sent;
    if (!newer && k->other_failed)
        k->attempts++;
    else if (!newer)
        k->slot_rounds++;
    k->other_failed = false;
    atomic_fetch_add(&c->retries, 1);
    const int waited = k->attempts + k->slot_rounds; /* >= 1 when it backs off */
    const int doublings = waited - 1 < BACKOFF_DOUBLINGS ? waited - 1 : BACKOFF_DOUBLINGS;
    uv_timer_start(&k->backoff, on_backoff, newer ? 0 : (uint64_t)BACKOFF_MS << doublings, 0);
}

static void map_ask_others(psc_t *c, const server_t *lost);
static void server_connect(server_t *s);

/* Fail every part of server s (connection lost or refused): s->msg becomes "<rc's message>:
 * <why>" (why NULL: s->msg says it already). */
static void server_fail(server_t *s, int rc, const char *why) {
    psc_t *c = s->c;
    if (rc != PC_EAUTH && rc != PC_ETLS)
        map_ask_others(c, s);
    if (why && rc == PC_ETLS) /* why says "TLS: ..." already */
        snprintf(s->msg, sizeof s->msg, "%s", why);
    else if (why)
        snprintf(s->msg, sizeof s->msg, "%s: %s", pc_strerror(rc), why);
    part_t *lists[2] = {s->inflight, s->qhead};
    s->inflight = s->qhead = s->qtail = NULL;
    s->ninflight = 0;
    for (int l = 0; l < 2; l++) {
        for (part_t *p = lists[l], *nx; p; p = nx) {
            nx = p->next;
            /* A sent push may have been applied: never resend it. Nor anything to a dead server */
            bool transient = rc != PC_EAUTH && rc != PC_ETLS && !s->dead &&
                             !(p->sent && p->call->op == PC_OP_PUSH);
            part_done(c, p, rc, transient);
        }
    }
}

/* ==== connections ========================================================================== */

/* A heap handle's close callback: free it (pc_smalloc'ed). */
static void close_free(uv_handle_t *h) {
    pc_sfree(h);
}

static void on_close_tcp(uv_handle_t *h) {
    server_t *s = h->data;
    s->state = 0;
    pc_tls_free(s->tls);
    s->tls = NULL;
    pc_sfree(s->body);
    s->body = NULL;
    s->body_cap = s->hdr_have = s->body_have = 0;
    s->cur = NULL;
    s->direct = NULL;
    if (!s->c->stopping && (s->qhead || s->inflight))
        server_pump(s); /* reconnect for what is still queued */
}

/* Connections to servers the map no longer names (moved by a resharding, replaced by a
 * failover), with nothing queued or in flight, are closed: each held an fd and its peer's
 * resources for as long as that server lived. The object stays (a later map may name it again:
 * it connects then, as one never connected). */
static void close_unmapped(psc_t *c) {
    for (server_t *s = c->all; s; s = s->next_all)
        if (s->state == 2 && s->hello_done && !s->qhead && !s->inflight &&
            pc_cmap_find(c->map, s->addr) < 0) {
            s->state = 3; /* (not a lost connection: nothing to fail, no warning) */
            if (!uv_is_closing((uv_handle_t *)&s->tcp))
                uv_close((uv_handle_t *)&s->tcp, on_close_tcp);
        }
}

static void server_drop(server_t *s, int rc, const char *why) {
    if (s->state == 0 || s->state == 3)
        return;
    const bool was_up = s->state == 2 && !atomic_load(&s->c->stopping) && !s->dead;
    if (s->dead && rc != s->dead_rc) /* the close that follows a refusal: the refusal stays */
        server_fail(s, s->dead_rc, NULL);
    else
        server_fail(s, rc, why);
    if (was_up) /* once per lost connection: its calls are retried (reconnecting) */
        PC_WARN("psclient: %s: connection lost (%s); calls to it are retried", s->addr, s->msg);
    if (!s->hello_done) { /* lost before the HELLO answer: psc_connect ends with it, now */
        s->hello_done = true;
        hello_settled(s, rc, s->msg);
    }
    s->state = 3; /* nothing is sent on it now; on_close_tcp reconnects for what is queued */
    if (!uv_is_closing((uv_handle_t *)&s->tcp))
        uv_close((uv_handle_t *)&s->tcp, on_close_tcp);
}

typedef struct wbuf {
    uv_write_t req;
    size_t len;
    uint8_t data[];
} wbuf_t;

static void on_written(uv_write_t *req, int status) {
    wbuf_t *w = (wbuf_t *)req;
    server_t *s = req->data;
    pc_sfree(w);
    if (status < 0 && s->state == 2)
        server_drop(s, PC_EUNAVAIL, uv_strerror(status));
}

/* Write buffer w (taken) to server s. PC_EUNAVAIL when it cannot be queued. */
static int write_buf(server_t *s, wbuf_t *w) {
    w->req.data = s;
    uv_buf_t b = uv_buf_init((char *)w->data, (unsigned)w->len);
    if (uv_write(&w->req, (uv_stream_t *)&s->tcp, &b, 1, on_written) < 0) {
        pc_sfree(w);
        return PC_EUNAVAIL;
    }
    return 0;
}

/* TLS: write the session's pending ciphertext as one write. PC_ENOMEM, PC_EUNAVAIL. */
static int tls_flush(server_t *s) {
    const size_t n = pc_tls_pending(s->tls);
    if (!n)
        return 0;
    wbuf_t *w = pc_smalloc(PC_MEM_CLIENT, sizeof *w + n);
    if (!w)
        return PC_ENOMEM;
    w->len = pc_tls_take(s->tls, w->data, n);
    return write_buf(s, w);
}

/* Send frame w (taken): as it is, or encrypted into one write (pc_tls_seal). */
static int send_frame(server_t *s, wbuf_t *w) {
    if (s->tls) {
        const size_t cap = pc_tls_pending(s->tls) + pc_tls_sealed_max(w->len);
        wbuf_t *e = pc_smalloc(PC_MEM_CLIENT, sizeof *e + cap);
        int rc = e ? pc_tls_seal(s->tls, w->data, w->len, e->data, cap, &e->len) : PC_ENOMEM;
        pc_sfree(w);
        if (rc) {
            pc_sfree(e);
            return rc == PC_ENOMEM ? rc : PC_EUNAVAIL;
        }
        w = e;
    }
    return write_buf(s, w);
}

/* A server was lost (NULL: a call timed out, on a server that may hang): ask every other server
 * of the map for its map, at most every MAP_ASK_NS: with replicas (docs/server.md "Replicas and
 * failover") the lost server's backup takes its slots under a newer map, which the retries then
 * follow. The connected ones are asked (MAP). When there are none (the lost server was the
 * client's only connection, or, after a timeout, the one connection may be the server that
 * hangs) while calls wait, the others are connected to, at most every MAP_CONNECT_NS, and each
 * HELLO answers with that server's map: the backup that takes over may be a server no call
 * went to (one with no slots, rejoining). Connections stay few otherwise (a follower's client
 * talks to one server). */
/* Ask connected server o for its map (MAP): false when out of memory. Not sent: no answer, and
 * the next look asks again. */
static bool map_ask(psc_t *c, server_t *o) {
    wbuf_t *w = pc_smalloc(PC_MEM_CLIENT, sizeof *w + PC_WIRE_HDR);
    if (!w)
        return false;
    pc_wire_hdr_t h = {.op = PC_OP_MAP, .map_version = pc_cmap_version(c->map)};
    pc_wire_hdr_encode(&h, w->data);
    w->len = PC_WIRE_HDR;
    send_frame(o, w);
    return true;
}

static void map_ask_others(psc_t *c, const server_t *lost) {
    const uint64_t now = pc_time_mono_ns();
    if (c->placeholder || atomic_load(&c->stopping) || now - c->map_asked_ns < MAP_ASK_NS)
        return;
    c->map_asked_ns = now;
    size_t asked = 0;
    for (size_t i = 0; i < c->nsrv; i++) {
        server_t *o = c->srv[i];
        if (o && o != lost && o->state == 2) {
            if (!map_ask(c, o))
                return;
            asked++;
        }
    }
    /* none left to ask (after a timeout, lost NULL: the one asked may be the server that
     * hangs); only for parts waiting on the lost server or a call that timed out (a failed
     * connect with nothing queued lands here too: no endless chain of them), and at most every
     * MAP_CONNECT_NS */
    const bool waiting = !lost || lost->inflight || lost->qhead;
    if (asked > (lost ? 0u : 1u) || !waiting || now - c->map_connect_ns < MAP_CONNECT_NS)
        return;
    c->map_connect_ns = now;
    for (size_t i = 0; i < c->nsrv; i++) {
        server_t *o = c->srv[i];
        if (o && o != lost && !o->dead && o->state == 0)
            server_connect(o);
    }
}

/* A reply of server s carried a map version newer than the client's: ask s for that map, at
 * most every MAP_NEWER_NS (a follower of the delta stream, whose calls never meet a wrong slot,
 * learns of a failover or a resharding this way; a trainer before its next wrong slot). */
static void map_ask_newer(psc_t *c, server_t *s, uint64_t version) {
    const uint64_t now = pc_time_mono_ns();
    if (c->placeholder || version <= pc_cmap_version(c->map) ||
        now - c->newer_asked_ns < MAP_NEWER_NS)
        return;
    c->newer_asked_ns = now;
    map_ask(c, s);
}

/* Merge server s's claim reply (status 0, body in s->body) into k's result; a failure is
 * explained in s->msg (for part_done). */
static int claim_reply(server_t *s, call_t *k) {
    psc_claim_t *out = k->claim;
    pc_wire_claim_reply_t *r = pc_smalloc(PC_MEM_CLIENT, sizeof *r);
    int rc = 0;
    if (!r) {
        rc = PC_ENOMEM;
        snprintf(s->msg, sizeof s->msg, "%s: the claim reply", pc_strerror(rc));
    } else if (pc_wire_claim_reply_decode(s->body, s->h.body_len, r)) {
        rc = PC_EINVAL;
        snprintf(s->msg, sizeof s->msg, "malformed claim reply");
    } else if (k->claimed && strcmp(r->config, out->config) != 0) {
        rc = PC_ESTATE;
        snprintf(s->msg, sizeof s->msg,
                 "servers disagree on table %s: this one has %.150s, another %.150s", k->table,
                 r->config, out->config);
    } else {
        /* the strongest action any server took: reset > warm-started > new > continued */
        static const int rank[] = {1, 0, 2, 3, -1};
        if (!k->claimed || rank[r->action] > rank[out->action]) /* both below 5 (decoded) */
            out->action = (int)r->action;
        if (!out->previous[0])
            snprintf(out->previous, sizeof out->previous, "%s", r->previous);
        snprintf(out->config, sizeof out->config, "%s", r->config);
        out->dim = r->dim;
        out->rows += r->rows;
        out->version += r->version;
        k->claimed = true;
    }
    pc_sfree(r);
    return rc;
}

/* Merge server s's table list (status 0, body in s->body) into k's text: every server must list
 * the same tables with the same settings. A failure is explained in s->msg. */
static int tables_reply(server_t *s, call_t *k) {
    const size_t n = s->h.body_len;
    if (k->listed) {
        if (n == *k->text_len && (n >= k->text_cap || !memcmp(k->text, s->body, n)))
            return 0;
        snprintf(s->msg, sizeof s->msg,
                 "servers disagree on the tables (%zu bytes of settings "
                 "here, %zu at another server): compare `psctl tables` on each",
                 n, *k->text_len);
        return PC_ESTATE;
    }
    k->listed = true;
    *k->text_len = n;
    if (n < k->text_cap) {
        memcpy(k->text, s->body, n);
        k->text[n] = '\0';
    }
    return 0;
}

/* Server s's stream reply (status 0, body in s->body) into the caller's buffers of k->stream: at
 * most cap rows of the request's dim. A failure is explained in s->msg. */
static int stream_reply(server_t *s, call_t *k) {
    const psc_stream_req_t *q = k->stream;
    pc_wire_stream_reply_t r;
    if (pc_wire_stream_reply_decode(s->body, s->h.body_len, &r)) {
        snprintf(s->msg, sizeof s->msg, "malformed stream reply");
        return PC_EINVAL;
    }
    if ((q->dim && r.dim != q->dim) || r.n > q->cap) { /* dim 0: a bounds query's any dim */
        snprintf(s->msg, sizeof s->msg, "a stream reply of %u rows of dim %u for %u rows of dim %u",
                 r.n, r.dim, q->cap, q->dim);
        return r.dim != q->dim ? PC_EDIM : PC_ETOOBIG;
    }
    if (r.n) {
        memcpy(q->keys, s->body + PC_WIRE_STREAM_REPLY_PREFIX, (size_t)r.n * 8);
        memcpy(q->found, s->body + pc_wire_stream_found_off(r.n), r.n);
        memcpy(q->rows, s->body + pc_wire_stream_rows_off(r.n), (size_t)r.n * r.dim * 4);
    }
    *k->stream_out = (psc_stream_t){r.uid, r.from, r.next, r.head, r.oldest, r.n};
    return 0;
}

/* s->msg = the error reply's message (one line, printable; the server's map for
 * PC_EWRONGSLOT is not a message). */
static void reply_msg(server_t *s) {
    const pc_wire_hdr_t *h = &s->h;
    if (h->status == PC_EWRONGSLOT) {
        snprintf(s->msg, sizeof s->msg, "%s (map version %llu)", pc_strerror(h->status),
                 (unsigned long long)h->map_version);
        return;
    }
    size_t n = h->body_len < sizeof s->msg - 1 ? h->body_len : sizeof s->msg - 1;
    for (size_t i = 0; i < n; i++) {
        const uint8_t ch = s->body[i];
        s->msg[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
    }
    s->msg[n] = '\0';
    if (!n) /* a server that sent no message */
        snprintf(s->msg, sizeof s->msg, "%s", pc_strerror(h->status));
}

/* Whether part p's positions in its call are consecutive (one block of the caller's rows). */
static bool part_consecutive(const part_t *p) {
    for (uint32_t i = 1; i < p->n; i++)
        if (p->idx[i] != p->idx[0] + i)
            return false;
    return true;
}

/* The bf16/f16 rows of part p's reply (at body) into the caller's fp32 rows of call k. */
static void rows_convert(const uint8_t *body, pc_wire_dtype_t dt, const part_t *p,
                         const call_t *k) {
    const pc_half_kernels_t *kern = pc_half_kernels(NULL);
    void (*from)(const uint16_t *, float *, size_t) =
        dt == PC_WIRE_BF16 ? kern->from_bf16 : kern->from_f16;
    const uint16_t *h = (const uint16_t *)(const void *)body;
    if (!p->n)
        return;
    if (part_consecutive(p)) {
        from(h, k->rows + (size_t)p->idx[0] * k->dim, (size_t)p->n * k->dim);
        return;
    }
    for (uint32_t i = 0; i < p->n; i++)
        from(h + (size_t)i * k->dim, k->rows + (size_t)p->idx[i] * k->dim, k->dim);
}

static void handle_reply(server_t *s) {
    psc_t *c = s->c;
    const pc_wire_hdr_t *h = &s->h;
    if (h->op == PC_OP_HELLO) {
        if (h->status) {
            reply_msg(s);
            if (s->hello_done) /* while connecting, psc_connect logs it */
                PC_ERROR("psclient: %s refused the connection: %s", s->addr, s->msg);
            /* a refused token (or protocol) is for good; a server short of memory is not */
            s->dead = h->status == PC_EAUTH || h->status == PC_EINVAL;
            s->dead_rc = h->status;
            server_fail(s, h->status, NULL);
        } else {
            map_adopt_text(c, s->body, h->body_len);
            s->failures = 0;
            s->down_ns = 0;
        }
        if (!s->hello_done) {
            s->hello_done = true;
            hello_settled(s, h->status, s->msg);
        }
        return;
    }
    if (h->op == PC_OP_MAP) { /* asked by map_ask_others */
        if (!h->status)
            map_adopt_text(c, s->body, h->body_len);
        return;
    }
    part_t **pp = &s->inflight, *p = NULL;
    for (; *pp; pp = &(*pp)->next)
        if ((*pp)->fid == h->id) {
            p = *pp;
            *pp = p->next;
            break;
        }
    if (!p)
        return; /* not ours (never happens with a correct server): ignore */
    s->ninflight--;
    call_t *k = p->call;
    int rc = h->status;
    bool transient = rc == PC_EWRONGSLOT || rc == PC_EUNAVAIL;
    if (rc)
        reply_msg(s);
    if (rc == PC_EINVAL && keyed(k) && k->dtype != PC_WIRE_F32) { /* a server of wire v1 */
        char said[sizeof s->msg];
        memcpy(said, s->msg, sizeof said);
        rc = PC_EUNSUPPORTED;
        snprintf(s->msg, sizeof s->msg,
                 "%s: the server refused %s rows (an older server takes f32 only: use "
                 "PSC_WIRE_F32); it said: %.300s",
                 pc_strerror(rc), pc_wire_dtype_name(k->dtype), said);
    }
    if (rc == PC_EWRONGSLOT)
        map_adopt_text(c, s->body, h->body_len);
    else
        map_ask_newer(c, s, h->map_version);
    if (!keyed(k)) {
        if (!k->finished && !rc)
            rc = k->op == PC_OP_CLAIM    ? claim_reply(s, k)
                 : k->op == PC_OP_TABLES ? tables_reply(s, k)
                 : k->stream             ? stream_reply(s, k)
                                         : 0;
        if (k->op == PC_OP_PING && !rc)
            health_note(k, p, 0);
        part_done(c, p, rc, false);
        server_pump(s);
        return;
    }
    if (!rc && !k->finished) {
        const uint32_t dim = k->dim;
        const pc_wire_dtype_t dt = (pc_wire_dtype_t)k->dtype;
        const size_t es = pc_wire_dtype_size(dt), nb = (size_t)p->n * dim * es;
        const size_t want = k->op == PC_OP_PUSH     ? 3 * sizeof(uint64_t)
                            : k->op == PC_OP_LOOKUP ? nb + p->n
                                                    : nb;
        if (pc_wire_hdr_dtype(h) != dt) {
            rc = PC_EINVAL;
            snprintf(s->msg, sizeof s->msg, "%s: a reply in %s to a request in %s", pc_strerror(rc),
                     pc_wire_dtype_name(pc_wire_hdr_dtype(h)), pc_wire_dtype_name(dt));
        } else if (h->body_len != want) {
            rc = PC_EINVAL;
            snprintf(s->msg, sizeof s->msg, "%s: a reply of %u bytes, %zu expected",
                     pc_strerror(rc), h->body_len, want);
        } else if (k->op == PC_OP_PUSH) {
            uint64_t cnt[3];
            memcpy(cnt, s->body, sizeof cnt);
            k->acc.applied += cnt[0];
            k->acc.skipped_nonfinite += cnt[1];
            k->acc.dropped_unadmitted += cnt[2];
        } else if (dt != PC_WIRE_F32) {
            rows_convert(s->body, dt, p, k);
            if (k->op == PC_OP_LOOKUP && k->found)
                for (uint32_t i = 0; i < p->n; i++)
                    k->found[p->idx[i]] = s->body[nb + i];
        } else {
            const float *rows = (const float *)(const void *)s->body;
            if (s->cur != p || !s->direct) /* else read into place already (direct_start) */
                for (uint32_t i = 0; i < p->n; i++)
                    memcpy(k->rows + (size_t)p->idx[i] * dim, rows + (size_t)i * dim, dim * 4);
            if (k->op == PC_OP_LOOKUP && k->found)
                for (uint32_t i = 0; i < p->n; i++)
                    k->found[p->idx[i]] = s->body[nb + i];
        }
    }
    part_done(c, p, rc, transient);
    server_pump(s);
}

/* Where the next plaintext bytes of server s go: the header, then the reply's body (its rows
 * straight into the caller's array while s->direct, see direct_start). */
static uv_buf_t plain_buf(server_t *s) {
    if (s->hdr_have < PC_WIRE_HDR)
        return uv_buf_init((char *)s->hdr + s->hdr_have, (unsigned)(PC_WIRE_HDR - s->hdr_have));
    if (s->direct && s->body_have < s->direct_len) {
        if (!s->cur->call->finished)
            return uv_buf_init((char *)s->direct + s->body_have,
                               (unsigned)(s->direct_len - s->body_have));
        s->direct = NULL; /* the call ended meanwhile (deadline, close): not the caller's now */
    }
    return uv_buf_init((char *)s->body + s->body_have, (unsigned)(s->h.body_len - s->body_have));
}

/* A reply header arrived: when it answers a PULL or LOOKUP part with the size expected and the
 * part's positions are consecutive (always so for a call to one server), its rows are read
 * straight into the caller's array (s->direct), not into s->body and then copied. Only while
 * the call has not ended: plain_buf checks before every read, on the I/O thread that ends
 * calls, and part_free stops it when the part goes. */
static void direct_start(server_t *s) {
    const pc_wire_hdr_t *h = &s->h;
    s->cur = NULL;
    s->direct = NULL;
    if (h->status || (h->op != PC_OP_PULL && h->op != PC_OP_LOOKUP))
        return;
    part_t *p = s->inflight;
    while (p && p->fid != h->id)
        p = p->next;
    if (!p || p->call->finished || p->call->op != h->op || !p->n)
        return;
    const call_t *k = p->call;
    if (k->dtype != PC_WIRE_F32 || pc_wire_hdr_dtype(h) != PC_WIRE_F32) /* converted instead */
        return;
    const size_t rows = (size_t)p->n * k->dim * 4;
    if (h->body_len != (k->op == PC_OP_LOOKUP ? rows + p->n : rows))
        return;
    if (!part_consecutive(p))
        return;
    s->cur = p;
    s->direct = (uint8_t *)(k->rows + (size_t)p->idx[0] * k->dim);
    s->direct_len = rows;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    server_t *s = h->data;
    void *p;
    size_t cap;
    if (!s->tls)
        *buf = plain_buf(s);
    else /* the socket is read straight into the session; no space: the read fails */
        *buf =
            pc_tls_inbuf(s->tls, &p, &cap) ? uv_buf_init(NULL, 0) : uv_buf_init(p, (unsigned)cap);
}

/* nread plaintext bytes arrived where plain_buf() said. Returns false when the connection was
 * dropped meanwhile. */
static bool input(server_t *s, size_t nread) {
    if (s->hdr_have < PC_WIRE_HDR) {
        s->hdr_have += nread;
        if (s->hdr_have < PC_WIRE_HDR)
            return true;
        if (pc_wire_hdr_decode(s->hdr, MAX_REPLY, &s->h) || !(s->h.flags & PC_WIRE_RESPONSE)) {
            PC_ERROR("psclient: bad reply from %s", s->addr);
            server_drop(s, PC_EUNAVAIL, "not an EmberPS reply");
            return false;
        }
        if (s->body_cap < s->h.body_len || !s->body) { /* kept from the last reply if it fits */
            pc_sfree(s->body);
            s->body_cap = s->h.body_len ? s->h.body_len : 1;
            if (!(s->body = pc_smalloc(PC_MEM_CLIENT, s->body_cap))) {
                s->body_cap = 0;
                server_drop(s, PC_ENOMEM, "for a reply"); /* the calls waiting end with it */
                return false;
            }
        }
        s->body_have = 0;
        direct_start(s);
    } else {
        s->body_have += nread;
    }
    if (s->body_have < s->h.body_len)
        return true;
    handle_reply(s);
    s->cur = NULL;
    s->direct = NULL;
    if (s->body_cap > BODY_KEEP) {
        pc_sfree(s->body);
        s->body = NULL;
        s->body_cap = 0;
    }
    s->hdr_have = 0;
    return !uv_is_closing((uv_handle_t *)&s->tcp);
}

static void hello_send(server_t *s);

/* TLS: ciphertext arrived: advance the handshake (HELLO once it is done), then hand the
 * plaintext to input(). */
static void tls_input(server_t *s, const uint8_t *data, size_t n) {
    if (!pc_tls_established(s->tls) && n >= 4 && memcmp(data, "EMBR", 4) == 0) {
        s->dead = true; /* a plaintext EmberPS reply to our ClientHello */
        s->dead_rc = PC_ETLS;
        server_drop(s, PC_ETLS,
                    "TLS: the server answered in plaintext (its data plane has no "
                    "TLS: connect without it, or give the server a certificate)");
        return;
    }
    pc_tls_received(s->tls, n);
    if (!pc_tls_established(s->tls)) {
        const int rc = pc_tls_handshake(s->tls);
        const int frc = tls_flush(s);
        if (rc == PC_ETLS) {
            s->dead = true; /* an unverified certificate does not heal by retrying */
            s->dead_rc = PC_ETLS;
            server_drop(s, PC_ETLS, pc_tls_error(s->tls));
            return;
        }
        if (frc) {
            server_drop(s, frc, "cannot send the TLS handshake");
            return;
        }
        if (rc == PC_EAGAIN)
            return;
        hello_send(s);
        if (uv_is_closing((uv_handle_t *)&s->tcp))
            return;
    }
    for (;;) {
        const uv_buf_t b = plain_buf(s);
        const ssize_t got = pc_tls_read(s->tls, b.base, b.len);
        if (got == 0)
            break;
        if (got < 0) {
            if (got == PC_ETLS && !s->hello_done) { /* refused in the handshake's last step
                                                     * (TLS 1.3: a client certificate) */
                s->dead = true;
                s->dead_rc = PC_ETLS;
            }
            server_drop(s, got == PC_ECLOSED ? PC_EUNAVAIL : PC_ETLS,
                        got == PC_ECLOSED ? "the server closed the TLS session"
                                          : pc_tls_error(s->tls));
            return;
        }
        if (!input(s, (size_t)got))
            return;
    }
    if (tls_flush(s)) /* what reading produced (TLS 1.3 post-handshake messages) */
        server_drop(s, PC_EUNAVAIL, "cannot write to the server");
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf) {
    server_t *s = st->data;
    if (nread < 0) {
        server_drop(s, PC_EUNAVAIL,
                    nread == UV_EOF ? "the server closed the connection" : uv_strerror((int)nread));
        return;
    }
    if (s->tls)
        tls_input(s, (const uint8_t *)buf->base, (size_t)nread);
    else
        input(s, (size_t)nread);
}

/* How long a connection lives once its server acknowledges nothing (pc_wire_watch_peer): twice
 * the call timeout, at least DEAD_PEER_MIN_MS. A call to a server gone without a word times out
 * first; the connection ends next, failing its parts in flight (a sent push counts as lost) and
 * freeing its max_inflight slots, and the calls after it reconnect (to a promoted backup, or to
 * the server when it is back) instead of queueing behind a dead socket for the kernel's 15 min. */
static uint32_t dead_peer_ms(const psc_t *c) {
    const uint64_t ms = 2 * (uint64_t)c->o.timeout_ms;
    return ms < DEAD_PEER_MIN_MS ? DEAD_PEER_MIN_MS : ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
}

static void on_connect(uv_connect_t *req, int status) {
    server_t *s = req->data;
    psc_t *c = s->c;
    if (status < 0) {
        s->failures++;
        const uint64_t now = pc_time_mono_ns();
        if (!s->down_ns)
            s->down_ns = now;
        char why[160];
        const double down = (double)(now - s->down_ns) * 1e-9;
        if (down >= 0.1)
            snprintf(why, sizeof why, "%s (failing for %.1f s)", uv_strerror(status), down);
        else
            snprintf(why, sizeof why, "%s", uv_strerror(status));
        if (!s->hello_done) {
            s->hello_done = true;
            char text[200];
            snprintf(text, sizeof text, "%s: %s", pc_strerror(PC_EUNAVAIL), why);
            hello_settled(s, PC_EUNAVAIL, text);
        }
        server_drop(s, PC_EUNAVAIL, why);
        return;
    }
    s->was_connected = true;
    uv_tcp_nodelay(&s->tcp, 1);
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)&s->tcp, &fd) == 0 &&
        pc_wire_watch_peer(fd, dead_peer_ms(c)) != 0)
        PC_WARN("psclient: %s: cannot watch the connection for a dead server (%s)", s->addr,
                strerror(errno));
    if (c->tls) { /* the handshake first; HELLO once it is done (tls_input) */
        char host[PC_ADDR_MAX];
        snprintf(host, sizeof host, "%s", s->addr);
        char *colon = strrchr(host, ':');
        if (colon)
            *colon = '\0';
        int rc = pc_tls_new(c->tls, c->tls_name[0] ? c->tls_name : host, &s->tls);
        if (!rc && (rc = pc_tls_handshake(s->tls)) == PC_EAGAIN)
            rc = tls_flush(s);
        if (rc) {
            server_drop(s, rc, "cannot start TLS");
            return;
        }
        uv_read_start((uv_stream_t *)&s->tcp, on_alloc, on_read);
        return;
    }
    uv_read_start((uv_stream_t *)&s->tcp, on_alloc, on_read);
    hello_send(s);
}

/* The connection is up (TLS: its handshake done): say HELLO (with the token; the server answers
 * with its map), then send what is queued. */
static void hello_send(server_t *s) {
    psc_t *c = s->c;
    s->state = 2;
    size_t tl = strlen(c->token);
    wbuf_t *w = pc_smalloc(PC_MEM_CLIENT, sizeof *w + PC_WIRE_HDR + tl);
    if (!w) {
        server_drop(s, PC_ENOMEM, "for HELLO");
        return;
    }
    pc_wire_hdr_t h = {.op = PC_OP_HELLO, .body_len = (uint32_t)tl};
    pc_wire_hdr_encode(&h, w->data);
    memcpy(w->data + PC_WIRE_HDR, c->token, tl);
    w->len = PC_WIRE_HDR + tl;
    if (send_frame(s, w)) {
        server_drop(s, PC_EUNAVAIL, "cannot send HELLO");
        return;
    }
    server_pump(s);
}

static void server_connect(server_t *s) {
    psc_t *c = s->c;
    char host[PC_ADDR_MAX];
    snprintf(host, sizeof host, "%s", s->addr);
    char *colon = strrchr(host, ':');
    struct sockaddr_in sa;
    if (!colon || uv_ip4_addr((*colon = '\0', host), atoi(colon + 1), &sa) != 0) {
        s->dead = true;
        s->dead_rc = PC_EINVAL;
        if (!s->hello_done) { /* psc_connect fails at once, not at its deadline */
            s->hello_done = true;
            hello_settled(s, PC_EINVAL, "invalid argument: not an IPv4 host:port");
        }
        server_fail(s, PC_EINVAL, "not an IPv4 host:port");
        return;
    }
    if (s->was_connected || s->failures)
        atomic_fetch_add(&c->reconnects, 1);
    uv_tcp_init(&c->loop, &s->tcp);
    s->tcp.data = s;
    s->creq.data = s;
    s->state = 1;
    int rc = uv_tcp_connect(&s->creq, &s->tcp, (const struct sockaddr *)&sa, on_connect);
    if (rc < 0)
        server_drop(s, PC_EUNAVAIL, uv_strerror(rc));
}

/* Build and send the request of part p. */
static int part_send(server_t *s, part_t *p) {
    call_t *k = p->call;
    const size_t nl = strlen(k->table);
    const uint64_t body = k->op == PC_OP_CLAIM ? pc_wire_claim_len(nl, strlen(k->job))
                          : k->stream          ? pc_wire_stream_len(nl, k->stream_flags)
                          : keyed(k)
                              ? pc_wire_batch_body_len_typed((pc_wire_op_t)k->op, nl, p->n, k->dim,
                                                             (pc_wire_dtype_t)k->dtype)
                              : 0; /* PING, TABLES */
    wbuf_t *w = pc_smalloc(PC_MEM_CLIENT, sizeof *w + PC_WIRE_HDR + body);
    if (!w)
        return PC_ENOMEM;
    w->len = PC_WIRE_HDR + body;
    p->fid = atomic_fetch_add(&s->c->next_fid, 1);
    pc_wire_hdr_t h = {.op = k->op,
                       .id = p->fid,
                       .body_len = (uint32_t)body,
                       .map_version = k->stream_flags & PC_STREAM_SAME_MAP
                                          ? k->stream_map
                                          : pc_cmap_version(s->c->map)};
    pc_wire_hdr_encode(&h, w->data);
    uint8_t *b = w->data + PC_WIRE_HDR;
    p->t_sent = pc_time_mono_ns();
    if (k->op == PC_OP_CLAIM)
        pc_wire_claim_encode(k->table, k->job, (uint32_t)k->mode, k->epoch, b);
    if (k->stream) {
        const psc_stream_req_t *q = k->stream;
        pc_wire_stream_t sq = {.flags = k->stream_flags,
                               .max = q->cap,
                               .part = q->part,
                               .parts = q->parts,
                               .from = q->from,
                               .uid = q->uid,
                               .start = k->stream_start};
        snprintf(sq.name, sizeof sq.name, "%s", k->table);
        pc_wire_stream_encode(&sq, b);
    }
    if (!keyed(k)) {
        const int rc = send_frame(s, w);
        p->sent = rc == 0;
        return rc;
    }
    const size_t hl =
        pc_wire_batch_head_encode_typed(k->table, p->n, k->dim, (pc_wire_dtype_t)k->dtype, b);
    if (k->op == PC_OP_PUSH)
        pc_wire_batch_set_epoch(b, k->epoch);
    b += hl;
    uint64_t *keys = (uint64_t *)(void *)b;
    for (uint32_t i = 0; i < p->n; i++)
        keys[i] = k->keys[p->idx[i]];
    if (k->op == PC_OP_PUSH && k->dtype == PC_WIRE_F32) {
        float *g = (float *)(void *)(b + (size_t)p->n * 8);
        for (uint32_t i = 0; i < p->n; i++)
            memcpy(g + (size_t)i * k->dim, k->grads + (size_t)p->idx[i] * k->dim, k->dim * 4);
    } else if (k->op == PC_OP_PUSH && p->n) { /* converted from the caller's fp32 */
        const pc_half_kernels_t *kern = pc_half_kernels(NULL);
        void (*to)(const float *, uint16_t *, size_t) =
            k->dtype == PC_WIRE_BF16 ? kern->to_bf16 : kern->to_f16;
        uint16_t *g = (uint16_t *)(void *)(b + (size_t)p->n * 8);
        if (part_consecutive(p))
            to(k->grads + (size_t)p->idx[0] * k->dim, g, (size_t)p->n * k->dim);
        else
            for (uint32_t i = 0; i < p->n; i++)
                to(k->grads + (size_t)p->idx[i] * k->dim, g + (size_t)i * k->dim, k->dim);
    }
    const int rc = send_frame(s, w); /* a push not handed to the socket is no push sent */
    p->sent = rc == 0;
    return rc;
}

/* Send queued parts while the server has room; connect when needed. */
static void server_pump(server_t *s) {
    psc_t *c = s->c;
    if (s->dead) {
        server_fail(s, s->dead_rc, NULL); /* s->msg says why */
        return;
    }
    if (s->state == 0 && (s->qhead || s->inflight)) {
        if (s->failures >= RECONNECT_MAX) {
            char why[PC_WIRE_MSG_MAX];
            snprintf(why, sizeof why, "%d connection attempts failed, the last: %.300s",
                     s->failures, s->msg);
            server_fail(s, PC_EUNAVAIL, why);
            s->failures = 0;
            return;
        }
        server_connect(s);
        return;
    }
    while (s->state == 2 && s->qhead && s->ninflight < c->o.max_inflight) {
        part_t *p = s->qhead;
        s->qhead = p->next;
        if (!s->qhead)
            s->qtail = NULL;
        if (p->call->finished) { /* ended meanwhile: do not send */
            part_done(c, p, 0, false);
            continue;
        }
        p->next = s->inflight;
        s->inflight = p;
        s->ninflight++;
        int rc = part_send(s, p);
        if (rc) {
            server_drop(s, rc, "cannot send a request");
            return;
        }
    }
}

/* ==== calls ================================================================================ */

static void on_timer_closed(uv_handle_t *h) {
    call_t *k = h->data;
    if (--k->timers_open == 0) {
        pc_sfree(k->retry);
        pc_sfree(k);
    }
}

/* Free calls whose result was taken and whose parts are all back (I/O thread). */
static void sweep(psc_t *c) {
    pthread_mutex_lock(&c->mu);
    call_t **pp = &c->live;
    while (*pp) {
        call_t *k = *pp;
        if (k->consumed && k->parts_left == 0) {
            *pp = k->next_live;
            uv_close((uv_handle_t *)&k->deadline, on_timer_closed);
            uv_close((uv_handle_t *)&k->backoff, on_timer_closed);
        } else {
            pp = &k->next_live;
        }
    }
    pthread_mutex_unlock(&c->mu);
}

/* Whether server s holds a part of call k (queued or in flight). */
static bool server_has(const server_t *s, const call_t *k) {
    for (int l = 0; l < 2; l++)
        for (const part_t *p = l ? s->qhead : s->inflight; p; p = p->next)
            if (p->call == k)
                return true;
    return false;
}

/* Append to the string in buf[0..cap) (truncated). */
__attribute__((format(printf, 3, 4))) static void why_add(char *buf, size_t cap, const char *fmt,
                                                          ...) {
    const size_t n = strlen(buf);
    va_list ap;
    va_start(ap, fmt);
    if (n + 1 < cap)
        vsnprintf(buf + n, cap - n, fmt, ap);
    va_end(ap);
}

/* k->why for a result no server's failure explains (k->why_final false): a timeout names the
 * servers still owing an answer, and any earlier failure is kept after it. */
static void call_explain(psc_t *c, call_t *k, int rc) {
    char last[PSC_WHY_MAX];
    snprintf(last, sizeof last, "%s", k->why);
    k->why[0] = '\0';
#define WHY(...) why_add(k->why, sizeof k->why, __VA_ARGS__)
    if (rc == PC_ETIMEDOUT) {
        WHY("%s after %d ms", pc_strerror(rc), c->o.timeout_ms);
        int listed = 0;
        for (server_t *s = c->all; s && listed < 4; s = s->next_all)
            if (server_has(s, k))
                WHY("%s %s (%s)", listed++ ? "," : "; no answer from", s->addr,
                    s->state == 2   ? "connected"
                    : s->state == 1 ? "connecting"
                                    : "not connected");
    } else if (rc == PC_ECANCELED) {
        WHY("%s: the client is closing", pc_strerror(rc));
    } else {
        WHY("%s", pc_strerror(rc));
    }
    if (last[0])
        WHY("; before: %s", last);
#undef WHY
    k->why_final = true;
}

/* The call's result is decided: tell the caller (once). */
static void call_finish(psc_t *c, call_t *k, int rc) {
    if (!k->finished) {
        if (rc && (!k->why_final || rc != k->rc))
            call_explain(c, k, rc);
        uv_timer_stop(&k->deadline);
        uv_timer_stop(&k->backoff);
        if (k->res && !rc)
            *k->res = k->acc;
        pthread_mutex_lock(&c->mu);
        k->finished = true;
        k->rc = rc;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        if (k->done) {
            k->done(k->ctx, k->id, rc);
            pthread_mutex_lock(&c->mu);
            k->consumed = true;
            pthread_mutex_unlock(&c->mu);
        }
    }
    if (k->parts_left == 0)
        sweep(c);
}

static void on_deadline(uv_timer_t *t) {
    call_t *k = t->data;
    psc_t *c = (psc_t *)t->loop->data;
    atomic_fetch_add(&c->timeouts, 1);
    /* a part already failed for good (PC_EDIM from one server while another hangs): that is the
     * call's error, not the deadline the hung part made it wait for */
    call_finish(c, k, k->rc ? k->rc : PC_ETIMEDOUT);
    /* Its parts still queued go now (the pump drops them only when it takes them, which a
     * server that hangs with its requests in flight never lets it do: every call to it would
     * stay queued for as long as it hangs). */
    for (server_t *s = c->all; s; s = s->next_all) {
        part_t *prev = NULL;
        for (part_t *p = s->qhead, *nx; p; p = nx) {
            nx = p->next;
            if (p->call != k) {
                prev = p;
                continue;
            }
            if (prev)
                prev->next = nx;
            else
                s->qhead = nx;
            if (s->qtail == p)
                s->qtail = prev;
            part_done(c, p, 0, false);
        }
    }
    map_ask_others(c, NULL); /* a server that hangs may have been replaced */
}

static void on_backoff(uv_timer_t *t) {
    call_t *k = t->data;
    psc_t *c = (psc_t *)t->loop->data;
    uint32_t *idx = k->retry;
    size_t n = k->nretry;
    k->retry = NULL;
    k->nretry = k->retry_cap = 0;
    call_dispatch(c, k, idx, n);
    pc_sfree(idx);
}

/* Split positions idx[0..n) of call k by server under the current map and queue the parts. */
static void call_dispatch(psc_t *c, call_t *k, const uint32_t *idx, size_t n) {
    const size_t ns = c->nsrv;
    k->map_sent = c->map ? pc_cmap_version(c->map) : 0;
    uint32_t *count = pc_scalloc(PC_MEM_CLIENT, ns + 1, sizeof *count);
    uint32_t *owner = pc_smalloc(PC_MEM_CLIENT, (n + 1) * sizeof *owner);
    part_t **parts = pc_scalloc(PC_MEM_CLIENT, ns + 1, sizeof *parts);
    int rc = count && owner && parts ? 0 : PC_ENOMEM;
    if (!rc && k->target >= 0 && (size_t)k->target >= ns) {
        rc = PC_EINVAL;
        snprintf(k->why, sizeof k->why, "%s: the map has %zu servers, no server %d",
                 pc_strerror(rc), ns, k->target);
        k->why_final = true;
    }
    for (size_t i = 0; !rc && i < n; i++) { /* one server owning every slot: no hashing */
        owner[i] =
            c->sole >= 0 ? (uint32_t)c->sole : pc_cmap_key_owner(c->map, k->keys[idx ? idx[i] : i]);
        count[owner[i]]++;
    }
    for (size_t s = 0; !rc && s < ns; s++) {
        if ((!count[s] && keyed(k)) || (k->target >= 0 && (size_t)k->target != s))
            continue; /* the other calls go to every server, or to their target */
        if (!keyed(k) && k->target < 0 && k->op != PC_OP_PING && c->map &&
            !pc_cmap_has_role(c->map, (uint32_t)s))
            continue; /* TABLES and CLAIM: not to a server with no role (see psc_connect2) */
        parts[s] = pc_scalloc(PC_MEM_CLIENT, 1, sizeof(part_t));
        if (!parts[s] ||
            !(parts[s]->idx = pc_smalloc(PC_MEM_CLIENT, (count[s] + 1) * sizeof(uint32_t)))) {
            rc = PC_ENOMEM;
            break;
        }
        parts[s]->call = k;
        parts[s]->srv = c->srv[s];
        parts[s]->sidx = (uint32_t)s;
    }
    if (rc) {
        for (size_t s = 0; parts && s < ns; s++)
            if (parts[s])
                part_free(parts[s]);
        pc_sfree(count);
        pc_sfree(owner);
        pc_sfree(parts);
        k->rc = rc;
        if (k->parts_left == 0)
            call_finish(c, k, rc);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        part_t *p = parts[owner[i]];
        p->idx[p->n++] = idx ? idx[i] : (uint32_t)i;
    }
    if (k->op == PC_OP_PING) { /* psc_health: a result per server, "no answer" until one */
        *k->nhealth = ns;
        for (size_t s = 0; s < ns && s < k->health_cap; s++) {
            psc_server_health_t *e = &k->health[s];
            snprintf(e->addr, sizeof e->addr, "%s", c->srv[s]->addr);
            e->rc = PC_ETIMEDOUT;
            snprintf(e->message, sizeof e->message, "no answer within %d ms", k->timeout_ms);
        }
    }
    for (size_t s = 0; s < ns; s++)
        if (parts[s])
            k->parts_left++;
    if (k->parts_left == 0) /* no keys */
        call_finish(c, k, 0);
    for (size_t s = 0; s < ns; s++) {
        part_t *p = parts[s];
        if (!p)
            continue;
        server_t *sv = p->srv;
        if (sv->qtail)
            sv->qtail->next = p;
        else
            sv->qhead = p;
        sv->qtail = p;
        server_pump(sv);
    }
    pc_sfree(count);
    pc_sfree(owner);
    pc_sfree(parts);
}

static void on_wake(uv_async_t *a) {
    psc_t *c = a->data;
    pthread_mutex_lock(&c->mu);
    call_t *list = c->submit_head;
    c->submit_head = c->submit_tail = NULL;
    bool stopping = c->stopping;
    pthread_mutex_unlock(&c->mu);
    if (c->unmapped_due && !stopping) {
        c->unmapped_due = false;
        close_unmapped(c);
    }
    for (call_t *k = list, *nx; k; k = nx) {
        nx = k->next_submit;
        uv_timer_init(&c->loop, &k->deadline);
        uv_timer_init(&c->loop, &k->backoff);
        k->deadline.data = k->backoff.data = k;
        k->timers_open = 2;
        k->started = true;
        uv_timer_start(&k->deadline, on_deadline,
                       (uint64_t)(k->timeout_ms ? k->timeout_ms : c->o.timeout_ms), 0);
        if (stopping)
            call_finish(c, k, PC_ECANCELED);
        else
            call_dispatch(c, k, NULL, k->n);
    }
    if (stopping) {
        pthread_mutex_lock(&c->mu);
        call_t *live = c->live;
        pthread_mutex_unlock(&c->mu);
        for (call_t *k = live; k; k = k->next_live) /* freed only by close callbacks, later */
            if (k->started)
                call_finish(c, k, PC_ECANCELED);
        for (server_t *s = c->all; s; s = s->next_all) {
            server_fail(s, PC_ECANCELED, "the client is closing");
            if (s->state && !uv_is_closing((uv_handle_t *)&s->tcp))
                uv_close((uv_handle_t *)&s->tcp, NULL);
        }
        /* Calls still listed are freed by psc_close once the loop has ended. */
        pthread_mutex_lock(&c->mu);
        for (call_t *k = c->live; k; k = k->next_live) {
            if (k->started && !uv_is_closing((uv_handle_t *)&k->deadline)) {
                uv_close((uv_handle_t *)&k->deadline, NULL);
                uv_close((uv_handle_t *)&k->backoff, NULL);
            }
        }
        pthread_mutex_unlock(&c->mu);
        uv_close((uv_handle_t *)&c->wake, NULL);
        return;
    }
    sweep(c);
}

static void *io_main(void *arg) {
    psc_t *c = arg;
    for (int alive = 1; alive;) {
        alive = uv_run(&c->loop, UV_RUN_ONCE);
        /* While a caller yields in psc_wait, poll instead of sleeping in epoll: its answer is
         * seen at the next poll, without the wake-up of a sleeping thread. */
        while (alive && atomic_load_explicit(&c->spinners, memory_order_relaxed) > 0) {
            sched_yield();
            alive = uv_run(&c->loop, UV_RUN_NOWAIT);
        }
    }
    return NULL;
}

/* ==== public API =========================================================================== */

static call_t *call_new(psc_t *c, uint8_t op, const char *table);
static int call_submit(psc_t *c, call_t *k);

static int start_call(psc_t *c, uint8_t op, const char *table, const uint64_t *keys, size_t n,
                      uint32_t dim, float *rows, const float *grads, uint8_t *found,
                      psc_push_result_t *res, psc_done_fn done, void *ctx, uint64_t *id) {
    if (!c || !table || (n && !keys) || !id || dim == 0 || dim > PC_WIRE_DIM_MAX ||
        strlen(table) == 0 || strlen(table) > PC_WIRE_NAME_MAX || n > UINT32_MAX)
        return PC_EINVAL;
    if ((op == PC_OP_PUSH && n && !grads) || (op != PC_OP_PUSH && n && !rows))
        return PC_EINVAL;
    /* A frame's length (header and body) is 32 bits where it is written: a request that may not
     * fit is refused here (servers take at most --max-body-bytes, 256 MiB by default, anyway) */
    if (pc_wire_batch_body_len_typed((pc_wire_op_t)op, strlen(table), (uint32_t)n, dim,
                                     PC_WIRE_F32) > UINT32_MAX - PC_WIRE_HDR)
        return PC_ETOOBIG;
    call_t *k = call_new(c, op, table);
    if (!k)
        return PC_ENOMEM;
    k->keys = keys;
    k->n = n;
    k->dim = dim;
    k->dtype = (uint8_t)atomic_load_explicit(&c->wire, memory_order_relaxed);
    k->epoch = op == PC_OP_PUSH ? atomic_load(&c->push_epoch) : 0;
    k->rows = rows;
    k->grads = grads;
    k->found = found;
    k->res = res;
    k->done = done;
    k->ctx = ctx;
    *id = k->id;
    return call_submit(c, k);
}

/* A new call (not submitted yet). */
static call_t *call_new(psc_t *c, uint8_t op, const char *table) {
    call_t *k = pc_scalloc(PC_MEM_CLIENT, 1, sizeof *k);
    if (!k)
        return NULL;
    k->id = atomic_fetch_add(&c->next_id, 1);
    k->op = op;
    k->target = -1;
    snprintf(k->table, sizeof k->table, "%s", table);
    return k;
}

/* Hand call k to the I/O thread; PC_ECANCELED (k freed) when the client is closing. */
static int call_submit(psc_t *c, call_t *k) {
    atomic_fetch_add(&c->calls, 1);
    pthread_mutex_lock(&c->mu);
    if (c->stopping) {
        pthread_mutex_unlock(&c->mu);
        pc_sfree(k);
        return PC_ECANCELED;
    }
    k->next_live = c->live;
    c->live = k;
    if (c->submit_tail)
        c->submit_tail->next_submit = k;
    else
        c->submit_head = k;
    c->submit_tail = k;
    pthread_mutex_unlock(&c->mu);
    uv_async_send(&c->wake);
    return 0;
}

/* The detail of finished call k into buf (snprintf-like; "" for a success); under mu. */
static void call_why(const call_t *k, char *buf, size_t cap) {
    if (buf && cap)
        snprintf(buf, cap, "%s", k->rc ? k->why : "");
}

int psc_wait(psc_t *c, uint64_t id) {
    return psc_wait_detail(c, id, NULL, 0);
}

int psc_wait_detail(psc_t *c, uint64_t id, char *buf, size_t cap) {
    if (buf && cap)
        buf[0] = '\0';
    pthread_mutex_lock(&c->mu);
    call_t *k = c->live;
    while (k && k->id != id)
        k = k->next_live;
    if (k && k->done && !k->consumed && k->finished && pthread_equal(pthread_self(), c->thread)) {
        /* in the call's own callback: the I/O thread frees nothing until it returned */
        int rc = k->rc;
        call_why(k, buf, cap);
        pthread_mutex_unlock(&c->mu);
        return rc;
    }
    if (!k || k->done || k->consumed) {
        pthread_mutex_unlock(&c->mu);
        return PC_EINVAL;
    }
    if (!k->finished && pthread_equal(pthread_self(), c->thread)) { /* it would never end */
        pthread_mutex_unlock(&c->mu);
        PC_ERROR("psclient: a wait for a running call from a done callback (the client's own "
                 "thread): refused; the call's result stays to be taken from another thread");
        return PC_EINVAL;
    }
    c->waiters++;
    pthread_mutex_unlock(&c->mu);
    /* k stays allocated until consumed. Short calls finish within tens of microseconds:
     * yielding for a while lets the I/O thread run (also on the same core) and spares the
     * futex sleep and wake-up, which cost more than that on virtual machines. */
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    atomic_fetch_add_explicit(&c->spinners, 1, memory_order_relaxed);
    for (int i = 0; !atomic_load_explicit(&k->finished, memory_order_acquire); i++) {
        if ((i & 15) == 15) {
            clock_gettime(CLOCK_MONOTONIC, &t);
            if ((t.tv_sec - t0.tv_sec) * 1000000000L + (t.tv_nsec - t0.tv_nsec) > WAIT_SPIN_NS)
                break;
        }
        sched_yield();
    }
    atomic_fetch_sub_explicit(&c->spinners, 1, memory_order_relaxed);
    pthread_mutex_lock(&c->mu);
    while (!k->finished)
        pthread_cond_wait(&c->cv, &c->mu);
    int rc = k->rc;
    call_why(k, buf, cap);
    k->consumed = true; /* freed by the I/O thread's next sweep (its next wake-up) */
    if (--c->waiters == 0)
        pthread_cond_broadcast(&c->cv); /* a psc_close waiting for them */
    pthread_mutex_unlock(&c->mu);
    return rc;
}

int psc_pull_async(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
                   float *rows, psc_done_fn done, void *ctx, uint64_t *id) {
    return start_call(c, PC_OP_PULL, table, keys, n, dim, rows, NULL, NULL, NULL, done, ctx, id);
}

int psc_push_async(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
                   const float *grads, psc_push_result_t *res, psc_done_fn done, void *ctx,
                   uint64_t *id) {
    return start_call(c, PC_OP_PUSH, table, keys, n, dim, NULL, grads, NULL, res, done, ctx, id);
}

int psc_lookup_async(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
                     float *rows, uint8_t *found, psc_done_fn done, void *ctx, uint64_t *id) {
    return start_call(c, PC_OP_LOOKUP, table, keys, n, dim, rows, NULL, found, NULL, done, ctx, id);
}

/* Whether a blocking call may start here: not on the I/O thread (a done callback), where its
 * wait would never end (the thread runs the call's deadline too). Refused before anything is
 * sent: a push not applied, no rows written later. */
static bool may_block(const psc_t *c) {
    if (!c || !pthread_equal(pthread_self(), c->thread))
        return true;
    PC_ERROR("psclient: a blocking call from a done callback (the client's own thread): refused, "
             "nothing sent; start it with a callback, or from another thread");
    return false;
}

int psc_pull(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
             float *rows) {
    uint64_t id;
    int rc =
        may_block(c) ? psc_pull_async(c, table, keys, n, dim, rows, NULL, NULL, &id) : PC_EINVAL;
    return rc ? rc : psc_wait(c, id);
}

int psc_push(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
             const float *grads, psc_push_result_t *res) {
    uint64_t id;
    int rc = may_block(c) ? psc_push_async(c, table, keys, n, dim, grads, res, NULL, NULL, &id)
                          : PC_EINVAL;
    return rc ? rc : psc_wait(c, id);
}

int psc_lookup(psc_t *c, const char *table, const uint64_t *keys, size_t n, uint32_t dim,
               float *rows, uint8_t *found) {
    uint64_t id;
    int rc = may_block(c) ? psc_lookup_async(c, table, keys, n, dim, rows, found, NULL, NULL, &id)
                          : PC_EINVAL;
    return rc ? rc : psc_wait(c, id);
}

/* Submit call k (no callback) and wait for its result, the detail into why (may be NULL). */
static int call_run(psc_t *c, call_t *k, char *why, size_t cap) {
    if (!may_block(c)) {
        pc_sfree(k); /* (not submitted) */
        if (why && cap)
            snprintf(why, cap, "a blocking call from a done callback");
        return PC_EINVAL;
    }
    const uint64_t id = k->id;
    int rc = call_submit(c, k);
    if (why && cap && rc)
        why[0] = '\0';
    return rc ? rc : psc_wait_detail(c, id, why, cap);
}

/* A CLAIM of `mode` (and a fence's epoch) on every server with a role, its result into out. */
static int claim_run(psc_t *c, const char *table, const char *job, int mode, uint32_t epoch,
                     psc_claim_t *out) {
    memset(out, 0, sizeof *out);
    call_t *k = call_new(c, PC_OP_CLAIM, table);
    if (!k)
        return PC_ENOMEM;
    k->job = job;
    k->mode = mode;
    k->epoch = epoch;
    k->claim = out;
    int rc = call_run(c, k, out->message, sizeof out->message);
    if (rc && !out->message[0])
        snprintf(out->message, sizeof out->message, "%s", pc_strerror(rc));
    return rc;
}

int psc_claim(psc_t *c, const char *table, const char *job, int mode, psc_claim_t *out) {
    if (!c || !table || !job || !out || !table[0] || strlen(table) > PC_WIRE_NAME_MAX ||
        strlen(job) > PC_WIRE_JOB_MAX || mode < PSC_CLAIM_CHECK || mode > PSC_CLAIM_INSPECT ||
        (!job[0] && mode != PSC_CLAIM_FRESH && mode != PSC_CLAIM_INSPECT))
        return PC_EINVAL;
    return claim_run(c, table, job, mode, 0, out);
}

int psc_fence(psc_t *c, const char *table, const char *job, uint32_t epoch, psc_claim_t *out) {
    if (!c || !table || !job || !out || !table[0] || strlen(table) > PC_WIRE_NAME_MAX || !job[0] ||
        strlen(job) > PC_WIRE_JOB_MAX || epoch == 0)
        return PC_EINVAL;
    const int rc = claim_run(c, table, job, PSC_CLAIM_FENCE, epoch, out);
    atomic_store(&c->push_epoch, rc ? 0 : epoch);
    return rc;
}

int psc_tables(psc_t *c, char *buf, size_t cap, size_t *len) {
    if (!c || (!buf && cap) || !len)
        return PC_EINVAL;
    call_t *k = call_new(c, PC_OP_TABLES, "-");
    if (!k)
        return PC_ENOMEM;
    *len = 0;
    k->text = buf;
    k->text_cap = cap;
    k->text_len = len;
    int rc = call_run(c, k, NULL, 0);
    if (!rc && *len >= cap)
        rc = PC_ETOOBIG;
    if (rc && rc != PC_ETOOBIG)
        *len = 0;
    return rc;
}

int psc_health(psc_t *c, int timeout_ms, psc_server_health_t *out, size_t cap) {
    if (!c || (!out && cap) || timeout_ms <= 0)
        return PC_EINVAL;
    call_t *k = call_new(c, PC_OP_PING, "-");
    if (!k)
        return PC_ENOMEM;
    size_t n = 0;
    k->health = out;
    k->health_cap = cap;
    k->nhealth = &n;
    k->timeout_ms = timeout_ms;
    int rc = call_run(c, k, NULL, 0);
    if (rc && rc != PC_ETIMEDOUT) /* a timeout leaves "no answer" for the servers still out */
        return rc;
    return (int)n;
}

/* DELTAS or SCAN of request q at its server; the reason of a failure into why. */
static int stream_call(psc_t *c, uint8_t op, const psc_stream_req_t *q, uint32_t flags,
                       uint64_t map_version, uint64_t start, psc_stream_t *out, char *why,
                       size_t cap) {
    if (why && cap)
        why[0] = '\0';
    const bool bounds = op == PC_OP_DELTAS && !q->cap; /* rows neither asked nor buffered */
    const uint32_t dim_max = flags & PC_STREAM_STATE ? PC_WIRE_STREAM_STRIDE_MAX : PC_WIRE_DIM_MAX;
    if (!c || !q || !out || !q->table || !q->table[0] || strlen(q->table) > PC_WIRE_NAME_MAX ||
        (flags & ~PC_STREAM_FLAGS) || ((flags & PC_STREAM_SAME_MAP) && op != PC_OP_SCAN) ||
        ((flags & PC_STREAM_BACKUP) && !(flags & PC_STREAM_SAME_MAP)) ||
        ((flags & PC_STREAM_CAUGHT) && !(flags & PC_STREAM_ACK)) ||
        ((flags & PC_STREAM_ACK) && (op != PC_OP_DELTAS || q->parts)) || (!q->dim && !bounds) ||
        q->dim > dim_max || (!bounds && (!q->cap || !q->keys || !q->found || !q->rows)) ||
        q->server > INT32_MAX || ((flags & PC_STREAM_COLD) && op != PC_OP_SCAN) ||
        (op == PC_OP_SCAN && (!q->parts || q->part >= q->parts + !!(flags & PC_STREAM_COLD))) ||
        (start && (!(flags & PC_STREAM_COLD) || q->part < q->parts)))
        return PC_EINVAL;
    memset(out, 0, sizeof *out);
    call_t *k = call_new(c, op, q->table);
    if (!k)
        return PC_ENOMEM;
    k->target = (int)q->server; /* a server the map does not have: PC_EINVAL (call_dispatch) */
    k->stream = q;
    k->stream_flags = flags;
    k->stream_map = map_version;
    k->stream_start = start;
    k->stream_out = out;
    k->dim = q->dim;
    return call_run(c, k, why, cap);
}

int psc_deltas(psc_t *c, const psc_stream_req_t *q, psc_stream_t *out, char *why, size_t cap) {
    return stream_call(c, PC_OP_DELTAS, q, 0, 0, 0, out, why, cap);
}

int psc_scan(psc_t *c, const psc_stream_req_t *q, psc_stream_t *out, char *why, size_t cap) {
    return stream_call(c, PC_OP_SCAN, q, 0, 0, 0, out, why, cap);
}

int psc__stream(psc_t *c, bool scan, const psc_stream_req_t *q, uint32_t flags,
                uint64_t map_version, uint64_t start, psc_stream_t *out, char *why, size_t cap) {
    return stream_call(c, scan ? PC_OP_SCAN : PC_OP_DELTAS, q, flags, map_version, start, out, why,
                       cap);
}

uint64_t psc_feature_key(uint32_t field, uint64_t value) {
    return pc_feature_key(field, value);
}

uint64_t psc_text_key(uint32_t field, const char *value, size_t len) {
    return pc_text_key(field, value, len);
}

uint64_t psc_missing_key(uint32_t field) {
    return pc_missing_key(field);
}

void psc_feature_keys(uint32_t field, const uint64_t *values, size_t n, uint64_t *out) {
    for (size_t i = 0; i < n; i++)
        out[i] = pc_feature_key(field, values[i]);
}

/* Connect: adopt the configured map (or a one-server placeholder), connect to every server and
 * wait until each answered HELLO (its newer map replaces the placeholder). */
static void on_connect_start(uv_async_t *a) {
    psc_t *c = a->data;
    uv_close((uv_handle_t *)a, close_free);
    pthread_mutex_lock(&c->mu);
    const bool stopping = c->stopping; /* (a connect that gave up before this ran: its stop,
                                        * already handled, closed no connection of these) */
    pthread_mutex_unlock(&c->mu);
    for (size_t i = 0; i < c->nsrv && !stopping; i++)
        if (c->srv[i]) /* (NULL: out of memory; psc_connect fails) */
            server_connect(c->srv[i]);
}

int psc_connect(const psc_opts_t *o, psc_t **out) {
    return psc_connect2(o, NULL, NULL, 0, out);
}

int psc_connect2(const psc_opts_t *o, const psc_tls_opts_t *tls, char *why, size_t cap,
                 psc_t **out) {
    if (why && cap)
        why[0] = '\0';
    if (!o || !o->servers || !out || (o->token && strlen(o->token) >= 256) ||
        (tls && tls->server_name && strlen(tls->server_name) >= 256))
        return PC_EINVAL;
    pc_tls_ctx_t *ctx = NULL;
    if (tls) { /* the files are read now, on the caller's thread */
        pc_tls_opts_t to = {.cert = tls->cert, .key = tls->key, .ca = tls->ca};
        char err[PSC_WHY_MAX];
        const int rc = pc_tls_ctx_create(&to, &ctx, err, sizeof err);
        if (rc) {
            PC_ERROR("psclient: cannot connect: %s", err);
            if (why && cap)
                snprintf(why, cap, "%s", err);
            return rc;
        }
    }
    psc_t *c = pc_scalloc(PC_MEM_CLIENT, 1, sizeof *c);
    if (!c) {
        pc_tls_ctx_destroy(ctx);
        return PC_ENOMEM;
    }
    c->tls = ctx;
    if (tls && tls->server_name)
        snprintf(c->tls_name, sizeof c->tls_name, "%s", tls->server_name);
    c->o = *o;
    c->o.timeout_ms = o->timeout_ms > 0 ? o->timeout_ms : 10000;
    c->o.max_inflight = o->max_inflight > 0 ? o->max_inflight : 8;
    c->o.retries = o->retries >= 0 ? (o->retries ? o->retries : 3) : 0;
    c->o.connect_timeout_ms = o->connect_timeout_ms > 0 ? o->connect_timeout_ms : 5000;
    snprintf(c->token, sizeof c->token, "%s", o->token ? o->token : "");
    c->o.token = c->token;
    c->o.servers = NULL;
    atomic_store(&c->next_id, 1);
    atomic_store(&c->next_fid, 1);
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    uv_loop_init(&c->loop);
    c->loop.data = c;
    pc_cluster_map_t *m;
    char err[128], text[PC_ADDR_MAX + 64];
    int rc = 0;
    if (strchr(o->servers, '=')) {
        rc = pc_cmap_parse(o->servers, &m, err, sizeof err);
    } else { /* one address: a placeholder map until that server's HELLO answer */
        snprintf(text, sizeof text, "version=1;servers=%s;slots=0-16383:0", o->servers);
        rc = pc_cmap_parse(text, &m, err, sizeof err);
    }
    if (rc) {
        PC_ERROR("psclient: servers: %s", err);
        if (why && cap)
            snprintf(why, cap, "servers: %s", err);
        uv_loop_close(&c->loop);
        pc_tls_ctx_destroy(c->tls);
        pc_sfree(c);
        return PC_EINVAL;
    }
    map_adopt(c, m);
    c->placeholder = !strchr(o->servers, '=');
    /* Wait for the servers with a role: one listed with none (the dead server a failover left
     * in the map, one added for a resharding) holds nothing a call needs, and a dead one made
     * every connect fail (a worker restarted after a failover could not join its job). One that
     * has a role in the caller's map but not in a newer one a server answers with is not waited
     * for from then on (connect_check). */
    bool missing = !c->map; /* out of memory in map_adopt: a map or a server object short */
    for (size_t i = 0; i < c->nsrv; i++) {
        if (!c->srv[i])
            missing = true;
        else /* (connect_check counts those with a role) */
            c->srv[i]->hello_wait = true;
    }
    c->connect_phase = true;
    if (missing) {
        c->connect_done = true;
        c->connect_rc = PC_ENOMEM;
        snprintf(c->connect_why, sizeof c->connect_why, "out of memory for the cluster map");
    } else {
        connect_check(c); /* (no thread yet: mu is not needed) */
    }
    uv_async_init(&c->loop, &c->wake, on_wake);
    c->wake.data = c;
    uv_async_t *start = pc_smalloc(PC_MEM_CLIENT, sizeof *start);
    if (!start || uv_async_init(&c->loop, start, on_connect_start)) {
        pc_sfree(start);
        c->stopping = true; /* the loop closes everything and ends at once */
        uv_close((uv_handle_t *)&c->wake, NULL);
    } else {
        start->data = c;
        uv_async_send(start);
    }
    if (pthread_create(&c->thread, NULL, io_main, c)) {
        PC_ERROR("psclient: cannot start the I/O thread");
        abort(); /* the loop holds handles that only its thread can close */
    }
    if (!start) {
        psc_close(c);
        return PC_ENOMEM;
    }
    /* Wait (bounded) for every HELLO answer. */
    struct timespec dl;
    clock_gettime(CLOCK_REALTIME, &dl);
    dl.tv_sec += c->o.connect_timeout_ms / 1000;
    dl.tv_nsec += (long)(c->o.connect_timeout_ms % 1000) * 1000000L;
    if (dl.tv_nsec >= 1000000000L) {
        dl.tv_sec++;
        dl.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->mu);
    int w = 0;
    while (w == 0 && !c->connect_done)
        w = pthread_cond_timedwait(&c->cv, &c->mu, &dl);
    c->connect_phase = false; /* (decided, or given up: nothing is noted after) */
    rc = c->connect_rc ? c->connect_rc : w ? PC_EUNAVAIL : 0;
    if (rc && !c->connect_rc)
        snprintf(c->connect_why, sizeof c->connect_why, "%d server(s) did not answer within %d ms",
                 c->hello_pending, c->o.connect_timeout_ms);
    if (rc) /* logged here, and given to psc_connect2's caller */
        PC_ERROR("psclient: cannot connect: %s", c->connect_why);
    if (rc && why && cap)
        snprintf(why, cap, "%s", c->connect_why);
    pthread_mutex_unlock(&c->mu);
    if (rc) {
        psc_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void psc_close(psc_t *c) {
    if (!c)
        return;
    if (pthread_equal(pthread_self(), c->thread)) { /* it would wait for itself */
        PC_ERROR("psclient: psc_close from a done callback (the client's own thread): not "
                 "closed; close it from another thread");
        return;
    }
    pthread_mutex_lock(&c->mu);
    bool was = c->stopping;
    c->stopping = true;
    pthread_mutex_unlock(&c->mu);
    if (!was)
        uv_async_send(&c->wake);
    pthread_join(c->thread, NULL);
    pthread_mutex_lock(&c->mu); /* threads in psc_wait: their calls ended (canceled); they leave */
    while (c->waiters)
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    uv_run(&c->loop, UV_RUN_DEFAULT); /* close callbacks still pending */
    for (call_t *k = c->live, *nx; k; k = nx) {
        nx = k->next_live;
        pc_sfree(k->retry);
        pc_sfree(k);
    }
    for (server_t *s = c->all, *nx; s; s = nx) {
        nx = s->next_all;
        pc_sfree(s->body);
        pc_tls_free(s->tls);
        pc_sfree(s);
    }
    if (uv_loop_close(&c->loop) != 0)
        PC_ERROR("psclient: loop closed with handles open");
    pc_cmap_destroy(c->map);
    pc_sfree(c->srv);
    pc_sfree(c->map_text);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pc_tls_ctx_destroy(c->tls);
    pc_sfree(c);
}

int psc_set_wire_type(psc_t *c, int type) {
    if (!c || type < PSC_WIRE_F32 || type > PSC_WIRE_F16)
        return PC_EINVAL;
    atomic_store_explicit(&c->wire, type, memory_order_relaxed);
    return 0;
}

int psc_wire_type(psc_t *c) {
    return c ? atomic_load_explicit(&c->wire, memory_order_relaxed) : PC_EINVAL;
}

size_t psc_map_text(psc_t *c, char *buf, size_t cap) {
    pthread_mutex_lock(&c->mu);
    size_t len = c->map_text ? strlen(c->map_text) : 0;
    if (cap)
        snprintf(buf, cap, "%s", c->map_text ? c->map_text : "");
    pthread_mutex_unlock(&c->mu);
    return len;
}

uint64_t psc_map_unclean_slots(psc_t *c) {
    return atomic_load(&c->unclean);
}

void psc_stats(psc_t *c, psc_stats_t *s) {
    s->calls = atomic_load(&c->calls);
    s->retries = atomic_load(&c->retries);
    s->map_refreshes = atomic_load(&c->refreshes);
    s->reconnects = atomic_load(&c->reconnects);
    s->timeouts = atomic_load(&c->timeouts);
}

/* ==== version and errors =================================================================== */

unsigned int psc_version(void) {
    return PSC_VERSION_HEX;
}

const char *psc_version_string(void) {
    return VERSION_STRING;
}

const char *psc_strerror(int err) {
    return pc_strerror(err);
}

const char *psc_err_name(int err) {
    return pc_err_name(err);
}
