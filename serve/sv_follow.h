/* sv_follow.h: keeps a serving replica (sv_sparse.h) up to date from the training servers'
 * delta streams (docs/wire.md "The delta stream"; docs/serving.md "The replica and its
 * follower").
 *
 * One follower thread per training server (each with its own libpsclient connection to that
 * server only, so a server that is down delays no other) follows every table of the replica on
 * that server. A source is one (server, table): the table's uid it follows and the position of
 * the server's change log up to which its rows are applied. A source starts from a given
 * position (a loaded checkpoint's uid and log position: sv_follow_create's `starts`) or, without
 * one, by a scan. Then, in a loop: DELTAS from the position (up to batch_rows keys), present rows
 * loaded (weights, fresh optimizer state), absent ones erased, the position advanced; when every
 * table of the server is caught up the thread sleeps poll_ms. PC_ERANGE (fell behind the ring, or
 * a log the DELTAS itself just started) and PC_ESTATE (the table was replaced: a claim --fresh, a
 * restarted server) start a rescan: every part of the table scanned into a staging table that is
 * swapped in at the end in one step (lookups never see a half-filled table), then DELTAS from
 * the scan's position. A server that does not answer keeps its rows in the replica (served as
 * they were) and is retried with a backoff doubling to backoff_max_ms; a restarted server has a
 * new uid, so it is rescanned.
 *
 * Thread rule: sv_follow_status, sv_follow_positions and sv_follow_caught_up are thread-safe
 * and may be called while the follower runs. create/start/stop/destroy are for one owner thread.
 * sv_follow_stop returns once every follower thread has ended: at once from a wait, within
 * timeout_ms when a call to a server is in flight.
 *
 * Ownership: the follower borrows the replica (it must outlive the follower) and copies its
 * options, credentials and starts.
 */
#ifndef SV_FOLLOW_H
#define SV_FOLLOW_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_cluster.h"
#include "pc_settings.h"
#include "sv_sparse.h"

typedef struct sv_follow sv_follow_t;

/* Settings (sv_follow_settings() declares them; fill with sv_follow_opts_defaults). */
typedef struct sv_follow_opts {
    int64_t poll_ms;        /* caught up: ask again after this long (default 2) */
    int64_t batch_rows;     /* keys per DELTAS (default 4096) */
    int64_t scan_bytes;     /* a scan part's reply is sized to about this (default 16Mi) */
    int64_t timeout_ms;     /* one call to a server (default 5000); bounds sv_follow_stop */
    int64_t backoff_max_ms; /* a server down is retried after 10 ms doubling to this (1000) */
    int64_t tables_poll_ms; /* the owner (sv_serve) asks for new tables this often (5000; 0 no) */
} sv_follow_opts_t;

/* The settings table behind sv_follow_opts_t (names follow_poll_ms ... are the daemon's). */
const pc_setting_t *sv_follow_settings(size_t *n);
void sv_follow_opts_defaults(sv_follow_opts_t *o);

/* How to reach the training servers' data plane, as ps-worker passes it (all may be NULL;
 * copied by sv_follow_create and sv_follow_discover). */
typedef struct sv_follow_auth {
    const char *token;    /* the servers' shared token */
    const char *tls_ca;   /* TLS: the CA bundle (NULL or "": plain TCP) */
    const char *tls_cert; /* client certificate and key, for servers that ask for one */
    const char *tls_key;
    const char *tls_server_name; /* name the certificates carry (NULL: each server's address) */
} sv_follow_auth_t;

/* Connect to the cluster at `servers` (a map text or any server's "host:port"), and give its map
 * (psc_map_text) and every table's settings (psc_tables): what sv_sparse_create and
 * sv_sparse_add_tables take. Blocking, bounded by timeout_ms. The transport's errors; why gets
 * one line. */
int sv_follow_discover(const char *servers, const sv_follow_auth_t *auth, int timeout_ms, char *map,
                       size_t mapcap, char *tables, size_t tablescap, char *why, size_t whycap);

/* A follower of every table `s` holds (add them first), on every server of its map. starts[0..n)
 * (may be NULL with n 0): per (server, table) the uid and position to follow from (a loaded
 * checkpoint's, sv_sparse_load_checkpoints); sources without one start by a scan. Nothing runs
 * before sv_follow_start. PC_EINVAL, PC_ENOMEM. */
int sv_follow_create(sv_sparse_t *s, const sv_follow_opts_t *o, const sv_follow_auth_t *auth,
                     const sv_sparse_start_t *starts, size_t n, sv_follow_t **out);
/* Start the follower threads. PC_ESTATE when started already, PC_ESYS. */
int sv_follow_start(sv_follow_t *f);
/* Stop and join the threads (bounded: see the thread rule). The replica keeps its rows. */
void sv_follow_stop(sv_follow_t *f);
/* Stop, then free. NULL is a no-op. */
void sv_follow_destroy(sv_follow_t *f);

typedef enum {
    SV_SOURCE_STARTING,  /* not asked yet */
    SV_SOURCE_FOLLOWING, /* reading DELTAS */
    SV_SOURCE_SCANNING,  /* a scan into the staging table is under way */
    SV_SOURCE_DOWN,      /* the server did not answer, or refused (last_error): retried */
} sv_source_state_t;

