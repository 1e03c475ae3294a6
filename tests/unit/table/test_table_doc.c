/* Table settings as users read them: every key of ps_table_settings() is in `ps-server
 * --help-tables` and in the "Table settings" section of docs/server.md with the table's own
 * default (so neither can drift from the declaration), and a spec without name= is refused by
 * ps-server with a message that says so.
 *
 *   test_table_doc DOCS/server.md BUILD/bin/ps-server
 */
#include "test_util.h"

#include <string.h>
#include <sys/wait.h>

#include "ps_table.h"

static const char *g_doc, *g_server;

/* The rest of a stream, malloc'ed and NUL-terminated. */
static char *slurp(FILE *f) {
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    assert_non_null(buf);
    size_t got;
    while ((got = fread(buf + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (cap - len < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
            assert_non_null(buf);
        }
    }
    buf[len] = '\0';
    return buf;
}

/* ps-server's output (stderr too) for `args`, malloc'ed; *status: its exit status. */
static char *run(const char *args, int *status) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "timeout 30 %s %s 2>&1", g_server, args);
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    char *out = slurp(p);
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    return out;
}

/* The line of `text` that starts with `prefix`, cut at its end (in a copy); NULL if none. */
static char *line_starting(const char *text, const char *prefix, char *buf, size_t cap) {
    size_t pl = strlen(prefix);
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        if (strncmp(p, prefix, pl) == 0) {
            const char *e = strchr(p, '\n');
            size_t n = e ? (size_t)(e - p) : strlen(p);
            snprintf(buf, cap, "%.*s", (int)n, p);
            return buf;
        }
    }
    return NULL;
}

static void test_docs_name_every_key(void **state) {
    (void)state;
    FILE *f = fopen(g_doc, "r");
    assert_non_null(f);
    char *doc = slurp(f);
    fclose(f);
    char *sec = strstr(doc, "\n## Table settings\n");
    if (!sec)
        fail_msg("%s: no \"## Table settings\" section", g_doc);
    char *end = strstr(sec + 1, "\n## ");
    if (end)
        *end = '\0';
    assert_non_null(strstr(sec, "ps-server --help-tables"));
    size_t n;
    const pc_setting_t *tab = ps_table_settings(&n);
    for (size_t i = 0; i < n; i++) {
        char prefix[96], row[1024], want[160];
        snprintf(prefix, sizeof prefix, "| `%s` |", tab[i].name);
        if (!line_starting(sec, prefix, row, sizeof row))
            fail_msg("%s, Table settings: no row for key %s", g_doc, tab[i].name);
        /* the last column: the table's default ("required" for the name) */
        if (strcmp(tab[i].name, "name") == 0)
            snprintf(want, sizeof want, "| required |");
        else
            snprintf(want, sizeof want, "| `%s` |", tab[i].def);
        size_t rl = strlen(row), wl = strlen(want);
        if (rl < wl || strcmp(row + rl - wl, want) != 0)
            fail_msg("%s, Table settings, key %s: the default column should read %s (from "
                     "ps_table_settings()): %s",
                     g_doc, tab[i].name, want, row);
    }
    free(doc);
}

static void test_help_tables_names_every_key(void **state) {
    (void)state;
    int st;
    char *out = run("--help-tables", &st);
    assert_int_equal(st, 0);
    size_t n;
    const pc_setting_t *tab = ps_table_settings(&n);
    for (size_t i = 0; i < n; i++) {
        char prefix[96], line[512];
        snprintf(prefix, sizeof prefix, "  %s=<", tab[i].name);
        if (!line_starting(out, prefix, line, sizeof line))
            fail_msg("ps-server --help-tables does not list %s:\n%s", tab[i].name, out);
        char def[96];
        if (strcmp(tab[i].name, "name") == 0)
            snprintf(def, sizeof def, "(required)");
        else
            snprintf(def, sizeof def, "(default: %s", tab[i].def);
        if (!strstr(line, def))
            fail_msg("ps-server --help-tables, %s: no \"%s\": %s", tab[i].name, def, line);
    }
    assert_non_null(strstr(out, "name= is required"));
    free(out);
    out = run("--help", &st); /* --help points at it, and names flags as the docs do */
    assert_int_equal(st, 0);
    assert_non_null(strstr(out, "--help-tables"));
    assert_non_null(strstr(out, "--ckpt-dir=<str>"));
    assert_null(strstr(out, "--ckpt_dir=<"));
    free(out);
}

static void test_server_refuses_unnamed_spec(void **state) {
    (void)state;
    int st;
    char *out = run("--tables=dim=8 --port=0 --grpc-port=-1 --metrics-port=-1", &st);
    assert_int_equal(st, 2);
    if (!strstr(out, "table spec 'dim=8': name= is required"))
        fail_msg("no clear message:\n%s", out);
    free(out);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: test_table_doc DOCS/server.md PS-SERVER\n");
        return 2;
    }
    g_doc = argv[1];
    g_server = argv[2];
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_docs_name_every_key),
        cmocka_unit_test(test_help_tables_names_every_key),
        cmocka_unit_test(test_server_refuses_unnamed_spec),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
