/* raw_frame.h: a test's raw data-plane connection (frames by hand, docs/wire.md) and HTTP GET of
 * a server's /metrics, for tests that check what the client library would hide.
 * Blocking sockets on loopback; every receive is bounded by a 5 s timeout (SO_RCVTIMEO). */
#ifndef RAW_FRAME_H
#define RAW_FRAME_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "pc_wire.h"

/* A plain TCP connection to 127.0.0.1:port (no HELLO sent). */
static inline int raw_connect(int port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    struct timeval tv = {5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

static inline void send_all(int fd, const void *p, size_t n) {
    assert_int_equal(send(fd, p, n, MSG_NOSIGNAL), (ssize_t)n);
}

static inline void recv_all(int fd, void *p, size_t n) {
    for (size_t got = 0; got < n;) {
        ssize_t r = recv(fd, (uint8_t *)p + got, n - got, 0);
        assert_true(r > 0);
        got += (size_t)r;
    }
}

static inline void send_frame(int fd, uint8_t op, uint64_t id, const void *body, uint32_t len) {
    uint8_t h[PC_WIRE_HDR];
    pc_wire_hdr_t hd = {.op = op, .id = id, .body_len = len};
    pc_wire_hdr_encode(&hd, h);
    send_all(fd, h, sizeof h);
    if (len)
        send_all(fd, body, len);
}

/* Seconds until the server closed fd (read returned its end or an error), reading and dropping
 * what comes meanwhile; -1 when it was still open after wait_s. */
static inline double raw_closed_after(int fd, double wait_s) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    struct timeval tv = {.tv_sec = 0, .tv_usec = 100000};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    for (;;) {
        clock_gettime(CLOCK_MONOTONIC, &t);
        const double s = (double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) / 1e9;
        if (s >= wait_s)
            return -1;
        char b[256];
        const ssize_t n = recv(fd, b, sizeof b, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return s;
    }
}

/* One reply: its header, the body into body (cap bytes; NUL-terminated when it is text). */
static inline pc_wire_hdr_t recv_frame(int fd, uint64_t id, uint8_t *body, size_t cap) {
    uint8_t h[PC_WIRE_HDR];
    recv_all(fd, h, sizeof h);
    pc_wire_hdr_t hd;
    assert_int_equal(pc_wire_hdr_decode(h, 1u << 30, &hd), 0);
    assert_int_equal(hd.id, id);
    assert_true(hd.body_len < cap);
    recv_all(fd, body, hd.body_len);
    body[hd.body_len] = 0;
    return hd;
}

/* GET path from an HTTP port (a server's /metrics): the HTTP status; the response into out. */
static inline int http_get(int port, const char *path, char *out, size_t cap) {
    int fd = raw_connect(port);
    char req[256];
    int n = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: x\r\n\r\n", path);
    send_all(fd, req, (size_t)n);
    size_t got = 0;
    for (ssize_t r; got < cap - 1 && (r = recv(fd, out + got, cap - 1 - got, 0)) > 0;)
        got += (size_t)r;
    out[got] = '\0';
    close(fd);
    int code = 0;
    sscanf(out, "HTTP/1.%*d %d", &code);
    return code;
}

/* The value of metric `name` (a line "name value") at the metrics port; -1 when absent. */
static inline double metric(int port, const char *name) {
    static char out[1 << 16];
    http_get(port, "/metrics", out, sizeof out);
    char want[128];
    snprintf(want, sizeof want, "\n%s ", name);
    const char *p = strstr(out, want);
    return p ? atof(p + strlen(want)) : -1;
}

#endif
