/* pc_settings.c: parsing, validation and printing for settings tables (see pc_settings.h).
 *
 * DESIGN: all entry points funnel into set_value(), the single place that parses and checks a
 * value, so flags, files, environment and lists cannot disagree on syntax or bounds.
 */
#include "pc_settings.h"
#include "pc_error.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void set_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void set_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* Name match where '-' in `given` (flags) stands for '_'; `len` bounds `given`. */
static bool name_eq(const char *name, const char *given, size_t len) {
    size_t i = 0;
    for (; i < len; i++) {
        char c = given[i] == '-' ? '_' : given[i];
        if (name[i] == '\0' || name[i] != c)
            return false;
    }
    return name[i] == '\0';
}

/* How a setting is named in a message or in --help: "--ckpt-dir" among flags (the form the docs
 * use; "--ckpt_dir" works too), "ckpt_dir" in files, lists and the environment. */
static const char *shown(const pc_setting_t *s, bool flag, char *buf, size_t cap) {
    if (!flag)
        return s->name;
    size_t len = (size_t)snprintf(buf, cap, "--%s", s->name);
    for (size_t i = 2; i < len && i < cap; i++)
        if (buf[i] == '_')
            buf[i] = '-';
    return buf;
}

/* "a, b, c": an enum's choices, for messages. */
static void choices_text(const pc_setting_t *s, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; s->choices[i] && len < cap; i++) {
        int w = snprintf(buf + len, cap - len, "%s%s", i ? ", " : "", s->choices[i]);
        len += w > 0 ? (size_t)w : 0;
    }
}

static const pc_setting_t *find(const pc_setting_t *tab, size_t n, const char *name, size_t len) {
    for (size_t i = 0; i < n; i++)
        if (name_eq(tab[i].name, name, len))
            return &tab[i];
    return NULL;
}

static int parse_bool(const char *v, bool *out) {
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (strcasecmp(v, yes[i]) == 0) {
            *out = true;
            return 0;
        }
        if (strcasecmp(v, no[i]) == 0) {
            *out = false;
            return 0;
        }
    }
    return PC_EINVAL;
}

static int parse_int(const char *v, int64_t *out) {
    errno = 0;
    char *end;
    long long x = strtoll(v, &end, 10); /* decimal only: "010" is ten, not eight */
    if (end == v || errno)
        return PC_EINVAL;
    struct {
        const char *sfx;
        int64_t mul;
    } units[] = {
        {"", 1},           {"k", 1000},  {"K", 1000},         {"M", 1000000},
        {"G", 1000000000}, {"Ki", 1024}, {"Mi", 1024 * 1024}, {"Gi", 1024LL * 1024 * 1024}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strcmp(end, units[i].sfx) == 0) {
            if (units[i].mul > 1 && (x > INT64_MAX / units[i].mul || x < INT64_MIN / units[i].mul))
                return PC_EINVAL;
            *out = (int64_t)x * units[i].mul;
            return 0;
        }
    }
    return PC_EINVAL;
}

/* Trim spaces in place at both ends of [b, e); returns the new start, *e updated. */
static const char *trim(const char *b, const char **e) {
    while (b < *e && isspace((unsigned char)*b))
        b++;
    while (*e > b && isspace((unsigned char)(*e)[-1]))
        (*e)--;
    return b;
}

/* Parse v into s's field of obj; `flag`: v came from a command line flag (messages name the
 * setting as the flag: "--ckpt-dir: ..."). */
