/* ps_catalog.h: the named tables of one server process.
 *
 * A catalog owns tables by name. Request handlers acquire a table for the duration of a call and
 * release it afterwards; dropping a table removes its name at once (new acquires fail with
 * PC_ENOTFOUND, the name can be reused) and destroys it when the last holder releases it.
 *
 * Thread rule: thread-safe, except ps_catalog_destroy (no table may still be acquired).
 */
#ifndef PS_CATALOG_H
#define PS_CATALOG_H

#include <stdbool.h>
#include <stddef.h>

#include "ps_table.h"

typedef struct ps_catalog ps_catalog_t;

int ps_catalog_create(ps_catalog_t **out);
/* Destroys every table. No table may be acquired any more. NULL is a no-op. */
void ps_catalog_destroy(ps_catalog_t *c);

/* Create a table from cfg under cfg->name. PC_EEXIST if the name is taken, PC_EINVAL for a bad
 * config, PC_ENOMEM. */
int ps_catalog_add(ps_catalog_t *c, const ps_table_config_t *cfg);

/* Add an existing table under its configured name, taking ownership (also on failure: the
 * table is destroyed then). PC_EEXIST if the name is taken. */
int ps_catalog_put(ps_catalog_t *c, ps_table_t *t);

/* Acquire the table `name`: *out stays valid until ps_catalog_release. PC_ENOTFOUND. */
int ps_catalog_acquire(ps_catalog_t *c, const char *name, ps_table_t **out);
void ps_catalog_release(ps_catalog_t *c, ps_table_t *t);

/* Hooks that follow tables in and out of the catalog (the server's cold tier uses them):
 * attach runs before a table becomes visible (keep: it is being restored, so state held for it
 * elsewhere is kept rather than wiped) and may refuse it; detach runs before a table is
 * destroyed. Without hooks, tables with config cold=true are refused (PC_EINVAL). */
typedef struct ps_catalog_hooks {
    int (*attach)(void *ctx, ps_table_t *t, bool keep);
    void (*detach)(void *ctx, ps_table_t *t);
    void *ctx;
} ps_catalog_hooks_t;

/* Install hooks (copied) before the catalog holds tables. */
void ps_catalog_set_hooks(ps_catalog_t *c, const ps_catalog_hooks_t *h);

/* Run the attach hook on a table that is not in the catalog yet, so rows can be loaded into it
 * before ps_catalog_put (restore, import). ps_catalog_put on an attached table does not attach
 * it again. */
int ps_catalog_attach(ps_catalog_t *c, ps_table_t *t, bool keep);

/* Destroy a table that never entered the catalog (runs the detach hook). NULL is a no-op. */
void ps_catalog_discard(ps_catalog_t *c, ps_table_t *t);

/* Remove `name`; the table is destroyed once no one holds it. PC_ENOTFOUND. */
int ps_catalog_drop(ps_catalog_t *c, const char *name);

/* Copy up to `cap` names (sorted) into names; returns how many tables there are. */
size_t ps_catalog_list(ps_catalog_t *c, char (*names)[PS_TABLE_NAME_MAX], size_t cap);

#endif
