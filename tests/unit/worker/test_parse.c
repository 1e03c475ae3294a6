/* Sample parsers: Criteo TSV (empty fields, CRLF, hex cases, missing keys), libsvm, libffm, and
 * every kind of malformed line refused with a reason (a wrong format's lines say what was
 * expected and what came: counts of fields and columns, the item). */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "pc_error.h"
#include "pc_feature.h"
#include "pw_parse.h"

static pw_sample_t g_s;

static int parse(pw_format_t f, const char *line) {
    char err[128];
    return pw_parse_line(f, NULL, line, strlen(line), &g_s, err, sizeof err);
}

/* The reason a line of format f (csv: its spec) is refused ("" when it parses). */
static const char *why(pw_format_t f, const pw_csv_spec_t *csv, const char *line) {
    static char err[200];
    err[0] = '\0';
    if (pw_parse_line(f, csv, line, strlen(line), &g_s, err, sizeof err) == 0)
        err[0] = '\0';
    return err;
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
    assert_true(g_s.keys[0] == pc_feature_key(0, 0x68fd1e64u));
    assert_true(g_s.keys[1] == pc_feature_key(1, 0x68fd1e64u));
    assert_true(g_s.keys[0] != g_s.keys[1]); /* fields never share keys */
    assert_true(g_s.keys[5] == pc_missing_key(5));
    assert_true(g_s.keys[6] == pc_feature_key(6, 0xabcdef01u)); /* hex is case-blind */
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
    assert_int_equal(pw_parse_line(PW_FMT_CRITEO, NULL, "0\t\0", 3, &g_s, NULL, 0), PC_EPARSE);
}

static void test_libsvm_libffm(void **state) {
    (void)state;
    assert_int_equal(parse(PW_FMT_LIBSVM, "+1 3:0.5 17:2 9:1e-3\n"), 0);
    assert_true(g_s.label == 1.0f);
    assert_int_equal(g_s.nkeys, 3);
    assert_true(g_s.keys[1] == pc_feature_key(0, 17) && g_s.val[1] == 2.0f);
    assert_int_equal(parse(PW_FMT_LIBSVM, "-1"), 0); /* no features */
    assert_true(g_s.label == 0.0f && g_s.nkeys == 0);
    assert_int_equal(parse(PW_FMT_LIBSVM, "0  5:1\t6:1  "), 0); /* extra blanks */
    assert_int_equal(g_s.nkeys, 2);
    assert_int_equal(parse(PW_FMT_LIBFFM, "1 0:5:1 3:5:0.25"), 0);
    assert_int_equal(g_s.nkeys, 2);
    assert_true(g_s.keys[0] == pc_feature_key(0, 5) && g_s.keys[1] == pc_feature_key(3, 5));
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
    /* A wrong format's lines say what was expected and what came. */
    assert_string_equal(why(PW_FMT_LIBSVM, NULL, "1 0:3:1 1:7:1"),
                        "feature 1: expected idx:val, got '0:3:1'");
    assert_string_equal(why(PW_FMT_LIBFFM, NULL, "1 0:3:1 7:1"),
                        "feature 2: expected field:idx:val, got '7:1'");
    assert_string_equal(why(PW_FMT_LIBSVM, NULL, "1\t2\t3"), /* Criteo read as libsvm */
                        "feature 1: expected idx:val, got '2'");
    assert_string_equal(why(PW_FMT_CRITEO, NULL, "1 3:1"),
                        "expected 40 tab-separated fields, got 1");
    assert_string_equal(
        why(PW_FMT_LIBSVM, NULL, "x 1:1"),
        "expected a number as the label, got 'x'"); /* long items are cut at 40 bytes: */
    assert_non_null(
        strstr(why(PW_FMT_LIBSVM, NULL, "1 0123456789012345678901234567890123456789xyz"),
               "got '0123456789012345678901234567890123456789...'"));
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
    assert_int_equal(pw_format_parse("csv", &f), 0);
    assert_int_equal(f, PW_FMT_CSV);
}