static int set_value(const pc_setting_t *s, void *obj, const char *v, bool flag, char *err,
                     size_t errlen) {
    char *field = (char *)obj + s->offset;
    char nbuf[96];
    const char *name = shown(s, flag, nbuf, sizeof nbuf);
    char trimmed[128]; /* numbers, booleans and choices: blanks around do not count; a string
                        * is taken as given (set_span trims file lines and spec lists first) */
    if (s->type != PC_SET_STRING) {
        const char *e = v + strlen(v);
        v = trim(v, &e);
        const size_t len = (size_t)(e - v);
        if (len >= sizeof trimmed) {
            set_err(err, errlen, "%s: value too long", name);
            return PC_EINVAL;
        }
        memcpy(trimmed, v, len);
        trimmed[len] = '\0';
        v = trimmed;
    }
    switch (s->type) {
        case PC_SET_BOOL: {
            bool b;
            if (parse_bool(v, &b)) {
                set_err(err, errlen, "%s: '%s' is not a boolean (true/false)", name, v);
                return PC_EINVAL;
            }
            *(bool *)field = b;
            return 0;
        }
        case PC_SET_INT: {
            int64_t x;
            if (parse_int(v, &x)) {
                set_err(err, errlen, "%s: '%s' is not an integer", name, v);
                return PC_EINVAL;
            }
            if ((double)x < s->min || (double)x > s->max) {
                set_err(err, errlen, "%s: %lld is outside [%.17g, %.17g]", name, (long long)x,
                        s->min, s->max);
                return PC_EINVAL;
            }
            *(int64_t *)field = x;
            return 0;
        }
        case PC_SET_DOUBLE: {
            errno = 0;
            char *end;
            double x = strtod(v, &end);
            if (end == v || *end || errno || !isfinite(x)) {
                set_err(err, errlen, "%s: '%s' is not a finite number", name, v);
                return PC_EINVAL;
            }
            if (x < s->min || x > s->max) {
                set_err(err, errlen, "%s: %g is outside [%g, %g]", name, x, s->min, s->max);
                return PC_EINVAL;
            }
            *(double *)field = x;
            return 0;
        }
        case PC_SET_ENUM:
            for (int i = 0; s->choices[i]; i++) {
                if (strcasecmp(v, s->choices[i]) == 0) {
                    *(int *)field = i;
                    return 0;
                }
            }
            if (err && errlen) {
                char ch[256];
                choices_text(s, ch, sizeof ch);
                set_err(err, errlen, "%s: '%s' is not one of %s", name, v, ch);
            }
            return PC_EINVAL;
        case PC_SET_STRING: {
            size_t len = strlen(v);
            if (len >= s->size) {
                set_err(err, errlen, "%s: value longer than %zu bytes", name, s->size - 1);
                return PC_EINVAL;
            }
            memcpy(field, v, len + 1);
            return 0;
        }
    }
    return PC_EINVAL;
}

/* Storage size each type writes: a declaration on a field of another size is a bug. */
static size_t type_size(pc_setting_type_t t) {
    switch (t) {
        case PC_SET_BOOL:
            return sizeof(bool);
        case PC_SET_INT:
            return sizeof(int64_t);
        case PC_SET_DOUBLE:
            return sizeof(double);
        case PC_SET_ENUM:
            return sizeof(int);
        case PC_SET_STRING:
            return 0; /* any buffer */
    }
    return 0;
}

int pc_settings_defaults(const pc_setting_t *tab, size_t n, void *obj) {
    for (size_t i = 0; i < n; i++) {
        size_t want = type_size(tab[i].type);
        if ((want && tab[i].size != want) || (tab[i].type == PC_SET_STRING && tab[i].size < 2))
            return PC_EINVAL;
        int rc = set_value(&tab[i], obj, tab[i].def, false, NULL, 0);
        if (rc)
            return rc;
    }
    return 0;
}

int pc_settings_set(const pc_setting_t *tab, size_t n, void *obj, const char *name,
                    const char *value, char *err, size_t errlen) {
    const pc_setting_t *s = find(tab, n, name, strlen(name));
    if (!s) {
        set_err(err, errlen, "unknown setting '%s'", name);
        return PC_ENOTFOUND;
    }
    return set_value(s, obj, value, false, err, errlen);
}

