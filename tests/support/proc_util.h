/* proc_util.h: integration-test helpers: free loopback ports, starting ps-server processes and
 * waiting for them, every wait bounded. Servers started here are killed by pu_kill_all (call it
 * at the end of main, so a failed test leaves nothing running). */
#ifndef PROC_UTIL_H
#define PROC_UTIL_H

#include "test_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *pu_bin; /* the ps-server binary (argv[1] of the test) */
static pid_t pu_pids[32];
static int pu_npids;

static inline uint64_t pu_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline double pu_now(void) {
    return (double)pu_now_ns() * 1e-9;
}

static inline int pu_free_port(void) {
    /* Below the kernel's ephemeral range (32768-60999 here): a port the kernel handed out for
     * bind(0) and took back can be handed to another socket (a server's --grpc-port=0, a
     * client's connection) before the server given it binds it. Random per process, checked by
     * a bind. */
    /* Never one handed out before by this process (its last 512): a port not bound yet (the
     * server given it still starting) passed the check again, and two servers of one test got
     * the same port ("server ... listed twice" in a cluster map). */
    static unsigned seed;
    static int given[512], ngiven;
    if (!seed)
        seed = (unsigned)getpid() ^ (unsigned)pu_now_ns();
    for (int tries = 0; tries < 1000; tries++) {
        const int port = 20000 + rand_r(&seed) % 10000;
        bool again = false;
        for (int i = 0; i < ngiven && i < 512 && !again; i++)
            again = given[i] == port;
        if (again)
            continue;
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET,
                                .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        const int ok = bind(fd, (struct sockaddr *)&a, sizeof a) == 0;
        close(fd);
        if (ok) {
            given[ngiven++ % 512] = port;
            return port;
        }
    }
    fail_msg("no free port in 20000-29999");
    return -1;
}

static int pu_last_metrics_port; /* of the last server pu_spawn started */

/* Start ps-server on data-plane `port` with free gRPC and metrics ports and `extra` flags
 * (NULL-terminated); wait until it serves. *grpc_port (may be NULL) gets its gRPC port,
 * pu_last_metrics_port its metrics port. */
static inline pid_t pu_spawn(int port, const char *dir, const char *const *extra, int *grpc_port) {
    char pf[300], portarg[32], pfarg[320];
    snprintf(pf, sizeof pf, "%s/port-%d", dir, port);
    unlink(pf);
    snprintf(portarg, sizeof portarg, "--port=%d", port);
    snprintf(pfarg, sizeof pfarg, "--port-file=%s", pf);
    const char *argv[32] = {
        pu_bin,          portarg,           pfarg, "--log-level=warn", "--io-threads=2",
        "--grpc-port=0", "--metrics-port=0"};
    int a = 7;
    for (int i = 0; extra && extra[i] && a < 31; i++)
        argv[a++] = extra[i];
    argv[a] = NULL;
    const pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* dies with the test, however the test ends (a sanitizer's halt, a crash, a kill): no
         * server outlives its test (the thread that spawns must live as long: the main one) */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        execv(pu_bin, (char *const *)argv);
        _exit(127);
    }
    if (pu_npids < 32)
        pu_pids[pu_npids++] = pid;
    for (double t0 = pu_now(); pu_now() - t0 < 10;) {
        FILE *f = fopen(pf, "r");
        int dp = 0, gp = 0, mp = 0;
        if (f && fscanf(f, "%d %d %d", &dp, &gp, &mp) == 3) {
            fclose(f);
            if (grpc_port)
                *grpc_port = gp;
            pu_last_metrics_port = mp;
            return pid;
        }
        if (f)
            fclose(f);
        int st;
        if (waitpid(pid, &st, WNOHANG) == pid)
            fail_msg("ps-server exited early (status %d)", st);
        usleep(10000);
    }
    kill(pid, SIGKILL);
    fail_msg("ps-server did not come up on port %d", port);
    return -1;
}

