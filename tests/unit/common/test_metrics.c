/* The /metrics endpoint (pc_metrics) in process, on 127.0.0.1:
 *  - with every descriptor below 1100 taken, so its sockets are numbered above FD_SETSIZE
 *    (1024), GET /metrics still answers 200 (with select() it could not even listen);
 *  - it holds at most max_connections: idle connections beyond that wait in the listen backlog
 *    without a descriptor in the process, and once the idle ones go, scrapes are answered again;
 *  - libmicrohttpd's own messages about malformed requests reach pc_log's sink as formatted
 *    lines (time, level, identity), rate-limited to PC_METRICS_LOG_LINES per window;
 *  - a client that sends its request a byte a second (each byte renewing the library's idle
 *    timeout) is closed PC_METRICS_REQUEST_MS after it connected, while scrapes go on;
 *  - a latency histogram files a sample under the first bound not below it, in nanoseconds.
 * Every wait is bounded. */
#include "test_util.h"

#include "pc_hist.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "pc_error.h"
#include "pc_log.h"
#include "pc_metrics.h"

static size_t render(void *ctx, char *buf, size_t cap) {
    (void)ctx;
    return (size_t)snprintf(buf, cap, "# TYPE emberps_test gauge\nemberps_test 42\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* A connection to 127.0.0.1:port with 3 s timeouts; -1 when it cannot connect. */
static int tcp_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    struct timeval tv = {3, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    return fd;
}

/* Send `req`, read the answer into out; the HTTP status, 0 when none came. */
static int http_raw(int port, const char *req, char *out, size_t cap) {
    out[0] = '\0';
    int fd = tcp_connect(port);
    if (fd < 0)
        return 0;
    const size_t n = strlen(req);
    if (send(fd, req, n, MSG_NOSIGNAL) != (ssize_t)n) {
        close(fd);
        return 0;
    }
    size_t got = 0;
    for (ssize_t r; got < cap - 1 && (r = recv(fd, out + got, cap - 1 - got, 0)) > 0;)
        got += (size_t)r;
    out[got] = '\0';
    close(fd);
    int code = 0;
    sscanf(out, "HTTP/1.%*d %d", &code);
    return code;
}

static int http_get(int port, char *out, size_t cap) {
    return http_raw(port, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n", out, cap);
}

/* Descriptors open in this process. */
static int count_fds(void) {
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

/* Raise the soft descriptor limit to at least `want` (up to the hard limit). */
static bool raise_nofile(rlim_t want) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl))
        return false;
    if (rl.rlim_cur >= want)
        return true;
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < want)
        return false;
    rl.rlim_cur = want;
    return setrlimit(RLIMIT_NOFILE, &rl) == 0;
}

enum { FLOOR = 1100, LIMIT = 16, EXTRA = 40 };
static int g_dummy[FLOOR], g_ndummy; /* closed by close_dummies, even after a failure */

static int close_dummies(void **state) {
    (void)state;
    for (int i = 0; i < g_ndummy; i++)
        close(g_dummy[i]);
    g_ndummy = 0;
    return 0;
}