static int csv(const pw_csv_spec_t *sp, const char *line) {
    char err[128];
    return pw_parse_line(PW_FMT_CSV, sp, line, strlen(line), &g_s, err, sizeof err);
}

/* Column specs: every setting, and every malformed spec refused with a reason. */
static void test_csv_spec(void **state) {
    (void)state;
    pw_csv_spec_t sp;
    char err[128];
    assert_int_equal(
        pw_csv_spec_parse("header=1,threshold=4,columns=cat:cat:label:skip", &sp, err, sizeof err),
        0);
    assert_true(sp.header && sp.threshold == 4.0f && sp.ncols == 4 && sp.ncat == 2 && sp.nnum == 0);
    assert_true(sp.sep == ',' && sp.multi_sep == '|');
    assert_int_equal(pw_csv_spec_parse("columns=label:num:log:cats,sep=tab,multi_sep=space", &sp,
                                       err, sizeof err),
                     0);
    assert_true(sp.sep == '\t' && sp.multi_sep == ' ' && sp.ncat == 1 && sp.nnum == 2);
    int nf, nd;
    pw_format_shape(PW_FMT_CSV, &sp, &nf, &nd);
    assert_true(nf == 1 && nd == 2);
    pw_format_shape(PW_FMT_CRITEO, NULL, &nf, &nd);
    assert_true(nf == 26 && nd == 13);
    const char *bad[] = {"",
                         "header=1",                          /* no columns */
                         "columns=cat:cat",                   /* no label */
                         "columns=label:label:cat",           /* two labels */
                         "columns=label:skip",                /* no feature */
                         "columns=label:cat:bogus",           /* kind */
                         "columns=label:cat,threshold=x",     /* threshold */
                         "columns=label:cat,header=2",        /* header */
                         "columns=label:cat,sep=dot",         /* separator */
                         "columns=label:cat,multi_sep=comma", /* equals sep */
                         "columns=label:cat,speed=9",         /* unknown */
                         "columns=label:cat,columns=label",   /* two column lists */
                         "columns"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        assert_int_equal(pw_csv_spec_parse(bad[i], &sp, err, sizeof err), PC_EINVAL);
        assert_true(err[0] != '\0');
    }
}

