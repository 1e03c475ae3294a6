/* ps_bench.c: `ps-bench AREA [options]`, the benchmark programs of EmberPS.
 *
 * Each area measures one part of the system and prints its figures next to a baseline measured in
 * the same run, so ratios survive noisy machines; --json adds one JSON object as the last line.
 * Areas are a table: adding one is a function and a row below. */
#include <stdio.h>
#include <string.h>

#include "pw_backend.h"

int bench_table_main(int argc, char **argv);
int bench_store_main(int argc, char **argv);
int bench_rpc_main(int argc, char **argv);
int bench_data_main(int argc, char **argv);
int bench_train_main(int argc, char **argv);
int bench_dist_main(int argc, char **argv);
int bench_gpu_main(int argc, char **argv);
int bench_py_main(int argc, char **argv);
int bench_serve_main(int argc, char **argv);
int bench_ha_main(int argc, char **argv);

static const struct {
    const char *name;
    int (*main)(int argc, char **argv);
    const char *help;
} k_areas[] = {
    {"table", bench_table_main, "in-process embedding table vs a flat memory gather"},
    {"store", bench_store_main, "checkpoint and restore vs sequential disk writes"},
    {"rpc", bench_rpc_main, "the data plane (ps-server process) vs Redis on loopback"},
    {"data", bench_data_main, "Criteo parsing and generation vs a raw line scan"},
    {"train", bench_train_main, "local DLRM training vs OpenBLAS sgemm peak, AUC vs oracle"},
    {"dist", bench_dist_main, "training against a ps-server process vs the same model local"},
    {"gpu", bench_gpu_main, "the DLRM step on the GPU vs PyTorch, GEMM share of peak, overlap"},
    {"py", bench_py_main, "the Python package vs the C client, PyTorch DLRM steps and AUC"},
    {"serve", bench_serve_main, "ps-serve: Predict latency and rate vs PyTorch, freshness, swaps"},
    {"ha", bench_ha_main, "failover of a primary (stall, lost pushes), replication's push cost"},
};

int main(int argc, char **argv) {
    pw_blas_select(argv); /* first: it may execute this program again */
    if (argc >= 2) {
        for (size_t i = 0; i < sizeof k_areas / sizeof k_areas[0]; i++)
            if (strcmp(argv[1], k_areas[i].name) == 0)
                return k_areas[i].main(argc - 1, argv + 1);
    }
    fprintf(stderr, "usage: ps-bench AREA [--quick] [--smoke] [--json] [--no-pin] [--seconds=S]\n"
                    "areas:\n");
    for (size_t i = 0; i < sizeof k_areas / sizeof k_areas[0]; i++)
        fprintf(stderr, "  %-8s %s\n", k_areas[i].name, k_areas[i].help);
    return 2;
}
