/* pc_settings.h: the settings table pattern.
 *
 * A program (or a module, such as a table's configuration) declares each of its settings once,
 * in a table of pc_setting_t: name, type, bounds, default, help and where the value lives in a
 * plain C struct. The same table then feeds every way a value can arrive and every way it is
 * shown:
 *   defaults       pc_settings_defaults
 *   flags          pc_settings_parse_args   --name=value, --name value, --flag, --no-flag
 *   "a=1,b=2"      pc_settings_parse_list   (table specs, psctl arguments)
 *   config file    pc_settings_load_file    "name = value" lines, comments from a '#' at a
 *                                           line's start or after a blank; name = "..." quoted
 *   environment    pc_settings_load_env     PREFIX_NAME=value
 *   --help         pc_settings_help (flags: --ckpt-dir), pc_settings_help_list (lists)
 *   effective      pc_settings_dump         (same syntax as the config file: round-trips,
 *                                           except secrets: "name = (set)" or empty)
 *
 * Value syntax: bool true/false/1/0/yes/no/on/off; int in decimal with optional decimal (k, M, G)
 * or binary (Ki, Mi, Gi) suffix; double as strtod; enum by choice name; string up to its buffer
 * size - 1 (in spec lists a string cannot hold ','; in files a bare value ends at a '#' after a
 * blank, and "name = #..." is refused rather than read as an empty value; a value in double
 * quotes is taken whole, blanks and '#' included, with the escapes \" \\ \n \t \r, and only a
 * comment may follow it). Blanks around a value do not count, except a string's from a flag, the
 * environment, pc_settings_set or quotes: taken as given (bare file values and spec lists are
 * trimmed); the dump quotes a string that would not read back bare. A
 * config file's line is at most 64 KiB (a longer one, or a NUL byte, is an error at that line,
 * read no further).
 * Every value is checked against the bounds before it is stored; on error nothing is stored and
 * `err` (may be NULL) receives one line naming the setting (as the flag, "--ckpt-dir", when it
 * came from one), the value and the rule (an enum's lists the choices).
 *
 * Storage types: BOOL -> bool, INT -> int64_t, DOUBLE -> double, ENUM -> int, STRING -> char[].
 * Thread rule: functions touch only the table (read) and the target struct (caller-owned).
 */
#ifndef PC_SETTINGS_H
#define PC_SETTINGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    PC_SET_BOOL,
    PC_SET_INT,
    PC_SET_DOUBLE,
    PC_SET_ENUM,
    PC_SET_STRING,
} pc_setting_type_t;

typedef struct pc_setting {
    const char *name;           /* snake_case; flags accept '-' for '_' */
    pc_setting_type_t type;     /* storage type, see above */
    size_t offset;              /* offsetof(struct, field) */
    size_t size;                /* sizeof(field) */
    double min, max;            /* INT/DOUBLE inclusive bounds */
    const char *def;            /* default, in value syntax */
    const char *const *choices; /* ENUM: NULL-terminated names, stored as their index */
    const char *help;           /* one line */
    bool secret;                /* STRING: a token; pc_settings_dump does not print its value */
} pc_setting_t;

#define PC_SETTING_BOOL(T, field, def, help)                                                     \
    {                                                                                            \
#field, PC_SET_BOOL, offsetof(T, field), sizeof(((T *)0)->field), 0, 1, def, NULL, help, \
            false                                                                                \
    }
#define PC_SETTING_INT(T, field, lo, hi, def, help)                                               \
    {                                                                                             \
#field, PC_SET_INT, offsetof(T, field), sizeof(((T *)0)->field), lo, hi, def, NULL, help, \
            false                                                                                 \
    }
#define PC_SETTING_DOUBLE(T, field, lo, hi, def, help)                                         \
    {                                                                                          \
#field, PC_SET_DOUBLE, offsetof(T, field), sizeof(((T *)0)->field), lo, hi, def, NULL, \
            help, false                                                                        \
    }
#define PC_SETTING_ENUM(T, field, choices, def, help)                                         \
    {                                                                                         \
#field, PC_SET_ENUM, offsetof(T, field), sizeof(((T *)0)->field), 0, 0, def, choices, \
            help, false                                                                       \
    }
