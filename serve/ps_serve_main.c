/* ps_serve_main.c: the ps-serve daemon, a read-only serving replica (docs/serving.md).
 *
 *   build/bin/ps-serve --follow=127.0.0.1:7400 --publish-dir=/var/lib/emberps/publish \
 *       --versions=/var/lib/emberps/jobckpt                 (live: fresh rows and models)
 *   build/bin/ps-serve --versions=DIR --pin=STEP             (one version, as it was)
 *
 * Settings come from one table: defaults, then PS_SERVE_* environment variables, then flags
 * (--help lists them, with the follower's follow_* settings). The replica starts (sv_serve.h:
 * the newest version's rows and the delta stream, or a pinned version), then serves gRPC
 * (emberps.Serving: Predict, ServeStatus, ListVersions, LoadVersion, Follow; and
 * ParameterServer's Lookup and Health; writes refused) and Prometheus /metrics, and every
 * tick_ms takes a newer published dense model once the rows have reached its watermark.
 * SIGTERM/SIGINT: stop serving (health NOT_SERVING, calls in flight end), stop following, exit 0.
 * Exit status: 0 after a clean stop, 1 when the replica cannot start, 2 on bad settings.
 */
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_hist.h"
#include "pc_log.h"
#include "pc_metrics.h"
#include "pc_settings.h"
#include "pc_stop.h"
#include "pc_time.h"
#include "ps_grpc.h"
#include "pw_backend.h"
#include "sv_api.h"
#include "sv_follow.h"
#include "sv_serve.h"

#include <cblas.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct cfg {
    sv_follow_opts_t fo; /* follow_* (sv_follow_settings) */
    char name[128];
    char host[64];
    int64_t grpc_port, grpc_threads, grpc_call_wait_ms, metrics_port, evaluators;
    int64_t max_batch, max_keys, max_reply_bytes, max_message_bytes, tick_ms;
    char token[256], admin_token[256];
    char tls_cert[512], tls_key[512], tls_ca[512];
    int tls_client_auth;
    bool insecure_remote;
    char follow[4096], follow_token[256], follow_tls_ca[512], follow_tls_cert[512],
        follow_tls_key[512];
    char publish_dir[1024], versions[1024];
    int64_t pin;
    char device[32], port_file[512];
    int log_level;
    bool print_config;
} cfg_t;

static const char *const k_levels[] = {"error", "warn", "info", "debug", "trace", NULL};
static const char *const k_tls_auth[] = {"none", "request", "require", NULL};

#define T cfg_t
static const pc_setting_t k_own[] = {
    PC_SETTING_STRING(T, name, "default", "the model's name (PredictRequest.model)"),
    PC_SETTING_STRING(T, host, "127.0.0.1", "address to bind"),
    PC_SETTING_INT(T, grpc_port, 0, 65535, "7600", "gRPC port (0: any free port)"),
    PC_SETTING_INT(T, grpc_threads, 1, 64, "4", "gRPC handler threads"),
    PC_SETTING_INT(T, grpc_call_wait_ms, 100, 3600000, "30000",
                   "a gRPC call's request must arrive, and its reply leave, within this; a "
                   "stalled client's call is cancelled and its handler thread freed"),
    PC_SETTING_INT(T, metrics_port, -1, 65535, "9600",
                   "Prometheus /metrics port (0: any, -1: off)"),
    PC_SETTING_INT(T, evaluators, 0, 256, "0",
                   "model instances scoring at once (0: one per gRPC thread)"),
    PC_SETTING_INT(T, max_batch, 1, 65536, "1024", "most samples in one Predict"),
    PC_SETTING_INT(T, max_keys, 1, 16777216, "1Mi",
                   "most keys in one Lookup, and features in one Predict"),
    PC_SETTING_INT(T, max_reply_bytes, 1024, 2147483647, "64Mi",
                   "largest Lookup reply (rows + found bytes), and rows one Predict gathers; more: "
                   "PC_ETOOBIG"),
    PC_SETTING_INT(T, max_message_bytes, 1024, 2147483647, "64Mi",
                   "largest gRPC message either way"),
    PC_SETTING_INT(T, tick_ms, 10, 60000, "100",
                   "how often a newer published dense model is looked for"),
    PC_SETTING_SECRET(T, token, "token every gRPC call must present"),
    PC_SETTING_SECRET(T, admin_token, "token of LoadVersion and Follow (\"\": token)"),
    PC_SETTING_STRING(T, tls_cert, "", "PEM certificate chain: with tls_key, gRPC serves TLS only"),
    PC_SETTING_STRING(T, tls_key, "", "PEM private key of tls_cert"),
    PC_SETTING_STRING(T, tls_ca, "", "PEM CA bundle that client certificates must chain to"),
    PC_SETTING_ENUM(T, tls_client_auth, k_tls_auth, "none",
                    "client certificates: none, request (verified if sent), require"),
    PC_SETTING_BOOL(T, insecure_remote, "false",
                    "allow a non-loopback bind without a token and without TLS"),
    PC_SETTING_STRING(T, follow, "",
                      "the training servers to follow (a cluster map, or any server's "
                      "host:port): live rows; \"\": pinned versions only"),
    PC_SETTING_SECRET(T, follow_token, "the training servers' token"),
    PC_SETTING_STRING(T, follow_tls_ca, "", "PEM CA of the training servers: TLS to them"),
    PC_SETTING_STRING(T, follow_tls_cert, "", "PEM client certificate for them"),
    PC_SETTING_STRING(T, follow_tls_key, "", "its private key"),
    PC_SETTING_STRING(T, publish_dir, "",
                      "dense models the trainer publishes (ps-worker --publish-dir)"),
    PC_SETTING_STRING(T, versions, "",
                      "the job's coordinated checkpoints (ps-worker --ckpt-dir): versions"),
    PC_SETTING_INT(T, pin, 0, 1e18, "0",
                   "start pinned to this version's step (0: live when following, else the "
                   "newest version)"),
    PC_SETTING_STRING(T, device, "cpu", "where the model runs: cpu | auto | cuda | cuda:N"),
    PC_SETTING_STRING(T, port_file, "",
                      "write the gRPC and metrics ports here, one per line, once serving"),
    PC_SETTING_ENUM(T, log_level, k_levels, "info", "log level"),
    PC_SETTING_BOOL(T, print_config, "false", "print the effective settings and exit"),
};
#undef T
#define NOWN (sizeof k_own / sizeof k_own[0])

