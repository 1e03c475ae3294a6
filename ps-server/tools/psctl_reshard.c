/* psctl_reshard.c: see psctl_reshard.h. */
#include "psctl_reshard.h"
#include "psctl_exit.h"

#include "pc_cluster.h"
#include "pc_error.h"
#include "pc_hash.h"
#include "pc_time.h"
#include "ps_coord_remote.h"
#include "ps_mapstore.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* `reshard wait` asks again while the coordinator does not answer (g_retrying: such failures
 * are not said, and g_transient tells them from the others: a wrong CA is not asked again). */
static bool g_retrying, g_transient;

/* The newest map (exit code on failure, said on stderr). */
static int newest(const psctl_reshard_opts_t *o, ps_coord_store_t *st, pc_cluster_map_t **m) {
    g_transient = false;
    int rc = ps_mapstore_newest(st, 0, 1, m); /* the hint, else from the first version */
    if (rc) {
        g_transient = rc == PC_EUNAVAIL || rc == PC_ETIMEDOUT;
        if (!g_retrying || !g_transient)
            fprintf(stderr, "psctl: coordinator %s: cluster map: %s\n", o->coordinator,
                    pc_strerror(rc));
        return psctl_exit_of(rc);
    }
    if (!*m) {
        fprintf(stderr,
                "psctl: coordinator %s has no cluster map (servers with --cluster-coordinator "
                "publish it)\n",
                o->coordinator);
        return 1;
    }
    return 0;
}

/* A map's text (malloc'ed; NULL when out of memory). */
static char *map_text(const pc_cluster_map_t *m) {
    const size_t len = pc_cmap_format(m, NULL, 0);
    char *text = malloc(len + 1);
    if (text)
        pc_cmap_format(m, text, len + 1);
    return text;
}

/* The XXH3 of a map's text: which target a list of adds (added_key) belongs to. */
static uint64_t map_hash(const pc_cluster_map_t *m) {
    char *text = map_text(m);
    const uint64_t h = text ? pc_hash64(text, strlen(text), 0) : 0;
    free(text);
    return h;
}

/* Whether target t applies to map m as the servers take it (ps_repl's read_target): it names no
 * server the map has not, each in its place. */
static bool target_fits(const pc_cluster_map_t *m, const pc_cluster_map_t *t) {
    bool fits = pc_cmap_nservers(t) <= pc_cmap_nservers(m);
    for (size_t i = 0; fits && i < pc_cmap_nservers(t); i++)
        fits = strcmp(pc_cmap_addr(t, i), pc_cmap_addr(m, i)) == 0;
    return fits;
}

/* The resharding asked before that the map has not reached (*pending, NULL when none), listing
 * the map's servers: a new plan builds on it, so that it goes on rather than being cancelled.
 * *revision: the stored target's (0: none), for the compare-and-set of the new one. Exit code
 * when the target cannot be read (a pending one taken for none would be cancelled). */
static int pending_target(const psctl_reshard_opts_t *o, ps_coord_store_t *st,
                          const pc_cluster_map_t *m, pc_cluster_map_t **pending, uint64_t *hash,
                          uint64_t *revision) {
    *pending = NULL;
    int rc = ps_mapstore_get_target(st, pending, revision);
    if (rc == PC_ENOTFOUND)
        return 0;
    if (rc) {
        fprintf(stderr, "psctl: coordinator %s: target: %s\n", o->coordinator, pc_strerror(rc));
        return psctl_exit_of(rc);
    }
    *hash = map_hash(*pending);               /* as stored (its list's key names it) */
    if (*revision == PS_MAPSTORE_UNVERSIONED) /* (else every write lost: "kept changing") */
        fprintf(stderr,
                "psctl: coordinator %s is older than key revisions: the target is written over, "
                "not by compare-and-set (another psctl reshard at once may lose its plan)\n",
                o->coordinator);
    if (!target_fits(m, *pending) || pc_cmap_roles_same(m, *pending)) {
        pc_cmap_destroy(*pending); /* one the servers ignore, or done */
        *pending = NULL;
    }
    /* the servers the map lists after it, appended (without a role), each in its place */
    for (size_t i = *pending ? pc_cmap_nservers(*pending) : 0;
         !rc && *pending && i < pc_cmap_nservers(m); i++)
        rc = pc_cmap_add_server(*pending, pc_cmap_addr(m, i), pc_cmap_version(*pending) + 1);
    if (rc) {
        fprintf(stderr, "psctl: target: %s\n", pc_strerror(rc));
        pc_cmap_destroy(*pending);
        *pending = NULL;
        return psctl_exit_of(rc);
    }
    return 0;
}

