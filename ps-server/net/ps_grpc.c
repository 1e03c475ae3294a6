/* ps_grpc.c: see ps_grpc.h. Follows ../shared TOOLCHAIN facts for gRPC C core 1.51: grpc_init
 * first; initial metadata always sent with the status; grpc_op arrays zeroed; byte buffers read
 * with readall; shutdown: shutdown_and_notify, cancel_all_calls, drain, destroy server, shut
 * down and drain the queues. */
#include "ps_grpc.h"

#include "emberps/psgrpc.h"

#include "health.pb-c.h"
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_grpc_log.h"
#include "pc_hist.h"
#include "pc_log.h"
#include "pc_time.h"

#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/slice.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOKEN_KEY    "x-emberps-token"
#define HEALTH_CHECK "/grpc.health.v1.Health/Check"
#define HEALTH_WATCH "/grpc.health.v1.Health/Watch"
#define PEM_MAX      (1u << 20)
#define HEALTH_MAX   1024 /* bytes of a HealthCheckRequest: a service name */
/* ms a Health call's request may take to arrive: no token guards it, so a peer that opens Check
 * calls and sends no body holds a thread (there are few) this long, not call_wait_ms */
#define HEALTH_WAIT_MS 1000
#define CALL_WAIT_MS   30000 /* call_wait_ms's default */

typedef struct worker {
    struct ps_grpc *g;
    grpc_completion_queue *cq;
    pthread_t thread;
    bool started;
} worker_t;

struct ps_grpc {
    ps_grpc_service_t svc;
    char token[256], admin[256];
    grpc_server *server;
    int port;
    int nworkers;
    worker_t *w;
    atomic_bool stopping;
    atomic_bool serving; /* health: SERVING; API calls accepted */
    /* Read-held by every API call from its check of `serving` to its end; ps_grpc_set_serving
     * takes it exclusively (writers first), so when it turns serving off no call still runs
     * through env (the owner then stops what env points to: the data plane, the catalog). */
    pthread_rwlock_t gate;
    atomic_uint_least64_t calls, errors;
    atomic_uint_least64_t stalled; /* calls cancelled after call_wait_ms */
    /* Administrative calls running (a checkpoint or a restore runs for minutes): at most
     * admin_max, one handler thread fewer than there are, so that one stays for the data calls
     * and health checks (two checkpoints on two threads held every Lookup and Health call, and a
     * liveness probe restarted the server); a call past it is answered UNAVAILABLE at once. */
    atomic_int admin_running;
    int admin_max;
    atomic_uint_least64_t admin_busy; /* calls answered so */
    uint32_t call_wait_ms;
    pc_hist_t lat; /* request received -> reply sent */
};

/* The value of metadata `key`, compared in constant time with `want`. */
static bool token_ok(const grpc_metadata_array *md, const char *want) {
    const size_t wl = strlen(want);
    for (size_t i = 0; i < md->count; i++) {
        const grpc_slice k = md->metadata[i].key, v = md->metadata[i].value;
        if (GRPC_SLICE_LENGTH(k) != sizeof TOKEN_KEY - 1 ||
            memcmp(GRPC_SLICE_START_PTR(k), TOKEN_KEY, sizeof TOKEN_KEY - 1) != 0)
            continue;
        const size_t vl = GRPC_SLICE_LENGTH(v);
        const uint8_t *p = GRPC_SLICE_START_PTR(v);
        unsigned diff = vl != wl;
        for (size_t j = 0; j < wl; j++)
            diff |= (unsigned)((uint8_t)want[j] ^ (j < vl ? p[j] : 0));
        return diff == 0;
    }
    return false;
}

/* The method path of a call is `want` (a NUL-terminated literal). */
static bool path_is(const grpc_call_details *d, const char *want) {
    const size_t n = strlen(want);
    return GRPC_SLICE_LENGTH(d->method) == n &&
           memcmp(GRPC_SLICE_START_PTR(d->method), want, n) == 0;
}

