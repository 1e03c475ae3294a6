/* pc_metrics.c: the /metrics endpoint on libmicrohttpd (see pc_metrics.h for the contract).
 *
 * DESIGN: the daemon is started in epoll mode when the library has it (MHD_FEATURE_EPOLL; Debian
 * 12's 0.9.75 does), else poll; select() is never used (descriptors >= 1024). The connection
 * limit and the idle timeout bound what the endpoint holds. The idle timeout alone let a client
 * that sends a byte now and then keep its connection for days (each byte renews it), and 64 of
 * them blinded every scrape: so each connection is also on a list (MHD_OPTION_NOTIFY_CONNECTION,
 * under `mu`) with the time of its start, of its last request line (URI_LOG_CALLBACK) or of its
 * last answered request (NOTIFY_COMPLETED), and a watchdog thread shuts down (shutdown(2); the
 * daemon sees the end and closes it) any that has gone PC_METRICS_REQUEST_MS past that time: a
 * request is answered within it, or its connection goes. The daemon calls the CLOSED notice
 * before it closes the socket, and the watchdog shuts down only listed connections under `mu`, so
 * it never touches a descriptor number reused since. The library's messages arrive through
 * MHD_OPTION_EXTERNAL_LOGGER on its thread and are formatted into one pc_log line each, through
 * a rate limit that lives in the pc_metrics_t (created before the daemon, freed after it).
 */
#include "pc_metrics.h"

#include "pc_error.h"
#include "pc_log.h"

#include "pc_time.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* A connection the watchdog times (see DESIGN). */
typedef struct watched {
    struct watched *prev, *next;
    int fd;
    uint64_t since_ns; /* its start, or the end of its last request */
    bool cut;          /* shut down already */
} watched_t;

struct pc_metrics {
    struct MHD_Daemon *d;
    pc_metrics_fn fn;
    void *ctx;
    int port;
    pc_log_limit_t log_limit; /* libmicrohttpd's own messages */
    pthread_mutex_t mu;       /* the list, stop */
    pthread_cond_t cv;
    watched_t *conns;
    bool stop, watching;
    pthread_t watchdog;
};

/* MHD_OPTION_NOTIFY_CONNECTION: list a connection at its start, unlist it at its end. */
static void on_conn(void *cls, struct MHD_Connection *conn, void **socket_context,
                    enum MHD_ConnectionNotificationCode code) {
    pc_metrics_t *m = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *ci =
            MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        watched_t *w = ci ? calloc(1, sizeof *w) : NULL;
        *socket_context = w;
        if (!w)
            return; /* not timed: the idle timeout still holds */
        w->fd = ci->connect_fd;
        w->since_ns = pc_time_mono_ns();
        pthread_mutex_lock(&m->mu);
        w->next = m->conns;
        if (m->conns)
            m->conns->prev = w;
        m->conns = w;
        pthread_mutex_unlock(&m->mu);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        watched_t *w = *socket_context;
        pthread_mutex_lock(&m->mu);
        if (w->prev)
            w->prev->next = w->next;
        else
            m->conns = w->next;
        if (w->next)
            w->next->prev = w->prev;
        pthread_mutex_unlock(&m->mu);
        free(w);
        *socket_context = NULL;
    }
}

/* Restart the time of conn's connection. */
static void restart(pc_metrics_t *m, struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    watched_t *w = ci ? ci->socket_context : NULL;
    if (!w)
        return;
    pthread_mutex_lock(&m->mu);
    w->since_ns = pc_time_mono_ns();
    pthread_mutex_unlock(&m->mu);
}

/* MHD_OPTION_URI_LOG_CALLBACK: a request line came; its request has the whole time (a
 * keep-alive scraper's next request, near the end of the idle time, is not cut mid-answer). */
static void *on_request(void *cls, const char *uri, struct MHD_Connection *conn) {
    (void)uri;
    restart(cls, conn);
    return NULL;
}

/* MHD_OPTION_NOTIFY_COMPLETED: a request answered (or ended) restarts the time too. */
static void on_done(void *cls, struct MHD_Connection *conn, void **con_cls,
                    enum MHD_RequestTerminationCode code) {
    (void)con_cls;
    (void)code;
    restart(cls, conn);
}

/* The watchdog: every quarter of PC_METRICS_REQUEST_MS, shut down the connections past it. */
static void *watchdog_main(void *arg) {
    pc_metrics_t *m = arg;
    const uint64_t limit_ns = (uint64_t)PC_METRICS_REQUEST_MS * 1000000u;
    pthread_mutex_lock(&m->mu);
    while (!m->stop) {
        const struct timespec until = pc_time_mono_ts(pc_time_mono_ns() + limit_ns / 4);
        pthread_cond_timedwait(&m->cv, &m->mu, &until);
        const uint64_t now = pc_time_mono_ns();
        unsigned cut = 0;
        for (watched_t *w = m->conns; w && !m->stop; w = w->next)
            if (!w->cut && now - w->since_ns > limit_ns) {
                w->cut = true;
                shutdown(w->fd, SHUT_RDWR);
                cut++;
            }
        if (cut)
            PC_LOG_LIMITED(&m->log_limit, PC_LOG_WARN,
                           "metrics: http: %u connection(s) held %d ms without a request "
                           "answered: closed",
                           cut, PC_METRICS_REQUEST_MS);
    }
    pthread_mutex_unlock(&m->mu);
    return NULL;
}

