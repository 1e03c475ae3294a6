/* Settings tables: every input path, bounds, errors, help and dump round trip. */
#include "test_util.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "pc_error.h"
#include "pc_settings.h"

typedef struct cfg {
    bool verbose;
    int64_t count;
    double rate;
    int mode;
    char name[16];
} cfg_t;

static const char *const modes[] = {"fast", "safe", NULL};
static const pc_setting_t tab[] = {
    PC_SETTING_BOOL(cfg_t, verbose, "false", "talk more"),
    PC_SETTING_INT(cfg_t, count, 1, 1e12, "10", "how many"),
    PC_SETTING_DOUBLE(cfg_t, rate, 0, 1, "0.5", "a fraction"),
    PC_SETTING_ENUM(cfg_t, mode, modes, "safe", "speed"),
    PC_SETTING_STRING(cfg_t, name, "x", "a name"),
};
#define N (sizeof tab / sizeof tab[0])

static void test_defaults_and_list(void **state) {
    (void)state;
    cfg_t c;
    char err[200];
    assert_int_equal(pc_settings_defaults(tab, N, &c), 0);
    assert_false(c.verbose);
    assert_int_equal(c.count, 10);
    assert_int_equal(c.mode, 1);
    assert_string_equal(c.name, "x");
    assert_int_equal(pc_settings_parse_list(tab, N, &c,
                                            " count=2Ki , rate=0.25,mode=FAST,verbose=on", err,
                                            sizeof err),
                     0);
    assert_int_equal(c.count, 2048);
    assert_true(c.rate == 0.25);
    assert_int_equal(c.mode, 0);
    assert_true(c.verbose);
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "count=3M", err, sizeof err), 0);
    assert_int_equal(c.count, 3000000);
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "count=010", err, sizeof err), 0);
    assert_int_equal(c.count, 10); /* decimal, not octal */
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "count=0x10", err, sizeof err), PC_EINVAL);
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "", err, sizeof err), 0);
}

static void test_rejects(void **state) {
    (void)state;
    cfg_t c;
    char err[200];
    pc_settings_defaults(tab, N, &c);
    cfg_t before = c;
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "count=0", err, sizeof err), PC_EINVAL);
    assert_non_null(strstr(err, "count"));
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "count=12abc", err, sizeof err), PC_EINVAL);
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "rate=nan", err, sizeof err), PC_EINVAL);
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "rate=1.5", err, sizeof err), PC_EINVAL);
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "mode=slow", err, sizeof err), PC_EINVAL);
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "verbose=maybe", err, sizeof err),
                     PC_EINVAL);
    assert_int_equal(
        pc_settings_parse_list(tab, N, &c, "name=waytoolongforthebuffer", err, sizeof err),
        PC_EINVAL);
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "nosuch=1", err, sizeof err), PC_ENOTFOUND);
    assert_non_null(strstr(err, "nosuch"));
    assert_int_equal(pc_settings_parse_list(tab, N, &c, "count", err, sizeof err), PC_EINVAL);
    assert_int_equal(
        pc_settings_parse_list(tab, N, &c, "count=99999999999999999999", err, sizeof err),
        PC_EINVAL);
    assert_memory_equal(&c, &before, sizeof c); /* nothing stored on error */
}

static void test_args(void **state) {
    (void)state;
    cfg_t c;
    char err[200];
    pc_settings_defaults(tab, N, &c);
    char *argv[] = {"prog",         "--count",     "7",       "--rate=0.75", "--verbose",
                    "--no-verbose", "--mode=fast", "--other", "file"};
    int argi = 1;
    assert_int_equal(pc_settings_parse_args(tab, N, &c, 9, argv, &argi, err, sizeof err), 0);
    assert_int_equal(argi, 7); /* stopped at --other, left for the caller */
    assert_int_equal(c.count, 7);
    assert_true(c.rate == 0.75);
    assert_false(c.verbose);
    assert_int_equal(c.mode, 0);
    char *argv_u[] = {"prog", "--verbose", "--no_verbose"}; /* '_' as '-', also after no */
    argi = 1;
    assert_int_equal(pc_settings_parse_args(tab, N, &c, 3, argv_u, &argi, err, sizeof err), 0);
    assert_int_equal(argi, 3);
    assert_false(c.verbose);
    char *argv2[] = {"prog", "--count"};
    argi = 1;
    assert_int_equal(pc_settings_parse_args(tab, N, &c, 2, argv2, &argi, err, sizeof err),
                     PC_EINVAL);
    char *argv3[] = {"prog", "--count", "--rate=0.5"}; /* an option is not a value */
    argi = 1;
    assert_int_equal(pc_settings_parse_args(tab, N, &c, 3, argv3, &argi, err, sizeof err),
                     PC_EINVAL);
}

