/* ps_repl.c: replicas and failover (see ps_repl.h; docs/server.md "Replicas and failover").
 *
 * DESIGN
 * - Map versions are keys `cluster/map/<20-digit version>`, and every change writes the version
 *   after the newest one, set-if-absent: losing that race is normal, the loser reads the
 *   winner's map and acts on it. So versions are consecutive from the first one published, and
 *   the newest is found from any known version by asking for the next ones until one is absent
 *   (one small read a tick, never a listing of every version). `cluster/map-newest` is a hint
 *   (a version, written after each win, read first) so that a server starting with an old map
 *   does not walk the whole history.
 * - A server is "lost" when its alive key is absent and either this server saw it alive before
 *   or lease_ms x 3 have passed since this server started (a peer still starting is not lost),
 *   or (primaries only) when the follower found that the primary's table was replaced by
 *   another run of the primary while this server's copy of it held rows: a primary restarted
 *   before its lease ran out, with empty or checkpointed tables older than the copy. The copy
 *   wins: it is the one every acknowledged push reached. A table's uid names the run that made
 *   it (ps_table_uid_same_run): one replaced while the primary ran (a reset, as a job's fresh
 *   claim makes on every server, a live restore, a drop and create) is the operator's or the
 *   job's will, and the backup copies it like any new table, erasing what the primary no longer
 *   holds. When this server's own table is replaced (the same causes here), the rows it backs
 *   up are copied again into the new one (`local_uid`).
 * - Leases: the renewal is sent at t0; on success the data plane takes pushes until
 *   t0 + 3/4 lease_ms. The coordinator cannot expire the key before the previous renewal's
 *   send + lease_ms, so only a renewal that failed or came back later than that marks the lease
 *   lapsed; then pushes stay refused until this server wins a map version (the newest, unchanged,
 *   as the next version) in which it is still a primary. A backup promoting itself writes that
 *   same next version, so of a stale primary and its successor exactly one wins. At start the
 *   lease counts as lapsed.
 * - The follower keeps one libpsclient connection per primary (to that server only) and a
 *   source per (primary, table) with the table's uid and the position applied. A source copies
 *   the table when it starts, when the primary answers PC_ERANGE (fell behind its ring), when
 *   the map gives this server more slots of that primary, and on PC_ESTATE (a replaced table)
 *   when its copy is empty. A copy never goes backwards: it loads every part over what is there
 *   and erases afterwards only the keys of those slots the primary did not send, so a copy
 *   interrupted by the primary's death still holds everything it held before. A copy asks only
 *   for the slots this server backs up (PC_STREAM_BACKUP) and takes one part a round (copy_t),
 *   so that the other primaries' DELTAS, whose acknowledgements their sync pushes wait for, go
 *   on between its parts. Each part is asked under the follower's current map version (the
 *   primary refuses another one); a copy goes on across versions that leave this server the
 *   same slots of that primary, and starts over when they change. A copy for slots gained while
 *   following the log (`following`) does not stop the DELTAS of that table: its pushes go on
 *   being acknowledged (a handover to this server, which holds that primary's pushes until it
 *   acknowledges, does not wait on the copy), the keys they bring count as sent (not erased at
 *   the copy's end), and the position afterwards is the further of the two. Rows are applied
 *   under the map's mutex and only while the map is the one the round started with: a reply
 *   from a primary this server has just replaced is dropped (a version that changes no role, a
 *   lease confirmed or marks cleared, does not stop a round: `roles`). Caught up, the follower
 *   asks again after 200 us doubling to 2 ms (a sync push waits for the backup's next DELTAS); a
 *   primary that does not answer is retried after 100 ms doubling to 2 s; a table it answers it
 *   has not (made here first, or dropped there) is skipped while its others go on, and holds
 *   no acknowledged push to wait for (absent_there). A cold table's
 *   copy walks the primary's cold store after its parts of RAM rows (PC_STREAM_COLD: pages in
 *   key order), and this server's own keys of it include its cold store's (seen_cold: noted
 *   OWN_ROUND_KEYS a round before the first part, for the erasures at the copy's end; a
 *   release walks REL_TICK_KEYS of them a controller tick, and erases for an eighth of a lease
 *   at most, taking up where it stood: only past keys erased).
 * - Hand-back without a copy: a server handing slots to a new primary becomes its backup of them
 *   and holds exactly the rows the new primary holds (it acknowledged this server's log through
 *   the cut, and this server takes no push of them after it). Before holding pushes the
 *   handover notes each table's place in the new primary's change log (a bounds query: uid and
 *   head; a backup starts its own tables' logs when it first copies, so one exists): the new
 *   primary takes pushes and pulls of those slots only after it adopts the handover's version,
 *   and its loads of this server's stream are unlogged and end there, so every change to them
 *   is after that place. Tables that evict (TTL, capacity: the new primary may drop rows of
 *   them on its own before that) get no place. When the follower then finds it gained only
 *   those slots of that primary, and no copy was owed from before (`gain_only`), it follows
 *   the log from there instead of copying the table (handback_use). A place the log no longer
 *   holds (PC_ERANGE) falls back to a copy; another uid (PC_ESTATE: the new primary restarted
 *   with another table) is a replaced table with rows held here: this server takes over.
 * - In sync: a backup added to a running primary is marked catching up in the map (`~`,
 *   pc_cluster.h), and so is every backup of a slot whose primary changed (a failover, a
 *   handover: pc_cmap_fail_server, pc_cmap_take_slot), the old primary of a handover included. Its
 * follower knows when it holds every acknowledged push of a primary: each table copied, then a
 * DELTAS reply that reached the head (`reached`), and then the reply to a DELTAS that said so
 * (PC_STREAM_CAUGHT) reaching the head too (`caught`): that request made the primary's pushes wait
 * for this backup, so a push acknowledged earlier is before the head of its reply. Pushes do not
 * wait for a backup still working through the changes made during its copy (a copy under training
 * would stall every push until then). The follower then notes the map version it did so under
 * (caught_ver) and the controller clears its own mark on that primary's slots in the next version,
 * if that is still the map. A failover promotes a backup in sync first; one catching up only when
 * no other is left (counted in emberps_replication_unclean_promoted_slots_total).
 * - Falling behind again: a backup in sync that must copy a primary's table again (its own table
 *   replaced, the primary's replaced within its run, rows erased by a release, the log overrun)
 *   may lack pushes that primary acknowledged. The follower counts it (falls, fell_behind) and
 *   the controller marks this server catching up on that primary's slots in the next version
 *   (note_behind; cleared again as above), unless the follower caught up first; a fall counts
 *   as noted only once that version is this server's map, so that no look in between (a
 *   failover, emberps_replication_behind_primaries at a scrape) takes it for in sync. A follower
 *   waiting on a primary that does not answer cannot see its own table replaced: when this
 *   server writes the failover of a primary, it marks itself first also when a table here came
 *   or went since the follower last caught up with that primary (caught_gen against
 *   ps_catalog_changes), so the promotion counts as unclean rather than silently clean.
 */
#include "ps_repl.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_hist.h"
#include "pc_log.h"
#include "pc_time.h"
#include "ps_mapstore.h"
#include "ps_table.h"
#include "psclient_repl.h"

#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ALIVE_PREFIX PS_COORD_CLUSTER_PREFIX "alive/"
#define CALL_ROWS    16384u      /* rows one DELTAS or scan part brings at most */
#define CALL_BYTES   (32u << 20) /* and bytes of rows (a wide row with state: fewer rows) */
#define SCAN_PARTS   16u         /* a copy's first split; doubled while a part is larger */
/* keys a release erases under the map's mutex at a time: the follower's loads (acknowledgements
 * that sync pushes wait for) go on between them */
#define RELEASE_KEYS 4096u
/* a copy of a cold table notes this many keys of this server's own cold store a round at most,
 * and a release walks this many of a cold table's a tick (the controller renews the lease) */
#define OWN_ROUND_KEYS 65536u
#define REL_TICK_KEYS  65536u
#define HANDBACK_NS    500000000ull /* a handover's bounds queries stop after this (see DESIGN) */
#define MAX_TABLES     ((unsigned)PS_CATALOG_TABLES_MAX) /* every table of a catalog */
#define TABLES_NS      1000000000ull /* the catalog is listed again this often (new tables) */
#define LAG_MAX        (2 * MAX_TABLES * PC_MAX_BACKUPS) /* (table, backup) pairs a handover sees */

/* The keys this server held of the slots a copy brings, sorted, and which the copy sent; or, with
 * p PC_NO_SERVER, the keys of slots it has no role in (release_rows). */
typedef struct seen {
    const pc_cluster_map_t *m;
    uint32_t me, p;
    uint64_t *keys;
    uint8_t *got;
    size_t n, cap;
    bool failed;
} seen_t;

/* A copy under way (see DESIGN: one part a round): the parts loaded so far of the slots
 * `slots` (bits: those this server backs up of the primary), the table's uid from its first
 * part. */
typedef struct copy {
    bool on;
    bool owning; /* still noting this server's own cold keys, from own_start on */
    uint64_t own_start;
    uint32_t part;  /* == the source's parts: walking the primary's cold store, from `start` */
    uint64_t start; /* (the next cold page's first key) */
    uint64_t uid;
    uint64_t *slots;
    seen_t x;
} copy_t;

typedef struct source {
    char table[PS_TABLE_NAME_MAX];
    uint64_t uid, pos;
    bool need_copy;
    bool following;     /* pos is this server's place in the primary's log (a copy done since the
                         * table's uid or the ring's end last changed) */
    bool gain_only;     /* primaries_sync: its copy is owed only for the slots gained just now */
    bool reached;       /* a DELTAS reply since the last copy reached the primary's head */
    bool caught;        /* and since then one to a request saying so (PC_STREAM_CAUGHT) */
    uint32_t parts;     /* the split its last copy needed */
    uint64_t local_uid; /* this server's table its last copy went into (0: none yet) */
    bool absent_there;  /* the primary answered it has no such table (made here first, or dropped
                         * there): skipped, and no acknowledged push of it can be missing here */
    bool resync;        /* the primary's table was replaced while this one followed it: its copy's
                         * first part tells a replacement in the same run (fell_behind) from a
                         * takeover (another run's table: this copy holds every push) */
    int failing;        /* this table's own error in the last round (said once while it lasts) */
    copy_t cp;
} source_t;

typedef struct primary {
    uint32_t server;
    psc_t *c;
    uint64_t retry_ns, backoff_ms; /* down: when to connect again */
    source_t src[MAX_TABLES];
    size_t nsrc;
} primary_t;

struct ps_repl {
    ps_coord_store_t store;
    ps_catalog_t *cat;
    ps_dp_t *dp;
    ps_repl_opts_t o;
    char token[256], ca[512], cert[512], key[512];
    char self_addr[PC_ADDR_MAX];
    pthread_t ctl, fol;
    atomic_bool stop;
    uint64_t start_ns;
    pthread_mutex_t mu;    /* map; held by the follower while it applies rows */
    pc_cluster_map_t *map; /* adopted */
    /* controller thread only (and start, before the threads) */
    bool lapsed;
    /* the run record (ps_repl.h "A restarted only holder"; controller, and start) */
    bool record_read;   /* the last run's record is read (prev, went_back) */
    bool recorded;      /* this run's `running` is written: until then no confirm */
    bool record_warned; /* reading or writing it failed, and the log said so */
    bool went_back;     /* started with older rows: its slots held alone still to count */
    bool alone_known;   /* alone[] is set (from the map at start, else at the first confirm) */
    char prev[64];      /* the record found at start */
    uint64_t alone[PC_NSLOTS / 64]; /* slots held alone then */
    uint64_t tried_ver,
        tried_unclean;    /* a count written unanswered: its version, the map's count */
    uint32_t tried_alone; /* and the slots it added */
    uint64_t hinted;      /* the last ps_dp_newer_map acted on */
    uint64_t lease_until, last_sent;
    bool *seen;           /* per server index: its alive key was seen */
    atomic_bool *suspect; /* per server index: the follower saw its table replaced under a copy */
    /* per primary index: the times the follower began to copy a table of it again (see DESIGN
     * "In sync"), and how many of them the controller has dealt with (marked this server
     * catching up in the map it adopted, or found it caught up): behind while they differ */
    atomic_uint_least64_t *falls, *falls_noted;
    atomic_uint_least64_t version, promotions, drops, rejoins, rows_copied, rows_streamed;
    atomic_uint_least64_t map_unclean; /* the current map's count (pc_cmap_unclean) */
    atomic_uint_least64_t roles;       /* the first version with the current map's roles (a version
                                        * that only confirms a lease or clears marks keeps it) */
    atomic_uint_least64_t lapses, copies, handovers, released, unclean, synced, fell_behind;
    atomic_uint_least64_t restart_unclean; /* slots this server came back to as only holder */
    atomic_uint_least64_t *caught_ver;     /* per primary index: the map version the follower held
                                            * all its rows under (0: not caught up) */
    atomic_uint_least64_t *caught_gen;     /* and ps_catalog_changes before that round (0: never
                                            * caught up): a table replaced here since, unseen by
                                            * a follower stuck on a silent primary, shows */
    pc_cluster_map_t *target; /* controller: the resharding target (fits the map), or NULL */
    uint64_t handover_wait_ns, handover_said_ns; /* controller: since when a handover waits */
    uint32_t handover_to;
    ps_dp_lag_t lag_cut[LAG_MAX], lag_now[LAG_MAX]; /* controller: a handover's heads, acks */
    pc_cluster_map_t *released_map; /* controller: the map the role-less rows were erased under */
    /* controller: the release under way, under map version rel_ver: the tables it released
     * (done) and, for a cold table, where its walk of the cold store stands (REL_TICK_KEYS a
     * tick) */
    struct rel_walk {
        char table[PS_TABLE_NAME_MAX];
        uint64_t start; /* the cold store's next key to walk (0: from the first) */
        bool ram_done;  /* its RAM rows erased */
        bool done;
    } rel[MAX_TABLES];
    size_t nrel;
    uint64_t rel_ver;
    uint64_t gone[PC_NSLOTS / 64]; /* slots a release erased since the follower looked (mu) */
    bool gone_any;
    /* a handover's places in the new primary's logs (see DESIGN; mu): valid from map version
     * hb_ver (0: none), for the slots hb_slots handed to server hb_to */
    struct handback {
        char table[PS_TABLE_NAME_MAX];
        uint64_t uid, pos;
    } hb[MAX_TABLES];
    size_t nhb;
    uint32_t hb_to;
    uint64_t hb_ver, hb_slots[PC_NSLOTS / 64];
    atomic_uint_least64_t adopted_ns; /* when the current map was adopted */
    /* follower thread only */
    primary_t *prim;
    size_t nprim;
    uint64_t tables_ns;
};