/* grpc.health.v1.Health/Check: the serving status of service "" or one this server has. */
static void health_check(struct ps_grpc *g, const uint8_t *req, size_t len, ps_api_reply_t *r) {
    if (len > HEALTH_MAX) { /* no token here: nothing large is unpacked (unknown fields cost
                               ~40x their bytes in protobuf-c) */
        ps_api_fail(r, PC_ETOOBIG, "HealthCheckRequest over %d bytes", HEALTH_MAX);
        return;
    }
    Grpc__Health__V1__HealthCheckRequest *q = grpc__health__v1__health_check_request__unpack(
        ps_api_budget(&(ps_api_budget_t){0}, len), len, req);
    if (!q) {
        ps_api_fail(r, PC_EPARSE, "malformed HealthCheckRequest");
        return;
    }
    const char *svc = q->service;
    bool known = !svc[0];
    for (const char *const *n = g->svc.names; !known && n && *n; n++)
        known = strcmp(svc, *n) == 0;
    if (!known) {
        ps_api_fail(r, PC_ENOTFOUND, "unknown service '%.200s'", svc);
    } else {
        Grpc__Health__V1__HealthCheckResponse a = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
        const bool up =
            atomic_load(&g->serving) && (!g->svc.ready || g->svc.ready(g->svc.ctx, svc));
        a.status = up ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                      : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
        r->len = grpc__health__v1__health_check_response__get_packed_size(&a);
        r->body = malloc(r->len + 1);
        if (r->body)
            grpc__health__v1__health_check_response__pack(&a, r->body);
        else
            ps_api_fail(r, PC_ENOMEM, "out of memory");
    }
    grpc__health__v1__health_check_request__free_unpacked(q, NULL);
}

/* Run one batch and wait for it on the worker's queue, at most wait_ms: a client that sends
 * nothing (or too slowly), or never takes its reply, has its call cancelled instead of holding
 * this thread (the threads are few). */
static bool run_batch(worker_t *w, grpc_call *call, const grpc_op *ops, size_t n, void *tag,
                      int wait_ms) {
    grpc_call_error e = grpc_call_start_batch(call, ops, n, tag, NULL);
    if (e != GRPC_CALL_OK)
        return false;
    const gpr_timespec until =
        gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(wait_ms, GPR_TIMESPAN));
    grpc_event ev = grpc_completion_queue_next(w->cq, until, NULL);
    if (ev.type == GRPC_QUEUE_TIMEOUT) {
        atomic_fetch_add_explicit(&w->g->stalled, 1, memory_order_relaxed);
        grpc_call_cancel(call, NULL); /* the batch then completes, failed: taken off the queue */
        (void)grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
        return false;
    }
    return ev.type == GRPC_OP_COMPLETE && ev.tag == tag && ev.success;
}

/* Count an administrative call in, or false when admin_max run already. */
static bool admin_enter(struct ps_grpc *g) {
    int cur = atomic_load(&g->admin_running);
    do {
        if (cur >= g->admin_max)
            return false;
    } while (!atomic_compare_exchange_weak(&g->admin_running, &cur, cur + 1));
    return true;
}