/* Slots whose roles differ between the map and the target. */
static uint32_t left(const pc_cluster_map_t *m, const pc_cluster_map_t *t) {
    uint32_t n = 0;
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        n += !pc_cmap_slot_same(m, t, s);
    return n;
}

/* Print j (one line) and free it; NULL: nothing (human output was printed). */
static void emit(cJSON *j) {
    if (!j)
        return;
    char *s = cJSON_PrintUnformatted(j);
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(j);
}

static void print_map(const char *what, const pc_cluster_map_t *m, cJSON *o) {
    char *text = map_text(m);
    if (!text)
        return;
    if (o)
        cJSON_AddStringToObject(o, what, text);
    else
        printf("%s: %s\n", what, text);
    free(text);
}

/* The addresses a target adds, one a line, under a key of that target's own (its map_hash, 16
 * hex digits): a `reshard add` run again finds its own there (the slot counts cannot tell it
 * from a server that held slots before). Each list is written whole before its target (a
 * remove's carries the adds of the target it builds on, less the server it removes), so that a
 * target another psctl reads has its list: one key for every target's list held a race (two
 * adds at once, each reading the other's list before its target, kept only the last server of
 * them). A key stays in the store per target written with adds, as map versions do (tens of
 * bytes each). */
#define ADDED_PREFIX PS_COORD_CLUSTER_PREFIX "target-added/"

static void added_key(char *key, size_t cap, uint64_t hash) {
    snprintf(key, cap, ADDED_PREFIX "%016" PRIx64, hash);
}

/* The next line of [*l, e) into *line, *ll bytes (no newline); *l moves past it. false at the
 * end (*l NULL: an empty list). */
static bool next_line(const char **l, const char *e, const char **line, size_t *ll) {
    if (!*l || *l >= e)
        return false;
    const char *nl = memchr(*l, '\n', (size_t)(e - *l));
    *line = *l;
    *ll = (size_t)((nl ? nl : e) - *l);
    *l = nl ? nl + 1 : e;
    return true;
}

static bool line_is(const char *line, size_t ll, const char *s) {
    return s && ll == strlen(s) && memcmp(line, s, ll) == 0;
}

/* Whether addr is a line of the list [p, p + len). */
static bool listed(const void *p, size_t len, const char *addr) {
    const char *l = p, *e = l ? l + len : NULL, *line;
    size_t ll;
    while (next_line(&l, e, &line, &ll))
        if (line_is(line, ll, addr))
            return true;
    return false;
}

/* The adds of the target of map_hash `hash` (*adds, *n bytes, malloc'ed; none when it has no
 * list, or hash is 0: no target). Exit code when the store cannot be read. */
static int adds_of(const psctl_reshard_opts_t *o, ps_coord_store_t *st, uint64_t hash, void **adds,
                   size_t *n) {
    char key[128];
    added_key(key, sizeof key, hash);
    *adds = NULL;
    *n = 0;
    const int rc = hash ? st->get(st->ctx, key, adds, n) : PC_ENOTFOUND;
    if (rc && rc != PC_ENOTFOUND) {
        fprintf(stderr, "psctl: coordinator %s: %s: %s\n", o->coordinator, key, pc_strerror(rc));
        return psctl_exit_of(rc);
    }
    return 0;
}

/* pending_target, with the servers it adds (*adds, *alen bytes, malloc'ed; none without one). */
static int pending_with_adds(const psctl_reshard_opts_t *o, ps_coord_store_t *st,
                             const pc_cluster_map_t *m, pc_cluster_map_t **pending,
                             uint64_t *revision, void **adds, size_t *alen) {
    uint64_t hash = 0;
    *adds = NULL;
    *alen = 0;
    int rc = pending_target(o, st, m, pending, &hash, revision);
    if (!rc && *pending && (rc = adds_of(o, st, hash, adds, alen))) {
        pc_cmap_destroy(*pending);
        *pending = NULL;
    }
    return rc;
}

