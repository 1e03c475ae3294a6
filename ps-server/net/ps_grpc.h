/* ps_grpc.h: the gRPC transport of the public API (proto/emberps.proto, handlers in ps_api.h).
 *
 * gRPC C core, no generated stubs: `threads` handler threads, each with its own completion
 * queue, take one call at a time: receive the request message, check the token metadata
 * ("x-emberps-token"; the admin token for administrative methods when one is configured), run
 * ps_api_call, send initial metadata, the response and the status in one batch. A failed call's
 * status is its code's (pc_err_to_grpc) and its trailing metadata names the code
 * ("emberps-error: PC_EWRONGSLOT", PC_GRPC_ERROR_KEY). Messages over max_message bytes are
 * refused by gRPC itself with RESOURCE_EXHAUSTED (no name: PC_ETOOBIG at the client).
 *
 * Thread rule: start and stop from one owner thread.
 */
#ifndef PS_GRPC_H
#define PS_GRPC_H

#include <stddef.h>
#include <stdint.h>

#include "ps_api.h"

typedef struct ps_grpc ps_grpc_t;

typedef struct ps_grpc_opts {
    const char *addr;        /* "127.0.0.1:7500"; port 0 picks a free one */
    int threads;             /* handler threads, >= 1 */
    const char *token;       /* NULL/"": none */
    const char *admin_token; /* NULL/"": administrative calls need `token` like the rest */
    uint32_t max_message;    /* bytes, both directions */
} ps_grpc_opts_t;

/* Start serving; env (copied) must stay valid until ps_grpc_stop. PC_EIO when the address
 * cannot be bound. */
int ps_grpc_start(const ps_api_env_t *env, const ps_grpc_opts_t *o, ps_grpc_t **out);
int ps_grpc_port(const ps_grpc_t *g);
/* Append call counters and the call latency histogram (Prometheus text) to buf at len, up to
 * cap; returns the length needed. */
size_t ps_grpc_render_metrics(ps_grpc_t *g, char *buf, size_t cap, size_t len);

/* Cancel calls in flight, join the threads, free. NULL is a no-op. */
void ps_grpc_stop(ps_grpc_t *g);

#endif