/* Wait (bounded) for pid to exit: its exit status, 128 + signal, or -1 if it had to be killed. */
static inline int pu_reap(pid_t pid, double seconds) {
    int st;
    for (double t0 = pu_now(); pu_now() - t0 < seconds; usleep(10000))
        if (waitpid(pid, &st, WNOHANG) == pid)
            return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    /* It did not end: say where its threads wait (gdb when installed, else the kernel's view). */
    char cmd[512];
    snprintf(cmd, sizeof cmd,
             "echo 'process %d did not exit in %.0f s; its threads:' >&2; "
             "if command -v gdb >/dev/null; then timeout 60 gdb -p %d -batch "
             "-ex 'thread apply all bt' 2>&1 | grep -E '^(Thread|#)' | head -300 >&2; "
             "else for t in /proc/%d/task/*; do echo \"$(cat $t/comm) $(cat $t/wchan)\" >&2; "
             "done; fi",
             (int)pid, seconds, (int)pid, (int)pid);
    if (system(cmd) != 0)
        fprintf(stderr, "(could not list its threads)\n");
    kill(pid, SIGKILL);
    waitpid(pid, &st, 0);
    return -1;
}

/* SIGSTOP pid and wait (at most 5 s) until the kernel reports it stopped: kill() returns before
 * the target has stopped. */
static inline void pu_stop_signal(pid_t pid) {
    kill(pid, SIGSTOP);
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    for (double t0 = pu_now(); pu_now() - t0 < 5; usleep(1000)) {
        FILE *f = fopen(path, "r");
        size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
        if (f)
            fclose(f);
        buf[n] = '\0';
        const char *paren = strrchr(buf, ')'); /* state follows the command name */
        if (paren && paren[1] == ' ' && (paren[2] == 'T' || paren[2] == 't'))
            return;
    }
    fail_msg("process %d did not stop", (int)pid);
}

/* ps-server --coordinator (the coordinator's service, in memory) on gRPC port grpc_port (0: a
 * free one); its "127.0.0.1:PORT" into addr. Its pid. */
static inline pid_t pu_coordinator(const char *dir, int grpc_port, char *addr, size_t cap) {
    char grpc[32];
    snprintf(grpc, sizeof grpc, "--grpc-port=%d", grpc_port);
    const char *extra[] = {"--coordinator", grpc_port ? grpc : NULL, NULL};
    int gp = 0;
    const pid_t pid = pu_spawn(pu_free_port(), dir, extra, &gp);
    assert_true(!grpc_port || gp == grpc_port);
    snprintf(addr, cap, "127.0.0.1:%d", gp);
    return pid;
}

/* SIGTERM and expect a clean exit (0) within 10 s. */
static inline void pu_stop(pid_t pid) {
    kill(pid, SIGTERM);
    assert_int_equal(pu_reap(pid, 10), 0);
}

/* Run psctl (its binary: psctl) against the server at 127.0.0.1:grpc_port with args
 * (NULL-terminated, each quoted); its stdout into out, and its stderr too with `said` (else that
 * goes to the test's log); its exit status (-1: not exited). */
static inline int pu_psctl_run(const char *psctl, int grpc_port, char *out, size_t cap,
                               const char *const *args, bool said) {
    char cmd[1024];
    int n =
        snprintf(cmd, sizeof cmd, "%s --server=127.0.0.1:%d --timeout-ms=2000", psctl, grpc_port);
    for (int i = 0; args[i] && n < (int)sizeof cmd; i++)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " '%s'", args[i]);
    if (said && n < (int)sizeof cmd)
        n += snprintf(cmd + n, sizeof cmd - (size_t)n, " 2>&1");
    if (n >= (int)sizeof cmd)
        fail_msg("psctl command line over %zu bytes", sizeof cmd);
    FILE *p = popen(cmd, "r");
    if (!p)
        return -1;
    size_t got = fread(out, 1, cap - 1, p);
    out[got] = '\0';
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static inline int pu_psctl(const char *psctl, int grpc_port, char *out, size_t cap,
                           const char *const *args) {
    return pu_psctl_run(psctl, grpc_port, out, cap, args, false);
}

static inline void pu_kill_all(void) {
    for (int i = 0; i < pu_npids; i++)
        if (kill(pu_pids[i], 0) == 0) {
            kill(pu_pids[i], SIGKILL);
            waitpid(pu_pids[i], NULL, 0);
        }
}

#endif
