/* pc_cluster.h: key -> slot -> server mapping shared by every EmberPS component.
 *
 * A key belongs to one of PC_NSLOTS hash slots forever (pc_key_slot). Slots, not keys, are
 * assigned to servers by a versioned cluster map, so a shard can move between servers by
 * reassigning slot ranges without rehashing a single key (the Redis Cluster scheme). Every map
 * change produces a new, strictly larger version; servers refuse keys of slots they do not own
 * and report their version, clients refresh stale maps.
 *
 * Text form (config files, flags, logs), one line:
 *   version=3;servers=127.0.0.1:7000,127.0.0.1:7001;slots=0-8191:0,8192-16383:1
 * Every slot must be assigned exactly once; server indexes refer to the servers list.
 *
 * Replicas (docs/server.md "Replicas and failover"): a slot may also name up to PC_MAX_BACKUPS
 * backups after its primary, in promotion order: `0-8191:0/1,8192-16383:1/0` (server 1 backs up
 * server 0's slots and server 0 server 1's). Only the primary serves a slot; a backup holds a copy
 * of its rows, kept by following the primary's delta stream. A backup differs from the primary
 * and from the slot's other backups.
 *
 * In sync (docs/server.md "Which backup is promoted"): a backup added to a running primary (a
 * server rejoining, a resharding step), and every backup of a slot whose primary changed (a
 * failover, a handover: they followed the old one), is marked `~` until it has copied the
 * primary's tables and caught up with its stream: `0-8191:0/1~`. The backup clears its own mark in
 * a new version once it holds every row the primary acknowledged. Promotion prefers an unmarked
 * backup; marks are no part of a slot's roles (pc_cmap_slot_same).
 *
 * Losses: a slot promoted to a backup still catching up (no backup in sync was left) may have
 * lost rows, and so has a slot whose only holder restarted from an older state (ps_repl.h); the
 * map counts such slots, over its whole history, in an `unclean=N` field after the version
 * (absent while 0): `version=9;unclean=8192;servers=...`. Versions carry the count on, so a
 * client that sees it grow knows rows went back (docs/server.md "Which backup is promoted").
 *
 * Thread rule: a map is immutable once built except through pc_cmap_assign (single owner);
 * readers share one map freely. Replace a map by building a new one (copy + assign).
 */
#ifndef PC_CLUSTER_H
#define PC_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "pc_hash.h"

#define PC_NSLOTS      16384u
#define PC_MAX_SERVERS 1024u
#define PC_ADDR_MAX    128u
#define PC_MAX_BACKUPS 2u
#define PC_NO_SERVER   0xffffu /* no backup in that place */

typedef struct pc_cluster_map pc_cluster_map_t;

/* The slot of a key: a fixed function of the key, independent of any map. */
static inline uint32_t pc_key_slot(uint64_t key) {
    return (uint32_t)(pc_hash_u64(key, PC_HASH_SEED_SLOT) & (PC_NSLOTS - 1));
}

/* Build a map of `n` servers (addresses copied) owning equal contiguous slot ranges. */
int pc_cmap_create_even(uint64_t version, size_t n, const char *const *addrs,
                        pc_cluster_map_t **out);

/* Parse the text form. PC_EPARSE with a message in err on any defect. */
int pc_cmap_parse(const char *text, pc_cluster_map_t **out, char *err, size_t errlen);

/* Write the text form into buf (NUL-terminated when cap > 0). Returns the length the full text
 * needs (excluding NUL), like snprintf; slot ranges are merged where contiguous. */
size_t pc_cmap_format(const pc_cluster_map_t *m, char *buf, size_t cap);

int pc_cmap_copy(const pc_cluster_map_t *m, pc_cluster_map_t **out);
void pc_cmap_destroy(pc_cluster_map_t *m);

uint64_t pc_cmap_version(const pc_cluster_map_t *m);
/* Slots promoted to a backup that had not caught up, over the map's history (see Losses;
 * saturates at UINT64_MAX). */
uint64_t pc_cmap_unclean(const pc_cluster_map_t *m);
/* Raise that count to at least n: a map given anew (a file reloaded) goes on from the count of
 * the history it joins, so the count never goes back. */
void pc_cmap_unclean_at_least(pc_cluster_map_t *m, uint64_t n);
/* Add n slots to that count (saturating). */
void pc_cmap_unclean_add(pc_cluster_map_t *m, uint64_t n);
size_t pc_cmap_nservers(const pc_cluster_map_t *m);
/* Address of server i; valid as long as the map. NULL when i is out of range. */
const char *pc_cmap_addr(const pc_cluster_map_t *m, size_t i);
/* Server index for an address, or PC_ENOTFOUND. */
int pc_cmap_find(const pc_cluster_map_t *m, const char *addr);

/* Owner (server index) of a slot; slot must be < PC_NSLOTS. */
uint32_t pc_cmap_slot_owner(const pc_cluster_map_t *m, uint32_t slot);

static inline uint32_t pc_cmap_key_owner(const pc_cluster_map_t *m, uint64_t key) {
    return pc_cmap_slot_owner(m, pc_key_slot(key));
}

/* Number of slots a server owns. */
uint32_t pc_cmap_server_slots(const pc_cluster_map_t *m, uint32_t server);

/* Reassign slots [lo, hi] to `server` and set the version to `new_version`, which must be larger
 * than the current one. */
int pc_cmap_assign(pc_cluster_map_t *m, uint32_t lo, uint32_t hi, uint32_t server,
                   uint64_t new_version);

/* The backups of a slot, in promotion order, into out[0..PC_MAX_BACKUPS); returns how many. */
uint32_t pc_cmap_slot_backups(const pc_cluster_map_t *m, uint32_t slot,
                              uint32_t out[PC_MAX_BACKUPS]);