/* MovieLens-style lines, quoting, multi-valued and numeric columns, and malformed lines. */
static void test_csv_lines(void **state) {
    (void)state;
    pw_csv_spec_t ml, sp;
    assert_int_equal(
        pw_csv_spec_parse("header=1,threshold=4,columns=cat:cat:label:skip", &ml, NULL, 0), 0);
    assert_int_equal(csv(&ml, "1,31,2.5,1260759144\r\n"), 0);
    assert_true(g_s.label == 0.0f && g_s.nkeys == 2 && g_s.ndense == 0);
    assert_true(g_s.field[0] == 0 && g_s.field[1] == 1 && g_s.val[0] == 1.0f);
    const uint64_t u1 = g_s.keys[0], m31 = g_s.keys[1];
    assert_true(u1 != m31);
    assert_int_equal(csv(&ml, "1,1029,4.0,1260759179"), 0);
    assert_true(g_s.label == 1.0f && g_s.keys[0] == u1 && g_s.keys[1] != m31);
    assert_int_equal(csv(&ml, "31,1,4.5,0"), 0); /* same value, other field: other key */
    assert_true(g_s.keys[0] != m31 && g_s.keys[1] != u1);
    assert_int_equal(csv(&ml, ",1,4.5,0"), 0); /* empty cat: the field's missing key */
    assert_true(g_s.keys[0] == pc_missing_key(0));
    /* Wrong column counts (said with the counts), bad label. */
    assert_string_equal(why(PW_FMT_CSV, &ml, "1,31,2.5"), "expected 4 columns, got 3");
    assert_string_equal(why(PW_FMT_CSV, &ml, "1,31,2.5,1,9,\"a,b\",c"),
                        "expected 4 columns, got 7");
    assert_string_equal(why(PW_FMT_CSV, &ml, "1,31,2.5,1,\"open"),
                        "expected 4 columns, got over 4");
    /* a quoted value's line break, seen line by line: both halves refused */
    assert_string_equal(why(PW_FMT_CSV, &ml, "x,\"a"), "column 2: a broken quote (unterminated, "
                                                       "or inside an unquoted value)");
    assert_string_equal(why(PW_FMT_CSV, &ml, "b\",2,4.5,1"), "column 1: a broken quote "
                                                             "(unterminated, or inside an unquoted "
                                                             "value)");
    pw_csv_spec_t tsv; /* another separator's data may hold a quote: 12" */
    assert_int_equal(pw_csv_spec_parse("sep=tab,columns=cat:label", &tsv, NULL, 0), 0);
    assert_int_equal(csv(&tsv, "12\" pizza\t1"), 0);
    assert_int_equal(csv(&ml, "1,31,2.5"), PC_EPARSE);
    assert_int_equal(csv(&ml, "1,31,2.5,1,9"), PC_EPARSE);
    assert_int_equal(csv(&ml, ""), PC_EPARSE);
    assert_int_equal(csv(&ml, "1,31,,1"), PC_EPARSE);
    assert_int_equal(csv(&ml, "1,31,nan,1"), PC_EPARSE);
    assert_int_equal(csv(&ml, "1,31,four,1"), PC_EPARSE);
    /* Quotes, multi-valued, numeric and log columns. */
    assert_int_equal(
        pw_csv_spec_parse("columns=skip:cats:num:log:label:cat,threshold=1", &sp, NULL, 0), 0);
    assert_int_equal(csv(&sp, "\"Heat, (1995)\",Action|Crime|Thriller,-1.5,e,1,\"x\"\"y\""),
                     PC_EPARSE); /* "e" is not a number */
    assert_int_equal(csv(&sp, "\"Heat, (1995)\",Action|Crime|Thriller,-1.5,7,1,\"x\"\"y\""), 0);
    assert_true(g_s.label == 1.0f && g_s.ndense == 2 && g_s.nkeys == 4);
    assert_true(g_s.dense[0] == -1.5f && fabsf(g_s.dense[1] - (float)log1p(7.0)) < 1e-6f);
    assert_true(g_s.field[0] == 0 && g_s.field[2] == 0 && g_s.field[3] == 1);
    const uint64_t action = g_s.keys[0];
    assert_int_equal(csv(&sp, "t,Crime|Action,,-3,0,z"), 0); /* order-free, empty num 0 */
    assert_true(g_s.keys[1] == action && g_s.dense[0] == 0 && g_s.dense[1] == 0);
    assert_true(g_s.label == 0.0f);
    assert_int_equal(csv(&sp, "t,,1,1,0,z"), 0); /* empty multi-valued: no feature */
    assert_int_equal(g_s.nkeys, 1);
    assert_int_equal(csv(&sp, "t,a||b|,1,1,0,z"), 0); /* empty items skipped */
    assert_int_equal(g_s.nkeys, 3);
    assert_int_equal(csv(&sp, "\"open,A,1,1,0,z"), PC_EPARSE); /* unterminated quote */
    assert_int_equal(csv(&sp, "\"a\"b,A,1,1,0,z"), PC_EPARSE); /* text after a quote */
    assert_int_equal(csv(&sp, "t,A,1,1,0,\"\""), 0);           /* quoted empty */
    assert_int_equal(pw_parse_line(PW_FMT_CSV, NULL, "1,2", 3, &g_s, NULL, 0), PC_EPARSE);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_csv_spec),      cmocka_unit_test(test_csv_lines),
        cmocka_unit_test(test_criteo),        cmocka_unit_test(test_criteo_bad),
        cmocka_unit_test(test_libsvm_libffm),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
