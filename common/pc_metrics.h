/* pc_metrics.h: the Prometheus endpoint, over HTTP served by libmicrohttpd.
 *
 * GET /metrics answers 200 with the text the render callback produces (Prometheus text format
 * 0.0.4); any other path 404, any other method 405. The callback runs on libmicrohttpd's thread.
 *
 * DESIGN: libmicrohttpd runs one internal thread with epoll (poll where the library lacks it),
 * never select(): select cannot watch a descriptor >= FD_SETSIZE (1024), and a server with a
 * thousand data-plane connections hands out descriptor numbers above that, which made /metrics
 * refuse every scrape. It holds at most `max_connections` connections at once (more wait in the
 * listen backlog, where they cost no descriptor) and closes any that has gone
 * PC_METRICS_REQUEST_MS without a request answered (idle, or sending its request a byte now and
 * then: each byte renewed the library's idle timeout, and 64 such clients blinded every scrape
 * for days), so a flood of connections cannot use up the process's descriptors or the endpoint.
 * The library's own messages (one per malformed request) go through
 * pc_log as WARN lines prefixed "metrics: http: ", rate-limited to PC_METRICS_LOG_LINES per
 * PC_METRICS_LOG_WINDOW_MS (the next line let through counts the suppressed ones).
 *
 * Thread rule: start and stop from one owner thread.
 */
#ifndef PC_METRICS_H
#define PC_METRICS_H

#include <stddef.h>

#define PC_METRICS_LOG_LINES     5
#define PC_METRICS_LOG_WINDOW_MS 10000
#define PC_METRICS_REQUEST_MS    10000 /* a connection's longest time without a request answered */

typedef struct pc_metrics pc_metrics_t;

/* Render into buf (cap bytes) starting at 0; return the length needed (the caller retries with
 * a larger buffer when it exceeds cap). */
typedef size_t (*pc_metrics_fn)(void *ctx, char *buf, size_t cap);

/* Serve on host:port (port 0: a free one), holding at most max_connections (>= 1) connections.
 * PC_EINVAL for a bad address or argument, PC_EIO when it cannot bind. */
int pc_metrics_start(const char *host, int port, unsigned max_connections, pc_metrics_fn fn,
                     void *ctx, pc_metrics_t **out);
int pc_metrics_port(const pc_metrics_t *m);
void pc_metrics_stop(pc_metrics_t *m);

#endif