/* Write the list of target t: the adds of the target it builds on (adds, n bytes) but `drop`,
 * and `add` (either may be NULL). Nothing when the list is empty. */
static int note_adds(ps_coord_store_t *st, const pc_cluster_map_t *t, const char *adds, size_t n,
                     const char *add, const char *drop) {
    char key[128];
    added_key(key, sizeof key, map_hash(t));
    const size_t al = add ? strlen(add) : 0;
    char *v = malloc(n + al + 1);
    if (!v)
        return PC_ENOMEM;
    size_t len = 0, ll;
    for (const char *l = adds, *e = adds ? adds + n : NULL, *line; next_line(&l, e, &line, &ll);)
        if (ll && !line_is(line, ll, drop)) {
            memcpy(v + len, line, ll);
            v[len + ll] = '\n';
            len += ll + 1;
        }
    if (add) {
        memcpy(v + len, add, al);
        v[len + al] = '\n';
        len += al + 1;
    }
    const int rc = len ? st->set(st->ctx, key, v, len, false, 0) : 0;
    free(v);
    return rc;
}

/* What add and remove return when another psctl wrote a target between their read and their
 * write (the compare-and-set lost): nothing said, plan again from that one. */
#define AGAIN (-1000) /* (neither an exit code nor a PC_ code: PC_EINVAL is -1) */

/* add: list the server (its own map version), then the target. */
static int add(const psctl_reshard_opts_t *o, ps_coord_store_t *st, const char *addr) {
    pc_cluster_map_t *m = NULL;
    int rc = 0, idx = -1;
    for (int tries = 0; tries < 10; tries++) {
        pc_cmap_destroy(m);
        m = NULL;
        if ((rc = newest(o, st, &m)))
            return rc;
        if ((idx = pc_cmap_find(m, addr)) >= 0)
            break;
        if (pc_cmap_nservers(m) >= PC_MAX_SERVERS) { /* (not a usage error) */
            fprintf(stderr, "psctl: reshard add %s: the map lists %u servers, the most it can\n",
                    addr, PC_MAX_SERVERS);
            pc_cmap_destroy(m);
            return 1;
        }
        pc_cluster_map_t *next = NULL;
        if ((rc = pc_cmap_copy(m, &next)) ||
            (rc = pc_cmap_add_server(next, addr, pc_cmap_version(m) + 1))) {
            fprintf(stderr, "psctl: reshard add %s: %s\n", addr, pc_strerror(rc));
            pc_cmap_destroy(next);
            pc_cmap_destroy(m);
            return rc == PC_EINVAL ? 2 : 1;
        }
        rc = ps_mapstore_put(st, next);
        if (!rc) { /* listed: plan on the version written (the last try's too) */
            pc_cmap_destroy(m);
            m = next;
            idx = pc_cmap_find(m, addr);
            break;
        }
        pc_cmap_destroy(next);
        if (rc != PC_EEXIST) {
            fprintf(stderr, "psctl: coordinator %s: %s\n", o->coordinator, pc_strerror(rc));
            pc_cmap_destroy(m);
            return psctl_exit_of(rc);
        }
        pc_time_sleep_ms(10 * (uint32_t)(tries + 1)); /* another writer's version: read it */
    }
    if (idx < 0) {
        fprintf(stderr, "psctl: reshard add %s: the map kept changing\n", addr);
        pc_cmap_destroy(m);
        return 1;
    }
    /* from the resharding asked before, when there is one */
    pc_cluster_map_t *t = NULL, *base = NULL;
    uint64_t rev = 0;
    void *adds = NULL; /* the servers the pending target adds */
    size_t alen = 0;
    if ((rc = pending_with_adds(o, st, m, &base, &rev, &adds, &alen))) {
        pc_cmap_destroy(m);
        return rc;
    }
    if (base && listed(adds, alen, addr) && pc_cmap_has_role(base, (uint32_t)idx)) {
        t = base; /* asked already (this command run again, the move begun): said again */
        base = NULL;
    } else {
        rc = pc_cmap_plan_add(base ? base : m, (uint32_t)idx, &t);
        if (rc == PC_EINVAL)
            fprintf(stderr, "psctl: reshard add %s: it has a role in the map already\n", addr);
        else if (rc)
            fprintf(stderr, "psctl: reshard add %s: %s\n", addr, pc_strerror(rc));
        else if (!(rc = note_adds(st, t, adds, alen, addr, NULL)) &&
                 (rc = ps_mapstore_put_target(st, t, rev)) == PC_EEXIST)
            rc = AGAIN; /* another psctl wrote one since: plan again */
        else if (rc)
            fprintf(stderr, "psctl: coordinator %s: %s\n", o->coordinator, pc_strerror(rc));
    }
    free(adds);
    pc_cmap_destroy(base);
    if (!rc) {
        cJSON *j = o->json ? cJSON_CreateObject() : NULL;
        const uint32_t slots = pc_cmap_server_slots(t, (uint32_t)idx);
        if (j) {
            cJSON_AddNumberToObject(j, "server", idx);
            cJSON_AddNumberToObject(j, "slots", slots);
            psctl_json_u64(j, "map_version", pc_cmap_version(m));
        } else {
            printf("%s is server %d; the target gives it %u slots. Start it with the map below "
                   "and --cluster-coordinator; `psctl reshard wait` returns when the slots "
                   "moved.\n",
                   addr, idx, slots);
        }
        print_map("map", m, j);
        print_map("target", t, j);
        emit(j);
    }
    pc_cmap_destroy(m);
    pc_cmap_destroy(t);
    return rc == AGAIN ? AGAIN : rc ? (rc == PC_EINVAL ? 1 : psctl_exit_of(rc)) : 0;
}

