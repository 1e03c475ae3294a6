/* Feature keys: pinned values (computed by the parser's functions before they moved to common/,
 * so this proves the keys of trained models did not change), the shared test vectors
 * (tests/data/feature_keys.tsv, argv[1]; the Python package checks the same file) through both
 * pc_feature.h and libpsclient's exported psc_*_key, and the text, hex and missing paths
 * agreeing with one another. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>

#include "emberps/psclient.h"
#include "pc_feature.h"
#include "pc_hash.h"

static const char *g_vectors;

/* A change to any of these moves every row of every trained model: never update them. */
static void test_pinned(void **state) {
    (void)state;
    assert_true(pc_feature_key(0, 0) == UINT64_C(0x9a75d1e1f3e4792e));
    assert_true(pc_feature_key(3, 0x68fd1e64u) == UINT64_C(0x162adadc3f46c5c0));
    assert_true(pc_feature_key(25, 0xffffffffu) == UINT64_C(0x50f72b534aaf78f0));
    assert_true(pc_text_key(1, "Toy Story", 9) == UINT64_C(0x49fdbf15802ef5d2));
    assert_true(pc_text_key(0, "", 0) == UINT64_C(0x4c6d5dff039bb7cf));
    assert_true(pc_missing_key(0) == UINT64_C(0xfdb42c3dfebe9fde));
    assert_true(pc_missing_key(25) == UINT64_C(0x41e666cd2bf22279));
}

/* One line of the vectors file: "kind field value key" (tab-separated; see its header). */
static void check_vector(const char *line) {
    char kind[16], value[256];
    unsigned field;
    unsigned long long key;
    assert_int_equal(sscanf(line, "%15s %u %255s %llx", kind, &field, value, &key), 4);
    uint64_t got, got_psc;
    if (!strcmp(kind, "feature")) {
        const uint64_t v = strtoull(value, NULL, 16);
        got = pc_feature_key(field, v);
        got_psc = psc_feature_key(field, v);
        uint64_t batch[3], vals[3] = {v, v, v};
        psc_feature_keys(field, vals, 3, batch);
        assert_true(batch[0] == got && batch[2] == got);
    } else if (!strcmp(kind, "text")) {
        char bytes[128];
        size_t n = 0;
        for (const char *h = value; strcmp(value, "-") && h[0] && h[1]; h += 2) {
            unsigned b;
            assert_int_equal(sscanf(h, "%2x", &b), 1);
            bytes[n++] = (char)b;
        }
        got = pc_text_key(field, bytes, n);
        got_psc = psc_text_key(field, bytes, n);
    } else {
        assert_string_equal(kind, "missing");
        got = pc_missing_key(field);
        got_psc = psc_missing_key(field);
    }
    if (got != key || got_psc != key)
        fail_msg("vector '%s': pc_ %016llx, psc_ %016llx", line, (unsigned long long)got,
                 (unsigned long long)got_psc);
}

static void test_vectors(void **state) {
    (void)state;
    FILE *f = fopen(g_vectors, "r");
    assert_non_null(f);
    char line[512];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        if (line[0] == '#' || line[0] == '\n')
            continue;
        check_vector(line);
        n++;
    }
    fclose(f);
    assert_true(n >= 80); /* the file was read, not skipped */
}

static void test_paths_agree(void **state) {
    (void)state;
    /* A text value is its hash keyed as a number; only len bytes count. */
    const char *v = "Toy Story (1995)";
    for (uint32_t f = 0; f < 8; f++) {
        assert_true(pc_text_key(f, v, 9) ==
                    pc_feature_key(f, pc_hash64("Toy Story", 9, PC_HASH_SEED_FEATURE)));
        assert_true(pc_text_key(f, v, 9) != pc_text_key(f, v, strlen(v)));
        /* The missing key is the value 2^40, which no 32-bit categorical takes. */
        assert_true(pc_missing_key(f) == pc_feature_key(f, UINT64_C(1) << 40));
        assert_true(pc_missing_key(f) != pc_missing_key(f + 1));
    }
    /* The text "68fd1e64" is a different value from the hex 0x68fd1e64 (CSV vs Criteo), and
     * equal values of different fields never share a key. */
    assert_true(pc_text_key(3, "68fd1e64", 8) != pc_feature_key(3, 0x68fd1e64u));
    uint64_t seen[PC_FEATURE_FIELDS_MAX];
    for (uint32_t f = 0; f < PC_FEATURE_FIELDS_MAX; f++) {
        seen[f] = pc_feature_key(f, 0x68fd1e64u);
        for (uint32_t g = 0; g < f; g++)
            assert_true(seen[f] != seen[g]);
    }
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: test_feature VECTORS.tsv\n");
        return 2;
    }
    g_vectors = argv[1];
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_pinned),
                                       cmocka_unit_test(test_vectors),
                                       cmocka_unit_test(test_paths_agree)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