static void handle(worker_t *w, grpc_call *call, const grpc_call_details *d,
                   const grpc_metadata_array *md) {
    struct ps_grpc *g = w->g;
    ps_api_reply_t r;
    memset(&r, 0, sizeof r);
    const int m =
        g->svc.method((const char *)GRPC_SLICE_START_PTR(d->method), GRPC_SLICE_LENGTH(d->method));
    const bool health = path_is(d, HEALTH_CHECK), watch = path_is(d, HEALTH_WATCH);
    const bool admin_call = m >= 0 && g->svc.is_admin(m);
    const char *need = admin_call && g->admin[0] ? g->admin : g->token;
    /* The admin token opens every call (it replaces the token for administrative ones): a server
     * of the cluster presents it to a remote coordinator for its cluster/ keys and for the
     * plain KV calls alike (before, those were refused with it, unless both tokens were one). */
    const bool authed =
        !need[0] || token_ok(md, need) || (!admin_call && g->admin[0] && token_ok(md, g->admin));
    /* refusals by the method and the metadata come before the message is read: a peer without
     * the token has no request body copied (health: no token, probes send none; ps_grpc.h) */
    if (watch)
        ps_api_fail(&r, PC_EUNSUPPORTED, "Watch is not served: poll Check");
    else if (!health && !authed)
        ps_api_fail(&r, PC_EAUTH, "missing or wrong %s", TOKEN_KEY);
    else if (!health && m < 0)
        ps_api_fail(&r, PC_EUNSUPPORTED, "no such method");
    grpc_byte_buffer *in = NULL;
    grpc_op op[4];
    memset(op, 0, sizeof op);
    op[0].op = GRPC_OP_RECV_MESSAGE;
    op[0].data.recv_message.recv_message = &in;
    /* Calls open to anyone (health) and calls refused by their metadata get the short wait, for
     * their request and their reply alike: a peer with no token that never lets its reply go out
     * (an HTTP/2 window of 0) would hold a handler thread for call_wait_ms. */
    const uint32_t short_ms = g->call_wait_ms > HEALTH_WAIT_MS ? HEALTH_WAIT_MS : g->call_wait_ms;
    const uint32_t wait_ms = health || r.err ? short_ms : g->call_wait_ms;
    if (!r.err && !run_batch(w, call, op, 1, (void *)1, (int)wait_ms)) {
        if (in) /* a message that completed as the wait gave up */
            grpc_byte_buffer_destroy(in);
        return;
    }
    grpc_slice s = grpc_empty_slice();
    if (in && health && grpc_byte_buffer_length(in) > HEALTH_MAX) {
        /* not copied: health_check refuses it by its length (no token here) */
        ps_api_fail(&r, PC_ETOOBIG, "HealthCheckRequest over %d bytes", HEALTH_MAX);
    } else if (in) {
        grpc_byte_buffer_reader rd;
        if (grpc_byte_buffer_reader_init(&rd, in)) {
            s = grpc_byte_buffer_reader_readall(&rd);
            grpc_byte_buffer_reader_destroy(&rd);
        }
    }
    if (r.err) {
        /* refused above */
    } else if (health) {
        health_check(g, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s), &r);
    } else if (admin_call && !admin_enter(g)) {
        atomic_fetch_add_explicit(&g->admin_busy, 1, memory_order_relaxed);
        ps_api_fail(&r, PC_EUNAVAIL,
                    PSG_BUSY
                    "%d of the %d handler threads run administrative calls, the last "
                    "stays for data calls and health checks: try again, or start the server with "
                    "more --grpc-threads",
                    g->admin_max, g->nworkers);
    } else {
        /* serving is looked at before the gate and while trying it: a stop turns it off first
         * and then waits on the gate for the calls in flight (ps_grpc_set_serving), and a call
         * queued there behind it (the gate prefers writers) would wait as long (a checkpoint:
         * minutes), holding its handler thread; one that found serving on just before is told
         * at its next try */
        bool gated = false;
        while (atomic_load(&g->serving) && !(gated = pthread_rwlock_tryrdlock(&g->gate) == 0))
            pc_time_sleep_ms(1);
        if (!gated || !atomic_load(&g->serving))
            ps_api_fail(&r, PC_EUNAVAIL, "not serving (starting or shutting down)");
        else
            g->svc.call(g->svc.ctx, m, GRPC_SLICE_START_PTR(s), GRPC_SLICE_LENGTH(s),
                        !g->admin[0] || token_ok(md, g->admin), &r);
        if (gated)
            pthread_rwlock_unlock(&g->gate);
        if (admin_call)
            atomic_fetch_sub(&g->admin_running, 1);
    }
    grpc_slice_unref(s);
    if (in)
        grpc_byte_buffer_destroy(in);
    atomic_fetch_add_explicit(&g->calls, 1, memory_order_relaxed);
    if (r.status != PS_ST_OK)
        atomic_fetch_add_explicit(&g->errors, 1, memory_order_relaxed);
    grpc_byte_buffer *out = NULL;
    if (r.status == PS_ST_OK) {
        grpc_slice body = grpc_slice_from_copied_buffer((const char *)r.body, r.len);
        out = grpc_raw_byte_buffer_create(&body, 1);
        grpc_slice_unref(body);
    }
    grpc_slice details = grpc_slice_from_copied_string(r.msg);
    /* The code's name beside its status, so that clients get the exact code back. */
    grpc_metadata code = {.key = grpc_slice_from_static_string(PC_GRPC_ERROR_KEY),
                          .value = grpc_slice_from_static_string(pc_err_name(r.err))};
    int cancelled = 0;
    size_t n = 0;
    memset(op, 0, sizeof op);
    op[n++].op = GRPC_OP_SEND_INITIAL_METADATA;
    if (out) {
        op[n].op = GRPC_OP_SEND_MESSAGE;
        op[n++].data.send_message.send_message = out;
    }
    op[n].op = GRPC_OP_SEND_STATUS_FROM_SERVER;
    op[n].data.send_status_from_server.status = (grpc_status_code)r.status;
    op[n].data.send_status_from_server.trailing_metadata_count = r.err ? 1 : 0;
    op[n].data.send_status_from_server.trailing_metadata = &code;
    op[n++].data.send_status_from_server.status_details = &details;
    op[n].op = GRPC_OP_RECV_CLOSE_ON_SERVER;
    op[n++].data.recv_close_on_server.cancelled = &cancelled;
    run_batch(w, call, op, n, (void *)2, (int)wait_ms);
    grpc_slice_unref(details);
    if (out)
        grpc_byte_buffer_destroy(out);
    ps_api_reply_free(&r);
}