#define PC_SETTING_STRING(T, field, def, help)                                                     \
    {                                                                                              \
#field, PC_SET_STRING, offsetof(T, field), sizeof(((T *)0)->field), 0, 0, def, NULL, help, \
            false                                                                                  \
    }
#define PC_SETTING_SECRET(T, field, help)                                                         \
    {                                                                                             \
#field, PC_SET_STRING, offsetof(T, field), sizeof(((T *)0)->field), 0, 0, "", NULL, help, \
            true                                                                                  \
    }

/* Store every default. Returns 0, or PC_EINVAL if a default violates its own rule (a bug). */
int pc_settings_defaults(const pc_setting_t *tab, size_t n, void *obj);

/* Set one setting by name from text. PC_ENOTFOUND for an unknown name, PC_EINVAL for a bad
 * value. */
int pc_settings_set(const pc_setting_t *tab, size_t n, void *obj, const char *name,
                    const char *value, char *err, size_t errlen);

/* Parse "name=value,name=value" (whitespace around items ignored; empty list is fine). */
int pc_settings_parse_list(const pc_setting_t *tab, size_t n, void *obj, const char *list,
                           char *err, size_t errlen);

/* Parse options from argv[*argi] on, stopping at the first argument that is not an option, at
 * "--" (skipped) or at an option not in the table (left for the caller). *argi is advanced past
 * what was consumed. */
int pc_settings_parse_args(const pc_setting_t *tab, size_t n, void *obj, int argc, char **argv,
                           int *argi, char *err, size_t errlen);

/* Read "name = value" lines (value bare or "quoted"); '#' starts a comment; unknown names are
 * errors (with file:line). */
int pc_settings_load_file(const pc_setting_t *tab, size_t n, void *obj, const char *path, char *err,
                          size_t errlen);

/* For each setting, apply the environment variable PREFIX + NAME (upper case) when set. */
int pc_settings_load_env(const pc_setting_t *tab, size_t n, void *obj, const char *prefix,
                         char *err, size_t errlen);

/* Format one setting's current value into buf (always NUL-terminated). */
void pc_settings_format(const pc_setting_t *s, const void *obj, char *buf, size_t cap);

/* One line per setting: --name=<type> help (default; bounds or choices), names with '-' for
 * '_' (--ckpt-dir, the form the docs use), then a line saying both forms work. */
void pc_settings_help(const pc_setting_t *tab, size_t n, FILE *out);

/* The same lines for a "name=value,..." list (table specs): name=<type> as the list spells it. */
void pc_settings_help_list(const pc_setting_t *tab, size_t n, FILE *out);

/* The usual command line of a tool: store the defaults, apply the environment (PROG_NAME: prog
 * upper-cased, '-' as '_', e.g. PS_WORKER_TOKEN: secrets stay out of the process list), answer
 * --help/-h (usage line, then pc_settings_help), parse every argument as a flag (flags override
 * the environment). Returns 0 to go on, 1 when help was printed
 * (exit 0), 2 on a bad or unexpected argument (the message is printed on stderr as
 * "prog: ..."; exit 2). */
int pc_settings_cli(const pc_setting_t *tab, size_t n, void *obj, int argc, char **argv,
                    const char *prog, const char *usage);

/* A program's table made of a module's table nested in the program's struct (at byte offset
 * `nested_at`, e.g. offsetof(cfg_t, train)) followed by the program's own entries: malloc'ed
 * (free it), *n entries; NULL when out of memory. */
pc_setting_t *pc_settings_join(const pc_setting_t *nested, size_t nn, size_t nested_at,
                               const pc_setting_t *own, size_t no, size_t *n);

/* Compare two "name=value,..." lists without their table (a worker checking a server's table
 * against the settings it was given): every item of `want` must be in `have` with an equal
 * value (numbers compare as numbers: 0.05 = 5e-2; '-' and '_' in names are the same). Returns
 * how many differ (or are missing from `have`); diff (may be NULL) gets them as
 * "name=want (have: value)", "; "-separated. */
int pc_settings_list_diff(const char *want, const char *have, char *diff, size_t cap);

/* "name = value" per setting, in table order. */
void pc_settings_dump(const pc_setting_t *tab, size_t n, const void *obj, FILE *out);

#endif
