/* psclient_abi_prog.c: a program outside the project, built by psclient_abi.sh against only the
 * installed emberps/psclient.h and libpsclient.so. It checks that the library loaded at run time
 * is the version of the header, that error codes have their names and messages, and that
 * psc_connect fails cleanly and within its bounded wait: PC_EINVAL at once for bad arguments and
 * a server that is not an IPv4 address, PC_EUNAVAIL for a refused connection; psc_connect2
 * (TLS) says why it failed. Exit 0: all good. */
#define _POSIX_C_SOURCE 200809L
#include <emberps/psclient.h>

#include <stdio.h>
#include <string.h>
#include <time.h>

#define CHECK(cond)                                                   \
    do {                                                              \
        if (!(cond)) {                                                \
            fprintf(stderr, "FAIL: %s (line %d)\n", #cond, __LINE__); \
            return 1;                                                 \
        }                                                             \
    } while (0)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* psc_connect to `servers`: its code, named `want`, within `max_s` seconds; no client made. */
static int connect_fails(const char *servers, const char *want, double max_s) {
    psc_opts_t o = {.servers = servers, .timeout_ms = 1000, .connect_timeout_ms = 3000};
    psc_t *c = NULL;
    double t0 = now_s();
    int rc = psc_connect(&o, &c);
    double dt = now_s() - t0;
    printf("psc_connect(\"%s\"): %d %s (%s) in %.3f s\n", servers, rc, psc_err_name(rc),
           psc_strerror(rc), dt);
    CHECK(rc < 0);
    CHECK(strcmp(psc_err_name(rc), want) == 0);
    CHECK(c == NULL);
    CHECK(dt < max_s);
    return 0;
}

int main(void) {
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", PSC_VERSION_MAJOR, PSC_VERSION_MINOR,
             PSC_VERSION_PATCH);
    printf("libpsclient %s (0x%06x), header %s\n", psc_version_string(), psc_version(), want);
    CHECK(psc_version() >> 16 == PSC_VERSION_MAJOR);
    CHECK(psc_version() == PSC_VERSION_HEX);
    CHECK(strcmp(psc_version_string(), want) == 0);

    CHECK(strcmp(psc_err_name(0), "PC_OK") == 0);
    CHECK(strcmp(psc_err_name(-13), "PC_ETIMEDOUT") == 0);
    CHECK(strcmp(psc_strerror(-13), "timed out") == 0);
    CHECK(strcmp(psc_err_name(-9999), "PC_UNKNOWN") == 0);

    psc_t *c = NULL;
    int rc = psc_connect(NULL, &c);
    CHECK(rc < 0 && strcmp(psc_err_name(rc), "PC_EINVAL") == 0 && c == NULL);
    if (connect_fails("127.0.0.1:1", "PC_EUNAVAIL", 3.5)) /* nothing listens on port 1 */
        return 1;
    if (connect_fails("no-such-host.invalid:7400", "PC_EINVAL", 1.0))
        return 1;
    /* psc_connect2 (1.3): TLS with a CA file that does not exist fails at once, saying so */
    psc_opts_t o = {.servers = "127.0.0.1:1"};
    psc_tls_opts_t tls = {.ca = "/nonexistent/ca.pem"};
    char why[512] = "x";
    rc = psc_connect2(&o, &tls, why, sizeof why, &c);
    printf("psc_connect2(ca=/nonexistent/ca.pem): %s: %s\n", psc_err_name(rc), why);
    CHECK(strcmp(psc_err_name(rc), "PC_ENOTFOUND") == 0 && c == NULL);
    CHECK(strstr(why, "/nonexistent/ca.pem") != NULL);
    rc = psc_connect2(&o, NULL, why, sizeof why, &c); /* plain TCP: port 1 refuses */
    printf("psc_connect2(127.0.0.1:1): %s: %s\n", psc_err_name(rc), why);
    CHECK(strcmp(psc_err_name(rc), "PC_EUNAVAIL") == 0 && strstr(why, "127.0.0.1:1: ") == why);
    psc_close(NULL);
    puts("ok");
    return 0;
}
