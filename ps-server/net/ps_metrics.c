/* ps_metrics.c: see ps_metrics.h. */
#include "ps_metrics.h"

#include "pc_error.h"
#include "pc_log.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

struct ps_metrics {
    struct MHD_Daemon *d;
    ps_metrics_fn fn;
    void *ctx;
    int port;
};

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    ps_metrics_t *m = cls;
    unsigned code = MHD_HTTP_OK;
    char *body = NULL;
    size_t len = 0;
    if (strcmp(method, "GET") != 0) {
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
    } else if (strcmp(url, "/metrics") != 0) {
        code = MHD_HTTP_NOT_FOUND;
    } else {
        size_t cap = 64 << 10;
        for (int tries = 0; tries < 4; tries++) {
            char *b = realloc(body, cap);
            if (!b)
                break;
            body = b;
            len = m->fn(m->ctx, body, cap);
            if (len < cap)
                break;
            cap = len + 4096;
        }
        if (!body || len >= cap) {
            code = MHD_HTTP_INTERNAL_SERVER_ERROR;
            len = 0;
        }
    }
    struct MHD_Response *r =
        code == MHD_HTTP_OK
            ? MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE)
            : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (code != MHD_HTTP_OK)
        free(body);
    if (!r)
        return MHD_NO;
    if (code == MHD_HTTP_OK)
        MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

int ps_metrics_start(const char *host, int port, ps_metrics_fn fn, void *ctx, ps_metrics_t **out) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (!fn || !out || inet_pton(AF_INET, host, &a.sin_addr) != 1)
        return PC_EINVAL;
    ps_metrics_t *m = calloc(1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    m->fn = fn;
    m->ctx = ctx;
    m->d = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG, (uint16_t)port,
                            NULL, NULL, answer, m, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&a,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10, MHD_OPTION_END);
    if (!m->d) {
        PC_ERROR("metrics: cannot listen on %s:%d", host, port);
        free(m);
        return PC_EIO;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
    m->port = info ? info->port : port;
    PC_INFO("metrics on http://%s:%d/metrics", host, m->port);
    *out = m;
    return 0;
}

int ps_metrics_port(const ps_metrics_t *m) {
    return m->port;
}

void ps_metrics_stop(ps_metrics_t *m) {
    if (!m)
        return;
    MHD_stop_daemon(m->d);
    free(m);
}