/* Whether `server` is a backup of `slot`. */
bool pc_cmap_is_backup(const pc_cluster_map_t *m, uint32_t slot, uint32_t server);

/* Whether any slot has a backup. */
bool pc_cmap_replicated(const pc_cluster_map_t *m);
/* A job without replicas: no slot has a backup and every server listed has a role. A server
 * lost there means a job rollback (docs/training.md); anywhere else its slots go to a backup,
 * and rows that go back are counted in the map (Losses). */
bool pc_cmap_unreplicated(const pc_cluster_map_t *m);

/* Sets of slots as bits: PC_NSLOTS / 64 words. */
static inline void pc_slots_add(uint64_t *bits, uint32_t slot) {
    bits[slot / 64] |= 1ull << (slot % 64);
}
static inline bool pc_slots_has(const uint64_t *bits, uint32_t slot) {
    return bits[slot / 64] >> (slot % 64) & 1;
}
/* The slots `primary` owns under m that `backup` backs up (PC_NO_SERVER: all it owns), into
 * bits[PC_NSLOTS / 64] (cleared first). */
void pc_cmap_backed_up(const pc_cluster_map_t *m, uint32_t primary, uint32_t backup,
                       uint64_t *bits);

/* Give every slot `r` (0..PC_MAX_BACKUPS, < the number of servers) backups: the servers after its
 * primary in the servers list, round the ring (r = 0 removes them). The version is unchanged (a
 * map being built). PC_EINVAL. */
int pc_cmap_set_replicas(pc_cluster_map_t *m, uint32_t r);

/* Whether `server` is a backup of `slot` still marked as catching up (`~`). */
bool pc_cmap_backup_syncing(const pc_cluster_map_t *m, uint32_t slot, uint32_t server);

/* Set (`syncing`) or clear the mark of backup `server` on every slot `primary` owns (version
 * unchanged); returns how many slots changed. */
uint32_t pc_cmap_set_syncing(pc_cluster_map_t *m, uint32_t primary, uint32_t server, bool syncing);

/* What pc_cmap_fail_server did, in slots. */
typedef struct pc_cmap_failover {
    uint32_t promoted; /* changed primary */
    uint32_t unclean;  /* ... of those, to a backup still catching up: rows may be missing */
    uint32_t orphaned; /* had no backup: their rows are lost */
} pc_cmap_failover_t;

/* The map after server `dead` is lost: each slot it was primary of gets as primary its first
 * backup in sync, else its first backup (unclean: added to the map's count), its other backups
 * marked catching up (they followed `dead`, not the new primary), and `dead` leaves every
 * backup list. Version new_version (> the current). */
int pc_cmap_fail_server(pc_cluster_map_t *m, uint32_t dead, uint64_t new_version,
                        pc_cmap_failover_t *out);

/* Add `server`, marked catching up, as the last backup of each slot with fewer than `r` backups
 * where it is neither primary nor backup yet; version new_version when anything changed
 * (*added: slots). */
int pc_cmap_add_backup(pc_cluster_map_t *m, uint32_t server, uint32_t r, uint64_t new_version,
                       uint32_t *added);

/* Set the version alone (> the current): a map confirmed again unchanged. */
int pc_cmap_bump(pc_cluster_map_t *m, uint64_t new_version);

/* ---- live resharding (docs/server.md "Live resharding") ----
 * A target map names the roles every slot should end with; the primaries move their slots there
 * step by step (ps_repl.h). Server indexes never change: a server is appended, and one removed
 * stays listed with no role. */

/* Append server addr (no role yet) and set the version: PC_EEXIST when listed, PC_EINVAL. */
int pc_cmap_add_server(pc_cluster_map_t *m, const char *addr, uint64_t new_version);

/* Whether slot has the same primary and backups, in order, in a and b (servers by index). */
bool pc_cmap_slot_same(const pc_cluster_map_t *a, const pc_cluster_map_t *b, uint32_t slot);

/* Whether every slot has the same roles in a and b (pc_cmap_slot_same; marks, versions and
 * servers listed without a role aside). */
bool pc_cmap_roles_same(const pc_cluster_map_t *a, const pc_cluster_map_t *b);

/* Give slot the primary and backups it has in `from` (version unchanged): PC_EINVAL when they
 * are not servers of m. Marks as pc_cmap_set_backups when the primary stays; when it changes (a
 * handover) every backup, the old primary included, is marked catching up: none follows the new
 * primary yet, whose pushes do not wait for it until it has. */
int pc_cmap_take_slot(pc_cluster_map_t *m, const pc_cluster_map_t *from, uint32_t slot);

/* Set slot's backups to b[0..n) (distinct, not its primary, servers of m; version unchanged).
 * One that was a backup keeps its mark; one new to the slot is marked catching up. */
int pc_cmap_set_backups(pc_cluster_map_t *m, uint32_t slot, const uint32_t *b, uint32_t n);

/* Whether server has a role (primary or backup of some slot). */
bool pc_cmap_has_role(const pc_cluster_map_t *m, uint32_t server);

/* Target layouts, with the version of m. Add: `server` (listed, with no role) takes about 1 / (k +
 * 1) of the slots of each of the k servers with slots (the last ones of each), keeping their old
 * primary as first backup; backups per slot stay as many as m has (at most PC_MAX_BACKUPS).
 * Remove: `server`'s slots go to their first backup (else to the server with the fewest slots),
 * and every backup list it was on takes another server instead (the one with the fewest backups
 * among those with a role); PC_EINVAL when it is the only server with a role. */
int pc_cmap_plan_add(const pc_cluster_map_t *m, uint32_t server, pc_cluster_map_t **out);
int pc_cmap_plan_remove(const pc_cluster_map_t *m, uint32_t server, pc_cluster_map_t **out);

#endif