/* A copy of the current map, when its version is not `have` (NULL otherwise or on ENOMEM). */
static pc_cluster_map_t *map_if_new(ps_repl_t *r, uint64_t have) {
    if (atomic_load(&r->version) == have)
        return NULL;
    pc_cluster_map_t *m = NULL;
    pthread_mutex_lock(&r->mu);
    if (r->map)
        pc_cmap_copy(r->map, &m);
    pthread_mutex_unlock(&r->mu);
    return m;
}

/* ==== the map in the coordinator =========================================================== */

/* Adopt m (taken) as the current map when newer. 0, or the data plane's error (not adopted: the
 * version is read again at the next refresh). */
static int adopt(ps_repl_t *r, pc_cluster_map_t *m) {
    pthread_mutex_lock(&r->mu);
    if (r->map && pc_cmap_version(m) <= pc_cmap_version(r->map)) {
        pthread_mutex_unlock(&r->mu);
        pc_cmap_destroy(m);
        return 0;
    }
    if (pc_cmap_nservers(m) <= r->o.self || strcmp(pc_cmap_addr(m, r->o.self), r->self_addr) != 0) {
        pthread_mutex_unlock(&r->mu);
        PC_ERROR("replication: map version %" PRIu64 " does not have this server (%s) as server "
                 "%u: not adopted",
                 pc_cmap_version(m), r->self_addr, r->o.self);
        pc_cmap_destroy(m);
        return 0;
    }
    /* backups new since r->map join (not the first); the data plane's map first: adopted
     * without it, a promoted server refused pushes for its new slots (PC_EWRONGSLOT), and a
     * handed-over one took them, until another version came (this one is read again) */
    const int rc = ps_dp_set_map_from(r->dp, m, r->map);
    if (rc) {
        pthread_mutex_unlock(&r->mu);
        PC_ERROR("replication: map version %" PRIu64 " not adopted: %s", pc_cmap_version(m),
                 pc_strerror(rc));
        pc_cmap_destroy(m);
        return rc;
    }
    if (!r->map || !pc_cmap_roles_same(m, r->map))
        atomic_store(&r->roles, pc_cmap_version(m));
    pc_cmap_destroy(r->map);
    r->map = m;
    atomic_store(&r->version, pc_cmap_version(m));
    atomic_store(&r->map_unclean, pc_cmap_unclean(m));
    atomic_store(&r->adopted_ns, pc_time_mono_ns());
    pthread_mutex_unlock(&r->mu);
    char text[512];
    pc_cmap_format(m, text, sizeof text);
    PC_INFO("replication: map version %" PRIu64 ": %s%s", pc_cmap_version(m), text,
            pc_cmap_format(m, NULL, 0) >= sizeof text ? "..." : "");
    return 0;
}

/* The current map's version (0: none yet). */
static uint64_t current(ps_repl_t *r) {
    return atomic_load(&r->version);
}

/* Whether the current map has the roles of map m (an adopted one): no role changed since m. */
static bool same_roles_as(ps_repl_t *r, const pc_cluster_map_t *m) {
    return atomic_load(&r->roles) <= pc_cmap_version(m);
}

/* Read the newest map from the current one on and adopt it; 0 or the store's error. */
static int refresh(ps_repl_t *r) {
    pc_cluster_map_t *m;
    int rc = ps_mapstore_newest(&r->store, current(r), 0, &m);
    if (!rc && m)
        rc = adopt(r, m);
    return rc;
}

/* Write `next` (derived from the current map, with the next version) and adopt it when won;
 * PC_EEXIST when another server wrote that version first (its map is adopted instead); adopt's
 * error when the version is written but not adopted here (read again at the next refresh: the
 * caller takes the change for not done yet). */
static int change_map(ps_repl_t *r, pc_cluster_map_t *next, const char *what) {
    int rc = ps_mapstore_put(&r->store, next);
    if (rc == 0) {
        PC_INFO("replication: wrote map version %" PRIu64 " (%s)", pc_cmap_version(next), what);
        return adopt(r, next);
    }
    pc_cmap_destroy(next);
    refresh(r);
    return rc;
}

/* A copy of the current map, to derive the next version from (NULL on ENOMEM). */
static pc_cluster_map_t *map_copy(ps_repl_t *r) {
    pc_cluster_map_t *m = NULL;
    pthread_mutex_lock(&r->mu);
    pc_cmap_copy(r->map, &m);
    pthread_mutex_unlock(&r->mu);
    return m;
}

/* ==== the controller ======================================================================= */

/* Whether server s's alive key is there (*known false: the coordinator did not answer). */
static bool alive(ps_repl_t *r, const pc_cluster_map_t *m, uint32_t s, bool *known) {
    char key[PC_ADDR_MAX + 32];
    snprintf(key, sizeof key, ALIVE_PREFIX "%s", pc_cmap_addr(m, s));
    void *v = NULL;
    size_t len = 0;
    int rc = r->store.get(r->store.ctx, key, &v, &len);
    free(v);
    *known = rc == 0 || rc == PC_ENOTFOUND;
    if (rc == 0)
        r->seen[s] = true;
    return rc == 0;
}

/* Whether server s's lease is in the coordinator, asked once per look: up[s] keeps the answer
 * (1 yes, -1 no, 0 not asked yet). A server not running (yet) is never made a backup: it would
 * be dropped for its lease and added again, a map version every tick. *known (may be NULL) is
 * cleared when the coordinator did not answer (then it counts as not up). */
static bool lease_up(ps_repl_t *r, const pc_cluster_map_t *m, int8_t *up, uint32_t s, bool *known) {
    if (!up[s]) {
        bool k;
        up[s] = alive(r, m, s, &k) ? 1 : -1;
        if (known && !k)
            *known = false;
    }
    return up[s] > 0;
}

/* Whether server s is lost (see DESIGN); false when the coordinator did not answer. */
static bool lost(ps_repl_t *r, const pc_cluster_map_t *m, uint32_t s, bool primary) {
    if (primary && atomic_load(&r->suspect[s]))
        return true;
    bool known;
    if (alive(r, m, s, &known) || !known)
        return false;
    return r->seen[s] || pc_time_mono_ns() - r->start_ns > 3ull * r->o.lease_ms * 1000000ull;
}

static void renew(ps_repl_t *r) {
    char key[PC_ADDR_MAX + 32];
    snprintf(key, sizeof key, ALIVE_PREFIX "%s", r->self_addr);
    const uint64_t t0 = pc_time_mono_ns(), lease_ns = r->o.lease_ms * 1000000ull;
    const int rc = r->store.set(r->store.ctx, key, "1", 1, false, r->o.lease_ms);
    /* the coordinator may have expired the key from the last renewal's send + lease on */
    const bool expired = !r->last_sent || pc_time_mono_ns() >= r->last_sent + lease_ns;
    if (!rc)
        r->last_sent = t0;
    if (expired) {
        if (!r->lapsed) {
            atomic_fetch_add(&r->lapses, 1);
            PC_WARN("replication: this server's lease lapsed (%s): no pushes until it is "
                    "confirmed in a new map version",
                    rc ? pc_strerror(rc) : "renewed too late");
        }
        r->lapsed = true;
        ps_dp_set_write_until(r->dp, 0);
    }
    if (!rc) {
        r->lease_until = t0 + lease_ns / 4 * 3;
        if (!r->lapsed)
            ps_dp_set_write_until(r->dp, r->lease_until);
    }
}

/* alone[]: the slots of map m this server is primary of that no live backup in sync holds;
 * false when the coordinator did not answer. */
static bool find_alone(ps_repl_t *r, const pc_cluster_map_t *m) {
    int8_t up[PC_MAX_SERVERS] = {0};
    bool known = true;
    memset(r->alone, 0, sizeof r->alone);
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        uint32_t b[PC_MAX_BACKUPS];
        if (pc_cmap_slot_owner(m, s) != r->o.self)
            continue;
        const uint32_t nb = pc_cmap_slot_backups(m, s, b);
        bool held = false;
        for (uint32_t j = 0; j < nb && !held; j++)
            held = !pc_cmap_backup_syncing(m, s, b[j]) && lease_up(r, m, up, b[j], &known);
        if (!held)
            r->alone[s / 64] |= 1ull << (s % 64);
    }
    return known;
}

/* The map counts the slots this server came back to as their only holder with older rows. */
static void counted(ps_repl_t *r, uint32_t alone) {
    r->went_back = false;
    atomic_fetch_add(&r->restart_unclean, alone);
    PC_ERROR("replication: this server restarted with older rows than its last run ended with "
             "(it started from checkpoint %llu; its last run's record: %s) and is the only "
             "holder of %u slots: pushes acknowledged after that checkpoint are lost; the map "
             "counts the slots as unclean",
             (unsigned long long)r->o.restored, r->prev, alone);
}

/* How many slots of map m the version confirming this server should count as gone back (see
 * ps_repl.h): those it held alone after its start and is still primary of, unless m is a job
 * without replicas (workers roll back there) or an earlier count's write, unanswered, landed
 * after all (its version holds exactly that count). *known false: ask again. */
static uint32_t to_count(ps_repl_t *r, const pc_cluster_map_t *m, bool *known) {
    *known = true;
    if (r->went_back && r->tried_ver) {
        pc_cluster_map_t *t = NULL;
        const int rc = ps_mapstore_get(&r->store, r->tried_ver, &t);
        const bool landed = !rc && pc_cmap_unclean(t) == r->tried_unclean;
        pc_cmap_destroy(t);
        if (rc && rc != PC_ENOTFOUND) {
            *known = false;
            return 0;
        }
        r->tried_ver = 0;
        if (landed)
            counted(r, r->tried_alone);
    }
    if (!r->went_back || pc_cmap_unreplicated(m)) {
        r->went_back = false;
        return 0;
    }
    if (!r->alone_known && !(r->alone_known = find_alone(r, m))) {
        *known = false;
        return 0;
    }
    uint32_t n = 0;
    for (uint32_t s = 0; s < PC_NSLOTS; s++)
        n += (r->alone[s / 64] >> (s % 64) & 1) && pc_cmap_slot_owner(m, s) == r->o.self;
    return n;
}

/* After a lapse: win the next map version unchanged while still a primary in it. Restarted with
 * older rows (went_back), the slots it holds alone go into that version's unclean count. Not
 * before this run's record is written: a crash must be seen by the next start. */