/* remove: the target without the server's roles, from the target asked before if any. */
static int remove_server(const psctl_reshard_opts_t *o, ps_coord_store_t *st, const char *addr) {
    pc_cluster_map_t *m = NULL, *base = NULL, *t = NULL;
    int rc = newest(o, st, &m);
    if (rc)
        return rc;
    const int idx = pc_cmap_find(m, addr);
    if (idx < 0) {
        fprintf(stderr, "psctl: reshard remove %s: not in the cluster map\n", addr);
        pc_cmap_destroy(m);
        return 1;
    }
    uint64_t rev = 0;
    void *adds = NULL; /* the pending target's adds: still added by this one, but this server */
    size_t alen = 0;
    if ((rc = pending_with_adds(o, st, m, &base, &rev, &adds, &alen))) {
        pc_cmap_destroy(m);
        return rc;
    }
    rc = pc_cmap_plan_remove(base ? base : m, (uint32_t)idx, &t);
    if (rc == PC_EINVAL)
        fprintf(stderr, "psctl: reshard remove %s: it is the only server with slots\n", addr);
    else if (!rc && !(rc = note_adds(st, t, adds, alen, NULL, addr)) &&
             (rc = ps_mapstore_put_target(st, t, rev)) == PC_EEXIST)
        rc = AGAIN;
    else if (rc)
        fprintf(stderr, "psctl: coordinator %s: %s\n", o->coordinator, pc_strerror(rc));
    if (!rc) {
        cJSON *j = o->json ? cJSON_CreateObject() : NULL;
        if (j)
            cJSON_AddNumberToObject(j, "server", idx);
        else
            printf("%s (server %d) will hold no slots; stop it once `psctl reshard wait` "
                   "returns.\n",
                   addr, idx);
        print_map("target", t, j);
        emit(j);
    }
    free(adds);
    pc_cmap_destroy(m);
    pc_cmap_destroy(base);
    pc_cmap_destroy(t);
    return rc == AGAIN ? AGAIN : rc ? (rc == PC_EINVAL ? 1 : psctl_exit_of(rc)) : 0;
}