/* Apply value (a C string) to the setting named [nb, ne). */
static int apply(const pc_setting_t *tab, size_t n, void *obj, const char *nb, const char *ne,
                 const char *value, char *err, size_t errlen) {
    const pc_setting_t *s = find(tab, n, nb, (size_t)(ne - nb));
    if (!s) {
        set_err(err, errlen, "unknown setting '%.*s'", (int)(ne - nb), nb);
        return PC_ENOTFOUND;
    }
    return set_value(s, obj, value, false, err, errlen);
}

/* Apply "name=value" from [b, e), both trimmed (value copied so set_value sees a C string). */
static int set_span(const pc_setting_t *tab, size_t n, void *obj, const char *b, const char *e,
                    char *err, size_t errlen) {
    const char *eq = memchr(b, '=', (size_t)(e - b));
    if (!eq) {
        set_err(err, errlen, "'%.*s': expected name=value", (int)(e - b), b);
        return PC_EINVAL;
    }
    const char *ne = eq;
    const char *nb = trim(b, &ne);
    const char *ve = e;
    const char *vb = trim(eq + 1, &ve);
    char *buf = malloc((size_t)(ve - vb) + 1); /* as long as the setting takes (a map: 4 KiB) */
    if (!buf) {
        set_err(err, errlen, "out of memory");
        return PC_ENOMEM;
    }
    memcpy(buf, vb, (size_t)(ve - vb));
    buf[ve - vb] = '\0';
    const int rc = apply(tab, n, obj, nb, ne, buf, err, errlen);
    free(buf);
    return rc;
}

int pc_settings_parse_list(const pc_setting_t *tab, size_t n, void *obj, const char *list,
                           char *err, size_t errlen) {
    const char *p = list ? list : "";
    while (*p) {
        const char *e = strchr(p, ',');
        if (!e)
            e = p + strlen(p);
        const char *te = e;
        const char *tb = trim(p, &te);
        if (tb < te) {
            int rc = set_span(tab, n, obj, tb, te, err, errlen);
            if (rc)
                return rc;
        }
        p = *e ? e + 1 : e;
    }
    return 0;
}

int pc_settings_parse_args(const pc_setting_t *tab, size_t n, void *obj, int argc, char **argv,
                           int *argi, char *err, size_t errlen) {
    while (*argi < argc) {
        const char *a = argv[*argi];
        if (strcmp(a, "--") == 0) {
            (*argi)++;
            return 0;
        }
        if (strncmp(a, "--", 2) != 0)
            return 0;
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const pc_setting_t *s = find(tab, n, name, len);
        if (!s && !eq && (strncmp(name, "no-", 3) == 0 || strncmp(name, "no_", 3) == 0)) {
            const pc_setting_t *b = find(tab, n, name + 3, len - 3);
            if (b && b->type == PC_SET_BOOL) {
                *(bool *)((char *)obj + b->offset) = false;
                (*argi)++;
                continue;
            }
        }
        if (!s)
            return 0; /* not ours: the caller decides */
        const char *value;
        if (eq) {
            value = eq + 1;
        } else if (s->type == PC_SET_BOOL) {
            value = "true";
        } else if (*argi + 1 < argc && strncmp(argv[*argi + 1], "--", 2) != 0) {
            value = argv[++*argi];
        } else {
            char nbuf[96];
            set_err(err, errlen, "%s needs a value", shown(s, true, nbuf, sizeof nbuf));
            return PC_EINVAL;
        }
        int rc = set_value(s, obj, value, true, err, errlen);
        if (rc)
            return rc;
        (*argi)++;
    }
    return 0;
}

#define LINE_MAX_BYTES (64u << 10)

/* The next line of f into buf (cap bytes; its newline dropped): its length, -1 at the end, -2 for
 * a line longer than cap - 1 bytes or holding a NUL byte, read no further (getline read a whole
 * line of any length into memory before it could be refused). */