static void confirm(ps_repl_t *r) {
    if (!r->recorded || pc_time_mono_ns() >= r->lease_until || refresh(r))
        return; /* no record yet, the lease is not held now, or no answer */
    pc_cluster_map_t *m = map_copy(r);
    if (!m || pc_cmap_bump(m, pc_cmap_version(m) + 1)) {
        pc_cmap_destroy(m);
        return;
    }
    if (!pc_cmap_server_slots(m, r->o.self)) { /* no primary of anything: nothing to fence */
        pc_cmap_destroy(m);
        r->lapsed = false;
        r->went_back = false;
        ps_dp_set_write_until(r->dp, r->lease_until);
        return;
    }
    bool known;
    const uint32_t alone = to_count(r, m, &known);
    if (!known) {
        pc_cmap_destroy(m);
        return;
    }
    pc_cmap_unclean_add(m, alone);
    const uint64_t ver = pc_cmap_version(m), unclean = pc_cmap_unclean(m);
    const int rc = change_map(r, m, "this server confirmed as primary (its lease was not held)");
    if (rc == 0) {
        r->lapsed = false;
        ps_dp_set_write_until(r->dp, r->lease_until);
        if (alone)
            counted(r, alone);
        r->went_back = false;
    } else if (alone && rc != PC_EEXIST) { /* no answer: the write may have landed */
        r->tried_ver = ver;
        r->tried_unclean = unclean;
        r->tried_alone = alone;
    }
}

/* Whether this server may lack pushes primary p acknowledged although the map may still have it
 * in sync: its follower never caught up with p in this run (a backup restarted within its lease,
 * still named in sync), a table here was replaced (or made) since it last did, which a follower
 * waiting on p's answer has not seen yet (ps_catalog_changes), or it copies a table of p again
 * (falls not yet marked in the map) and has not caught up since. */
static bool behind_now(ps_repl_t *r, uint32_t p) {
    const uint64_t gen = atomic_load(&r->caught_gen[p]);
    if (!gen || gen != ps_catalog_changes(r->cat))
        return true; /* (0: never caught up with p in this run) */
    return atomic_load(&r->falls[p]) != atomic_load(&r->falls_noted[p]) &&
           atomic_load(&r->caught_ver[p]) != current(r);
}

/* One look at the other servers: promote over a lost primary, drop a lost backup, join again. */
static void watch(ps_repl_t *r) {
    pc_cluster_map_t *m = map_if_new(r, 0);
    if (!m)
        return;
    const uint32_t n = (uint32_t)pc_cmap_nservers(m), me = r->o.self;
    bool prim_of_me[PC_MAX_SERVERS] = {false}, bk_of_me[PC_MAX_SERVERS] = {false};
    bool role = false;
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        uint32_t b[PC_MAX_BACKUPS];
        const uint32_t owner = pc_cmap_slot_owner(m, s), nb = pc_cmap_slot_backups(m, s, b);
        if (owner == me) {
            role = true;
            for (uint32_t j = 0; j < nb; j++)
                bk_of_me[b[j]] = true;
        } else if (pc_cmap_is_backup(m, s, me)) {
            role = true;
            prim_of_me[owner] = true;
        }
    }
    /* A suspicion holds only while this server backs the suspect up: another server's failover
     * of it, or any other change of roles, ends it (else, once this server backed it up again,
     * its follower would skip it for good and the next look fail over a healthy primary). */
    for (uint32_t s = 0; s < PC_MAX_SERVERS; s++)
        if (!prim_of_me[s] && atomic_load_explicit(&r->suspect[s], memory_order_relaxed))
            atomic_store(&r->suspect[s], false);
    for (uint32_t s = 0; s < n; s++) {
        if (s == me || !(prim_of_me[s] || bk_of_me[s]) || !lost(r, m, s, prim_of_me[s]))
            continue;
        pc_cluster_map_t *next = map_copy(r);
        pc_cmap_failover_t f;
        if (next && prim_of_me[s] && behind_now(r, s)) /* perhaps not marked yet: note_behind */
            pc_cmap_set_syncing(next, s, me, true);
        if (!next || pc_cmap_version(next) != pc_cmap_version(m) ||
            pc_cmap_fail_server(next, s, pc_cmap_version(m) + 1, &f)) {
            pc_cmap_destroy(next); /* the map moved meanwhile: look again next tick */
            break;
        }
        char what[256];
        snprintf(what, sizeof what,
                 "%s %s: %u slots to their backups (%u still catching up), %u slots with none "
                 "left, and it backs up nothing",
                 pc_cmap_addr(m, s),
                 atomic_load(&r->suspect[s]) ? "came back without its rows" : "lost its lease",
                 f.promoted, f.unclean, f.orphaned);
        if (change_map(r, next, what) == 0) {
            atomic_store(&r->suspect[s], false);
            atomic_fetch_add(prim_of_me[s] ? &r->promotions : &r->drops, 1);
            atomic_fetch_add(&r->unclean, f.unclean);
            if (f.unclean)
                PC_ERROR("replication: %u slots of %s went to a backup that had not caught up "
                         "(no backup in sync was left): rows it had not copied are back at their "
                         "initial values",
                         f.unclean, pc_cmap_addr(m, s));
            if (f.orphaned)
                PC_ERROR("replication: %u slots of %s had no backup: their rows are lost",
                         f.orphaned, pc_cmap_addr(m, s));
        }
        break; /* one change per tick: the map moved */
    }
    uint32_t added = 0; /* not when a resharding target leaves this server out */
    const bool wanted = !r->target || pc_cmap_has_role(r->target, me);
    pc_cluster_map_t *next = !role && wanted && r->o.replicas && n > 1 ? map_copy(r) : NULL;
    if (next &&
        pc_cmap_add_backup(next, me, r->o.replicas, pc_cmap_version(next) + 1, &added) == 0 &&
        added) { /* restarted after being replaced: back up again */
        char what[96];
        snprintf(what, sizeof what, "this server joins again as a backup of %u slots", added);
        if (change_map(r, next, what) == 0)
            atomic_fetch_add(&r->rejoins, 1);
    } else {
        pc_cmap_destroy(next);
    }
    pc_cmap_destroy(m);
}

/* The follower copies a table of primary p again (falls[p] moved): this server's rows of p's
 * slots may lack pushes p acknowledged, so mark it catching up on them in the next version (a
 * failover before it caught up again counts them unclean, or takes a backup in sync). Not when
 * the map already marks them all, nor when the follower caught up again under the current map.
 * The falls count as noted only once the marked map is adopted (or none was needed), so that
 * behind_now and the gauge never miss one in between; a fall after the look is noted at the
 * next tick (fell_behind zeroes caught_ver before it counts, so the look below cannot see an
 * older catch-up as this one). One change a tick. */
static void note_behind(ps_repl_t *r) {
    bool any = false;
    for (uint32_t p = 0; p < PC_MAX_SERVERS && !any; p++)
        any = atomic_load(&r->falls[p]) != atomic_load(&r->falls_noted[p]);
    pc_cluster_map_t *m = any ? map_copy(r) : NULL;
    const uint32_t me = r->o.self, n = m ? (uint32_t)pc_cmap_nservers(m) : 0;
    for (uint32_t p = 0; p < n; p++) {
        const uint64_t falls = atomic_load(&r->falls[p]);
        if (falls == atomic_load(&r->falls_noted[p]))
            continue;
        const uint32_t marked = atomic_load(&r->caught_ver[p]) == pc_cmap_version(m)
                                    ? 0
                                    : pc_cmap_set_syncing(m, p, me, true);
        if (!marked) {
            atomic_store(&r->falls_noted[p], falls);
            continue;
        }
        char what[PC_ADDR_MAX + 96];
        snprintf(what, sizeof what, "this server copies %s's rows again: catching up on %u slots",
                 pc_cmap_addr(m, p), marked);
        int rc = pc_cmap_bump(m, pc_cmap_version(m) + 1);
        if (!rc) {
            rc = change_map(r, m, what);
            m = NULL; /* change_map took it */
        }
        if (!rc)
            atomic_store(&r->falls_noted[p], falls); /* else again next tick */
        break;
    }
    pc_cmap_destroy(m);
}

/* A backup caught up with a primary (the follower's caught_ver is the current map): clear this
 * server's marks on that primary's slots in the next version. One change a tick. */
static void note_synced(ps_repl_t *r) {
    bool any = false; /* a primary caught up with under the current map: else no map copy */
    for (uint32_t p = 0; p < PC_MAX_SERVERS && !any; p++)
        any = atomic_load(&r->caught_ver[p]) == current(r);
    pc_cluster_map_t *m = any ? map_if_new(r, 0) : NULL;
    const uint32_t me = r->o.self, n = m ? (uint32_t)pc_cmap_nservers(m) : 0;
    bool marked[PC_MAX_SERVERS] = {false};
    for (uint32_t s = 0; s < PC_NSLOTS && m; s++)
        if (pc_cmap_backup_syncing(m, s, me))
            marked[pc_cmap_slot_owner(m, s)] = true;
    for (uint32_t p = 0; p < n; p++) {
        if (!marked[p] || atomic_load(&r->caught_ver[p]) != pc_cmap_version(m))
            continue;
        uint32_t cleared = pc_cmap_set_syncing(m, p, me, false);
        char what[PC_ADDR_MAX + 96];
        snprintf(what, sizeof what, "this server caught up with %s: in sync for %u slots",
                 pc_cmap_addr(m, p), cleared);
        if (pc_cmap_bump(m, pc_cmap_version(m) + 1) == 0) {
            if (change_map(r, m, what) == 0)
                atomic_fetch_add(&r->synced, 1);
            m = NULL; /* change_map took it */
        }
        break;
    }
    pc_cmap_destroy(m);
}

/* ==== live resharding ====================================================================== */

#define HANDOVER_MS     1000  /* the longest pushes are held off for a handover (then retried) */
#define HANDOVER_SLACK  65536 /* change-log entries a new primary may be behind when one starts */
#define HANDOVER_SAY_NS 30000000000ull /* a handover waiting this long says why (then as often) */
#define RESHARD_TICK_MS 20 /* the controller's tick while the map differs from the target, */
#define RESHARD_FAST_NS 2000000000ull /* and changed this recently (else stuck: normal ticks) */

/* Read the target (psctl reshard) into r->target: kept when it fits map m (its servers are m's
 * first ones, in place); the last one stays when the coordinator does not answer. */
static void read_target(ps_repl_t *r, const pc_cluster_map_t *m) {
    pc_cluster_map_t *t = NULL;
    int rc = ps_mapstore_get_target(&r->store, &t, NULL);
    if (rc && rc != PC_ENOTFOUND)
        return;
    bool fits = t && pc_cmap_nservers(t) <= pc_cmap_nservers(m);
    for (size_t i = 0; fits && i < pc_cmap_nservers(t); i++)
        fits = strcmp(pc_cmap_addr(t, i), pc_cmap_addr(m, i)) == 0;
    if (t && !fits) {
        PC_WARN("resharding: the target names servers the map has not (in those places): "
                "ignored");
        pc_cmap_destroy(t);
        t = NULL;
    }
    pc_cmap_destroy(r->target);
    r->target = t;
}

/* Step 1: every server the target names for a slot of this primary (as primary or backup)
 * becomes a backup of it now, so that it copies the rows and follows. Returns whether a new map
 * was tried. */
static bool reshard_add_backups(ps_repl_t *r, const pc_cluster_map_t *m,
                                const pc_cluster_map_t *t) {
    const uint32_t me = r->o.self;
    pc_cluster_map_t *next = map_copy(r);
    uint32_t n = 0;
    int8_t up[PC_MAX_SERVERS] = {0}; /* lease_up's answers */
    for (uint32_t s = 0; next && s < PC_NSLOTS; s++) {
        if (pc_cmap_slot_owner(m, s) != me || pc_cmap_slot_same(m, t, s))
            continue;
        uint32_t want[PC_MAX_BACKUPS + 1], nw = 0, b[PC_MAX_BACKUPS];
        uint32_t nb = pc_cmap_slot_backups(m, s, b);
        if (pc_cmap_slot_owner(t, s) != me)
            want[nw++] = pc_cmap_slot_owner(t, s);
        nw += pc_cmap_slot_backups(t, s, want + nw);
        bool changed = false;
        for (uint32_t i = 0; i < nw; i++) {
            bool have = want[i] == me;
            for (uint32_t j = 0; j < nb; j++)
                have = have || b[j] == want[i];
            if (have || !lease_up(r, m, up, want[i], NULL))
                continue;
            if (nb == PC_MAX_BACKUPS) { /* full: a backup the target does not name goes */
                uint32_t j = nb;
                while (j-- > 0) {
                    bool named = false;
                    for (uint32_t k = 0; k < nw; k++)
                        named = named || want[k] == b[j];
                    if (!named)
                        break;
                }
                if (j >= nb)
                    continue;
                memmove(b + j, b + j + 1, (nb - j - 1) * sizeof *b);
                nb--;
            }
            b[nb++] = want[i];
            changed = true;
        }
        if (changed && pc_cmap_set_backups(next, s, b, nb) == 0)
            n++;
    }
    if (!n || pc_cmap_bump(next, pc_cmap_version(m) + 1)) {
        pc_cmap_destroy(next);
        return false;
    }
    char what[128];
    snprintf(what, sizeof what, "resharding: %u slots get the backups the target names", n);
    change_map(r, next, what);
    return true;
}