/* status, and wait: *slots_left (0 with no target). */
static int status(const psctl_reshard_opts_t *o, ps_coord_store_t *st, bool print,
                  uint32_t *slots_left) {
    pc_cluster_map_t *m = NULL, *t = NULL;
    int rc = newest(o, st, &m);
    if (rc)
        return rc;
    int trc = ps_mapstore_get_target(st, &t, NULL);
    if (trc && trc != PC_ENOTFOUND) {
        g_transient = trc == PC_EUNAVAIL || trc == PC_ETIMEDOUT;
        if (!g_retrying || !g_transient)
            fprintf(stderr, "psctl: coordinator %s: target: %s\n", o->coordinator,
                    pc_strerror(trc));
        pc_cmap_destroy(m);
        return psctl_exit_of(trc);
    }
    const bool fits = t && target_fits(m, t);
    *slots_left = fits ? left(m, t) : t ? PC_NSLOTS : 0; /* a target not comparable: not done */
    if (print && o->json) {
        cJSON *j = cJSON_CreateObject();
        psctl_json_u64(j, "map_version", pc_cmap_version(m));
        cJSON_AddBoolToObject(j, "target", t != NULL);
        cJSON_AddNumberToObject(j, "slots_left", *slots_left);
        cJSON_AddBoolToObject(j, "done", *slots_left == 0);
        emit(j);
    } else if (print) {
        printf("map version %llu; %s\n", (unsigned long long)pc_cmap_version(m),
               !t            ? "no resharding asked"
               : !fits       ? "the target names servers the map has not"
               : *slots_left ? "slots still moving"
                             : "the map is the target");
        if (*slots_left)
            printf("%u slots differ from the target\n", *slots_left);
    }
    pc_cmap_destroy(m);
    pc_cmap_destroy(t);
    return 0;
}

int psctl_reshard(const psctl_reshard_opts_t *o, int nargs, char **args) {
    const bool two = nargs == 2 && (!strcmp(args[0], "add") || !strcmp(args[0], "remove"));
    const bool one = (nargs == 1 && !strcmp(args[0], "status")) ||
                     ((nargs == 1 || nargs == 2) && !strcmp(args[0], "wait"));
    char *end = NULL;
    const double limit = nargs == 2 && !two ? strtod(args[1], &end) : 120;
    if ((!two && !one) || (end && (end == args[1] || *end || !(limit >= 0 && limit <= 1e7)))) {
        fprintf(stderr, "psctl: reshard add ADDR | remove ADDR | status | wait [SECONDS]\n");
        return 2;
    }
    ps_coord_store_t st;
    int rc = ps_coord_store_open(o->coordinator, o->sec, o->timeout_ms, &st);
    if (rc) {
        fprintf(stderr, "psctl: coordinator %s: %s\n", o->coordinator, pc_strerror(rc));
        return 2;
    }
    uint32_t slots = 0;
    if (!strcmp(args[0], "add") || !strcmp(args[0], "remove")) {
        /* another psctl's target written between this one's read and write: plan again on it */
        const bool adding = !strcmp(args[0], "add");
        for (int tries = 0;
             (rc = adding ? add(o, &st, args[1]) : remove_server(o, &st, args[1])) == AGAIN;) {
            if (++tries == 20) {
                fprintf(stderr,
                        "psctl: reshard %s %s: the target kept changing (other psctl "
                        "runs): try again\n",
                        args[0], args[1]);
                rc = 1;
                break;
            }
            pc_time_sleep_ms(10 * (uint32_t)tries);
        }
    } else if (!strcmp(args[0], "status")) {
        rc = status(o, &st, true, &slots);
    } else {
        /* a coordinator that does not answer for a moment is asked again until then */
        const uint64_t t0 = pc_time_mono_ns();
        g_retrying = true;
        while (((rc = status(o, &st, false, &slots)) && g_transient) || (!rc && slots)) {
            if (pc_time_sec_since(t0) >= limit)
                break;
            pc_time_sleep_ms(rc ? 200 : 20);
        }
        g_retrying = false;
        int src;
        if (!rc || g_transient) /* (the last answer said now, whatever it is) */
            rc = (src = status(o, &st, true, &slots)) ? src : slots ? 1 : 0;
    }
    st.destroy(st.ctx);
    return rc;
}
