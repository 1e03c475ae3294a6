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
#include <stdint.h>

#include "ps_table.h"

typedef struct ps_catalog ps_catalog_t;

/* Live tables a catalog holds at most (a checkpoint and replication carry every one of them). */
#define PS_CATALOG_TABLES_MAX 256

int ps_catalog_create(ps_catalog_t **out);
/* Destroys every table. No table may be acquired any more. NULL is a no-op. */
void ps_catalog_destroy(ps_catalog_t *c);

/* A table spec as a server takes it from a user ("name=ads,dim=64,optimizer=adam": ps-server
 * --tables, gRPC CreateTable, psctl create; keys: ps-server --help-tables): the defaults, then
 * the spec, which must name the table. On failure *cfg is unchanged, PC_EINVAL, and err (may be
 * NULL) gets one line that quotes the spec ("table spec 'dim=8': name= is required"). In-process
 * tables (ps_table_config_parse) keep the default name. */
int ps_catalog_spec_parse(const char *spec, ps_table_config_t *cfg, char *err, size_t errlen);

/* Create a table from cfg under cfg->name. PC_EEXIST if the name is taken, PC_EINVAL for a bad
 * config, PC_ETOOBIG with PS_CATALOG_TABLES_MAX tables already, PC_ENOMEM. */
int ps_catalog_add(ps_catalog_t *c, const ps_table_config_t *cfg);

/* Add an existing table under its configured name, taking ownership (also on failure: the
 * table is destroyed then). PC_EEXIST if the name is taken, PC_ETOOBIG as ps_catalog_add. */
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

/* Change logs (ps_changelog.h; the delta stream) are started by their first follower, not
 * kept by every table: a table nobody follows costs its writers one load per call.
 * ps_catalog_set_changelog sets the capacity (`entries` keys, 8 bytes each) of the logs started
 * from then on; 0 (the default): none is started. ps_catalog_changelog_start gives table t's
 * log (t acquired from c), starting one of that capacity when it has none (*started, may be
 * NULL: this call started it, so it holds no change made before now); PC_EUNSUPPORTED when t
 * has none and the capacity is 0, PC_ENOMEM. Both thread-safe. */
void ps_catalog_set_changelog(ps_catalog_t *c, size_t entries);
int ps_catalog_changelog_start(ps_catalog_t *c, ps_table_t *t, ps_changelog_t **out, bool *started);

/* Run the attach hook on a table that is not in the catalog yet, so rows can be loaded into it
 * before ps_catalog_put (restore, import). ps_catalog_put on an attached table does not attach
 * it again. */
int ps_catalog_attach(ps_catalog_t *c, ps_table_t *t, bool keep);

/* Destroy a table that never entered the catalog (runs the detach hook). NULL is a no-op. */
void ps_catalog_discard(ps_catalog_t *c, ps_table_t *t);

/* Put `t` in place of the table of the same name in one step: an acquire sees the old table or
 * the new one, never none (a replica swapping in a table it filled aside). Takes ownership of t
 * (destroyed on failure); the old table is destroyed once its last holder releases it.
 * PC_ENOTFOUND when no table has t's name (t is not added then), PC_ENOMEM. */
int ps_catalog_replace(ps_catalog_t *c, ps_table_t *t);

/* ps_catalog_replace when a table has t's name, else ps_catalog_put (a restore installing its
 * tables: a failure leaves the old table in place), past PS_CATALOG_TABLES_MAX too (a checkpoint
 * written before the limit may hold more: all of them come back, and new tables are refused
 * until some are dropped). PC_ENOMEM. */
int ps_catalog_set(ps_catalog_t *c, ps_table_t *t);

/* Room for `more` installs beyond the entries now there (a restore reserves every table's before
 * it installs the first: an allocation failure midway left the catalog partly restored).
 * PC_ENOMEM, nothing changed. */
int ps_catalog_reserve(ps_catalog_t *c, size_t more);