static long read_line(FILE *f, char *buf, size_t cap) {
    size_t len = 0;
    int ch;
    while ((ch = getc(f)) != EOF && ch != '\n') {
        if (ch == '\0' || len + 1 >= cap)
            return -2;
        buf[len++] = (char)ch;
    }
    buf[len] = '\0';
    return ch == EOF && len == 0 ? -1 : (long)len;
}

/* A quoted value: from q (just past the opening '"') to the closing quote, unescaped in place
 * (\\" \\\\ \\n \\t \\r); *end gets the byte after the closing quote. Returns the value, or NULL
 * for a missing closing quote or an unknown escape (message in err). */
static char *unquote(char *q, char **end, char *err, size_t errlen) {
    char *w = q;
    for (char *r = q; *r; r++) {
        if (*r == '"') {
            *w = '\0';
            *end = r + 1;
            return q;
        }
        if (*r == '\\') {
            const char *from = "\"\\ntr", *to = "\"\\\n\t\r";
            const char *x = r[1] ? strchr(from, r[1]) : NULL;
            if (!x) {
                set_err(err, errlen, "unknown escape '\\%.1s' in a quoted value", r + 1);
                return NULL;
            }
            *w++ = to[x - from];
            r++;
            continue;
        }
        *w++ = *r;
    }
    set_err(err, errlen, "a quoted value without its closing '\"'");
    return NULL;
}

/* One config file line (modified in place): blank, a comment, or "name = value". A value is
 * bare (blanks around dropped; a '#' after a blank starts a comment) or quoted ("...": taken
 * whole, blanks and '#' included, with the escapes of unquote; only a comment may follow). */
static int file_line(const pc_setting_t *tab, size_t n, void *obj, char *line, char *err,
                     size_t errlen) {
    const char *e = line + strlen(line);
    const char *b = trim(line, &e);
    if (b == e || *b == '#')
        return 0;
    char *eq = strchr(line, '=');
    if (!eq) {
        set_err(err, errlen, "'%.*s': expected name=value", (int)(e - b), b);
        return PC_EINVAL;
    }
    const char *ne = eq;
    const char *nb = trim(b, &ne);
    char *v = eq + 1;
    while (isspace((unsigned char)*v))
        v++;
    if (*v == '"') {
        char *after;
        const char *value = unquote(v + 1, &after, err, errlen);
        if (!value)
            return PC_EINVAL;
        while (isspace((unsigned char)*after))
            after++;
        if (*after && *after != '#') {
            set_err(err, errlen, "'%s' after a quoted value", after);
            return PC_EINVAL;
        }
        return apply(tab, n, obj, nb, ne, value, err, errlen);
    }
    if (*v == '#' && v > eq + 1) { /* "token = #s3cret": not an empty value, silently */
        set_err(err, errlen, "a value cannot begin with '#' (a comment there; quote it)");
        return PC_EINVAL;
    }
    for (char *hash = v; (hash = strchr(hash, '#')); hash++) /* a comment after a blank */
        if (hash[-1] == ' ' || hash[-1] == '\t') {
            *hash = '\0';
            break;
        }
    const char *ve = v + strlen(v);
    const char *vb = trim(v, &ve);
    *(char *)ve = '\0';
    return apply(tab, n, obj, nb, ne, vb, err, errlen);
}

