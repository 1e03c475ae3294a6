/* ps_changelog.h: a table's change log, the source of the delta stream (docs/wire.md, "The
 * delta stream": DELTAS and SCAN).
 *
 * Every change to a table's rows appends the changed keys: rows pushed, loaded, erased or
 * evicted. Entries are numbered by a position that only grows; a ring of `capacity` entries
 * keeps the newest, so the memory is bounded (8 bytes an entry) and a reader that fell more than
 * `capacity` entries behind is told so (PC_ERANGE) and must start again from a full scan.
 *
 * DESIGN: the log holds keys, not rows or operations. A reader sends each key with its row as
 * the table holds it when the key is read (or "absent"), so a key changed many times since a
 * position goes out once with its latest state, and erasures need no separate record. Writers
 * append after the change is applied (a reader that meets the key sees the change), readers take
 * keys in position order. One mutex: writers take it once per call (a push of n keys appends n
 * entries in one copy), readers for the copy of at most `max` keys, so a slow subscriber holds
 * it no longer than that and never slows training further.
 *
 * A log starts at a base position (ps_changelog_create): a log started after its table already
 * held rows (lazily, when the first follower asked: ps_table_changelog_start) begins at a base
 * no earlier position of that table can reach (the wall clock in nanoseconds), so a position
 * given out before the log existed, or by an earlier log of a table of the same name, is older
 * than its oldest and refused (PC_ERANGE) instead of silently skipping the changes the log never
 * saw. Position 0 is therefore never inside a lazily started log.
 *
 * Thread rule: thread-safe.
 */
#ifndef PS_CHANGELOG_H
#define PS_CHANGELOG_H

#include <stddef.h>
#include <stdint.h>

typedef struct ps_changelog ps_changelog_t;

/* A log keeping the newest `capacity` (>= 1) entries, whose first entry gets position `base`
 * (head = oldest = base until the first append; base <= UINT64_MAX / 2). PC_EINVAL, PC_ENOMEM. */
int ps_changelog_create(size_t capacity, uint64_t base, ps_changelog_t **out);
void ps_changelog_destroy(ps_changelog_t *l);

/* Append keys[0..n) (positions head .. head + n - 1). */
void ps_changelog_append(ps_changelog_t *l, const uint64_t *keys, size_t n);

/* The next position (base + entries so far) and the oldest one still held. */
void ps_changelog_bounds(ps_changelog_t *l, uint64_t *oldest, uint64_t *head);

/* Copy the keys at positions from .. from + *n - 1 into keys (*n <= max: up to the head);
 * *oldest and *head (may be NULL) get the bounds at the copy. PC_ERANGE (nothing copied) when
 * `from` is older than the oldest entry held or beyond the head. */
int ps_changelog_read(ps_changelog_t *l, uint64_t from, size_t max, uint64_t *keys, size_t *n,
                      uint64_t *oldest, uint64_t *head);

#endif
