/* ps_metrics.h: the Prometheus endpoint, over HTTP served by libmicrohttpd.
 *
 * GET /metrics answers 200 with the text the render callback produces (Prometheus text format
 * 0.0.4); any other path 404, any other method 405. The callback runs on libmicrohttpd's thread.
 *
 * Thread rule: start and stop from one owner thread.
 */
#ifndef PS_METRICS_H
#define PS_METRICS_H

#include <stddef.h>

typedef struct ps_metrics ps_metrics_t;

/* Render into buf (cap bytes) starting at 0; return the length needed (the caller retries with
 * a larger buffer when it exceeds cap). */
typedef size_t (*ps_metrics_fn)(void *ctx, char *buf, size_t cap);

/* Serve on host:port (port 0: a free one). PC_EIO when it cannot bind. */
int ps_metrics_start(const char *host, int port, ps_metrics_fn fn, void *ctx, ps_metrics_t **out);
int ps_metrics_port(const ps_metrics_t *m);
void ps_metrics_stop(ps_metrics_t *m);

#endif