int pc_settings_load_file(const pc_setting_t *tab, size_t n, void *obj, const char *path, char *err,
                          size_t errlen) {
    FILE *f = fopen(path, "r");
    if (!f) {
        set_err(err, errlen, "%s: %s", path, strerror(errno));
        return PC_EIO;
    }
    char *line = malloc(LINE_MAX_BYTES + 1); /* a value (a map: 4 KiB) up to LINE_MAX_BYTES */
    int lineno = 0, rc = line ? 0 : PC_ENOMEM;
    if (!line)
        set_err(err, errlen, "%s: out of memory", path);
    for (long got; !rc && (got = read_line(f, line, LINE_MAX_BYTES + 1)) != -1;) {
        lineno++;
        if (got == -2) {
            set_err(err, errlen, "%s:%d: line too long, or a NUL byte in it", path, lineno);
            rc = PC_EINVAL;
            break;
        }
        char msg[512] = "";
        rc = file_line(tab, n, obj, line, msg, sizeof msg);
        if (rc) {
            set_err(err, errlen, "%s:%d: %s", path, lineno, msg);
            break;
        }
    }
    if (!rc && ferror(f)) {
        set_err(err, errlen, "%s: read error", path);
        rc = PC_EIO;
    }
    free(line);
    fclose(f);
    return rc;
}

int pc_settings_load_env(const pc_setting_t *tab, size_t n, void *obj, const char *prefix,
                         char *err, size_t errlen) {
    for (size_t i = 0; i < n; i++) {
        char var[256];
        int len = snprintf(var, sizeof var, "%s%s", prefix, tab[i].name);
        if (len < 0 || len >= (int)sizeof var) {
            set_err(err, errlen, "environment name for %s is too long", tab[i].name);
            return PC_EINVAL;
        }
        for (int j = 0; j < len; j++)
            var[j] = (char)toupper((unsigned char)var[j]);
        const char *v = getenv(var);
        if (!v)
            continue;
        char msg[400] = "";
        int rc = set_value(&tab[i], obj, v, false, msg, sizeof msg);
        if (rc) {
            set_err(err, errlen, "environment %s: %s", var, msg);
            return rc;
        }
    }
    return 0;
}

void pc_settings_format(const pc_setting_t *s, const void *obj, char *buf, size_t cap) {
    const char *field = (const char *)obj + s->offset;
    switch (s->type) {
        case PC_SET_BOOL:
            snprintf(buf, cap, "%s", *(const bool *)field ? "true" : "false");
            break;
        case PC_SET_INT:
            snprintf(buf, cap, "%lld", (long long)*(const int64_t *)field);
            break;
        case PC_SET_DOUBLE:
            snprintf(buf, cap, "%.17g", *(const double *)field);
            break;
        case PC_SET_ENUM: {
            int v = *(const int *)field, nch = 0;
            while (s->choices[nch])
                nch++;
            snprintf(buf, cap, "%s", v >= 0 && v < nch ? s->choices[v] : "?");
            break;
        }
        case PC_SET_STRING:
            snprintf(buf, cap, "%s", field);
            break;
    }
}

/* One line per setting: "--ckpt-dir=<str>" (flags) or "init_scale=<num>" (spec lists), then
 * the help, the default and the bounds or choices. */
static void help_lines(const pc_setting_t *tab, size_t n, bool flags, FILE *out) {
    static const char *types[] = {"bool", "int", "num", "enum", "str"};
    for (size_t i = 0; i < n; i++) {
        const pc_setting_t *s = &tab[i];
        char left[96], nbuf[80];
        snprintf(left, sizeof left, "%s=<%s>", shown(s, flags, nbuf, sizeof nbuf), types[s->type]);
        fprintf(out, "  %-32s %s (default: %s", left, s->help, s->def[0] ? s->def : "\"\"");
        if (s->type == PC_SET_INT || s->type == PC_SET_DOUBLE)
            fprintf(out, "; %g..%g", s->min, s->max);
        if (s->type == PC_SET_ENUM) {
            fprintf(out, "; one of");
            for (int j = 0; s->choices[j]; j++)
                fprintf(out, "%s%s", j ? "|" : " ", s->choices[j]);
        }
        fprintf(out, ")\n");
    }
}

void pc_settings_help(const pc_setting_t *tab, size_t n, FILE *out) {
    help_lines(tab, n, true, out);
    fprintf(out,
            "  (a name takes '-' or '_' alike: --ckpt-dir is --ckpt_dir; --no-NAME turns a bool "
            "off)\n");
}