/* Whether backup `to` acknowledged every table up to the heads in snap[0..n) (its entries). */
static bool caught_up(ps_repl_t *r, uint32_t to, const ps_dp_lag_t *snap, size_t n) {
    ps_dp_lag_t *now = r->lag_now;
    const size_t m = ps_dp_repl_lag(r->dp, now, LAG_MAX);
    for (size_t i = 0; i < n; i++) {
        if (snap[i].server != to)
            continue;
        bool ok = false;
        for (size_t j = 0; j < m && j < LAG_MAX && !ok; j++)
            ok = now[j].uid == snap[i].uid && now[j].server == to && now[j].acked >= snap[i].head;
        if (!ok)
            return false;
    }
    return true;
}

static int connect_server(ps_repl_t *r, const char *addr, int limit_ms, char *why, size_t cap,
                          psc_t **out);

/* What a wait of the controller may take in a handover, in ns: at most `ms`, and at most a
 * quarter of the lease (renewed between ticks: the bounds queries, their connect included, and
 * the wait for the acknowledgements stay under three quarters of it; they took up to 8.5 s). */
static uint64_t handover_wait_ns(const ps_repl_t *r, uint64_t ms) {
    const uint64_t quarter = (uint64_t)r->o.lease_ms / 4;
    return (ms < quarter ? ms : quarter) * 1000000ull;
}

/* Before handing slots to `to`: each table's place in to's change log (a bounds query: its
 * uid and head), kept as r->hb for the handover's map version (see DESIGN). A table whose log
 * `to` has not started, one that evicts (TTL, or a capacity without a cold tier: `to` may drop
 * rows of those slots before it takes them, unseen here; a cold table's capacity spills, which
 * keeps the rows), and any left when HANDBACK_NS have passed get none: their new backup copies
 * them. */
static void handback_note(ps_repl_t *r, const pc_cluster_map_t *m, uint32_t to) {
    char(*names)[PS_TABLE_NAME_MAX] = pc_scalloc(PC_MEM_SCRATCH, MAX_TABLES, PS_TABLE_NAME_MAX);
    struct handback *hb = pc_scalloc(PC_MEM_SCRATCH, MAX_TABLES, sizeof *hb);
    const size_t nt = names && hb ? ps_catalog_list(r->cat, names, MAX_TABLES) : 0;
    const uint64_t t0 = pc_time_mono_ns();
    char why[320];
    psc_t *c = NULL;
    size_t k = 0;
    const uint64_t budget = handover_wait_ns(r, HANDBACK_NS / 1000000u);
    if (nt &&
        !connect_server(r, pc_cmap_addr(m, to), (int)(budget / 1000000u), why, sizeof why, &c)) {
        for (size_t i = 0; i < nt && i < MAX_TABLES && pc_time_mono_ns() - t0 < budget; i++) {
            ps_table_t *t;
            if (ps_catalog_acquire(r->cat, names[i], &t))
                continue;
            const ps_table_config_t *cfg = ps_table_config(t);
            const bool evicts = cfg->ttl_ticks || (cfg->capacity_rows && !cfg->cold);
            ps_catalog_release(r->cat, t);
            psc_stream_req_t q = {.server = to, .table = names[i]};
            psc_stream_t out;
            if (evicts || psc_deltas(c, &q, &out, why, sizeof why) || !out.head)
                continue;
            snprintf(hb[k].table, sizeof hb[k].table, "%s", names[i]);
            hb[k].uid = out.uid;
            hb[k++].pos = out.head;
        }
        psc_close(c);
    }
    pthread_mutex_lock(&r->mu);
    if (k)
        memcpy(r->hb, hb, k * sizeof *hb);
    r->nhb = k;
    r->hb_to = to;
    r->hb_ver = 0; /* set for the handover's version just before it is written */
    pthread_mutex_unlock(&r->mu);
    pc_sfree(names);
    pc_sfree(hb);
}

/* Step 2: hand this primary's slots to the target's primary `to` (a backup now) once it is in
 * sync in the map (its own mark cleared: the map's one writer of that change goes first, so a
 * handover never loses its version to it after holding pushes) and close behind: pushes are held
 * off (PC_EUNAVAIL: clients retry) and, once none is half-applied, the change logs' heads are every
 * push this server took; when `to` acknowledged them, the map names it primary. A push this server
 * answered is in its copy; one it refused goes there. */
static void reshard_handover(ps_repl_t *r, const pc_cluster_map_t *m, const pc_cluster_map_t *t,
                             uint32_t to) {
    for (uint32_t s = 0; s < PC_NSLOTS; s++) /* it cleared its own mark first (note_synced) */
        if (pc_cmap_slot_owner(m, s) == r->o.self && pc_cmap_slot_owner(t, s) == to &&
            pc_cmap_backup_syncing(m, s, to))
            return;
    char behind[PS_TABLE_NAME_MAX];
    if (!ps_dp_backup_synced(r->dp, to, HANDOVER_SLACK, behind, sizeof behind)) {
        /* still copying or catching up: next tick; said when it lasts (a table the new server
         * does not have, which it cannot follow, holds the move for good) */
        const uint64_t now = pc_time_mono_ns();
        if (!r->handover_wait_ns || r->handover_to != to)
            r->handover_wait_ns = now, r->handover_said_ns = 0, r->handover_to = to;
        if (now - r->handover_wait_ns > HANDOVER_SAY_NS &&
            now - r->handover_said_ns > HANDOVER_SAY_NS) {
            r->handover_said_ns = now;
            PC_WARN("reshard: handing slots to %s has waited %.0f s for it to follow table %s "
                    "(does that server have the table?)",
                    pc_cmap_addr(m, to), (double)(now - r->handover_wait_ns) * 1e-9, behind);
        }
        return;
    }
    r->handover_wait_ns = 0;
    handback_note(r, m, to); /* before its first push as their primary, whenever that comes */
    const uint64_t t0 = pc_time_mono_ns(), limit = t0 + handover_wait_ns(r, HANDOVER_MS);
    ps_dp_set_write_until(r->dp, 0);
    while (!ps_dp_pushes_idle(r->dp) && pc_time_mono_ns() < limit)
        sched_yield();
    ps_dp_lag_t *snap = r->lag_cut;
    const size_t n = ps_dp_pushes_idle(r->dp) ? ps_dp_repl_lag(r->dp, snap, LAG_MAX) : 0;
    bool synced = false;
    while (n && n <= LAG_MAX && !(synced = caught_up(r, to, snap, n)) && !atomic_load(&r->stop) &&
           pc_time_mono_ns() < limit)
        pc_time_sleep_ms(1);
    pc_cluster_map_t *next = synced ? map_copy(r) : NULL;
    uint32_t moved = 0;
    for (uint32_t s = 0; next && s < PC_NSLOTS; s++)
        if (pc_cmap_slot_owner(m, s) == r->o.self && pc_cmap_slot_owner(t, s) == to &&
            pc_cmap_take_slot(next, t, s) == 0)
            moved++;
    if (next && moved && pc_cmap_bump(next, pc_cmap_version(m) + 1) == 0) {
        char what[PC_ADDR_MAX + 96];
        snprintf(what, sizeof what, "resharding: %u slots handed to %s (pushes held %.1f ms)",
                 moved, pc_cmap_addr(m, to), (pc_time_mono_ns() - t0) / 1e6);
        /* the places are valid for this version, published before the follower can adopt it */
        pthread_mutex_lock(&r->mu);
        memset(r->hb_slots, 0, sizeof r->hb_slots);
        for (uint32_t s = 0; s < PC_NSLOTS; s++)
            if (pc_cmap_slot_owner(m, s) == r->o.self && pc_cmap_slot_owner(next, s) == to)
                pc_slots_add(r->hb_slots, s);
        const uint64_t ver = r->hb_ver = pc_cmap_version(next);
        pthread_mutex_unlock(&r->mu);
        const int rc = change_map(r, next, what);
        if (rc == 0) {
            atomic_fetch_add(&r->handovers, 1);
        } else if (rc == PC_EEXIST && current(r) >= ver) {
            /* another server wrote that version (adopted): nothing was handed over */
            pthread_mutex_lock(&r->mu);
            r->hb_ver = 0;
            pthread_mutex_unlock(&r->mu);
        } else {
            /* no answer (the write may have landed: `to` may be taking these slots' pushes), or
             * written and not adopted here: pushes stay refused until this server wins a later
             * version or adopts this one (confirm, as after a lapse) */
            r->lapsed = true;
            PC_WARN("resharding: the map naming %s primary (version %" PRIu64 ") is not known "
                    "to be written or not (%s): no pushes until the next map version settles it",
                    pc_cmap_addr(m, to), ver, pc_strerror(rc));
        }
    } else {
        pc_cmap_destroy(next);
        if (!synced)
            PC_WARN("resharding: %s did not catch up within %d ms: handover tried again",
                    pc_cmap_addr(m, to), HANDOVER_MS);
    }
    if (!r->lapsed)
        ps_dp_set_write_until(r->dp, r->lease_until);
}

/* Step 3: the slots this server keeps get the backups the target names whose lease is in the
 * coordinator (lease_up: one that died since the target was written stays out). Nothing when the
 * coordinator does not answer. */
static void reshard_set_backups(ps_repl_t *r, const pc_cluster_map_t *m,
                                const pc_cluster_map_t *t) {
    const uint32_t me = r->o.self;
    pc_cluster_map_t *next = map_copy(r);
    int8_t up[PC_MAX_SERVERS] = {0}; /* lease_up's answers */
    uint32_t n = 0;
    bool known = true;
    for (uint32_t s = 0; next && known && s < PC_NSLOTS; s++) {
        if (pc_cmap_slot_owner(m, s) != me || pc_cmap_slot_same(m, t, s))
            continue;
        uint32_t want[PC_MAX_BACKUPS], b[PC_MAX_BACKUPS], cur[PC_MAX_BACKUPS], nb = 0;
        const uint32_t nw = pc_cmap_slot_backups(t, s, want), nc = pc_cmap_slot_backups(m, s, cur);
        for (uint32_t i = 0; i < nw && known; i++)
            if (lease_up(r, m, up, want[i], &known))
                b[nb++] = want[i];
        if (known && (nb != nc || memcmp(b, cur, nb * sizeof *b) != 0) &&
            pc_cmap_set_backups(next, s, b, nb) == 0)
            n++;
    }
    if (!known || !n || pc_cmap_bump(next, pc_cmap_version(m) + 1)) {
        pc_cmap_destroy(next);
        return;
    }
    char what[96];
    snprintf(what, sizeof what, "resharding: backups of %u slots as the target names", n);
    change_map(r, next, what);
}

/* One step towards the target for the slots this server is primary of: backups first, then
 * handovers (one new primary a tick), then the backups of the slots it keeps as the target says.
 * One map change a tick. Returns whether the map differs from the target (anywhere: the
 * controller then ticks faster). */
static bool reshard(ps_repl_t *r) {
    pc_cluster_map_t *m = map_copy(r);
    if (m)
        read_target(r, m);
    const pc_cluster_map_t *t = r->target;
    const bool pending = m && t && !pc_cmap_roles_same(m, t);
    if (!pending || r->lapsed || reshard_add_backups(r, m, t)) {
        pc_cmap_destroy(m);
        return pending;
    }
    const uint32_t me = r->o.self;
    uint32_t to = PC_NO_SERVER, keep = 0;
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        if (pc_cmap_slot_owner(m, s) != me || pc_cmap_slot_same(m, t, s))
            continue;
        if (pc_cmap_slot_owner(t, s) != me && to == PC_NO_SERVER)
            to = pc_cmap_slot_owner(t, s);
        keep += pc_cmap_slot_owner(t, s) == me;
    }
    if (to != PC_NO_SERVER) {
        reshard_handover(r, m, t, to);
    } else if (keep) {
        reshard_set_backups(r, m, t);
    }
    pc_cmap_destroy(m);
    return true;
}

/* Release (after the follower's key collection, which it shares). */
static void release_rows(ps_repl_t *r);
/* The run record (with the life of the replication, below). */
static void run_begin(ps_repl_t *r);

static void *ctl_main(void *arg) {
    ps_repl_t *r = arg;
    const int tick = r->o.lease_ms / 4 < 50 ? 50 : (int)(r->o.lease_ms / 4);
    while (!atomic_load(&r->stop)) {
        renew(r);
        refresh(r);
        if (!r->recorded)
            run_begin(r);
        if (r->lapsed) {
            confirm(r);
        } else {
            watch(r);
            note_behind(r);
            note_synced(r);
        }
        /* steps follow each other closer while slots move (and the map still changes) */
        const bool moving =
            reshard(r) && pc_time_mono_ns() - atomic_load(&r->adopted_ns) < RESHARD_FAST_NS;
        release_rows(r);
        /* a client refused under a newer map than ours (ps_dp_newer_map): read it now, once */
        for (int t = 0; t < (moving ? RESHARD_TICK_MS : tick) && !atomic_load(&r->stop); t += 5) {
            const uint64_t hint = ps_dp_newer_map(r->dp);
            if (hint > current(r) && hint != r->hinted) {
                r->hinted = hint;
                break;
            }
            pc_time_sleep_ms(5);
        }
    }
    return NULL;
}