static void *worker_main(void *arg) {
    worker_t *w = arg;
    struct ps_grpc *g = w->g;
    while (!atomic_load(&g->stopping)) {
        grpc_call *call = NULL;
        grpc_call_details d;
        grpc_metadata_array md;
        grpc_call_details_init(&d);
        grpc_metadata_array_init(&md);
        grpc_call_error e =
            grpc_server_request_call(g->server, &call, &d, &md, w->cq, w->cq, (void *)w);
        bool got = false;
        if (e == GRPC_CALL_OK) {
            grpc_event ev =
                grpc_completion_queue_next(w->cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
            got = ev.type == GRPC_OP_COMPLETE && ev.success;
        }
        if (got) {
            const uint64_t t0 = pc_time_mono_ns();
            handle(w, call, &d, &md);
            pc_hist_add(&g->lat, pc_time_mono_ns() - t0);
        }
        if (call)
            grpc_call_unref(call);
        grpc_call_details_destroy(&d);
        grpc_metadata_array_destroy(&md);
        if (e != GRPC_CALL_OK || !got)
            break; /* the server is shutting down */
    }
    return NULL;
}

/* Read one PEM file of the settings, logging which one failed. */
static int read_pem(const char *setting, const char *path, char **out) {
    int rc = pc_fs_read_all(path, PEM_MAX, out, NULL);
    if (rc)
        PC_ERROR("gRPC: %s %s: %s", setting, path, pc_strerror(rc));
    return rc;
}

/* The port's credentials: TLS from the PEM files when a certificate is set, else plaintext. */
static int server_credentials(const ps_grpc_opts_t *o, grpc_server_credentials **out) {
    *out = NULL;
    if (!o->tls_cert || !o->tls_cert[0]) {
        *out = grpc_insecure_server_credentials_create();
        return 0;
    }
    static const grpc_ssl_client_certificate_request_type k_req[] = {
        [PS_GRPC_AUTH_NONE] = GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
        [PS_GRPC_AUTH_REQUEST] = GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY,
        [PS_GRPC_AUTH_REQUIRE] = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY,
    };
    char *cert = NULL, *key = NULL, *ca = NULL;
    int rc = read_pem("tls_cert", o->tls_cert, &cert);
    if (!rc)
        rc = read_pem("tls_key", o->tls_key, &key);
    if (!rc && o->tls_ca && o->tls_ca[0])
        rc = read_pem("tls_ca", o->tls_ca, &ca);
    if (!rc) {
        grpc_ssl_pem_key_cert_pair pair = {.private_key = key, .cert_chain = cert};
        *out = grpc_ssl_server_credentials_create_ex(ca, &pair, 1, k_req[o->tls_client_auth], NULL);
        rc = *out ? 0 : PC_EIO;
    }
    free(cert);
    free(key);
    free(ca);
    return rc;
}

int ps_grpc_security_check(const char *host, const char *token, const char *tls_cert,
                           const char *tls_key, const char *tls_ca, int client_auth,
                           bool insecure_remote, char *why, size_t cap) {
    static const char *const k_auth[] = {"none", "request", "require"};
    const bool tls = tls_cert[0] && tls_key[0],
               loopback = strncmp(host, "127.", 4) == 0 || strcmp(host, "localhost") == 0;
    if (!tls_cert[0] != !tls_key[0])
        snprintf(why, cap, "--tls-cert and --tls-key go together (got only --%s)",
                 tls_cert[0] ? "tls-cert" : "tls-key");
    else if (client_auth < 0 || client_auth > 2)
        snprintf(why, cap, "--tls-client-auth: none, request or require");
    else if (client_auth != 0 && (!tls || !tls_ca[0]))
        snprintf(why, cap, "--tls-client-auth=%s needs --tls-cert, --tls-key and --tls-ca",
                 k_auth[client_auth]);
    else if (!loopback && !token[0] && !tls && !insecure_remote)
        snprintf(why, cap,
                 "refusing to listen on %s without a token or TLS (set --token, --tls-cert and "
                 "--tls-key, or --insecure-remote if the network is trusted)",
                 host);
    else
        return 0;
    return PC_EINVAL;
}

int ps_grpc_start(const ps_grpc_service_t *svc, const ps_grpc_opts_t *o, ps_grpc_t **out) {
    const bool tls = o && o->tls_cert && o->tls_cert[0];
    if (!svc || !svc->method || !svc->is_admin || !svc->call || !o || !o->addr || !out ||
        o->threads < 1 || o->threads > 64 || (o->token && strlen(o->token) >= 256) ||
        (o->admin_token && strlen(o->admin_token) >= 256) ||
        (tls && (!o->tls_key || !o->tls_key[0])) || (unsigned)o->tls_client_auth > 2 ||
        (o->tls_client_auth != PS_GRPC_AUTH_NONE && (!tls || !o->tls_ca || !o->tls_ca[0])))
        return PC_EINVAL;
    pc_grpc_log_route();
    grpc_init();
    ps_grpc_t *g = calloc(1, sizeof *g);
    worker_t *w = calloc((size_t)o->threads, sizeof *w);
    if (!g || !w) {
        free(g);
        free(w);
        grpc_shutdown();
        return PC_ENOMEM;
    }
    g->svc = *svc;
    g->w = w;
    g->call_wait_ms = o->call_wait_ms ? o->call_wait_ms : CALL_WAIT_MS;
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&g->gate, &ra);
    pthread_rwlockattr_destroy(&ra);
    snprintf(g->token, sizeof g->token, "%s", o->token ? o->token : "");
    snprintf(g->admin, sizeof g->admin, "%s", o->admin_token ? o->admin_token : "");
    grpc_arg args[3] = {
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_RECEIVE_MESSAGE_LENGTH,
         .value.integer = (int)o->max_message},
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_MAX_SEND_MESSAGE_LENGTH,
         .value.integer = (int)o->max_message},
        /* gRPC sets SO_REUSEPORT on Linux by default: a second server could share the port */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_ALLOW_REUSEPORT, .value.integer = 0},
    };
    grpc_channel_args ca = {3, args};
    g->server = grpc_server_create(&ca, NULL);
    for (int i = 0; i < o->threads; i++) {
        w[i].g = g;
        w[i].cq = grpc_completion_queue_create_for_next(NULL);
        grpc_server_register_completion_queue(g->server, w[i].cq, NULL);
    }
    g->nworkers = o->threads;
    g->admin_max = o->threads > 1 ? o->threads - 1 : 1; /* (one thread: nothing to keep) */
    grpc_server_credentials *cr;
    int rc = server_credentials(o, &cr);
    if (rc) {
        ps_grpc_stop(g);
        return rc;
    }
    g->port = grpc_server_add_http2_port(g->server, o->addr, cr);
    grpc_server_credentials_release(cr);
    if (g->port == 0) {
        PC_ERROR("gRPC: cannot listen on %s%s", o->addr,
                 tls ? " (or tls_cert and tls_key are not a valid pair)" : "");
        ps_grpc_stop(g);
        return PC_EIO;
    }
    grpc_server_start(g->server);
    for (int i = 0; i < o->threads; i++) {
        if (pthread_create(&w[i].thread, NULL, worker_main, &w[i])) {
            ps_grpc_stop(g);
            return PC_ESYS;
        }
        w[i].started = true;
    }
    static const char *const k_auth[] = {"", ", client certificates verified when sent",
                                         ", client certificates required"};
    PC_INFO("gRPC API on %s (port %d), %d threads%s%s%s", o->addr, g->port, o->threads,
            tls ? ", TLS only" : ", plaintext", k_auth[o->tls_client_auth],
            g->token[0] ? ", token required" : "");
    *out = g;
    return 0;
}