void pc_settings_help_list(const pc_setting_t *tab, size_t n, FILE *out) {
    help_lines(tab, n, false, out);
}

/* Whether a string reads back differently bare in a config file: blanks at its ends, a '"' or
 * '#' first, a '#' after a blank, a control character (a line's end). */
static bool needs_quotes(const char *v) {
    const size_t len = strlen(v);
    if (len && (isspace((unsigned char)v[0]) || isspace((unsigned char)v[len - 1]) || v[0] == '"' ||
                v[0] == '#'))
        return true;
    for (size_t i = 0; i < len; i++)
        if (iscntrl((unsigned char)v[i]) || (v[i] == '#' && (v[i - 1] == ' ' || v[i - 1] == '\t')))
            return true;
    return false;
}

/* "name = "value"" with the escapes file_line reads back. */
static void print_quoted(FILE *out, const char *name, const char *v) {
    fprintf(out, "%s = \"", name);
    for (; *v; v++) {
        const char *esc = *v == '"'    ? "\\\""
                          : *v == '\\' ? "\\\\"
                          : *v == '\n' ? "\\n"
                          : *v == '\t' ? "\\t"
                          : *v == '\r' ? "\\r"
                                       : NULL;
        if (esc)
            fputs(esc, out);
        else
            fputc(*v, out);
    }
    fputs("\"\n", out);
}

void pc_settings_dump(const pc_setting_t *tab, size_t n, const void *obj, FILE *out) {
    for (size_t i = 0; i < n; i++) { /* a string whole, however long (a cluster map) */
        const size_t cap = tab[i].type == PC_SET_STRING ? tab[i].size + 1 : 128;
        char *buf = malloc(cap);
        if (!buf)
            return;
        pc_settings_format(&tab[i], obj, buf, cap);
        if (tab[i].secret && buf[0]) /* (printed configurations end up in logs) */
            fprintf(out, "# %s = (set, not shown)\n", tab[i].name);
        else if (tab[i].type == PC_SET_STRING && needs_quotes(buf))
            print_quoted(out, tab[i].name, buf);
        else
            fprintf(out, "%s = %s\n", tab[i].name, buf);
        free(buf);
    }
}

int pc_settings_cli(const pc_setting_t *tab, size_t n, void *obj, int argc, char **argv,
                    const char *prog, const char *usage) {
    char err[256], prefix[64];
    if (pc_settings_defaults(tab, n, obj))
        return 2;
    size_t pl = 0; /* "ps-worker" -> "PS_WORKER_" */
    for (; prog[pl] && pl < sizeof prefix - 2; pl++)
        prefix[pl] = prog[pl] == '-' ? '_' : (char)toupper((unsigned char)prog[pl]);
    prefix[pl++] = '_';
    prefix[pl] = '\0';
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            printf("usage: %s\n\n", usage);
            pc_settings_help(tab, n, stdout);
            printf("  (each setting also comes from the environment as %sNAME, e.g. %s%s; a flag "
                   "overrides it)\n",
                   prefix, prefix, "TOKEN");
            return 1;
        }
    if (pc_settings_load_env(tab, n, obj, prefix, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 2;
    }
    int argi = 1;
    if (pc_settings_parse_args(tab, n, obj, argc, argv, &argi, err, sizeof err)) {
        fprintf(stderr, "%s: %s\n", prog, err);
        return 2;
    }
    if (argi < argc) {
        fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", prog, argv[argi]);
        return 2;
    }
    return 0;
}

pc_setting_t *pc_settings_join(const pc_setting_t *nested, size_t nn, size_t nested_at,
                               const pc_setting_t *own, size_t no, size_t *n) {
    pc_setting_t *t = malloc((nn + no) * sizeof *t);
    if (!t)
        return NULL;
    for (size_t i = 0; i < nn; i++) {
        t[i] = nested[i];
        t[i].offset += nested_at;
    }
    if (no)
        memcpy(t + nn, own, no * sizeof *own);
    *n = nn + no;
    return t;
}