/* ==== the follower ========================================================================= */

/* Whether this server backs up `slot` of primary p under m. */
static bool backs_up(const pc_cluster_map_t *m, uint32_t me, uint32_t p, uint32_t slot) {
    return pc_cmap_slot_owner(m, slot) == p && pc_cmap_is_backup(m, slot, me);
}

/* The follower's buffers: rows of up to `stride` floats, and the split of a reply to load. */
typedef struct bufs {
    uint64_t *keys, *ek;
    uint8_t *found;
    float *rows;
    uint32_t stride, cap; /* rows per call for this stride */
} bufs_t;

static int bufs_fit(bufs_t *b, uint32_t stride) {
    /* each on its own: after a failure, the next call allocates those still missing */
    if (!b->keys)
        b->keys = pc_malloc(PC_MEM_SCRATCH, CALL_ROWS * 8);
    if (!b->ek)
        b->ek = pc_malloc(PC_MEM_SCRATCH, CALL_ROWS * 8);
    if (!b->found)
        b->found = pc_malloc(PC_MEM_SCRATCH, CALL_ROWS);
    if (!b->keys || !b->ek || !b->found)
        return PC_ENOMEM;
    if (stride > b->stride) {
        const size_t old = b->rows ? (size_t)b->cap * b->stride * 4 : 0;
        uint32_t cap = CALL_BYTES / (stride * 4);
        cap = cap > CALL_ROWS ? CALL_ROWS : cap ? cap : 1;
        const size_t bytes = (size_t)cap * stride * 4;
        pc_free(PC_MEM_SCRATCH, b->rows, old);
        b->rows = pc_malloc(PC_MEM_SCRATCH, bytes);
        b->stride = b->rows ? stride : 0;
        b->cap = b->stride ? cap : 0;
        if (!b->stride)
            return PC_ENOMEM;
    }
    return 0;
}

static void bufs_free(bufs_t *b) {
    const size_t rb = (size_t)b->cap * b->stride * 4;
    pc_free(PC_MEM_SCRATCH, b->keys, CALL_ROWS * 8);
    pc_free(PC_MEM_SCRATCH, b->ek, CALL_ROWS * 8);
    pc_free(PC_MEM_SCRATCH, b->found, CALL_ROWS);
    pc_free(PC_MEM_SCRATCH, b->rows, rb);
}

/* Load a stream reply's n rows (with state) into t: present ones loaded, absent ones erased,
 * keys of slots this server does not back up of p skipped; only while the map is still m
 * (PC_ESTATE otherwise: the reply is dropped). `seen` (may be NULL): note the keys a copy got. */
static void seen_mark(seen_t *x, const uint64_t *keys, size_t n);

static int apply(ps_repl_t *r, const pc_cluster_map_t *m, uint32_t p, ps_table_t *t, bufs_t *b,
                 size_t n, seen_t *seen) {
    const size_t stride = (size_t)ps_table_dim(t) + ps_table_state_len(t);
    size_t nl = 0, ne = 0; /* present rows compacted in place (rarely moved), absent keys aside */
    for (size_t i = 0; i < n; i++) {
        if (!backs_up(m, r->o.self, p, pc_key_slot(b->keys[i])))
            continue;
        if (!b->found[i]) {
            b->ek[ne++] = b->keys[i];
            continue;
        }
        if (nl != i) {
            b->keys[nl] = b->keys[i];
            memmove(b->rows + nl * stride, b->rows + i * stride, stride * 4);
        }
        nl++;
    }
    int rc = 0;
    pthread_mutex_lock(&r->mu); /* no promotion while rows of the old primary go in */
    if (!same_roles_as(r, m))
        rc = PC_ESTATE;
    if (!rc && nl)
        rc = ps_table_load_rows_unlogged(t, nl, b->keys, b->rows);
    if (!rc && ne)
        rc = ps_table_erase(t, b->ek, ne, NULL);
    pthread_mutex_unlock(&r->mu);
    if (!rc && seen) { /* (erased as absent: the primary sent them too) */
        seen_mark(seen, b->keys, nl);
        seen_mark(seen, b->ek, ne);
    }
    if (!rc)
        atomic_fetch_add(&r->rows_streamed, nl + ne);
    return rc;
}

/* Note key in x when its slot is one x collects; false when out of memory (x->failed). */
static bool seen_add(seen_t *x, uint64_t key) {
    const uint32_t slot = pc_key_slot(key);
    if (x->p == PC_NO_SERVER
            ? pc_cmap_slot_owner(x->m, slot) == x->me || pc_cmap_is_backup(x->m, slot, x->me)
            : !backs_up(x->m, x->me, x->p, slot))
        return true;
    x->failed = x->failed || !pc_sappend_u64(&x->keys, &x->n, &x->cap, key);
    return !x->failed;
}

static int seen_collect(void *ctx, const ps_row_view_t *rows, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!seen_add(ctx, rows[i].key))
            return 1;
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* The keys of t's rows in RAM, in the slots x collects. */
static int seen_ram(seen_t *x, const ps_table_t *t) {
    return ps_table_scan(t, PS_SCAN_ALL, seen_collect, x) || x->failed ? PC_ENOMEM : 0;
}

/* ps_table_cold_walk into x (the keys of t's cold store from *start on, in the slots x collects,
 * `max` visited at most; *start then where to go on, 0 at the end). A promoted row is in RAM and
 * in the cold store: seen_sort drops the repeat. */
static int seen_cold_key(void *ctx, uint64_t key) {
    return seen_add(ctx, key) ? 0 : PC_ENOMEM;
}

static int seen_cold(seen_t *x, const ps_table_t *t, uint64_t *start, uint64_t max) {
    return ps_table_cold_walk(t, start, max, seen_cold_key, x);
}

/* Sort x's keys, each once. */
static void seen_sort(seen_t *x) {
    if (x->n)
        qsort(x->keys, x->n, sizeof *x->keys, cmp_u64);
    size_t u = 0;
    for (size_t i = 0; i < x->n; i++)
        if (!u || x->keys[u - 1] != x->keys[i])
            x->keys[u++] = x->keys[i];
    x->n = u;
}

static void seen_mark(seen_t *x, const uint64_t *keys, size_t n) {
    for (size_t i = 0; x->got && x->n && i < n; i++) {
        const uint64_t *at = bsearch(&keys[i], x->keys, x->n, sizeof *x->keys, cmp_u64);
        if (at)
            x->got[at - x->keys] = 1;
    }
}

/* A source of `primary` is copied again: one that followed the primary's log (`was_following`)
 * held its rows up to there, and now may lack pushes the primary acknowledged (this server's
 * table replaced, the primary's replaced within its run, rows erased by a release, the log
 * overrun). It stops counting as caught up, and the controller marks it catching up in the map
 * (note_behind). A first copy, or one started again, was not in sync before either. */
static void fell_behind(ps_repl_t *r, uint32_t primary, bool was_following) {
    if (!was_following)
        return;
    atomic_store(&r->caught_ver[primary], 0);
    atomic_fetch_add(&r->falls[primary], 1);
    atomic_fetch_add(&r->fell_behind, 1);
}

static void copy_end(source_t *src) {
    pc_sfree(src->cp.x.keys);
    pc_sfree(src->cp.x.got);
    pc_sfree(src->cp.slots);
    memset(&src->cp, 0, sizeof src->cp);
}

/* The next part of a copy of table src of primary pr (see DESIGN: load every part, then erase
 * the keys of those slots the primary did not send), starting one when none is under way for
 * the slots this server backs up of it under m: rows loaded, or an error (the copy then starts
 * over, except after PC_EWRONGSLOT). PC_ESTATE with *held > 0: the primary's table was replaced
 * while this server's copy holds rows of it. */
static long copy_step(ps_repl_t *r, primary_t *pr, source_t *src, const pc_cluster_map_t *m,
                      ps_table_t *t, bufs_t *b, char *why, size_t whycap, size_t *held) {
    const uint32_t stride = ps_table_dim(t) + ps_table_state_len(t);
    copy_t *cp = &src->cp;
    uint64_t slots[PC_NSLOTS / 64];
    pc_cmap_backed_up(m, pr->server, r->o.self, slots);
    if (cp->on && memcmp(cp->slots, slots, sizeof slots))
        copy_end(src); /* the parts loaded were another set of slots: start over */
    int rc = 0;
    if (!cp->on) {
        /* this table's own log, so that a server handing these slots to this one can follow it
         * from before its first push as their primary (see DESIGN); none when logs are off */
        ps_changelog_t *own;
        ps_catalog_changelog_start(r->cat, t, &own, NULL);
        src->local_uid = ps_table_uid(t);
        cp->on = true;
        cp->owning = ps_table_config(t)->cold;
        cp->x = (seen_t){.m = m, .me = r->o.self, .p = pr->server};
        rc = seen_ram(&cp->x, t);
        cp->x.m = NULL; /* the follower's map of now: not kept */
        if (!rc && !(cp->slots = pc_smalloc(PC_MEM_SCRATCH, sizeof slots)))
            rc = PC_ENOMEM;
        if (!rc)
            memcpy(cp->slots, slots, sizeof slots);
        if (src->parts < SCAN_PARTS)
            src->parts = SCAN_PARTS;
    }
    seen_t *x = &cp->x;
    if (!rc && cp->owning) {
        /* a cold table: this server's own cold keys of those slots, OWN_ROUND_KEYS a round (the
         * other primaries' DELTAS, which their sync pushes wait for, go on in between) */
        x->m = m;
        rc = seen_cold(x, t, &cp->own_start, OWN_ROUND_KEYS);
        x->m = NULL;
        if (!rc && cp->own_start)
            return 1; /* (progress: no idle wait before the next round) */
        cp->owning = false;
    }
    if (!rc && !x->got && !cp->part) { /* the keys held, complete: sorted once, none seen yet */
        seen_sort(x);
        if (!(x->got = pc_scalloc(PC_MEM_SCRATCH, x->n ? x->n : 1, 1)))
            rc = PC_ENOMEM;
    }
    *held = x->n;
    psc_stream_req_t q = {.server = pr->server,
                          .table = src->table,
                          .dim = stride,
                          .part = cp->part,
                          .parts = src->parts,
                          .from = r->o.self, /* PC_STREAM_BACKUP: only the slots it backs up */
                          .cap = b->cap,
                          .keys = b->keys,
                          .found = b->found,
                          .rows = b->rows};
    /* a cold table: its parts of RAM rows, then pages of the primary's cold store */
    const bool walk = ps_table_config(t)->cold;
    psc_stream_t out = {0};
    if (rc) { /* the copy's own keys could not be noted (memory): it starts over */
        copy_end(src);
        return rc;
    }
    rc = psc__stream(pr->c, true, &q,
                     PC_STREAM_STATE | PC_STREAM_SAME_MAP | PC_STREAM_BACKUP |
                         (walk ? PC_STREAM_COLD : 0),
                     pc_cmap_version(m), cp->part < src->parts ? 0 : cp->start, &out, why, whycap);
    if (rc == PC_ETOOBIG && src->parts < 65536) { /* a part over the buffers: split finer */
        src->parts *= 2;
        cp->part = 0; /* the parts loaded are loaded again: a load is idempotent */
        cp->start = 0;
        return 0;
    }
    if (rc == PC_EWRONGSLOT || rc == PC_EUNAVAIL || rc == PC_ETIMEDOUT || rc == PC_ECLOSED ||
        rc == PC_ETLS || rc == PC_EAUTH || rc == PC_ENOMEM)
        return rc; /* another map version there, no answer, no connection, or no memory for
                    * the reply: this part again later (the copy stays) */
    if (!rc && cp->part && out.uid != cp->uid) {
        if (ps_table_uid_same_run(cp->uid, out.uid)) { /* reset while the primary ran (DESIGN) */
            /* the copy starts over from the keys held now: those the earlier parts loaded from
             * the old table are among them, so its end erases what the new one lacks (kept, the
             * keys noted before would leave them here for good) */
            copy_end(src);
            return 0;
        }
        rc = PC_ESTATE; /* replaced by another run during the copy: see DESIGN */
    }
    if (!rc && !cp->part && src->uid && out.uid != src->uid && x->n &&
        !ps_table_uid_same_run(src->uid, out.uid)) {
        rc = PC_ESTATE; /* replaced by another run under a copy that holds rows: see DESIGN */
        src->resync = false;
    }
    if (!rc && !cp->part) {
        fell_behind(r, pr->server, src->resync);
        src->resync = false;
        /* the first part (again, after a finer split): what earlier parts or DELTAS brought is
         * marked no more, and the log is followed from this part's head on (kept when already
         * followed there: it is at or before it) */
        memset(x->got, 0, x->n);
        cp->uid = out.uid;
        if (!src->following || src->uid != out.uid) {
            src->uid = out.uid;
            src->pos = out.next;
            src->following = true;
        }
    }
    if (!rc) {
        rc = apply(r, m, pr->server, t, b, out.n, x);
        atomic_fetch_add(&r->rows_copied, out.n);
        if (rc == PC_ESTATE)
            return rc; /* the roles moved: the next round sees whether the slots did */
    }
    if (!rc && cp->part < src->parts && (++cp->part < src->parts || walk))
        return (long)out.n; /* the next part, or the cold store's first page */
    if (!rc && cp->part == src->parts && out.from) {
        cp->start = out.from; /* a cold page, and more to walk */
        return (long)out.n;
    }
    size_t gone = 0;
    for (size_t i = 0; !rc && i < x->n; i++)
        if (!x->got[i])
            x->keys[gone++] = x->keys[i];                    /* the primary has it no more */
    for (size_t i = 0; !rc && i < gone; i += RELEASE_KEYS) { /* loads go on in between */
        const size_t n = gone - i < RELEASE_KEYS ? gone - i : RELEASE_KEYS;
        pthread_mutex_lock(&r->mu);
        rc = same_roles_as(r, m) ? ps_table_erase(t, x->keys + i, n, NULL) : PC_ESTATE;
        pthread_mutex_unlock(&r->mu);
    }
    if (!rc) {
        src->need_copy = false;
        src->reached = src->caught = false; /* until DELTAS replies reach the head */
        atomic_fetch_add(&r->copies, 1);
        PC_INFO("replication: copied table %s of %s (uid %016" PRIx64 ", %zu rows held before, "
                "%zu gone), following at %" PRIu64,
                src->table, pc_cmap_addr(m, pr->server), cp->uid, *held, gone, src->pos);
    }
    copy_end(src);
    return rc ? rc : (long)out.n;
}