int ps_grpc_port(const ps_grpc_t *g) {
    return g->port;
}

void ps_grpc_set_serving(ps_grpc_t *g, bool serving) {
    if (!g)
        return;
    if (!serving) /* refused from now on, health NOT_SERVING, while the calls in flight end */
        atomic_store(&g->serving, false);
    pthread_rwlock_wrlock(&g->gate); /* calls in flight end first */
    atomic_store(&g->serving, serving);
    pthread_rwlock_unlock(&g->gate);
}

size_t ps_grpc_render_metrics(ps_grpc_t *g, char *buf, size_t cap, size_t len) {
    len = pc_prom_appendf(
        buf, cap, len,
        "# TYPE emberps_grpc_calls_total counter\nemberps_grpc_calls_total %llu\n"
        "# TYPE emberps_grpc_errors_total counter\nemberps_grpc_errors_total %llu\n"
        "# TYPE emberps_grpc_stalled_total counter\nemberps_grpc_stalled_total %llu\n"
        "# TYPE emberps_grpc_admin_busy_total counter\nemberps_grpc_admin_busy_total %llu\n"
        "# TYPE emberps_grpc_call_seconds histogram\n",
        (unsigned long long)atomic_load(&g->calls), (unsigned long long)atomic_load(&g->errors),
        (unsigned long long)atomic_load(&g->stalled),
        (unsigned long long)atomic_load(&g->admin_busy));
    return pc_hist_render(&g->lat, "emberps_grpc_call_seconds", "", buf, cap, len);
}

