/* bench_dist.c: `ps-bench dist`: training against a ps-server process vs the same model local.
 *
 * ps-datagen data (300k rows; --quick 100k, --smoke 10k; --keys sets it), the DLRM
 * (26 fields, dim 16, 13-64-16, 128-64-1, batch 1024, Adagrad table). The worker (this process:
 * its training and reader threads, and libpsclient's I/O thread) runs pinned to CPU 1, a
 * ps-server (one event loop) pinned to CPU 0; the baseline is the same training with the table
 * in process, also on CPU 1. Figures: local_samples_per_s, dist_samples_per_s, dist_vs_local
 * (1.0 means communication is completely hidden).
 *
 * Not measured yet (the pieces are not built): fifo_vs_priority under a tc tbf bandwidth limit,
 * time from a worker restart to its first step.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench_util.h"
#include "pc_log.h"
#include "pw_datagen.h"
#include "pw_train.h"

int bench_dist_main(int argc, char **argv) {
    bench_opts_t o;
    bench_parse_opts(argc, argv, "dist", &o);
    signal(SIGPIPE, SIG_IGN);
    pc_log_set_level(PC_LOG_WARN);
    const uint64_t n = o.keys > 0 ? (uint64_t)o.keys : o.smoke ? 10000 : o.quick ? 100000 : 300000;
    char dir[256], tr[300], pf[300], bin[600];
    snprintf(dir, sizeof dir, "%s/ps-bench-dist-XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir))
        abort();
    snprintf(tr, sizeof tr, "%s/train.tsv", dir);
    snprintf(pf, sizeof pf, "%s/port", dir);
    pw_datagen_opts_t go;
    pw_datagen_defaults(&go);
    go.rows = n;
    go.test_rows = 0;
    FILE *ft = fopen(tr, "w");
    if (!ft || pw_datagen_run(&go, ft, NULL, NULL))
        abort();
    fclose(ft);
    pw_train_config_t c;
    pw_train_config_defaults(&c);
    const char *trp[] = {tr};
    /* The server: CPU 0 (bench_spawn pins to the first CPU), the same table as local runs. */
    bench_sibling("ps-server", bin, sizeof bin);
    const int port = bench_free_port();
    char portarg[32], pfarg[320], tables[700];
    snprintf(portarg, sizeof portarg, "--port=%d", port);
    snprintf(pfarg, sizeof pfarg, "--port-file=%s", pf);
    snprintf(tables, sizeof tables, "--tables=name=emb,dim=%d,seed=%llu,%s", c.dim,
             (unsigned long long)c.seed, c.table_spec);
    char *sargv[] = {bin,
                     portarg,
                     pfarg,
                     "--io-threads=1",
                     "--grpc-port=-1",
                     "--metrics-port=-1",
                     "--log-level=warn",
                     tables,
                     NULL};
    const int ps = bench_spawn(&o, sargv);
    if (!bench_wait_file(pf, 10)) {
        fprintf(stderr, "ps-bench dist: %s did not start\n", bin);
        bench_stop(ps);
        return 1;
    }
    bench_pin(&o, 1); /* this thread; the reader and client threads inherit it */
    pw_train_result_t local, dist;
    if (pw_train_run(&c, PW_FMT_CRITEO, trp, 1, NULL, 0, &local))
        abort();
    snprintf(c.servers, sizeof c.servers, "127.0.0.1:%d", port);
    int rc = pw_train_run(&c, PW_FMT_CRITEO, trp, 1, NULL, 0, &dist);
    bench_stop(ps);
    unlink(tr);
    unlink(pf);
    rmdir(dir);
    if (rc) {
        fprintf(stderr, "ps-bench dist: distributed training failed\n");
        return 1;
    }
    const double ratio = dist.samples_per_s / local.samples_per_s;
    printf("ps-bench dist: DLRM (26 fields, dim 16), batch 1024, %llu rows, worker on CPU 1%s, "
           "ps-server on CPU 0\n",
           (unsigned long long)n, o.pin ? "" : " (unpinned)");
    printf("%-40s %12.0f samples/s\n", "local (in-process table)", local.samples_per_s);
    printf("%-40s %12.0f samples/s  (%.2f of local)\n", "1 worker + 1 server, sync",
           dist.samples_per_s, ratio);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "bench", "dist");
    cJSON_AddNumberToObject(root, "rows", (double)n);
    cJSON_AddNumberToObject(root, "local_samples_per_s", local.samples_per_s);
    cJSON_AddNumberToObject(root, "dist_samples_per_s", dist.samples_per_s);
    cJSON_AddNumberToObject(root, "dist_vs_local", ratio);
    bench_emit_json(&o, root);
    return 0;
}
