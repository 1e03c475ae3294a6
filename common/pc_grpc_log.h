/* pc_grpc_log.h: gRPC C core's own log lines through pc_log.
 * gRPC writes its messages (a failed TLS handshake, a peer that went away) straight to stderr in
 * its own format, one per event: a scan or a misconfigured client floods the log. Routing them
 * here gives them pc_log's time, level and identity, and a rate limit (5 lines per 10 s; the next
 * line says how many were suppressed). gRPC's ERROR lines become WARN (they are about a peer),
 * INFO and DEBUG become DEBUG and TRACE (gRPC only passes them with GRPC_VERBOSITY set).
 * DESIGN: gRPC's hook (gpr_set_log_function) is process-wide and takes no context, so the rate
 * limit is this module's (static, made once); the one such piece of state, next to pc_log's.
 * Thread rule: pc_grpc_log_route is thread-safe and idempotent; call it before grpc_init.
 */
#ifndef PC_GRPC_LOG_H
#define PC_GRPC_LOG_H

/* Install the routing (once per process; later calls do nothing). */
void pc_grpc_log_route(void);

#endif