typedef struct daemon {
    sv_serve_t *serve;
    ps_grpc_t *grpc;
    uint64_t start_ns;
} daemon_t;

static size_t render_metrics(void *ctx, char *buf, size_t cap) {
    daemon_t *d = ctx;
    size_t len = pc_prom_appendf(
        buf, cap, 0, "# TYPE emberps_uptime_seconds gauge\nemberps_uptime_seconds %.3f\n",
        (double)(pc_time_mono_ns() - d->start_ns) * 1e-9);
    len = ps_grpc_render_metrics(d->grpc, buf, cap, len);
    return sv_serve_render_metrics(d->serve, buf, cap, len);
}

int main(int argc, char **argv) {
    pw_blas_select(argv); /* first: it may execute this program again */
    size_t nf, nset;
    const pc_setting_t *fs = sv_follow_settings(&nf);
    pc_setting_t *set = pc_settings_join(fs, nf, offsetof(cfg_t, fo), k_own, NOWN, &nset);
    if (!set)
        return 1;
    cfg_t c;
    int cli = pc_settings_cli(set, nset, &c, argc, argv, "ps-serve",
                              "ps-serve (--follow=SERVERS | --versions=DIR) [--name=value ...]");
    if (!cli && c.print_config)
        pc_settings_dump(set, nset, &c, stdout);
    free(set);
    if (cli)
        return cli == 1 ? 0 : 2;
    if (c.print_config)
        return 0;
    char why[320];
    if (ps_grpc_security_check(c.host, c.token, c.tls_cert, c.tls_key, c.tls_ca, c.tls_client_auth,
                               c.insecure_remote, why, sizeof why)) {
        fprintf(stderr, "ps-serve: %s\n", why);
        return 2;
    }
    if (!c.follow[0] && !c.versions[0]) {
        fprintf(stderr, "ps-serve: give --follow=SERVERS (live) or --versions=DIR (pinned)\n");
        return 2;
    }
    pc_log_init(NULL, (pc_log_level_t)c.log_level, "ps-serve");
    if (c.port_file[0]) /* an earlier run's (killed): written again once this one serves */
        (void)remove(c.port_file);
    pc_stop_catch(); /* a flag the main loop reads, whichever thread takes the signal */
    signal(SIGPIPE, SIG_IGN);

    /* Requests score on grpc_threads threads at once, each with its own evaluator, so OpenBLAS's
     * thread pool only gets in the way: its pthreads build runs concurrent callers' GEMMs through
     * one pool whose threads spin, and on a busy or pinned CPU a Predict waited seconds behind a
     * version load (ps-bench serve). One thread per call. */
    openblas_set_num_threads(1);
    pw_backend_t *be = NULL;
    if (pw_backend_open(c.device, &be, why, sizeof why)) {
        fprintf(stderr, "ps-serve: --device %s: %s\n", c.device, why);
        return 2;
    }
    PC_INFO("dense math on %s", why);
    daemon_t d = {.start_ns = pc_time_mono_ns()};
    const int evaluators = (int)(c.evaluators ? c.evaluators : c.grpc_threads);
    sv_serve_opts_t so = {.name = c.name,
                          .follow = c.follow,
                          .publish_dir = c.publish_dir,
                          .versions_dir = c.versions,
                          .pin = (uint64_t)c.pin,
                          .evaluators = evaluators,
                          .max_batch = (int)c.max_batch,
                          .fo = &c.fo,
                          .token = c.follow_token,
                          .tls_ca = c.follow_tls_ca,
                          .tls_cert = c.follow_tls_cert,
                          .tls_key = c.follow_tls_key,
                          .be = be};
    if (sv_serve_create(&so, &d.serve)) {
        pw_backend_close(be);
        return 1;
    }
    sv_api_env_t env = {
        .serve = d.serve,
        .max_batch = (uint32_t)c.max_batch,
        .max_keys = (uint32_t)c.max_keys,
        .max_reply = ps_api_max_reply((uint64_t)c.max_reply_bytes, (uint64_t)c.max_message_bytes),
        .max_gather = (uint64_t)c.max_reply_bytes, /* (rows that stay here: no message's) */
        .start_ns = d.start_ns};
    static const char *const k_names[] = {"emberps.Serving", "emberps.ParameterServer", NULL};
    ps_grpc_service_t svc = {.names = k_names,
                             .method = sv_api_method,
                             .is_admin = sv_api_is_admin,
                             .call = sv_api_call,
                             .ready = sv_api_ready,
                             .ctx = &env};
    char addr[128];
    snprintf(addr, sizeof addr, "%s:%d", c.host, (int)c.grpc_port);
    ps_grpc_opts_t go = {.addr = addr,
                         .threads = (int)c.grpc_threads,
                         .call_wait_ms = (uint32_t)c.grpc_call_wait_ms,
                         .token = c.token,
                         .admin_token = c.admin_token,
                         .max_message = (uint32_t)c.max_message_bytes,
                         .tls_cert = c.tls_cert[0] ? c.tls_cert : NULL,
                         .tls_key = c.tls_key,
                         .tls_ca = c.tls_ca,
                         .tls_client_auth = (ps_grpc_auth_t)c.tls_client_auth};
    pc_metrics_t *metrics = NULL;
    int rc = ps_grpc_start(&svc, &go, &d.grpc) ? 1 : 0;
    if (!rc && c.metrics_port >= 0 &&
        pc_metrics_start(c.host, (int)c.metrics_port, 16, render_metrics, &d, &metrics))
        rc = 1;
    if (!rc) {
        ps_grpc_set_serving(d.grpc, true);
        if (c.port_file[0]) {
            char ports[32];
            const int len = snprintf(ports, sizeof ports, "%d\n%d\n", ps_grpc_port(d.grpc),
                                     metrics ? pc_metrics_port(metrics) : 0);
            if (pc_fs_write_atomic(c.port_file, ports, (size_t)len))
                PC_WARN("cannot write the port file %s", c.port_file);
        }
        PC_INFO("serving '%s' on %s (gRPC port %d)", c.name, c.host, ps_grpc_port(d.grpc));
        const struct timespec tick = {.tv_sec = c.tick_ms / 1000,
                                      .tv_nsec = (long)(c.tick_ms % 1000) * 1000000};
        while (!pc_stop_signal()) {
            nanosleep(&tick, NULL); /* a signal to this thread ends it early */
            if (pc_stop_signal())
                break;
            sv_serve_tick(d.serve);
        }
        PC_INFO("signal %d: stopping", pc_stop_signal());
        if (c.port_file[0]) /* its ports stop serving: a script waiting for it must not read it */
            (void)remove(c.port_file);
    }
    pc_metrics_stop(metrics);
    ps_grpc_set_serving(d.grpc, false); /* the calls in flight end first */
    ps_grpc_stop(d.grpc);
    sv_serve_destroy(d.serve);
    pw_backend_close(be);
    PC_INFO("stopped");
    return rc;
}
