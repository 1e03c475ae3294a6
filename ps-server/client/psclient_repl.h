/* psclient_repl.h: libpsclient's stream calls for a backup server (docs/server.md "Replicas and
 * failover") and a serving replica's scans (serve/sv_follow.c, under its map version). Not part
 * of the public ABI: ps-server's replication and ps-serve link the static psclient and call
 * this; outside users have psc_deltas and psc_scan.
 *
 * Thread rule: as psc_deltas.
 */
#ifndef PSCLIENT_REPL_H
#define PSCLIENT_REPL_H

#include <stdbool.h>
#include <stdint.h>

#include "emberps/psclient.h"
#include "pc_wire.h"

/* psc_scan (scan) or psc_deltas with stream flags (pc_wire.h PC_STREAM_*): PC_STREAM_STATE, rows
 * with their optimizer state (q->dim is then the table's dim + state words, the buffers sized to
 * it); PC_STREAM_ACK (DELTAS only, q->parts 0), the caller is the backup of server index
 * q->part, acknowledging every position before q->from; PC_STREAM_SAME_MAP (scan only), the
 * caller copies under map version map_version, and a server with another one answers
 * PC_EWRONGSLOT (map_version is ignored without it); PC_STREAM_BACKUP (with PC_STREAM_SAME_MAP),
 * the caller is the server of index q->from and takes only the rows of slots it backs up of
 * q->server under that map; PC_STREAM_CAUGHT (with PC_STREAM_ACK), the caller's previous reply
 * of this table reached the head: the primary's pushes wait for it from now on; PC_STREAM_COLD
 * (scan only), the caller walks a cold table's cold store too: q->part < q->parts is a part of
 * the rows in RAM (start 0), q->part == q->parts a page of the cold store's keys from `start`,
 * out->from then the next page's start (0: done). Errors as psc_deltas. */
int psc__stream(psc_t *c, bool scan, const psc_stream_req_t *q, uint32_t flags,
                uint64_t map_version, uint64_t start, psc_stream_t *out, char *why, size_t cap);

#endif
