/* Sample parsers: Criteo TSV (empty fields, CRLF, hex cases, missing keys), libsvm, libffm, and
 * every kind of malformed line refused with a reason. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pc_error.h"
#include "pw_parse.h"

static pw_sample_t g_s;

static int parse(pw_format_t f, const char *line) {
    char err[128];
    return pw_parse_line(f, line, strlen(line), &g_s, err, sizeof err);
}

/* A Criteo line with label y, integers i0.. (-1: empty), categoricals (NULL: empty). */
static void criteo_line(char *buf, int y, const long *ints, const char *const *cats) {
    int n = sprintf(buf, "%d", y);
    for (int i = 0; i < 13; i++)
        n += ints[i] == -1000 ? sprintf(buf + n, "\t") : sprintf(buf + n, "\t%ld", ints[i]);
    for (int i = 0; i < 26; i++)
        n += sprintf(buf + n, "\t%s", cats[i] ? cats[i] : "");
}

static void test_criteo(void **state) {
    (void)state;
    long ints[13];
    const char *cats[26];
    for (int i = 0; i < 13; i++)
        ints[i] = i * 10;
    for (int i = 0; i < 26; i++)
        cats[i] = "68fd1e64";
    ints[2] = -1000; /* empty */
    ints[3] = -2;    /* negative count */
    cats[5] = NULL;  /* empty categorical */
    cats[6] = "ABCDEF01";
    char line[1024];
    criteo_line(line, 1, ints, cats);
    assert_int_equal(parse(PW_FMT_CRITEO, line), 0);
    assert_true(g_s.label == 1.0f);
    assert_int_equal(g_s.ndense, 13);
    assert_int_equal(g_s.nkeys, 26);
    assert_true(g_s.dense[0] == 0.0f);
    assert_true(g_s.dense[1] == (float)log1p(10.0));
    assert_true(g_s.dense[2] == 0.0f && g_s.dense[3] == 0.0f);
    assert_true(g_s.keys[0] == pw_feature_key(0, 0x68fd1e64u));
    assert_true(g_s.keys[1] == pw_feature_key(1, 0x68fd1e64u));
    assert_true(g_s.keys[0] != g_s.keys[1]); /* fields never share keys */
    assert_true(g_s.keys[5] == pw_missing_key(5));
    assert_true(g_s.keys[6] == pw_feature_key(6, 0xabcdef01u)); /* hex is case-blind */
    /* CRLF and LF endings give the same sample. */
    char crlf[1100];
    snprintf(crlf, sizeof crlf, "%s\r\n", line);
    pw_sample_t a = g_s;
    assert_int_equal(parse(PW_FMT_CRITEO, crlf), 0);
    assert_memory_equal(a.keys, g_s.keys, 26 * sizeof(uint64_t));
    assert_memory_equal(a.dense, g_s.dense, 13 * sizeof(float));
}

static void test_criteo_bad(void **state) {
    (void)state;
    long ints[13] = {0};
    const char *cats[26];
    for (int i = 0; i < 26; i++)
        cats[i] = "1";
    char line[1024];
    criteo_line(line, 2, ints, cats);
    assert_int_equal(parse(PW_FMT_CRITEO, line), PC_EPARSE); /* label 2 */
    criteo_line(line, 0, ints, cats);
    assert_int_equal(parse(PW_FMT_CRITEO, line), 0);
    line[strlen(line) - 2] = '\0'; /* drop the last field and its tab */
    assert_int_equal(parse(PW_FMT_CRITEO, line), PC_EPARSE);
    criteo_line(line, 0, ints, cats);
    strcat(line, "\textra");
    assert_int_equal(parse(PW_FMT_CRITEO, line), PC_EPARSE); /* 41 fields */
    cats[3] = "12345678a";                                   /* 9 hex digits */
    criteo_line(line, 0, ints, cats);
    assert_int_equal(parse(PW_FMT_CRITEO, line), PC_EPARSE);
    cats[3] = "xyz";
    criteo_line(line, 0, ints, cats);
    assert_int_equal(parse(PW_FMT_CRITEO, line), PC_EPARSE);
    cats[3] = "1";
    criteo_line(line, 0, ints, cats);
    char *p = strchr(line, '\t') + 1; /* first integer field */
    *p = 'q';
    assert_int_equal(parse(PW_FMT_CRITEO, line), PC_EPARSE);
    assert_int_equal(parse(PW_FMT_CRITEO, ""), PC_EPARSE);
    assert_int_equal(pw_parse_line(PW_FMT_CRITEO, "0\t\0", 3, &g_s, NULL, 0), PC_EPARSE);
}

static void test_libsvm_libffm(void **state) {
    (void)state;
    assert_int_equal(parse(PW_FMT_LIBSVM, "+1 3:0.5 17:2 9:1e-3\n"), 0);
    assert_true(g_s.label == 1.0f);
    assert_int_equal(g_s.nkeys, 3);
    assert_true(g_s.keys[1] == pw_feature_key(0, 17) && g_s.val[1] == 2.0f);
    assert_int_equal(parse(PW_FMT_LIBSVM, "-1"), 0); /* no features */
    assert_true(g_s.label == 0.0f && g_s.nkeys == 0);
    assert_int_equal(parse(PW_FMT_LIBSVM, "0  5:1\t6:1  "), 0); /* extra blanks */
    assert_int_equal(g_s.nkeys, 2);
    assert_int_equal(parse(PW_FMT_LIBFFM, "1 0:5:1 3:5:0.25"), 0);
    assert_int_equal(g_s.nkeys, 2);
    assert_true(g_s.keys[0] == pw_feature_key(0, 5) && g_s.keys[1] == pw_feature_key(3, 5));
    assert_int_equal(g_s.field[1], 3);
    /* Malformed. */
    assert_int_equal(parse(PW_FMT_LIBSVM, "x 1:1"), PC_EPARSE);
    assert_int_equal(parse(PW_FMT_LIBSVM, "1 1"), PC_EPARSE);
    assert_int_equal(parse(PW_FMT_LIBSVM, "1 1:2:3"), PC_EPARSE);
    assert_int_equal(parse(PW_FMT_LIBSVM, "1 -4:1"), PC_EPARSE);
    assert_int_equal(parse(PW_FMT_LIBSVM, "1 4:nan"), PC_EPARSE);
    assert_int_equal(parse(PW_FMT_LIBSVM, "1 4:inf"), PC_EPARSE);
    assert_int_equal(parse(PW_FMT_LIBSVM, "1 4:1e999"), PC_EPARSE);
    assert_int_equal(parse(PW_FMT_LIBSVM, "1 99999999999999999999:1"), PC_EPARSE);
    assert_int_equal(parse(PW_FMT_LIBFFM, "1 3:1"), PC_EPARSE);
    assert_int_equal(parse(PW_FMT_LIBFFM, "1 5000:1:1"), PC_EPARSE); /* field range */
    /* Over the feature limit: PC_ETOOBIG. */
    static char big[PW_KEYS_MAX * 8 + 64];
    int n = sprintf(big, "1");
    for (int i = 0; i <= PW_KEYS_MAX; i++)
        n += sprintf(big + n, " %d:1", i);
    assert_int_equal(parse(PW_FMT_LIBSVM, big), PC_ETOOBIG);
    pw_format_t f;
    assert_int_equal(pw_format_parse("libffm", &f), 0);
    assert_int_equal(f, PW_FMT_LIBFFM);
    assert_int_equal(pw_format_parse("csv?", &f), PC_EINVAL);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_criteo),
        cmocka_unit_test(test_criteo_bad),
        cmocka_unit_test(test_libsvm_libffm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
