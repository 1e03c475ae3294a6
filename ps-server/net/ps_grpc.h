/* ps_grpc.h: the gRPC transport of a daemon's API (proto/emberps.proto) and of the standard
 * health service (proto/health.proto, grpc.health.v1.Health).
 *
 * What it serves is a table of functions (ps_grpc_service_t): ps-server passes the handlers of
 * ps_api.h (emberps.ParameterServer, emberps.Coordinator), ps-serve its own (emberps.Serving,
 * serve/sv_api.h). The transport knows methods only by the index the service gives a path.
 *
 * gRPC C core, no generated stubs: `threads` handler threads, each with its own completion
 * queue, take one call at a time: receive the request message, check the token metadata
 * ("x-emberps-token"; the admin token for administrative methods when one is configured), run
 * the service's call, send initial metadata, the response and the status in one batch. A failed
 * call's status is its code's (pc_err_to_grpc) and its trailing metadata names the code
 * ("emberps-error: PC_EWRONGSLOT", PC_GRPC_ERROR_KEY). Messages over max_message bytes are
 * refused by gRPC itself with RESOURCE_EXHAUSTED (no name: PC_ETOOBIG at the client).
 *
 * DESIGN (security): with tls_cert and tls_key the port serves TLS only (there is no plaintext
 * port beside it); tls_client_auth asks for client certificates verified against tls_ca
 * (REQUEST: verified when sent; REQUIRE: a client without one fails its handshake, and sees
 * UNAVAILABLE, never a status from us). The token is checked on top of TLS, per call.
 *
 * DESIGN (health): grpc.health.v1.Health/Check answers without a token (probes cannot send
 * one; it tells nothing but the serving status, and the service's `ready` hook's say) for
 * service "" and the names the service lists
 * (ps-server: "emberps.ParameterServer" and, on a coordinator, "emberps.Coordinator"); other
 * names get NOT_FOUND. The status is NOT_SERVING
 * until the owner calls ps_grpc_set_serving(g, true) (tables restored, every listener up) and
 * again from ps_grpc_set_serving(g, false) on (shutting down); while not serving, API calls are
 * refused with PC_EUNAVAIL (UNAVAILABLE, which clients already retry). Watch answers
 * UNIMPLEMENTED (a handler thread serves one call at a time; a stream would hold it), which the
 * protocol tells clients to take as "poll Check instead".
 *
 * Thread rule: start, set_serving and stop from one owner thread.
 */
#ifndef PS_GRPC_H
#define PS_GRPC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ps_api.h"

typedef struct ps_grpc ps_grpc_t;

/* tls_client_auth: what a TLS server asks of clients. */
typedef enum {
    PS_GRPC_AUTH_NONE = 0,    /* no client certificate asked for */
    PS_GRPC_AUTH_REQUEST = 1, /* asked for; verified against tls_ca when sent */
    PS_GRPC_AUTH_REQUIRE = 2, /* required and verified against tls_ca */
} ps_grpc_auth_t;

typedef struct ps_grpc_opts {
    const char *addr;        /* "127.0.0.1:7500"; port 0 picks a free one */
    int threads;             /* handler threads, >= 1 */
    const char *token;       /* NULL/"": none */
    const char *admin_token; /* NULL/"": administrative calls need `token` like the rest */
    uint32_t max_message;    /* bytes, both directions */
    uint32_t call_wait_ms;   /* a call's request must arrive, and its reply leave, within this
                                (0: 30000): a stalled client's call is cancelled */
    const char *tls_cert;    /* PEM file of the certificate chain; with tls_key: TLS only */
    const char *tls_key;     /* PEM file of its private key */
    const char *tls_ca;      /* PEM file of the CA client certificates chain to (NULL/"": none) */
    ps_grpc_auth_t tls_client_auth; /* needs tls_ca unless NONE */
} ps_grpc_opts_t;

/* A daemon's security settings, checked in one place (ps-server, ps-serve): tls_cert and
 * tls_key go together, client authentication (a PS_GRPC_AUTH_*) needs them and tls_ca, and a
 * bind beyond loopback (host) needs a token or TLS unless insecure_remote. 0, or PC_EINVAL with
 * one line for the user in why, naming the flags. */
int ps_grpc_security_check(const char *host, const char *token, const char *tls_cert,
                           const char *tls_key, const char *tls_ca, int client_auth,
                           bool insecure_remote, char *why, size_t cap);

/* What a daemon serves: its methods as a table of functions over its context. */
typedef struct ps_grpc_service {
    const char *const *names; /* NULL-terminated service names health checks answer for */
    /* The method index (>= 0) of a path such as "/emberps.ParameterServer/Lookup", or -1. */
    int (*method)(const char *path, size_t len);
    /* Administrative methods: the admin token applies. */
    bool (*is_admin)(int method);
    /* Run one call: decode req, answer in out (ps_api_reply_t: a body or a failure). Called
     * from the handler threads at once; must be thread-safe. */
    /* admin: the caller presented the admin token, or none is set */
    void (*call)(void *ctx, int method, const uint8_t *req, size_t len, bool admin,
                 ps_api_reply_t *out);
    /* Whether `service` (one of names, or "") can do its work now, beside the transport's own
     * serving state: health checks answer NOT_SERVING while it says no (ps-serve: no model yet).
     * NULL: always. Thread-safe. */
    bool (*ready)(void *ctx, const char *service);
    void *ctx; /* borrowed until ps_grpc_stop */
} ps_grpc_service_t;

/* Start serving (NOT_SERVING until ps_grpc_set_serving); svc is copied, what it points to must
 * stay valid until ps_grpc_stop; the option strings are read during the call. PC_EIO when the
 * address cannot be bound or the certificate and key are not a valid pair, PC_EINVAL for bad
 * options, and pc_fs_read_all's codes for a PEM file that cannot be read (each logged with the
 * file). */
int ps_grpc_start(const ps_grpc_service_t *svc, const ps_grpc_opts_t *o, ps_grpc_t **out);
int ps_grpc_port(const ps_grpc_t *g);
/* SERVING (true) or NOT_SERVING (false) to health checks; API calls are refused while false.
 * Turning it off waits for the API calls in flight to end: after it returns, no call uses the
 * service's context (a catalog, a data plane), which the owner may then stop. */
void ps_grpc_set_serving(ps_grpc_t *g, bool serving);
/* Append call counters and the call latency histogram (Prometheus text) to buf at len, up to
 * cap; returns the length needed. */
size_t ps_grpc_render_metrics(ps_grpc_t *g, char *buf, size_t cap, size_t len);

/* Cancel calls in flight, join the threads, free. NULL is a no-op. */
void ps_grpc_stop(ps_grpc_t *g);

#endif