/* "starting", "following", "scanning", "down". */
const char *sv_source_state_name(sv_source_state_t st);

/* One source's state. */
typedef struct sv_follow_source {
    uint32_t server;
    char addr[PC_ADDR_MAX];
    char table[PS_TABLE_NAME_MAX];
    sv_source_state_t state;
    uint64_t uid;          /* the table followed (0: none yet) */
    uint64_t position;     /* change-log position applied up to */
    uint64_t head;         /* the server's head at its last answer */
    uint64_t lag_entries;  /* head - position */
    uint64_t lag_ms;       /* since it was last caught up (0 when it is; since start before) */
    uint64_t rows_applied; /* rows loaded or erased, scans included */
    uint64_t rescans;      /* scans after the first (fell behind, table replaced) */
    uint64_t deltas_calls; /* DELTAS answered */
    int last_rc;           /* the last failure's code (0: none yet) */
    char last_error[320];  /* and its line, naming the server ("" none) */
} sv_follow_source_t;

/* Every source's state into out[0..cap), server by server, tables in name order; returns the
 * number of sources. */
size_t sv_follow_status(sv_follow_t *f, sv_follow_source_t *out, size_t cap);

/* Per server i of the map, `table`'s followed uid (0: none yet) and applied position: the sparse
 * watermark a reply can carry. Returns the number of servers (entries beyond cap not written),
 * or PC_ENOTFOUND. */
int sv_follow_positions(sv_follow_t *f, const char *table, uint64_t *uids, uint64_t *positions,
                        size_t cap);

/* Whether the replica's `table` is at least as new as the servers' state (uids[i], heads[i]) of
 * every server i < n (e.g. what a dense model was published with): for each server, either the
 * follower follows uids[i] and has applied up to heads[i] or beyond, or it followed uids[i]
 * before and has since rescanned a newer table of that server (a replaced table is never
 * followed again, so anything it holds now is newer). A uid the follower never followed is not
 * caught up (it has not reached that table yet; should a table be replaced twice within one of
 * its rescans, it never will, and the caller pairs with a newer state). uids[i] == 0: server i
 * is not asked about. A server the follower does not follow (primary of nothing in its map, or
 * beyond it) is caught up when the layout is not stale and the newest map noted lists it as
 * primary of nothing: its slots' rows, every acknowledged change included, moved to their
 * primaries before the scans that gave the replica those rows. While the layout is stale (a slot
 * moved), nothing is caught up: the moved slots' rows stay as they were until the new layout is
 * swapped in. */
bool sv_follow_caught_up(sv_follow_t *f, const char *table, const uint64_t *uids,
                         const uint64_t *heads, size_t n);

/* ---- map changes (docs/serving.md "After a map change") ----
 * A follower follows the layout of the replica's map: only servers that are primary of some
 * slot there, and its scans only while a server has that map. The servers' newer maps are noted
 * as its clients learn them. */

/* Whether the layout is stale: a map a server named gives some slot another primary than the
 * replica's, or versions were skipped on the way to it. Then *map_text (may be NULL; malloc'ed,
 * NULL when out of memory) gets the newest map noted, for a follower of the new layout. Such a
 * follower, once sv_follow_ready, replaces this one; this one goes on following meanwhile (the
 * rows of moved slots are not refreshed). Thread-safe. */
bool sv_follow_stale(sv_follow_t *f, char **map_text);
/* The sources whose rows a follower of map `version` can take over (copied, then followed from
 * the same position: sv_follow_create's starts) instead of scanning: those of servers that were
 * primary of the same slots in every map noted since this follower's (none when versions were
 * skipped, or `version` is not the newest noted), with rows of their own (scanned or started).
 * Up to cap into out; returns how many there are. Thread-safe. */
size_t sv_follow_unmoved(sv_follow_t *f, uint64_t version, sv_sparse_start_t *out, size_t cap);
/* Carry the table uids `from` (a follower being replaced) followed before, and those it follows
 * now, over to `to` (its successor over a new layout), server by address and table by name (of
 * a source `from` saw replaced after `to` started from its rows, only the uids older than `to`'s):
 * a published model's watermark naming a table that a server replaced before the new layout
 * still counts as reached (sv_follow_caught_up; the new follower started with no history, and
 * held such a model back for good). Thread-safe. */
void sv_follow_inherit(sv_follow_t *to, sv_follow_t *from);
/* The newest map noted, as text (malloc'ed; NULL when out of memory). Thread-safe. */
char *sv_follow_newest_map(sv_follow_t *f);
/* The version of the map followed. */
uint64_t sv_follow_map_version(const sv_follow_t *f);
/* Whether every table is held by every followed server's source (its rows scanned, or started
 * from a checkpoint's position) or gone (sv_follow_gone). Thread-safe. */
bool sv_follow_ready(sv_follow_t *f);
/* The tables no followed server has at the replica's dim (every source's last call answered
 * PC_ENOTFOUND or PC_EDIM: dropped on the servers, or created again with another dim): up to
 * cap names into names; returns how many there are. Thread-safe. */
size_t sv_follow_gone(sv_follow_t *f, char (*names)[PS_TABLE_NAME_MAX], size_t cap);

#endif