static void test_descriptors_above_fd_setsize(void **state) {
    (void)state;
    if (!raise_nofile(4096)) {
        print_message("SKIPPED: RLIMIT_NOFILE cannot be raised to 4096\n");
        skip();
    }
    /* Take every descriptor below FLOOR: the endpoint's sockets get numbers above 1024. */
    for (int fd = 0; fd < FLOOR - 1 && g_ndummy < FLOOR;) {
        if ((fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
            break;
        g_dummy[g_ndummy++] = fd;
    }
    assert_true(g_ndummy > 1000);
    pc_metrics_t *m = NULL;
    int rc = pc_metrics_start("127.0.0.1", 0, LIMIT, render, NULL, &m);
    assert_int_equal(rc, 0); /* select(): the listening socket >= FD_SETSIZE was refused */
    const int port = pc_metrics_port(m);
    const int fds_idle = count_fds();
    static char out[1 << 14];
    assert_int_equal(http_get(port, out, sizeof out), 200);
    assert_non_null(strstr(out, "emberps_test 42\n"));
    /* The daemon closes its side of that scrape on its own thread, maybe only now (a loaded
     * machine): counting from before that close would count one descriptor too few below. */
    for (int ms = 0; count_fds() > fds_idle && ms < 5000; ms += 10)
        usleep(10000);

    /* LIMIT + EXTRA idle connections: the daemon takes LIMIT of them (a descriptor each) and
     * leaves the rest in the listen backlog, where they cost it nothing. */
    const int fds0 = count_fds();
    int idle[LIMIT + EXTRA];
    for (int i = 0; i < LIMIT + EXTRA; i++) {
        idle[i] = tcp_connect(port);
        assert_true(idle[i] >= FLOOR);
    }
    /* ours (LIMIT + EXTRA) and the daemon's: wait (at most 5 s, half its idle timeout) until it
     * took LIMIT, which a loaded machine can delay past any fixed pause, then give it time to take
     * more than LIMIT */
    int added = count_fds() - fds0;
    for (int ms = 0; added < 2 * LIMIT + EXTRA && ms < 5000; ms += 10) {
        usleep(10000);
        added = count_fds() - fds0;
    }
    usleep(300000);
    added = count_fds() - fds0;
    print_message("%d idle connections: %d descriptors more in the process (limit %d)\n",
                  LIMIT + EXTRA, added, LIMIT);
    assert_true(added >= 2 * LIMIT + EXTRA && added <= 2 * LIMIT + EXTRA + 4);
    /* A scrape now waits for a free slot... */
    int fd = tcp_connect(port);
    assert_true(fd >= 0);
    const char *get = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    assert_int_equal(send(fd, get, strlen(get), MSG_NOSIGNAL), (ssize_t)strlen(get));
    struct timeval tv = {0, 300000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b;
    assert_true(recv(fd, &b, 1, 0) < 0); /* nothing yet */
    /* ... and is answered once the idle ones go (the daemon notices the closes). */
    for (int i = 0; i < LIMIT + EXTRA; i++)
        close(idle[i]);
    tv.tv_sec = 5;
    tv.tv_usec = 0;
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    size_t got = 0;
    for (ssize_t r; got < sizeof out - 1 && (r = recv(fd, out + got, sizeof out - 1 - got, 0)) > 0;)
        got += (size_t)r;
    out[got] = '\0';
    close(fd);
    print_message("pending scrape got %zu bytes: %.40s\n", got, out);
    assert_non_null(strstr(out, " 200 "));
    assert_int_equal(http_get(port, out, sizeof out), 200);
    pc_metrics_stop(m);
}

/* A slow client: "GET /metrics ..." a byte a second, never finished. The idle timeout alone
 * kept it for as long as it had bytes to send; the watchdog closes it after
 * PC_METRICS_REQUEST_MS. A scrape meanwhile is answered. */
static void test_slow_request_closed(void **state) {
    (void)state;
    pc_metrics_t *m = NULL;
    assert_int_equal(pc_metrics_start("127.0.0.1", 0, 4, render, NULL, &m), 0);
    const int port = pc_metrics_port(m);
    const int fd = tcp_connect(port);
    assert_true(fd >= 0);
    struct timeval tv = {0, 50000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    const char *req = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const double t0 = now_s(), limit = PC_METRICS_REQUEST_MS / 1000.0;
    double closed = -1, next = t0;
    static char out[1 << 14];
    bool scraped = false;
    for (size_t i = 0; closed < 0 && now_s() - t0 < limit + 6;) {
        if (now_s() >= next && i < strlen(req)) {
            if (send(fd, req + i++, 1, MSG_NOSIGNAL) != 1)
                closed = now_s() - t0;
            next += 1.0;
        }
        char b;
        const ssize_t r = recv(fd, &b, 1, 0);
        if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            closed = now_s() - t0;
        if (!scraped && now_s() - t0 > 3) {
            assert_int_equal(http_get(port, out, sizeof out), 200);
            scraped = true;
        }
    }
    print_message("a request sent a byte a second: closed after %.1f s (limit %.0f s)\n", closed,
                  limit);
    assert_true(scraped);
    assert_true(closed >= limit - 0.5 && closed < limit + 5);
    close(fd);
    pc_metrics_stop(m);
}

/* Count the lines of `text` that contain `what`. */
static int count_lines(const char *text, const char *what) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)); p += strlen(what))
        n++;
    return n;
}

static void test_library_log_limited(void **state) {
    (void)state;
    FILE *sink = tmpfile();
    assert_non_null(sink);
    pc_log_init(sink, PC_LOG_INFO, "tester[shard 7]");
    pc_metrics_t *m = NULL;
    assert_int_equal(pc_metrics_start("127.0.0.1", 0, 64, render, NULL, &m), 0);
    const int port = pc_metrics_port(m);
    static char out[1 << 14];
    enum { BAD = 300 };
    const double t0 = now_s();
    int answered = 0;
    for (int i = 0; i < BAD; i++) /* a header line without a colon: the library logs each */
        answered += http_raw(port, "GET /metrics HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n", out,
                             sizeof out) != 0;
    const double took = now_s() - t0;
    assert_int_equal(http_get(port, out, sizeof out), 200); /* still serving */
    pc_metrics_stop(m);
    pc_log_init(NULL, PC_LOG_INFO, "ember");

    fflush(sink);
    long size = ftell(sink);
    assert_true(size >= 0);
    char *text = calloc(1, (size_t)size + 1);
    rewind(sink);
    assert_int_equal(fread(text, 1, (size_t)size, sink), (size_t)size);
    fclose(sink);
    const int lines = count_lines(text, "metrics: http: ");
    const int formatted = count_lines(text, "Z W tester[shard 7] pc_metrics.c:");
    const int windows = 1 + (int)(took * 1000 / PC_METRICS_LOG_WINDOW_MS);
    print_message("%d malformed requests (%d answered) in %.2f s: %d library lines logged\n", BAD,
                  answered, took, lines);
    assert_true(lines >= 1);            /* the library's messages reach pc_log's sink */
    assert_int_equal(formatted, lines); /* each with time, level, identity and source */
    assert_true(lines <= PC_METRICS_LOG_LINES * (windows + 1));
    free(text);
}

/* A latency lands in the first bucket whose bound is not below it, compared in nanoseconds:
 * 10.999 us is over le="1e-05" (it was counted there, the microseconds truncated). */
static void test_hist_bounds(void **state) {
    (void)state;
    pc_hist_t h;
    memset(&h, 0, sizeof h);
    pc_hist_add(&h, 10000); /* 10 us: le 10 us */
    pc_hist_add(&h, 10999); /* over it: le 25 us */
    pc_hist_add(&h, 25001); /* le 50 us */
    assert_int_equal(atomic_load(&h.bucket[0]), 1);
    assert_int_equal(atomic_load(&h.bucket[1]), 1);
    assert_int_equal(atomic_load(&h.bucket[2]), 1);
    assert_int_equal(atomic_load(&h.count), 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_descriptors_above_fd_setsize, close_dummies),
        cmocka_unit_test(test_library_log_limited),
        cmocka_unit_test(test_slow_request_closed),
        cmocka_unit_test(test_hist_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