/* A long string setting (a cluster map of many servers) round-trips through dump and a file:
 * the dump cut it at 1099 bytes, and a file refused values of 1024 bytes and more. */
typedef struct big {
    char map[4096];
} big_t;
static const pc_setting_t big_tab[] = {PC_SETTING_STRING(big_t, map, "", "a long value")};

static void test_long_string_dump(void **state) {
    (void)state;
    big_t b, r;
    memset(&b, 0, sizeof b);
    memset(&r, 0, sizeof r);
    pc_settings_defaults(big_tab, 1, &b);
    memset(b.map, 'm', 3000);
    b.map[3000] = '\0';
    char path[] = "/tmp/ember_settings_big_XXXXXX", err[200];
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    pc_settings_dump(big_tab, 1, &b, f);
    fclose(f);
    pc_settings_defaults(big_tab, 1, &r);
    assert_int_equal(pc_settings_load_file(big_tab, 1, &r, path, err, sizeof err), 0);
    assert_memory_equal(&b, &r, sizeof b);
    unlink(path);
}

static void test_file_env_dump(void **state) {
    (void)state;
    cfg_t c, d;
    memset(&c, 0, sizeof c); /* padding bytes compare equal below */
    memset(&d, 0, sizeof d);
    char err[300];
    char path[] = "/tmp/ember_settings_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "# a comment\n\n  count = 42  # trailing\nname=a#b\n");
    fclose(f);
    pc_settings_defaults(tab, N, &c);
    assert_int_equal(pc_settings_load_file(tab, N, &c, path, err, sizeof err), 0);
    assert_int_equal(c.count, 42);
    assert_string_equal(c.name, "a#b"); /* a '#' inside a value is the value's (a token's) */
    f = fopen(path, "w"); /* a value beginning with '#': refused, not taken as empty */
    fprintf(f, "name = #s3cret\n");
    fclose(f);
    assert_int_equal(pc_settings_load_file(tab, N, &c, path, err, sizeof err), PC_EINVAL);
    assert_non_null(strstr(err, ":1: a value cannot begin with '#'"));
    assert_string_equal(c.name, "a#b");

    setenv("TST_RATE", "0.125", 1);
    assert_int_equal(pc_settings_load_env(tab, N, &c, "TST_", err, sizeof err), 0);
    assert_true(c.rate == 0.125);
    setenv("TST_RATE", "bad", 1);
    assert_int_equal(pc_settings_load_env(tab, N, &c, "TST_", err, sizeof err), PC_EINVAL);
    assert_non_null(strstr(err, "TST_RATE"));
    unsetenv("TST_RATE");

    /* dump -> file -> load gives the same struct */
    f = fopen(path, "w");
    pc_settings_dump(tab, N, &c, f);
    fclose(f);
    pc_settings_defaults(tab, N, &d);
    assert_int_equal(pc_settings_load_file(tab, N, &d, path, err, sizeof err), 0);
    assert_memory_equal(&c, &d, sizeof c);

    f = fopen(path, "w");
    fprintf(f, "count = 5\nbogus = 1\n");
    fclose(f);
    assert_int_equal(pc_settings_load_file(tab, N, &d, path, err, sizeof err), PC_ENOTFOUND);
    assert_non_null(strstr(err, ":2:"));
    unlink(path);
    assert_int_equal(pc_settings_load_file(tab, N, &d, path, err, sizeof err), PC_EIO);

    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    pc_settings_help(tab, N, m);
    fclose(m);
    assert_non_null(strstr(buf, "--count=<int>"));
    assert_non_null(strstr(buf, "fast|safe"));
    free(buf);
}

/* A quoted value in a file is taken whole (blanks, '#', escapes), and the dump quotes a string
 * that would not read back bare: " x" came back "x", "a #b" came back "a", and "\"q\"" with
 * its quotes. */