/* Whether server me has a role in slot s under m (NULL: none). */
static bool role_in(const pc_cluster_map_t *m, uint32_t me, uint32_t s) {
    return m && (pc_cmap_slot_owner(m, s) == me || pc_cmap_is_backup(m, s, me));
}

typedef struct release_ctx {
    ps_repl_t *r;
    const pc_cluster_map_t *m;
    uint64_t end_ns; /* the pass's time (an eighth of a lease: this thread renews the lease) */
} release_ctx_t;

/* Table `name` in the release under way under m (a new release when its map is another). NULL
 * when MAX_TABLES are noted (the table is then released whole at each call). */
static struct rel_walk *rel_walk_of(ps_repl_t *r, const pc_cluster_map_t *m, const char *name) {
    if (r->rel_ver != pc_cmap_version(m)) {
        r->nrel = 0;
        r->rel_ver = pc_cmap_version(m);
    }
    for (size_t i = 0; i < r->nrel; i++)
        if (!strcmp(r->rel[i].table, name))
            return &r->rel[i];
    if (r->nrel == MAX_TABLES)
        return NULL;
    struct rel_walk *c = &r->rel[r->nrel++];
    *c = (struct rel_walk){0};
    snprintf(c->table, sizeof c->table, "%s", name);
    return c;
}

/* ps_catalog_each: erase table t's rows of slots this server has no role in under x->m (only
 * while that is still the map: PC_ESTATE otherwise). A cold table's cold store is walked
 * REL_TICK_KEYS keys a call: PC_EAGAIN until its walk reached the end. The walk moves on only
 * past keys erased: a call that fails (a new map, an erasure refused) leaves it where it stood,
 * and the next call visits those keys again. */
static int release_table(void *ctx, ps_table_t *t) {
    const release_ctx_t *x = ctx;
    ps_repl_t *r = x->r;
    struct rel_walk *c = rel_walk_of(r, x->m, ps_table_config(t)->name);
    if (c && c->done)
        return 0; /* (released earlier in this release) */
    if (c && pc_time_mono_ns() > x->end_ns)
        return PC_EAGAIN; /* the pass's time is spent: this table at the next tick */
    seen_t k = {.m = x->m, .me = r->o.self, .p = PC_NO_SERVER};
    /* the rows in RAM until erased once (no row of those slots comes in after) */
    int rc = !c || !c->ram_done ? seen_ram(&k, t) : 0;
    uint64_t next = c ? c->start : 0;
    if (!rc && ps_table_config(t)->cold)
        rc = seen_cold(&k, t, &next, c ? REL_TICK_KEYS : UINT64_MAX);
    seen_sort(&k);
    size_t erased = 0, i = 0;
    /* erasures of cold rows read and delete them in RocksDB: past the pass's time (all tables
     * together), the rest waits for the next tick */
    for (; !rc && i < k.n && !(c && i && pc_time_mono_ns() > x->end_ns); i += RELEASE_KEYS) {
        const size_t n = k.n - i < RELEASE_KEYS ? k.n - i : RELEASE_KEYS;
        size_t e = 0;
        pthread_mutex_lock(&r->mu); /* the follower loads under it: not past a new map */
        rc = current(r) == pc_cmap_version(x->m) ? ps_table_erase(t, k.keys + i, n, &e) : PC_ESTATE;
        pthread_mutex_unlock(&r->mu);
        erased += e;
    }
    if (!rc && c && i < k.n) {
        /* out of time: the walk goes on from the first key not erased (not 0: i > 0), or from
         * where it stopped when that is before (the key may be a RAM row's); RAM rows again */
        const uint64_t at = k.keys[i];
        c->start = !ps_table_config(t)->cold ? 0 : next && next < at ? next : at;
    } else if (!rc && c) { /* (the name stays) */
        c->start = next;
        c->ram_done = true;
        c->done = !next;
    }
    atomic_fetch_add(&r->released, erased); /* those erased before a new map stopped it too */
    if (erased)
        PC_INFO("resharding: %zu rows of table %s released (slots with no role here under map "
                "version %" PRIu64 ")%s%s",
                erased, ps_table_config(t)->name, pc_cmap_version(x->m),
                rc ? ", stopped, again at the next tick: " : "",
                rc == PC_ESTATE ? "a new map"
                : rc            ? pc_strerror(rc)
                                : "");
    pc_sfree(k.keys);
    return !rc && c && !c->done ? PC_EAGAIN : rc;
}

/* Release: after a map change that took slots from this server (handed over, or a backup no
 * longer), erase their rows so that their memory goes back. Other changes (a lease confirmed, a
 * backup added) cost no scan. */
static void release_rows(ps_repl_t *r) {
    pc_cluster_map_t *m = map_if_new(r, r->released_map ? pc_cmap_version(r->released_map) : 0);
    if (!m)
        return;
    bool lost = false;
    for (uint32_t s = 0; s < PC_NSLOTS && !lost; s++)
        lost = role_in(r->released_map, r->o.self, s) && !role_in(m, r->o.self, s);
    release_ctx_t x = {r, m, pc_time_mono_ns() + (uint64_t)r->o.lease_ms * 1000000 / 8};
    const int rc = lost ? ps_catalog_each(r->cat, release_table, &x) : 0;
    if (lost) { /* (rows may be gone even when it stopped part way) */
        pthread_mutex_lock(&r->mu);
        for (uint32_t s = 0; s < PC_NSLOTS; s++)
            if (!role_in(m, r->o.self, s))
                pc_slots_add(r->gone, s);
        r->gone_any = true;
        pthread_mutex_unlock(&r->mu);
    }
    if (rc) {
        pc_cmap_destroy(m); /* again at the next tick, against the same map as before */
        return;
    }
    pc_cmap_destroy(r->released_map);
    r->released_map = m;
}

/* Slots whose rows a release erased (r->gone) that this server backs up under m, which the
 * follower may have kept following across the versions in between (it only sees the newest):
 * their primaries' tables are copied again. */
static void regain_released(ps_repl_t *r, const pc_cluster_map_t *m) {
    uint64_t gone[PC_NSLOTS / 64];
    pthread_mutex_lock(&r->mu);
    const bool any = r->gone_any;
    if (!any) {
        pthread_mutex_unlock(&r->mu);
        return;
    }
    memcpy(gone, r->gone, sizeof gone);
    memset(r->gone, 0, sizeof r->gone);
    r->gone_any = false;
    pthread_mutex_unlock(&r->mu);
    for (size_t i = 0; i < r->nprim; i++) {
        primary_t *p = &r->prim[i];
        bool hit = false;
        for (uint32_t s = 0; s < PC_NSLOTS && !hit; s++)
            hit = pc_slots_has(gone, s) && backs_up(m, r->o.self, p->server, s);
        for (size_t k = 0; hit && k < p->nsrc; k++) {
            copy_end(&p->src[k]);
            p->src[k].need_copy = true;
            p->src[k].following = false; /* (and no hand-back place may stand in for it) */
        }
    }
}

/* Whether primary pr's table `name`, followed under uid `was`, is now one another run of it made
 * (a bounds query; false when it does not answer: the copy's first part asks again). */
static bool replaced_by_restart(primary_t *pr, const char *name, uint64_t was) {
    psc_stream_req_t q = {.server = pr->server, .table = name};
    psc_stream_t out;
    return was && !psc_deltas(pr->c, &q, &out, NULL, 0) && out.uid && out.uid != was &&
           !ps_table_uid_same_run(was, out.uid);
}

/* One round over primary pr's tables; returns rows applied, or a negative error. */
static long follow_round(ps_repl_t *r, primary_t *pr, const pc_cluster_map_t *m, bufs_t *b) {
    const uint64_t gen = ps_catalog_changes(r->cat); /* before any local_uid is looked at */
    long total = 0;
    char why[320];
    for (size_t i = 0; i < pr->nsrc && !atomic_load(&r->stop); i++) {
        source_t *src = &pr->src[i];
        ps_table_t *t;
        if (ps_catalog_acquire(r->cat, src->table, &t)) {
            copy_end(src); /* (a table dropped here: its copy's memory goes back) */
            continue;
        }
        if (src->local_uid && src->local_uid != ps_table_uid(t)) {
            PC_INFO("replication: table %s was replaced here: copying %s's rows of it again",
                    src->table, pc_cmap_addr(m, pr->server));
            fell_behind(r, pr->server, src->following);
            copy_end(src); /* (one under way went into the old table) */
            src->local_uid = 0;
            src->need_copy = true;
        }
        const uint32_t stride = ps_table_dim(t) + ps_table_state_len(t);
        int rc = bufs_fit(b, stride);
        size_t held = 0;
        long got = 0;
        int crc = 0; /* the copy's */
        if (!rc && src->need_copy) {
            got = copy_step(r, pr, src, m, t, b, why, sizeof why, &held);
            crc = got < 0 ? (int)got : 0;
            total += got > 0 ? got : 0;
        }
        /* the change log while following it, a copy of gained slots under way or not (see
         * DESIGN) */
        if (!rc && (!crc || crc == PC_EWRONGSLOT) && src->following) {
            psc_stream_req_t q = {.server = pr->server,
                                  .table = src->table,
                                  .dim = stride,
                                  .uid = src->uid,
                                  .from = src->pos,
                                  .part = r->o.self,
                                  .cap = b->cap,
                                  .keys = b->keys,
                                  .found = b->found,
                                  .rows = b->rows};
            psc_stream_t out;
            /* caught up says so only with no copy under way (then pushes wait for this backup) */
            const uint32_t said = src->reached && !src->need_copy ? PC_STREAM_CAUGHT : 0;
            rc = psc__stream(pr->c, false, &q, PC_STREAM_STATE | PC_STREAM_ACK | said, 0, 0, &out,
                             why, sizeof why);
            if (rc == PC_ESTATE) { /* the primary's table was replaced: is a copy held here? */
                src->resync = src->resync || src->following;
                src->need_copy = true;
                src->following = false;
                got = src->cp.on ? 0 : copy_step(r, pr, src, m, t, b, why, sizeof why, &held);
                rc = got < 0 ? (int)got : 0;
                total += got > 0 ? got : 0;
                if (!rc && src->cp.owning && src->cp.x.n &&
                    replaced_by_restart(pr, src->table, src->uid)) {
                    /* a cold table's copy still noting this server's own keys, some found: held
                     * (part 0's uid check would come only after the whole walk) */
                    held = src->cp.x.n;
                    rc = PC_ESTATE;
                    src->resync = false;
                }
            } else if (!rc && (rc = apply(r, m, pr->server, t, b, out.n,
                                          src->cp.x.got ? &src->cp.x : NULL)) == 0) {
                src->pos = out.next;
                src->caught = src->caught || (said && out.next >= out.head);
                src->reached = src->reached || (!src->need_copy && out.next >= out.head);
                total += (long)out.n;
            }
        }
        ps_catalog_release(r->cat, t);
        if (!rc)
            rc = crc;
        if (!rc)
            src->absent_there = false;
        if ((rc == PC_ESTATE || rc == PC_EWRONGSLOT) && !same_roles_as(r, m)) {
            return 0; /* the roles moved: the round starts again under the new map */
        } else if (rc == PC_EWRONGSLOT) {
            continue; /* a copy's part while the primary has another map: again once it has ours */
        } else if (rc == PC_ENOTFOUND) { /* its other tables go on (a sync push waits on them) */
            if (!src->absent_there)
                PC_INFO("replication: %s has no table %s: followed once it has",
                        pc_cmap_addr(m, pr->server), src->table);
            src->absent_there = true;
            continue;
        } else if (rc == PC_ESTATE && held) {
            PC_WARN("replication: table %s of %s was replaced while this server holds %zu rows "
                    "of it: taking over its slots",
                    src->table, pc_cmap_addr(m, pr->server), held);
            atomic_store(&r->suspect[pr->server], true);
            return PC_ESTATE;
        } else if (rc == PC_ERANGE) {
            PC_INFO("replication: table %s of %s: %s: copying it again", src->table,
                    pc_cmap_addr(m, pr->server), why);
            fell_behind(r, pr->server, src->following);
            src->need_copy = true;
            src->following = false;
            copy_end(src); /* one under way starts over: its first part gives the position */
        } else if (rc == PC_EUNAVAIL || rc == PC_ETIMEDOUT || rc == PC_ECLOSED || rc == PC_ETLS ||
                   rc == PC_EAUTH) { /* the primary: down, or refusing us */
            PC_WARN("replication: table %s of %s: %s", src->table, pc_cmap_addr(m, pr->server),
                    why[0] ? why : pc_strerror(rc));
            return rc;
        } else if (rc) { /* this table's own (a damaged record, another dim, memory): the others
                          * go on; it stays uncaught, so this server's mark stays */
            if (rc != src->failing)
                PC_WARN("replication: table %s of %s: %s (its other tables go on)", src->table,
                        pc_cmap_addr(m, pr->server), why[0] ? why : pc_strerror(rc));
            src->failing = rc;
            src->caught = false;
            continue;
        }
        src->failing = 0;
    }
    bool caught = !atomic_load(&r->stop);
    for (size_t i = 0; i < pr->nsrc && caught; i++)
        caught = pr->src[i].absent_there || (!pr->src[i].need_copy && pr->src[i].caught);
    if (caught)
        atomic_store(&r->caught_gen[pr->server], gen);
    atomic_store(&r->caught_ver[pr->server], caught ? pc_cmap_version(m) : 0);
    return total;
}