/* libmicrohttpd's messages (MHD_OPTION_EXTERNAL_LOGGER): one WARN line each, rate-limited. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    pc_metrics_t *m = cls;
    char msg[512];
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    if (n < 0)
        return;
    size_t len = strnlen(msg, sizeof msg);
    while (len && (msg[len - 1] == '\n' || msg[len - 1] == '\r'))
        msg[--len] = '\0';
    PC_LOG_LIMITED(&m->log_limit, PC_LOG_WARN, "metrics: http: %s", msg);
}

static enum MHD_Result answer(void *cls, struct MHD_Connection *conn, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)version;
    (void)upload;
    (void)upload_size;
    (void)con_cls;
    pc_metrics_t *m = cls;
    unsigned code = MHD_HTTP_OK;
    char *body = NULL;
    size_t len = 0;
    if (strcmp(method, "GET") != 0) {
        code = MHD_HTTP_METHOD_NOT_ALLOWED;
    } else if (strcmp(url, "/metrics") != 0) {
        code = MHD_HTTP_NOT_FOUND;
    } else {
        size_t cap = 64 << 10, have = 0; /* have: body's size (cap: the next one asked) */
        for (int tries = 0; tries < 4; tries++) {
            char *b = realloc(body, cap);
            if (!b)
                break;
            body = b;
            have = cap;
            len = m->fn(m->ctx, body, have);
            if (len < have)
                break;
            cap = len + 4096;
        }
        if (!body || len >= have) {
            code = MHD_HTTP_INTERNAL_SERVER_ERROR;
            len = 0;
        }
    }
    struct MHD_Response *r =
        code == MHD_HTTP_OK
            ? MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE)
            : MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (code != MHD_HTTP_OK || !r)
        free(body); /* (MHD owns it only once the response was made) */
    if (!r)
        return MHD_NO;
    if (code == MHD_HTTP_OK)
        MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
    enum MHD_Result ret = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return ret;
}

int pc_metrics_start(const char *host, int port, unsigned max_connections, pc_metrics_fn fn,
                     void *ctx, pc_metrics_t **out) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (!fn || !out || max_connections < 1 || port < 0 || port > 65535 ||
        inet_pton(AF_INET, host, &a.sin_addr) != 1)
        return PC_EINVAL;
    /* Never select(): it cannot watch descriptors >= FD_SETSIZE. */
    unsigned flags = MHD_USE_ERROR_LOG;
    if (MHD_is_feature_supported(MHD_FEATURE_EPOLL) == MHD_YES) {
        flags |= MHD_USE_EPOLL_INTERNAL_THREAD;
    } else if (MHD_is_feature_supported(MHD_FEATURE_POLL) == MHD_YES) {
        flags |= MHD_USE_POLL_INTERNAL_THREAD;
    } else {
        PC_ERROR("metrics: libmicrohttpd %s has neither epoll nor poll", MHD_get_version());
        return PC_EUNSUPPORTED;
    }
    pc_metrics_t *m = calloc(1, sizeof *m);
    if (!m)
        return PC_ENOMEM;
    m->fn = fn;
    m->ctx = ctx;
    pc_log_limit_init(&m->log_limit, PC_METRICS_LOG_LINES, PC_METRICS_LOG_WINDOW_MS);
    pthread_mutex_init(&m->mu, NULL);
    pc_cond_init_mono(&m->cv);
    /* The logger first: messages about later options already go through it. */
    MHD_LogCallback logger = mhd_log;
    m->d = MHD_start_daemon(flags, (uint16_t)port, NULL, NULL, answer, m,
                            MHD_OPTION_EXTERNAL_LOGGER, logger, m, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&a, MHD_OPTION_CONNECTION_LIMIT, max_connections,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)(PC_METRICS_REQUEST_MS / 1000),
                            MHD_OPTION_NOTIFY_CONNECTION, on_conn, m, MHD_OPTION_NOTIFY_COMPLETED,
                            on_done, m, MHD_OPTION_URI_LOG_CALLBACK, on_request, m, MHD_OPTION_END);
    if (m->d && pthread_create(&m->watchdog, NULL, watchdog_main, m) == 0)
        m->watching = true;
    if (!m->watching) {
        if (m->d)
            MHD_stop_daemon(m->d);
        PC_ERROR("metrics: cannot %s on %s:%d", m->d ? "start its watchdog" : "listen", host, port);
        const int rc = m->d ? PC_ENOMEM : PC_EIO;
        pthread_cond_destroy(&m->cv);
        pthread_mutex_destroy(&m->mu);
        pc_log_limit_close(&m->log_limit);
        free(m);
        return rc;
    }
    const union MHD_DaemonInfo *info = MHD_get_daemon_info(m->d, MHD_DAEMON_INFO_BIND_PORT);
    m->port = info ? info->port : port;
    PC_INFO("metrics on http://%s:%d/metrics", host, m->port);
    *out = m;
    return 0;
}

int pc_metrics_port(const pc_metrics_t *m) {
    return m->port;
}

void pc_metrics_stop(pc_metrics_t *m) {
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->stop = true;
    pthread_cond_signal(&m->cv);
    pthread_mutex_unlock(&m->mu);
    pthread_join(m->watchdog, NULL);
    MHD_stop_daemon(m->d); /* joins its thread: no more log calls or notices */
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    pc_log_limit_close(&m->log_limit);
    free(m);
}