static void test_file_quoted(void **state) {
    (void)state;
    cfg_t c, d;
    memset(&c, 0, sizeof c);
    memset(&d, 0, sizeof d);
    char err[300], path[] = "/tmp/ember_settings_q_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fprintf(f, "name=#x\n"); /* a '#' right after '=' is the value's, as it always was */
    fclose(f);
    pc_settings_defaults(tab, N, &c);
    assert_int_equal(pc_settings_load_file(tab, N, &c, path, err, sizeof err), 0);
    assert_string_equal(c.name, "#x");
    f = fopen(path, "w");
    fprintf(f, "name = \" a #b \"  # a comment\r\ncount = \"7\"\n");
    fclose(f);
    assert_int_equal(pc_settings_load_file(tab, N, &c, path, err, sizeof err), 0);
    assert_string_equal(c.name, " a #b ");
    assert_int_equal(c.count, 7);
    static const char *const bad[][2] = {
        {"name = \"open\n", ":1: a quoted value without its closing"},
        {"name = \"a\\qb\"\n", ":1: unknown escape '\\q'"},
        {"name = \"a\" b\n", ":1: 'b' after a quoted value"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        f = fopen(path, "w");
        fputs(bad[i][0], f);
        fclose(f);
        assert_int_equal(pc_settings_load_file(tab, N, &c, path, err, sizeof err), PC_EINVAL);
        assert_non_null(strstr(err, bad[i][1]));
        assert_string_equal(c.name, " a #b ");
    }
    static const char *const names[] = {" x", "a #b", "\"q\"", "#h", "t\\\n\tu ", "plain\"mid"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        memset(c.name, 0, sizeof c.name); /* (the bytes after the string compare too) */
        strcpy(c.name, names[i]);
        f = fopen(path, "w");
        pc_settings_dump(tab, N, &c, f);
        fclose(f);
        memset(d.name, 0, sizeof d.name);
        pc_settings_defaults(tab, N, &d);
        assert_int_equal(pc_settings_load_file(tab, N, &d, path, err, sizeof err), 0);
        assert_string_equal(d.name, names[i]);
        assert_memory_equal(&c, &d, sizeof c);
    }
    unlink(path);
}

/* A config file whose line never ends (here 256 MiB of NUL bytes, a sparse file; a 100 KiB line
 * of letters too) is refused at its first 64 KiB: it was read whole into memory first. */
static void test_file_huge_line(void **state) {
    (void)state;
    cfg_t c;
    char err[300], path[] = "/tmp/ember_settings_huge_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, 256 << 20), 0);
    close(fd);
    FILE *reset = fopen("/proc/self/clear_refs", "w"); /* "5": the peak starts again from now */
    const bool measured = reset && fputs("5", reset) >= 0 && fclose(reset) == 0;
    if (reset && !measured)
        print_message("clear_refs not writable: the peak is not measured\n");
    const long before = tu_proc_kb(getpid(), "VmHWM:");
    pc_settings_defaults(tab, N, &c);
    assert_int_equal(pc_settings_load_file(tab, N, &c, path, err, sizeof err), PC_EINVAL);
    assert_non_null(strstr(err, ":1: line too long"));
    const long grew = tu_proc_kb(getpid(), "VmHWM:") - before;
    print_message("peak grew %ld KiB reading a 256 MiB line\n", grew);
    if (measured && before > 0)
        assert_true(grew < 16 << 10);
    FILE *f = fopen(path, "w");
    fputs("count = 3\nname = ", f);
    for (int i = 0; i < 100 << 10; i++)
        fputc('a', f);
    fputs("\n", f);
    fclose(f);
    assert_int_equal(pc_settings_load_file(tab, N, &c, path, err, sizeof err), PC_EINVAL);
    assert_non_null(strstr(err, ":2: line too long"));
    assert_int_equal(c.count, 3);
    f = fopen(path, "w"); /* the last line without its newline is a line */
    fputs("count = 4\ncount = 5", f);
    fclose(f);
    assert_int_equal(pc_settings_load_file(tab, N, &c, path, err, sizeof err), 0);
    assert_int_equal(c.count, 5);
    unlink(path);
}

/* A string from a flag or the environment is taken as written, blanks at both ends kept (the
 * leading ones were dropped, the trailing ones kept); a number's blanks do not count. */
static void test_string_blanks(void **state) {
    (void)state;
    cfg_t c;
    char err[200];
    pc_settings_defaults(tab, N, &c);
    char *argv[] = {"prog", "--name= x ", "--count= 8 "};
    int argi = 1;
    assert_int_equal(pc_settings_parse_args(tab, N, &c, 3, argv, &argi, err, sizeof err), 0);
    assert_string_equal(c.name, " x ");
    assert_int_equal(c.count, 8);
    setenv("TST_NAME", "  y", 1);
    assert_int_equal(pc_settings_load_env(tab, N, &c, "TST_", err, sizeof err), 0);
    unsetenv("TST_NAME");
    assert_string_equal(c.name, "  y");
}

/* A declaration whose field has the wrong size is refused (it would overwrite memory). */
typedef struct small {
    int n; /* INT settings store int64_t */
} small_t;

static void test_bad_declaration(void **state) {
    (void)state;
    const pc_setting_t bad[] = {{"n", PC_SET_INT, offsetof(small_t, n), sizeof(int), 0, 10, "1",
                                 NULL, "an int field", false}};
    small_t x;
    assert_int_equal(pc_settings_defaults(bad, 1, &x), PC_EINVAL);
}

/* A tool's command line: values parsed, --help answered, leftovers and bad values refused. */
static void test_cli(void **state) {
    (void)state;
    cfg_t c;
    char *ok[] = {"tool", "--count=7", "--verbose", NULL};
    assert_int_equal(pc_settings_cli(tab, N, &c, 3, ok, "tool", "tool [opts]"), 0);
    assert_int_equal(c.count, 7);
    assert_true(c.verbose);
    assert_string_equal(c.name, "x"); /* defaults for the rest */
    char *help[] = {"tool", "--count=7", "-h", NULL};
    assert_int_equal(pc_settings_cli(tab, N, &c, 3, help, "tool", "tool [opts]"), 1);
    char *extra[] = {"tool", "--count=7", "leftover", NULL};
    assert_int_equal(pc_settings_cli(tab, N, &c, 3, extra, "tool", "tool [opts]"), 2);
    char *bad[] = {"tool", "--count=0", NULL}; /* below its bound */
    assert_int_equal(pc_settings_cli(tab, N, &c, 2, bad, "tool", "tool [opts]"), 2);
    /* the environment (MY_TOOL_NAME for "my-tool"), overridden by flags; a bad value refused */
    setenv("MY_TOOL_NAME", "from-env", 1);
    setenv("MY_TOOL_COUNT", "5", 1);
    char *env[] = {"my-tool", "--count=8", NULL};
    assert_int_equal(pc_settings_cli(tab, N, &c, 2, env, "my-tool", "my-tool [opts]"), 0);
    assert_string_equal(c.name, "from-env");
    assert_int_equal(c.count, 8);
    setenv("MY_TOOL_COUNT", "many", 1);
    assert_int_equal(pc_settings_cli(tab, N, &c, 1, env, "my-tool", "my-tool [opts]"), 2);
    unsetenv("MY_TOOL_NAME");
    unsetenv("MY_TOOL_COUNT");
}

/* Messages and help name a setting as the user wrote it: flags as "--ckpt-dir" (either spelling
 * parses), an enum's bad value with its choices; lists keep the snake_case name. */
typedef struct named {
    int64_t ckpt_keep;
    int fmt;
} named_t;

static void test_names_and_choices(void **state) {
    (void)state;
    static const char *const fmts[] = {"criteo", "libsvm", "csv", NULL};
    const pc_setting_t t[] = {
        PC_SETTING_INT(named_t, ckpt_keep, 1, 10, "3", "checkpoints kept"),
        PC_SETTING_ENUM(named_t, fmt, fmts, "criteo", "input format"),
    };
    named_t c;
    char err[200];
    assert_int_equal(pc_settings_defaults(t, 2, &c), 0);
    char *argv[] = {"prog", "--ckpt-keep=4", "--ckpt_keep", "5", "--fmt=CSV"};
    int argi = 1;
    assert_int_equal(pc_settings_parse_args(t, 2, &c, 5, argv, &argi, err, sizeof err), 0);
    assert_int_equal(c.ckpt_keep, 5);
    assert_int_equal(c.fmt, 2);
    char *bad[] = {"prog", "--fmt=parquet"};
    argi = 1;
    assert_int_equal(pc_settings_parse_args(t, 2, &c, 2, bad, &argi, err, sizeof err), PC_EINVAL);
    assert_string_equal(err, "--fmt: 'parquet' is not one of criteo, libsvm, csv");
    char *big[] = {"prog", "--ckpt_keep=11"};
    argi = 1;
    assert_int_equal(pc_settings_parse_args(t, 2, &c, 2, big, &argi, err, sizeof err), PC_EINVAL);
    assert_non_null(strstr(err, "--ckpt-keep: 11 is outside"));
    char *none[] = {"prog", "--ckpt-keep"};
    argi = 1;
    assert_int_equal(pc_settings_parse_args(t, 2, &c, 2, none, &argi, err, sizeof err), PC_EINVAL);
    assert_string_equal(err, "--ckpt-keep needs a value");
    assert_int_equal(pc_settings_parse_list(t, 2, &c, "fmt=orc", err, sizeof err), PC_EINVAL);
    assert_string_equal(err, "fmt: 'orc' is not one of criteo, libsvm, csv");

    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    pc_settings_help(t, 2, m);
    fclose(m);
    assert_non_null(strstr(buf, "--ckpt-keep=<int>"));
    assert_null(strstr(buf, "--ckpt_keep="));   /* the docs' form only ... */
    assert_non_null(strstr(buf, "'-' or '_'")); /* ... and a line saying both work */
    free(buf);
    m = open_memstream(&buf, &len);
    pc_settings_help_list(t, 2, m);
    fclose(m);
    assert_non_null(strstr(buf, "  ckpt_keep=<int>"));
    assert_non_null(strstr(buf, "criteo|libsvm|csv"));
    assert_null(strstr(buf, "--"));
    free(buf);
}

/* Comparing a wanted list with a table's settings text (what a worker checks at start). */
static void test_list_diff(void **state) {
    (void)state;
    const char *have = "name=emb,dim=16,init_scale=0.050000000000000003,optimizer=adagrad,"
                       "lr=0.050000000000000003,adagrad_init=9.9999999999999995e-07,cold=false";
    char d[256];
    assert_int_equal(pc_settings_list_diff("", have, d, sizeof d), 0);
    assert_string_equal(d, "");
    assert_int_equal(pc_settings_list_diff(NULL, have, NULL, 0), 0);
    /* numbers as numbers, '-' as '_', blanks and empty items ignored */
    assert_int_equal(pc_settings_list_diff(" lr = 5e-2 ,, adagrad-init=1e-6,dim=16,cold=false,",
                                           have, d, sizeof d),
                     0);
    assert_int_equal(pc_settings_list_diff("optimizer=sgd,dim=8,lr=0.05", have, d, sizeof d), 2);
    assert_string_equal(d, "optimizer=sgd (have: adagrad); dim=8 (have: 16)");
    assert_int_equal(pc_settings_list_diff("shards=4", have, d, sizeof d), 1);
    assert_string_equal(d, "shards=4 (have: absent)");
    assert_int_equal(pc_settings_list_diff("lr=0.0500001", have, NULL, 0), 1); /* close: differs */
    /* as the parsers read them: suffixes, boolean spellings, choices in any case; integers
     * exactly (a relative tolerance once took 1000000001 for 1000000000) */
    const char *more = "admit_width=4194304,seed=1000000000,cold=false,optimizer=sgd";
    assert_int_equal(
        pc_settings_list_diff("admit_width=4Mi,cold=no,optimizer=SGD", more, d, sizeof d), 0);
    assert_int_equal(pc_settings_list_diff("seed=1000000001", more, d, sizeof d), 1);
    assert_int_equal(pc_settings_list_diff("cold=on", more, d, sizeof d), 1);
    assert_int_equal(pc_settings_list_diff("name=emb2", have, d, 8), 1); /* truncated */
    assert_int_equal(strlen(d), 7);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_list), cmocka_unit_test(test_long_string_dump),
        cmocka_unit_test(test_rejects),           cmocka_unit_test(test_args),
        cmocka_unit_test(test_file_env_dump),     cmocka_unit_test(test_file_quoted),
        cmocka_unit_test(test_file_huge_line),    cmocka_unit_test(test_string_blanks),
        cmocka_unit_test(test_bad_declaration),   cmocka_unit_test(test_cli),
        cmocka_unit_test(test_names_and_choices), cmocka_unit_test(test_list_diff),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