/* The sources of primary p: its tables (those of this server's catalog), new ones to copy. */
static void sources_sync(ps_repl_t *r, primary_t *p) {
    char(*names)[PS_TABLE_NAME_MAX] = pc_scalloc(PC_MEM_SCRATCH, MAX_TABLES, PS_TABLE_NAME_MAX);
    const size_t nt = names ? ps_catalog_list(r->cat, names, MAX_TABLES) : 0;
    if (nt > MAX_TABLES)
        PC_WARN("replication: %zu tables: only the first %u are replicated", nt, MAX_TABLES);
    /* a table dropped here goes (its source's copy would never end: no catch-up, and a mark this
     * server set would stay); made again, it is a new source */
    for (size_t j = 0; names && nt <= MAX_TABLES && j < p->nsrc;) {
        size_t k = 0;
        while (k < nt && strcmp(p->src[j].table, names[k]))
            k++;
        if (k < nt) {
            j++;
            continue;
        }
        copy_end(&p->src[j]);
        p->src[j] = p->src[--p->nsrc];
    }
    for (size_t k = 0; k < nt && k < MAX_TABLES; k++) {
        size_t j = 0;
        while (j < p->nsrc && strcmp(p->src[j].table, names[k]))
            j++;
        if (j < p->nsrc || p->nsrc == MAX_TABLES)
            continue;
        source_t *s = &p->src[p->nsrc++];
        memset(s, 0, sizeof *s);
        snprintf(s->table, sizeof s->table, "%s", names[k]);
        s->need_copy = true;
    }
    pc_sfree(names);
}

/* After primaries_sync: when the slots this server gained of a primary are only those it handed
 * to it (r->hb, see DESIGN), its tables follow that primary's log from the places noted before
 * the handover instead of being copied: these rows are here already. The first map from the
 * handover's version on uses the places or drops them. */
static void handback_use(ps_repl_t *r, const pc_cluster_map_t *m, const pc_cluster_map_t *old) {
    pthread_mutex_lock(&r->mu);
    const uint32_t to = r->hb_to, me = r->o.self;
    bool ok = r->hb_ver && r->hb_ver <= pc_cmap_version(m) && to < pc_cmap_nservers(m), any = false;
    for (uint32_t s = 0; ok && s < PC_NSLOTS; s++) {
        const bool gained = backs_up(m, me, to, s) && !(old && backs_up(old, me, to, s));
        ok = !gained || pc_slots_has(r->hb_slots, s);
        any = any || gained;
    }
    primary_t *p = NULL;
    for (size_t i = 0; ok && any && i < r->nprim; i++)
        p = r->prim[i].server == to ? &r->prim[i] : p;
    for (size_t k = 0; p && k < p->nsrc; k++) {
        source_t *src = &p->src[k];
        size_t h = 0;
        while (h < r->nhb && strcmp(r->hb[h].table, src->table))
            h++;
        const bool fresh = !src->following && !src->uid && !src->cp.on;
        if (h == r->nhb || !src->gain_only ||
            (!fresh && !(src->following && src->uid == r->hb[h].uid)))
            continue; /* no place noted, a copy owed from before, another table: copied */
        copy_end(src);
        src->pos = fresh || src->pos > r->hb[h].pos ? r->hb[h].pos : src->pos;
        src->uid = r->hb[h].uid;
        src->following = true;
        src->need_copy = false;
        src->reached = src->caught = false;
        PC_INFO("replication: table %s of %s: following its log from where it stood before this "
                "server handed it the slots (no copy)",
                src->table, pc_cmap_addr(m, to));
    }
    if (r->hb_ver && r->hb_ver <= pc_cmap_version(m))
        r->hb_ver = 0; /* the first map from the handover's on decides: used or not, once */
    pthread_mutex_unlock(&r->mu);
}

/* Set up the primaries this server backs up under m, from `old` (the previous map, or NULL):
 * a primary of which this server gained slots copies its tables again. */
static void primaries_sync(ps_repl_t *r, const pc_cluster_map_t *m, const pc_cluster_map_t *old) {
    const uint32_t n = (uint32_t)pc_cmap_nservers(m), me = r->o.self;
    bool want[PC_MAX_SERVERS] = {false}, gained[PC_MAX_SERVERS] = {false};
    for (uint32_t s = 0; s < PC_NSLOTS; s++) {
        if (!pc_cmap_is_backup(m, s, me))
            continue;
        const uint32_t p = pc_cmap_slot_owner(m, s);
        want[p] = true;
        if (!old || !backs_up(old, me, p, s))
            gained[p] = true;
    }
    for (size_t i = 0; i < r->nprim;) { /* drop primaries no longer backed up */
        primary_t *p = &r->prim[i];
        if (p->server < n && want[p->server]) {
            want[p->server] = false;
            for (size_t k = 0; k < p->nsrc; k++) {
                source_t *src = &p->src[k];
                src->gain_only = gained[p->server] && !src->need_copy && !src->cp.on;
                src->need_copy = src->need_copy || gained[p->server];
            }
            i++;
            continue;
        }
        PC_INFO("replication: no longer a backup of %s", pc_cmap_addr(m, p->server));
        for (size_t k = 0; k < p->nsrc; k++)
            copy_end(&p->src[k]);
        psc_close(p->c);
        r->prim[i] = r->prim[--r->nprim];
    }
    for (uint32_t s = 0; s < n; s++) {
        if (!want[s])
            continue;
        primary_t *np = pc_srealloc(PC_MEM_OTHER, r->prim, (r->nprim + 1) * sizeof *np);
        if (!np)
            break;
        r->prim = np;
        primary_t *p = &r->prim[r->nprim++];
        memset(p, 0, sizeof *p);
        p->server = s;
        sources_sync(r, p);
        for (size_t k = 0; k < p->nsrc; k++)
            p->src[k].gain_only = true; /* its copies are owed for this gain alone */
        PC_INFO("replication: backing up %s (%zu tables)", pc_cmap_addr(m, s), p->nsrc);
    }
    handback_use(r, m, old);
}

/* A client of one server; its calls and connect bounded by limit_ms (0: 5 s and 2 s). */
static int connect_server(ps_repl_t *r, const char *addr, int limit_ms, char *why, size_t cap,
                          psc_t **out) {
    psc_opts_t po = {.servers = addr,
                     .token = r->token[0] ? r->token : NULL,
                     .timeout_ms = limit_ms ? limit_ms : 5000,
                     .retries = -1,
                     .connect_timeout_ms = limit_ms ? limit_ms : 2000};
    psc_tls_opts_t tls = {
        .ca = r->ca, .cert = r->cert[0] ? r->cert : NULL, .key = r->key[0] ? r->key : NULL};
    return psc_connect2(&po, r->ca[0] ? &tls : NULL, why, cap, out);
}

/* Primary p did not answer: close, and connect again after a backoff. */
static void primary_down(primary_t *p) {
    psc_close(p->c);
    p->c = NULL;
    p->backoff_ms = p->backoff_ms ? (p->backoff_ms * 2 > 2000 ? 2000 : p->backoff_ms * 2) : 100;
    p->retry_ns = pc_time_mono_ns() + p->backoff_ms * 1000000ull;
}

static void *fol_main(void *arg) {
    ps_repl_t *r = arg;
    bufs_t b = {0};
    uint64_t idle_us = 200;
    pc_cluster_map_t *m = NULL;
    while (!atomic_load(&r->stop)) {
        pc_cluster_map_t *nm = map_if_new(r, m ? pc_cmap_version(m) : 0);
        if (nm) {
            primaries_sync(r, nm, m);
            pc_cmap_destroy(m);
            m = nm;
        }
        if (m)
            regain_released(r, m);
        if (!m) {
            pc_time_sleep_ms(50);
            continue;
        }
        const uint64_t now = pc_time_mono_ns();
        const bool relist = now - r->tables_ns > TABLES_NS;
        if (relist)
            r->tables_ns = now;
        long applied = 0;
        for (size_t i = 0; i < r->nprim && !atomic_load(&r->stop); i++) {
            primary_t *p = &r->prim[i];
            char why[320];
            if (relist)
                sources_sync(r, p);
            if (atomic_load(&r->suspect[p->server]) || (!p->c && now < p->retry_ns))
                continue; /* being replaced, or down: the controller acts on its lease */
            if (!p->c && connect_server(r, pc_cmap_addr(m, p->server), 0, why, sizeof why, &p->c)) {
                primary_down(p);
                continue;
            }
            const long got = follow_round(r, p, m, &b);
            if (got < 0 && got != PC_ESTATE)
                primary_down(p); /* the position and the copy stay: resumed when it answers */
            else if (got > 0)
                applied += got;
            if (got >= 0)
                p->backoff_ms = 0;
        }
        if (applied) {
            idle_us = 200;
        } else {
            pc_time_sleep_us(idle_us);
            idle_us = idle_us * 2 > 2000 ? 2000 : idle_us * 2;
        }
    }
    for (size_t i = 0; i < r->nprim; i++) {
        for (size_t k = 0; k < r->prim[i].nsrc; k++)
            copy_end(&r->prim[i].src[k]);
        psc_close(r->prim[i].c);
    }
    pc_sfree(r->prim);
    r->prim = NULL;
    r->nprim = 0;
    pc_cmap_destroy(m);
    bufs_free(&b);
    return NULL;
}

/* ==== life ================================================================================= */

/* This server's run record (ps_mapstore.h): whether it starts with older rows than its last run
 * ended with, then `running` from now on. Tried at start and then every tick until the
 * coordinator answers (no confirm, so no push, before); the record is read once (a retried
 * write must not read its own `running`). */