/* ==== comparing lists ======================================================================= */

/* A "name=value" item of a list, trimmed: name[0..nl), value[0..vl) (vl 0 without '='). */
typedef struct item {
    const char *name, *value;
    size_t nl, vl;
} item_t;

/* Split the item at *l and advance *l past it and its comma; false at the end of the list. */
static bool next_item(const char **l, item_t *it) {
    const char *p = *l;
    if (!p || !*p)
        return false;
    const size_t il = strcspn(p, ","), kl = strcspn(p, "=");
    const char *end = p + il, *eq = kl < il ? p + kl : end;
    it->name = p;
    while (it->name < eq && isspace((unsigned char)*it->name))
        it->name++;
    it->nl = (size_t)(eq - it->name);
    while (it->nl && isspace((unsigned char)it->name[it->nl - 1]))
        it->nl--;
    it->value = eq < end ? eq + 1 : end;
    while (it->value < end && isspace((unsigned char)*it->value))
        it->value++;
    it->vl = (size_t)(end - it->value);
    while (it->vl && isspace((unsigned char)it->value[it->vl - 1]))
        it->vl--;
    *l = end + (*end == ',');
    return true;
}

/* Names equal with '-' = '_'. */
static bool names_equal(const item_t *a, const item_t *b) {
    bool same = a->nl == b->nl;
    for (size_t i = 0; same && i < a->nl; i++)
        same = (a->name[i] == '-' ? '_' : a->name[i]) == (b->name[i] == '-' ? '_' : b->name[i]);
    return same;
}

/* Values compare as the parsers read them: integers exactly, with their suffixes (4Mi =
 * 4194304); other numbers as numbers (0.05 = 5e-2); booleans in any spelling (yes = true = 1);
 * anything else as text, case aside (a choice is read in any case). */
static bool values_equal(const item_t *a, const item_t *b) {
    char x[128], y[128];
    if (a->vl >= sizeof x || b->vl >= sizeof y)
        return a->vl == b->vl && memcmp(a->value, b->value, a->vl) == 0;
    memcpy(x, a->value, a->vl), x[a->vl] = '\0';
    memcpy(y, b->value, b->vl), y[b->vl] = '\0';
    int64_t ix, iy;
    if (!parse_int(x, &ix) && !parse_int(y, &iy))
        return ix == iy;
    char *ex, *ey;
    double dx = strtod(x, &ex), dy = strtod(y, &ey);
    if (a->vl && b->vl && !*ex && !*ey)
        return dx == dy || fabs(dx - dy) <= 1e-9 * fmax(fabs(dx), fabs(dy));
    bool bx, by;
    if (!parse_bool(x, &bx) && !parse_bool(y, &by))
        return bx == by;
    return strcasecmp(x, y) == 0;
}

int pc_settings_list_diff(const char *want, const char *have, char *diff, size_t cap) {
    int bad = 0;
    size_t used = 0;
    if (diff && cap)
        diff[0] = '\0';
    item_t w, h;
    for (const char *wl = want; next_item(&wl, &w);) {
        if (!w.nl)
            continue;
        bool found = false;
        for (const char *hl = have; !found && next_item(&hl, &h);)
            found = names_equal(&w, &h);
        if (found && values_equal(&w, &h))
            continue;
        bad++;
        if (diff && used < cap) {
            int m = snprintf(diff + used, cap - used, "%s%.*s=%.*s (have: %.*s)",
                             bad > 1 ? "; " : "", (int)w.nl, w.name, (int)w.vl, w.value,
                             found ? (int)h.vl : 6, found ? h.value : "absent");
            used += m > 0 ? (size_t)m : 0;
        }
    }
    return bad;
}