void ps_grpc_stop(ps_grpc_t *g) {
    if (!g)
        return;
    atomic_store(&g->stopping, true);
    atomic_store(&g->serving, false);
    grpc_completion_queue *scq = grpc_completion_queue_create_for_pluck(NULL);
    grpc_server_shutdown_and_notify(g->server, scq, (void *)g);
    grpc_server_cancel_all_calls(g->server);
    grpc_completion_queue_pluck(scq, (void *)g, gpr_inf_future(GPR_CLOCK_REALTIME), NULL);
    for (int i = 0; i < g->nworkers; i++)
        if (g->w[i].started)
            pthread_join(g->w[i].thread, NULL);
    grpc_server_destroy(g->server);
    grpc_completion_queue_shutdown(scq);
    grpc_completion_queue_destroy(scq);
    for (int i = 0; i < g->nworkers; i++) {
        grpc_completion_queue_shutdown(g->w[i].cq);
        while (
            grpc_completion_queue_next(g->w[i].cq, gpr_inf_future(GPR_CLOCK_REALTIME), NULL).type !=
            GRPC_QUEUE_SHUTDOWN)
            ;
        grpc_completion_queue_destroy(g->w[i].cq);
    }
    free(g->w);
    pthread_rwlock_destroy(&g->gate);
    free(g);
    grpc_shutdown();
}