/* Remove `name`; the table is destroyed once no one holds it. PC_ENOTFOUND. */
int ps_catalog_drop(ps_catalog_t *c, const char *name);

/* ---- table lifecycle: which job trains a table ------------------------------------------
 * A job claims a table before it trains it. The table's owner (ps_table_owner; kept in
 * checkpoints) says whose rows it holds. A claim by job J:
 *   - J owns the table already (a restarted worker, another worker of J): continued;
 *   - PS_CLAIM_FRESH: the table is replaced by an empty one of the same settings, owned by J
 *     (reset); with job "" it is left without an owner (psctl reset);
 *   - PS_CLAIM_WARM_START: J takes the table over with its rows (warm-started);
 *   - PS_CLAIM_CHECK: an unowned table that no push has changed becomes J's (new); a table owned
 *     by another job, or changed by pushes of clients that claim nothing, is refused with
 *     PC_EOWNED and a message in err that names the owner and what to do;
 *   - PS_CLAIM_INSPECT: nothing changes (action none); the result describes the table;
 *   - PS_CLAIM_FENCE: J, the owner already (else PC_EOWNED), raises the table's generation fence
 *     to `epoch` (> 0; ps_table_fence): pushes of J's older generations are refused from then on
 *     (action continued); an epoch below the table's fence is refused (PC_EFENCED: a fence of a
 *     left-behind generation, or a job whose generations were counted again from 0). A table
 *     installed over one of the same owner (a live restore) keeps the higher fence of the two.
 * `epoch` is 0 in every other mode.
 * Claims of one catalog are serialized. Cold tables cannot be reset while serving (PC_ESTATE:
 * their rows live in the tier under the table's name; drop and create them). */
typedef enum {
    PS_CLAIM_CHECK,
    PS_CLAIM_WARM_START,
    PS_CLAIM_FRESH,
    PS_CLAIM_INSPECT,
    PS_CLAIM_FENCE
} ps_claim_mode_t;
typedef enum {
    PS_CLAIMED_NEW,
    PS_CLAIMED_CONTINUED,
    PS_CLAIMED_WARM_STARTED,
    PS_CLAIMED_RESET,
    PS_CLAIMED_NONE
} ps_claim_action_t;
typedef struct ps_claim_result {
    ps_claim_action_t action;
    char previous[PS_OWNER_MAX]; /* the owner before the claim ("" none) */
    uint64_t rows, version;      /* of the table before the claim */
} ps_claim_result_t;
/* Claim table `name` for `job` (shorter than PS_OWNER_MAX; "" with PS_CLAIM_FRESH or
 * PS_CLAIM_INSPECT).
 * Errors: PC_ENOTFOUND, PC_EINVAL, PC_EOWNED, PC_ESTATE, PC_ENOMEM; err gets a message. */
int ps_catalog_claim(ps_catalog_t *c, const char *name, const char *job, ps_claim_mode_t mode,
                     uint32_t epoch, ps_claim_result_t *out, char *err, size_t errlen);
/* The name of a claim action ("new", "continued", "warm_started", "reset", "none"). */
const char *ps_claim_action_name(ps_claim_action_t a);

/* How many times a table came or went (put, reset, replace, drop) since the catalog was made: a
 * replica's follower compares it to know that no table it copied into was replaced since. */
uint64_t ps_catalog_changes(ps_catalog_t *c);

/* Copy up to `cap` names (sorted) into names; returns how many tables there are. */
size_t ps_catalog_list(ps_catalog_t *c, char (*names)[PS_TABLE_NAME_MAX], size_t cap);

/* fn(ctx, t) for every table, in name order, each acquired for the call (one dropped meanwhile
 * is skipped), until fn returns nonzero: that value; else 0 (PC_ENOMEM: no list). */
int ps_catalog_each(ps_catalog_t *c, int (*fn)(void *ctx, ps_table_t *t), void *ctx);

#endif