static void run_begin(ps_repl_t *r) {
    bool went_back = false;
    int rc = 0;
    if (!r->record_read && !(rc = ps_mapstore_run_read(&r->store, r->self_addr, r->o.restored,
                                                       &went_back, r->prev, sizeof r->prev))) {
        r->record_read = true;
        if (went_back && r->o.restore_chosen && !strcmp(r->prev, "running"))
            PC_WARN("replication: --restore-id=%llu after a run that did not stop cleanly: "
                    "counted as a job restarted from a coordinated checkpoint (no slot counted "
                    "unclean); a supervisor that restarts this server should not pass "
                    "--restore-id",
                    (unsigned long long)r->o.restored);
        r->went_back = went_back && !r->o.restore_chosen;
        if (r->went_back) { /* the slots held alone now: a backup may copy the older rows later */
            pc_cluster_map_t *m = map_copy(r);
            r->alone_known = m && find_alone(r, m);
            pc_cmap_destroy(m);
            PC_WARN("replication: this server's last run did not end at the rows it starts with "
                    "(it starts from checkpoint %llu, 0: empty tables; last run: %s): the slots "
                    "it alone holds count as unclean",
                    (unsigned long long)r->o.restored, r->prev);
        }
    }
    if (!rc && !(rc = ps_mapstore_run_start(&r->store, r->self_addr)))
        r->recorded = true;
    if (rc && !r->record_warned) {
        PC_WARN("replication: cannot read or write this server's run record in the coordinator "
                "(%s): it takes no push until it can",
                pc_strerror(rc));
        r->record_warned = true;
    }
}

static void repl_free(ps_repl_t *r) {
    pc_cmap_destroy(r->map);
    pc_cmap_destroy(r->target);
    pc_cmap_destroy(r->released_map);
    pc_sfree(r->seen);
    pc_sfree(r->suspect);
    pc_sfree(r->falls);
    pc_sfree(r->falls_noted);
    pc_sfree(r->caught_ver);
    pc_sfree(r->caught_gen);
    pthread_mutex_destroy(&r->mu);
    pc_sfree(r);
}

/* What ps_repl_record_end needs of r (its threads stopped). */
static void fill_end(const ps_repl_t *r, ps_repl_end_t *end) {
    memset(end, 0, sizeof *end);
    if (!r->recorded)
        return;
    end->store = r->store;
    end->recorded = true;
    end->pending = r->went_back;
    ps_dp_stats_t st; /* fenced until a lease was confirmed: a push means it was */
    ps_dp_stats(r->dp, &st);
    end->took_pushes = st.rows_pushed > 0;
    end->restored = r->o.restored;
    snprintf(end->addr, sizeof end->addr, "%s", r->self_addr);
    snprintf(end->prev, sizeof end->prev, "%s", r->prev);
}

/* A stop was asked while the server starts (ps_repl_opts_t.stopped). */
static bool stop_asked(const ps_repl_opts_t *o) {
    return o->stopped && o->stopped();
}

int ps_repl_start(const ps_coord_store_t *store, ps_catalog_t *cat, ps_dp_t *dp,
                  const pc_cluster_map_t *initial, const ps_repl_opts_t *o, ps_repl_t **out) {
    if (!store || !cat || !dp || !initial || !o || !out || o->replicas > PC_MAX_BACKUPS ||
        o->lease_ms < 200 || o->self >= pc_cmap_nservers(initial))
        return PC_EINVAL;
    ps_repl_t *r = pc_scalloc(PC_MEM_OTHER, 1, sizeof *r);
    if (!r)
        return PC_ENOMEM;
    r->store = *store;
    r->cat = cat;
    r->dp = dp;
    r->o = *o;
    snprintf(r->token, sizeof r->token, "%s", o->token ? o->token : "");
    snprintf(r->ca, sizeof r->ca, "%s", o->tls_ca ? o->tls_ca : "");
    snprintf(r->cert, sizeof r->cert, "%s", o->tls_cert ? o->tls_cert : "");
    snprintf(r->key, sizeof r->key, "%s", o->tls_key ? o->tls_key : "");
    snprintf(r->self_addr, sizeof r->self_addr, "%s", pc_cmap_addr(initial, o->self));
    r->start_ns = pc_time_mono_ns();
    r->seen = pc_scalloc(PC_MEM_OTHER, PC_MAX_SERVERS, sizeof *r->seen);
    r->suspect = pc_scalloc(PC_MEM_OTHER, PC_MAX_SERVERS, sizeof *r->suspect);
    r->falls = pc_scalloc(PC_MEM_OTHER, PC_MAX_SERVERS, sizeof *r->falls);
    r->falls_noted = pc_scalloc(PC_MEM_OTHER, PC_MAX_SERVERS, sizeof *r->falls_noted);
    r->caught_ver = pc_scalloc(PC_MEM_OTHER, PC_MAX_SERVERS, sizeof *r->caught_ver);
    r->caught_gen = pc_scalloc(PC_MEM_OTHER, PC_MAX_SERVERS, sizeof *r->caught_gen);
    pthread_mutex_init(&r->mu, NULL);
    r->lapsed = true; /* pushes once this server is confirmed (or is no primary) */
    ps_dp_set_write_until(dp, 0);
    /* The first map: the coordinator's newest, or the configured one (with `replicas` backups
     * per slot) written if absent and read back, whoever won. */
    pc_cluster_map_t *mine = NULL;
    int rc = r->seen && r->suspect && r->falls && r->falls_noted && r->caught_ver && r->caught_gen
                 ? pc_cmap_copy(initial, &mine)
                 : PC_ENOMEM;
    if (!rc && o->replicas && !pc_cmap_replicated(mine)) {
        if (pc_cmap_nservers(mine) > o->replicas)
            rc = pc_cmap_set_replicas(mine, o->replicas);
        else
            PC_WARN("replication: %zu servers cannot give every slot %u backups: none",
                    pc_cmap_nservers(mine), o->replicas);
    }
    enum { MAP_TRIES = 20 }; /* (ps_repl.h) */
    for (int attempt = 0; !rc && !current(r) && attempt < MAP_TRIES && !stop_asked(o); attempt++) {
        pc_cluster_map_t *m;
        int lr = ps_mapstore_newest(&r->store, 0, pc_cmap_version(mine), &m);
        if (!lr && !m && (lr = ps_mapstore_put(&r->store, mine)) == PC_EEXIST)
            lr = 0;
        if (!lr && m)
            lr = adopt(r, m); /* (its error: the same wait, then the same version again) */
        if (lr) {
            if (!attempt)
                PC_WARN("replication: no cluster map from the coordinator (%s): %d more tries, "
                        "%u ms apart",
                        pc_strerror(lr), MAP_TRIES - 1, o->lease_ms / 4);
            /* in steps: a stop asked meanwhile does not wait out a quarter lease (minutes) */
            for (uint32_t slept = 0;
                 attempt + 1 < MAP_TRIES && slept < o->lease_ms / 4 && !stop_asked(o); slept += 50)
                pc_time_sleep_ms(50);
        }
    }
    pc_cmap_destroy(mine);
    if (!rc && stop_asked(o) && !current(r)) {
        rc = PC_ECANCELED; /* before run_begin: no run record written */
    } else if (!rc && !current(r)) {
        PC_ERROR("replication: the coordinator gave no cluster map");
        rc = PC_EUNAVAIL;
    }
    if (!rc)
        run_begin(r);
    if (!rc && pthread_create(&r->ctl, NULL, ctl_main, r)) {
        rc = PC_ESYS;
    } else if (!rc && pthread_create(&r->fol, NULL, fol_main, r)) {
        atomic_store(&r->stop, true);
        pthread_join(r->ctl, NULL);
        rc = PC_ESYS;
    }
    if (rc) {
        ps_repl_end_t end; /* the record as it was */
        fill_end(r, &end);
        ps_repl_record_end(&end, false, 0);
        repl_free(r);
        return rc;
    }
    *out = r;
    return 0;
}

void ps_repl_stop(ps_repl_t *r, ps_repl_end_t *end) {
    if (end)
        memset(end, 0, sizeof *end);
    if (!r)
        return;
    atomic_store(&r->stop, true);
    pthread_join(r->ctl, NULL);
    pthread_join(r->fol, NULL);
    if (end)
        fill_end(r, end);
    repl_free(r);
}

void ps_repl_record_end(const ps_repl_end_t *end, bool served, uint64_t ckpt) {
    if (!end->recorded)
        return;
    if (end->pending) { /* the record stays `running`: the next start counts them */
        PC_WARN("replication: this server stops before the map counted the slots it held alone "
                "with older rows: its next start counts them");
        return;
    }
    int rc;
    if (served) /* its rows: the checkpoint written last, if any */
        rc = ps_mapstore_run_end(&end->store, end->addr, ckpt != 0, ckpt);
    else if (end->took_pushes) /* a start that failed late: pushes in no checkpoint */
        rc = ps_mapstore_run_end(&end->store, end->addr, false, 0);
    else if (strcmp(end->prev, "none")) /* a start that failed: the record as it was */
        rc = ps_mapstore_run_restore(&end->store, end->addr, end->prev);
    else /* the first run, failed at its start: its rows are still those it started with */
        rc = ps_mapstore_run_end(&end->store, end->addr, true, end->restored);
    if (rc)
        PC_WARN("replication: cannot record this server's stop in the coordinator (%s): its "
                "next start counts the slots it holds alone as unclean",
                pc_strerror(rc));
}

/* emberps_replication_behind_primaries, at each scrape: the primaries this server backs up under
 * the current map that a failover written now would count unclean (the map marks this server
 * catching up on their slots, or behind_now). */
static uint64_t behind_primaries(ps_repl_t *r) {
    bool prim[PC_MAX_SERVERS] = {false}, marked[PC_MAX_SERVERS] = {false};
    const uint32_t me = r->o.self;
    uint32_t n = 0;
    pthread_mutex_lock(&r->mu);
    if (r->map) {
        n = (uint32_t)pc_cmap_nservers(r->map);
        for (uint32_t s = 0; s < PC_NSLOTS; s++)
            if (pc_cmap_is_backup(r->map, s, me)) {
                const uint32_t p = pc_cmap_slot_owner(r->map, s);
                prim[p] = true;
                marked[p] = marked[p] || pc_cmap_backup_syncing(r->map, s, me);
            }
    }
    /* under the mutex too: a marked map adopted after the look above (and its falls noted)
     * would otherwise hide the fall from both */
    uint64_t behind = 0;
    for (uint32_t p = 0; p < n; p++)
        behind += prim[p] && (marked[p] || behind_now(r, p));
    pthread_mutex_unlock(&r->mu);
    return behind;
}

size_t ps_repl_render_metrics(ps_repl_t *r, char *buf, size_t cap, size_t len) {
    return pc_prom_appendf(
        buf, cap, len,
        "# TYPE emberps_replication_map_version gauge\n"
        "emberps_replication_map_version %llu\n"
        "# TYPE emberps_replication_map_unclean_slots gauge\n"
        "emberps_replication_map_unclean_slots %llu\n"
        "# TYPE emberps_replication_promotions_total counter\n"
        "emberps_replication_promotions_total %llu\n"
        "# TYPE emberps_replication_unclean_promoted_slots_total counter\n"
        "emberps_replication_unclean_promoted_slots_total %llu\n"
        "# TYPE emberps_replication_restart_unclean_slots_total counter\n"
        "emberps_replication_restart_unclean_slots_total %llu\n"
        "# TYPE emberps_replication_caught_up_total counter\n"
        "emberps_replication_caught_up_total %llu\n"
        "# TYPE emberps_replication_fell_behind_total counter\n"
        "emberps_replication_fell_behind_total %llu\n"
        "# TYPE emberps_replication_behind_primaries gauge\n"
        "emberps_replication_behind_primaries %llu\n"
        "# TYPE emberps_replication_backups_dropped_total counter\n"
        "emberps_replication_backups_dropped_total %llu\n"
        "# TYPE emberps_replication_rejoins_total counter\n"
        "emberps_replication_rejoins_total %llu\n"
        "# TYPE emberps_replication_lease_lapses_total counter\n"
        "emberps_replication_lease_lapses_total %llu\n"
        "# TYPE emberps_replication_copies_total counter\n"
        "emberps_replication_copies_total %llu\n"
        "# TYPE emberps_replication_rows_total counter\n"
        "emberps_replication_rows_total{how=\"copied\"} %llu\n"
        "emberps_replication_rows_total{how=\"applied\"} %llu\n"
        "# TYPE emberps_resharding_handovers_total counter\n"
        "emberps_resharding_handovers_total %llu\n"
        "# TYPE emberps_resharding_rows_released_total counter\n"
        "emberps_resharding_rows_released_total %llu\n",
        (unsigned long long)current(r), (unsigned long long)atomic_load(&r->map_unclean),
        (unsigned long long)atomic_load(&r->promotions),
        (unsigned long long)atomic_load(&r->unclean),
        (unsigned long long)atomic_load(&r->restart_unclean),
        (unsigned long long)atomic_load(&r->synced),
        (unsigned long long)atomic_load(&r->fell_behind), (unsigned long long)behind_primaries(r),
        (unsigned long long)atomic_load(&r->drops), (unsigned long long)atomic_load(&r->rejoins),
        (unsigned long long)atomic_load(&r->lapses), (unsigned long long)atomic_load(&r->copies),
        (unsigned long long)atomic_load(&r->rows_copied),
        (unsigned long long)atomic_load(&r->rows_streamed),
        (unsigned long long)atomic_load(&r->handovers),
        (unsigned long long)atomic_load(&r->released));
}
