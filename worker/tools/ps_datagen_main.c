/* ps-datagen: Criteo-format training and test data from a planted model (pw_datagen.h).
 *
 *   build/bin/ps-datagen --rows=2000000 --test-rows=200000 --out=train.tsv --test-out=test.tsv \
 *       --oracle-out=oracle.json
 *
 * A time-ordered split of a delimited file instead (MovieLens ratings by timestamp, the last 20%
 * as the test set; pw_split.h):
 *
 *   build/bin/ps-datagen --split=ratings.csv --split_column=3 --split_header=true \
 *       --test_fraction=0.2 --out=train.csv --test_out=test.csv
 *
 * --out=- writes the training rows to stdout. The oracle file holds the AUC and logloss of the
 * true probabilities on the test rows (the best any model can reach) as one JSON object, also
 * printed on stderr. Exit status: 0, 1 on an I/O error, 2 on bad settings.
 */
#include "pc_error.h"
#include "pc_fs.h"
#include "pc_settings.h"
#include "pw_datagen.h"
#include "pw_split.h"

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The generator's options (declared in pw_datagen: pw_datagen_settings) and this program's. */
typedef struct cfg {
    pw_datagen_opts_t gen;
    char out[512], test_out[512], oracle_out[512], split[512];
    int64_t split_column;
    bool split_header;
    double test_fraction;
} cfg_t;

#define T cfg_t
static const pc_setting_t k_own[] = {
    PC_SETTING_STRING(T, out, "-", "training rows file (- for stdout)"),
    PC_SETTING_STRING(T, test_out, "", "test rows file (empty: not written)"),
    PC_SETTING_STRING(T, oracle_out, "", "oracle metrics JSON file (empty: stderr only)"),
    PC_SETTING_STRING(T, split, "",
                      "split this comma-separated file by time instead (to out, test_out)"),
    PC_SETTING_INT(T, split_column, 0, 255, "3", "split: the time column (0-based)"),
    PC_SETTING_BOOL(T, split_header, "true", "split: the file has a header line"),
    PC_SETTING_DOUBLE(T, test_fraction, 0.0001, 0.9999, "0.2",
                      "split: the latest fraction to test"),
};
#undef T
#define NOWN (sizeof k_own / sizeof k_own[0])

int main(int argc, char **argv) {
    /* One table for the command line: the generator's settings, moved to cfg_t's `gen`, then
     * this program's. */
    size_t ngen, nset;
    const pc_setting_t *gen = pw_datagen_settings(&ngen);
    pc_setting_t *set = pc_settings_join(gen, ngen, offsetof(cfg_t, gen), k_own, NOWN, &nset);
    if (!set)
        return 1;
    cfg_t c;
    int cli =
        pc_settings_cli(set, nset, &c, argc, argv, "ps-datagen", "ps-datagen [--name=value ...]");
    free(set);
    if (cli)
        return cli == 1 ? 0 : 2;
    if (c.split[0]) {
        uint64_t ntr, nte;
        if (!strcmp(c.out, "-") || !c.test_out[0]) {
            fprintf(stderr, "ps-datagen: --split needs --out=FILE and --test_out=FILE\n");
            return 2;
        }
        int rc = pw_split_by_column(c.split, ',', c.split_header, (int)c.split_column,
                                    c.test_fraction, c.out, c.test_out, &ntr, &nte);
        if (rc) {
            fprintf(stderr, "ps-datagen: split: %s\n", pc_strerror(rc));
            return rc == PC_EINVAL ? 2 : 1;
        }
        fprintf(stderr, "{\"train_rows\":%llu,\"test_rows\":%llu}\n", (unsigned long long)ntr,
                (unsigned long long)nte);
        return 0;
    }
    if (c.gen.vocab_max < c.gen.vocab_min) {
        fprintf(stderr, "ps-datagen: vocab_max < vocab_min\n");
        return 2;
    }
    FILE *train = strcmp(c.out, "-") ? fopen(c.out, "w") : stdout;
    FILE *test = c.test_out[0] ? fopen(c.test_out, "w") : NULL;
    if (!train || (c.test_out[0] && !test)) {
        fprintf(stderr, "ps-datagen: cannot open the output files\n");
        return 1;
    }
    static char wbuf[1 << 20];
    setvbuf(train, wbuf, _IOFBF, sizeof wbuf);
    pw_datagen_result_t r;
    int rc = pw_datagen_run(&c.gen, train, test, &r);
    if ((train != stdout && fclose(train)) || (test && fclose(test)))
        rc = rc ? rc : PC_EIO;
    if (rc) {
        fprintf(stderr, "ps-datagen: %s\n", pc_strerror(rc));
        return rc == PC_EINVAL ? 2 : 1;
    }
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "seed", (double)c.gen.seed);
    cJSON_AddNumberToObject(j, "rows", (double)r.rows);
    cJSON_AddNumberToObject(j, "test_rows", (double)r.test_rows);
    cJSON_AddNumberToObject(j, "train_positive_rate", r.train_positive);
    cJSON_AddNumberToObject(j, "oracle_auc", r.oracle_auc);
    cJSON_AddNumberToObject(j, "oracle_logloss", r.oracle_logloss);
    cJSON_AddNumberToObject(j, "oracle_seen_auc", r.oracle_seen_auc);
    cJSON_AddNumberToObject(j, "oracle_seen5_auc", r.oracle_seen5_auc);
    char *text = cJSON_PrintUnformatted(j);
    fprintf(stderr, "%s\n", text);
    if (c.oracle_out[0]) {
        const size_t len = strlen(text);
        char *line = malloc(len + 2);
        if (line) {
            memcpy(line, text, len);
            line[len] = '\n';
        }
        if (!line || pc_fs_write_atomic(c.oracle_out, line, len + 1)) {
            fprintf(stderr, "ps-datagen: cannot write %s\n", c.oracle_out);
            rc = PC_EIO;
        }
        free(line);
    }
    cJSON_free(text);
    cJSON_Delete(j);
    return rc ? 1 : 0;
}
