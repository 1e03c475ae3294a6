/* ps_dataplane.c: see ps_dataplane.h.
 *
 * DESIGN
 * Input: a connection reads into a 64 KiB staging buffer and executes every complete frame in
 * it. A frame whose body does not fit in what is left gets a buffer of exactly its (checked)
 * size, and the rest of the body is read straight into it (bulk pushes are not copied through
 * the staging buffer). Bodies that start unaligned in the staging buffer are copied to an
 * aligned one first (keys are u64 arrays used in place).
 * Output: a response is one allocation {write request, header, payload} written with one
 * uv_write of two buffers; the table writes the rows straight into it. Allocations of 16 KiB and
 * more are reused: a written reply goes back to its loop's pool (at most POOL_SLOTS idle
 * allocations and POOL_KEEP bytes per loop, loop thread only, the oldest freed first) and the
 * next reply of about its size takes it. Freed to glibc instead, a 256 KB reply went back to the
 * kernel and its pages faulted in again for the next one (a fifth of the server's CPU at dim 64
 * with 8 pulls in flight). A reply counts as unsent by its allocation, pooled or not; idle
 * allocations are reply_pool_bytes. Small replies are corked: those to the frames one read
 * brought wait until the staging buffer is drained (or CORK_MAX of them, or CORK_BYTES) and go
 * out as one write, the first reply's write request carrying the others (their unsent bytes
 * counted from the moment each is made, as any reply's); a 256 KB pull reply is written at once.
 * Reply memory: a PULL or LOOKUP whose reply would exceed lim.max_reply is refused with
 * PC_ETOOBIG after decoding, before anything is looked up or allocated. Every reply counts as
 * unsent (its allocation) from uv_write until its write callback, per connection (c->unsent,
 * loop thread only) and per server (dp->unsent, atomic). Before executing a frame a connection
 * checks may_run(): its own unsent bytes under reply_queue and the server's under
 * reply_queue_total (or, over that, nothing of its own queued, while the server is under
 * 9/8 of reply_queue_total: a client that reads is served one request at a time while others
 * do not read). Push replies parked for the backups (Replication) count against their
 * connection's reply_queue with all they hold, but not against the server's total: the backups'
 * acknowledgements that release them must go on being read. Otherwise it pauses: reading stops and
 * the frames already read stay in the staging buffer (or the complete large body stays in `body`).
 * It resumes from its write callback once its queue is at most half of reply_queue, and, when it
 * waits for the server's total, from the `wake` async that any loop sends when the total falls
 * below the cap. The check comes before the frame, so a connection holds at most reply_queue plus
 * one reply, and the server at most 9/8 reply_queue_total plus one reply per event loop. Busy
 * polling (poll_us, docs/wire.md "Latency: busy polling"): a loop that read input within the last
 * poll_us runs libuv with UV_RUN_NOWAIT (epoll without a timeout), sched_yield between runs so that
 * a thread sharing the core is not starved; after poll_us without input it sleeps in epoll again
 * (UV_RUN_ONCE). `reads` counts the read callbacks that brought bytes. Bodies: a large body's
 * buffer (one that does not fit in the staging buffer) is taken from a server-wide budget,
 * `bodies` against body_total, when its header is read and given back when it is freed (executed
 * or closed). Over the budget (unless no other body is held: the largest must pass) the connection
 * pauses with the header still in its staging buffer; a release that sees `body_waiting` wakes
 * every loop, and the connection tries again as it continues. The whole body is taken at once, so
 * bodies read in part never wait on each other. Such a body must be complete within frame_ms plus
 * 1 ms per KiB of it from its header on (body_late): its buffer is the server's memory, not the
 * connection's. For the same reason a connection paused with its complete body (its replies over
 * reply_queue) is closed when none of its replies has been written for frame_ms (body_stuck): a
 * peer that stopped reading would hold its share of the budget for as long as it lived. TLS
 * (pc_tls.h, when the server has a certificate): the socket's bytes are read straight into the
 * connection's TLS session (made at accept); the plaintext it gives is read into exactly the places
 * a plain connection reads into (conn_buf: the staging buffer, a large body, the discard area) and
 * handled by the same code (conn_input). A reply is encrypted as soon as it is built (pc_tls_seal,
 * record by record into one buffer), and the ciphertext is one write whose allocation counts as
 * unsent exactly as a plain reply does; the plaintext is freed at once. A paused connection leaves
 * its undecrypted records in the session, and takes them up when it continues (tls_pump). The first
 * bytes of a connection must be a TLS ClientHello: a plaintext EmberPS frame is answered with
 * PC_ETLS in clear (the client learns why), anything else is closed with a log line. All TLS state
 * belongs to the loop's thread. Compressed rows (docs/wire.md): a batch in bf16 or f16 is converted
 * at this boundary, the table and its optimizer staying fp32. A PULL or LOOKUP gathers its rows
 * into the loop's conversion buffer (conv: loop thread only, kept between calls up to POOL_KEEP
 * bytes, so it is not faulted in again) and converts them into the reply (pc_half.h's fastest
 * kernels); a PUSH converts its gradients into that buffer and pushes from there. The reply's flags
 * say the type. Replication (docs/server.md "Replicas and failover"): a backup follows this
 * server's tables through DELTAS with PC_STREAM_ACK, and its `from` says it has applied every
 * change before it (acks: per table uid and backup). When the map names backups of this server's
 * slots, a PUSH that succeeded is not answered at once: its reply waits on its loop's `parked` list
 * with a target, the table's log head after the push less the table's replication_lag, until every
 * backup's acknowledged position reaches it. A backup counts once it has acknowledged, caught up
 * (PC_STREAM_CAUGHT: its copy done and a reply that reached the log's head), since it became one
 * (in_sync); one named by the first map this server followed holds pushes back from the start,
 * one that joined later (`joining`: a rejoin, a resharding) holds nothing back until then. An ACK
 * that moves a position, and a new map (a backup dropped or added), send `wake` to every loop,
 * which answers what is now held; a timer (running only while something is parked) answers the rest
 * PC_ETIMEDOUT after ack_timeout_ms (the push was applied here, not confirmed there). A push whose
 * keys this server no longer owns is answered 0 when their new primary (a backup before: a
 * handover) acknowledged it, else PC_ETIMEDOUT: a demoted server's map has no backups to wait for,
 * which must not read as "held". A closed or finishing connection drops its parked replies (one
 * whose peer half-closed is finished only after they are answered); a
 * stopping loop answers them PC_ETIMEDOUT (never PC_EUNAVAIL: the client would send an applied push
 * again). Waiting on the head rather than the push's own last position is safe (the head is at or
 * past it). A stream reply of a server with backups carries only keys of slots it is primary of, so
 * a backup's copy and a serving replica never take rows this server only holds as someone's backup;
 * a copy under another map version (PC_STREAM_SAME_MAP) is refused. ps_dp_set_write_until refuses
 * pushes from a deadline on (PC_EUNAVAIL: the client retries them elsewhere): the clock is read at
 * each push, so a server that was stopped past its lease refuses the pushes it meets on waking
 * before any other thread runs; `pushing` counts the pushes past that check and not yet in the
 * change log (ps_dp_pushes_idle: a handover's cut). Dead clients: every accepted connection is
 * watched by the kernel (pc_wire_watch_peer, dead_peer_ms): a peer that acknowledges nothing for
 * that long, idle or in the middle of a request, is ended as a closed connection is, and what it
 * held (a large body read in part, queued replies) is freed.
 */
#include "ps_dataplane.h"

#include "pc_alloc.h"
#include "pc_error.h"
#include "pc_half.h"
#include "pc_hash.h"
#include "pc_hist.h"
#include "pc_log.h"
#include "pc_time.h"
#include "pc_tls.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#include <uv.h>

#define STAGE_BYTES (64u << 10)
/* Reply pool (see DESIGN): replies of at least POOL_MIN bytes come from it; a loop keeps at most
 * POOL_SLOTS idle allocations and POOL_KEEP bytes of them. */
#define POOL_MIN   (16u << 10)
#define POOL_SLOTS 32
#define POOL_KEEP  (16u << 20)
/* Corked replies (see DESIGN): written together once there are CORK_MAX or CORK_BYTES of them. */
#define CORK_MAX   64
#define CORK_BYTES (64u << 10)
/* Parked push replies (see Replication) are looked at for their deadline this often. */
#define PARK_TICK_MS 20
/* A stop gives connections this long to take their replies, then closes them (a peer that does
 * not read would hold the loop, and the server's exit checkpoint, forever). */
#define STOP_FLUSH_MS 5000
/* A cold page (SCAN with PC_STREAM_COLD) visits at most COLD_PAGE_VISIT of the cold store's keys
 * and sends at most COLD_PAGE_ROWS rows, read from RocksDB: the loop waits for the walk and the
 * reads (a few ms to tens of ms). */
#define COLD_PAGE_VISIT 65536u
#define COLD_PAGE_ROWS  4096u

typedef struct loopctx loopctx_t;
typedef struct parked parked_t;

typedef struct conn {
    uv_tcp_t tcp;
    loopctx_t *lc;
    struct conn *prev, *next;
    bool authed;
    uint64_t born_ns;  /* accepted (the hello deadline counts from it) */
    uint64_t body_ms;  /* its loop's time when the header of the large body in `body` came */
    uint64_t input_ms; /* its loop's time (uv_now) at its last bytes read: a part-read frame's
                        * deadline counts from it (no clock read per read) */
    bool finishing;    /* no more reads or replies: a shutdown is flushing the queued ones */
    bool eof;          /* its peer half-closed: finished once its parked push replies are out */
    bool closing;      /* uv_close called */
    uint8_t *stage;
    size_t stage_len;
    pc_wire_hdr_t hdr; /* of the frame being read into `body` */
    uint8_t *body;
    size_t body_have;
    uint64_t skip;     /* bytes of an oversized body still to discard */
    uint64_t unsent;   /* bytes of replies written but not yet completed */
    uint64_t parked;   /* bytes its push replies parked for the backups hold (park_push) */
    bool paused;       /* held back by may_run(): not reading, frames wait in stage/body */
    bool body_ready;   /* paused with the large body complete, not yet executed */
    bool body_wait;    /* paused: its next large body is over body_total (counted once) */
    uint64_t wrote_ms; /* its loop's time at its last reply written (or its accept) */
    pc_tls_t *tls;     /* TLS servers: the session (NULL once a plaintext client is refused) */
    bool tls_started;  /* the first bytes were a ClientHello */
    bool corked;       /* replies wait in cork_* until cork_flush (drain_stage) */
    struct wreq *cork_head, *cork_tail;
    int ncork;
    size_t cork_bytes;
} conn_t;

struct loopctx {
    ps_dp_t *dp;
    uv_loop_t loop;
    uv_tcp_t listener;
    uv_async_t stop;
    uv_async_t wake; /* the server's unsent total fell below its cap: resume paused conns */
    pthread_t thread;
    int fd;
    conn_t *conns;
    bool stopping;
    uint64_t reads;                /* read callbacks with bytes (busy polling: input seen) */
    struct wreq *idle[POOL_SLOTS]; /* reply pool: idle allocations, oldest first */
    int nidle;
    size_t idle_bytes;
    float *conv; /* fp32 rows or gradients of a bf16/f16 batch (see DESIGN), conv_cap bytes */
    size_t conv_cap;
    parked_t *parked;          /* push replies waiting for the backups (see Replication) */
    uv_timer_t park_timer;     /* answers the parked ones past their deadline */
    uv_timer_t stop_timer;     /* a stop closes the connections that did not take their replies */
    uv_timer_t deadline_timer; /* closes connections past the hello or the frame deadline */
    uv_tcp_t spare;            /* a connection accepted without memory for it, to close it */
    bool spare_busy;           /* spare is in use (closing) until on_spare_closed */
    bool spare_pending;        /* a connection came while it was: taken by on_spare_closed */
};

/* A backup's acknowledged position of a table's change log (PC_STREAM_ACK). */
typedef struct ack {
    uint64_t uid;
    uint32_t server;
    uint64_t pos;
    bool in_sync; /* acknowledged, caught up, since it became a backup (its copy done) */
    char table[PC_WIRE_NAME_MAX + 1];
} ack_t;
#define ACKS_MIN 64 /* the acks table's first room; it doubles when full */

struct ps_dp {
    ps_catalog_t *cat;
    ps_dp_opts_t o;
    char token[256];
    size_t token_len;
    pc_tls_ctx_t *tls; /* NULL: plain TCP */
    pthread_rwlock_t map_lock;
    pc_cluster_map_t *map;
    bool owns_all; /* this server owns every slot of map: no key needs checking */
    char *map_text;
    size_t map_text_len;
    int port;
    int nloops;
    loopctx_t *loops;
    atomic_uint_least64_t conns, requests, errors, pulled, pushed, looked, bytes_in, bytes_out;
    atomic_uint_least64_t unsent, unsent_peak, paused; /* reply memory (see DESIGN) */
    atomic_uint_least64_t pooled;                      /* idle reply allocations, all loops */
    atomic_bool waiting; /* some connection waits for the unsent total to fall */
    atomic_uint_least64_t bodies, body_waits; /* large request bodies held (see Bodies) */
    atomic_bool body_waiting;                 /* some connection waits for `bodies` to fall */
    pc_hist_t lat[4]; /* request latency (frame complete -> reply queued): pull, push, lookup,
                       * other */
    /* Replication (see DESIGN): under map_lock, the servers that back up a slot this server is
     * primary of; under ack_mu, each (table uid, backup)'s acknowledged change-log position. */
    uint64_t backups[PC_MAX_SERVERS / 64];
    uint64_t joining[PC_MAX_SERVERS / 64]; /* backups added to a running primary (map_lock) */
    atomic_bool has_backups; /* some slot of this server has a backup (read without the lock) */
    atomic_uint_least64_t newer_map; /* ps_dp_newer_map */
    bool replicated;                 /* the map names backups: this server may hold others' rows */
    pthread_mutex_t ack_mu;
    ack_t *acks; /* pc_smalloc'ed, nacks of acks_cap used: one per (table, backup) that acked */
    size_t nacks, acks_cap;
    atomic_uint_least64_t write_until; /* ps_dp_set_write_until: pushes refused from then */
    atomic_uint pushing; /* pushes past the write_until check and not yet in the change log */
    atomic_uint_least64_t parked_now;    /* push replies waiting for backups, all loops */
    atomic_uint_least64_t parked_total;  /* pushes that waited */
    atomic_uint_least64_t park_timeouts; /* answered PC_ETIMEDOUT: no backup confirmed in time */
};

/* ==== replies ============================================================================== */

typedef struct wreq {
    uv_write_t req;
    conn_t *c;
    struct wreq *next; /* corked replies written with this one's request (cork_flush) */
    size_t len;        /* corked: the frame's bytes */
    size_t bytes;      /* the allocation */
    uint8_t *hdr;      /* the frame: PC_WIRE_HDR bytes of header, then the payload */
    uint8_t *payload;  /* hdr + PC_WIRE_HDR, 8-aligned */
    uint8_t data[];    /* TLS: room for the ciphertext (reply_alloc), then the frame */
} wreq_t;

static void conn_close(conn_t *c);
static void conn_finish(conn_t *c);

/* A push reply waiting for the backups (see Replication). */
struct parked {
    parked_t *next;
    conn_t *c;
    struct wreq *w;
    pc_wire_hdr_t h; /* the request's header (h of the frame is not kept) */
    size_t plen;
    uint16_t flags;
    uint64_t uid, target, deadline_ns;
    uint32_t n; /* the push's keys, kept: answered 0 only while this server owns them */
    uint64_t keys[];
};
static void cork_flush(conn_t *c);
static void reply_free(loopctx_t *lc, struct wreq *w);
static void conn_continue(conn_t *c);

/* Count a reply's bytes as unsent (+) or sent (-), per connection and per server. */
static void unsent_add(conn_t *c, size_t bytes) {
    ps_dp_t *dp = c->lc->dp;
    c->unsent += bytes;
    uint64_t now = atomic_fetch_add(&dp->unsent, bytes) + bytes;
    uint64_t peak = atomic_load_explicit(&dp->unsent_peak, memory_order_relaxed);
    while (now > peak && !atomic_compare_exchange_weak(&dp->unsent_peak, &peak, now)) {
    }
}

/* Every loop looks at its paused connections and parked replies again. */
static void wake_all(ps_dp_t *dp) {
    for (int i = 0; i < dp->nloops; i++)
        uv_async_send(&dp->loops[i].wake);
}

static void unsent_sub(conn_t *c, size_t bytes) {
    ps_dp_t *dp = c->lc->dp;
    c->unsent -= bytes;
    const uint64_t now = atomic_fetch_sub(&dp->unsent, bytes) - bytes;
    if (now < dp->o.reply_queue_total && atomic_exchange(&dp->waiting, false))
        wake_all(dp);
}

/* Take n bytes of the server's body budget (see Bodies): within body_total, or the only body. */
static bool body_take(ps_dp_t *dp, uint64_t n) {
    uint64_t cur = atomic_load(&dp->bodies);
    while (!cur || cur + n <= dp->o.body_total)
        if (atomic_compare_exchange_weak(&dp->bodies, &cur, cur + n))
            return true;
    return false;
}

/* Whether c may hold a large body of n bytes now; when not, the caller pauses it and a release
 * wakes it. */
static bool body_admit(conn_t *c, uint64_t n) {
    ps_dp_t *dp = c->lc->dp;
    bool ok = body_take(dp, n);
    if (!ok) { /* say so first, then try again (a release in between saw no waiter) */
        atomic_store(&dp->body_waiting, true);
        ok = body_take(dp, n);
    }
    if (!ok && !c->body_wait) /* a wait counts once, not at each try */
        atomic_fetch_add_explicit(&dp->body_waits, 1, memory_order_relaxed);
    c->body_wait = !ok;
    return ok;
}

/* Give n bytes back to the body budget, waking the connections that wait for it. */
static void body_give(ps_dp_t *dp, uint64_t n) {
    atomic_fetch_sub(&dp->bodies, n);
    if (atomic_exchange(&dp->body_waiting, false))
        wake_all(dp);
}

/* Free c's large body, and its bytes of the budget. */
static void body_free(conn_t *c) {
    if (!c->body)
        return;
    pc_free(PC_MEM_SCRATCH, c->body, c->hdr.body_len);
    c->body = NULL;
    body_give(c->lc->dp, c->hdr.body_len);
}

/* Whether connection c may execute its next frame now (see DESIGN); a connection resuming
 * from a pause needs its own queue down to half the cap. */
static bool may_run(conn_t *c) {
    ps_dp_t *dp = c->lc->dp;
    const uint64_t own = c->paused ? dp->o.reply_queue / 2 : dp->o.reply_queue;
    const uint64_t mine = c->unsent + c->parked;
    if (mine && mine >= own)
        return false;
    const uint64_t cap = dp->o.reply_queue_total, total = atomic_load(&dp->unsent);
    if (total < cap || (c->unsent == 0 && total < cap + cap / 8))
        return true;
    /* Wait for the total: say so first, then look again (a write that completed in between
     * saw no waiter and sent no wake-up). */
    atomic_store(&dp->waiting, true);
    return atomic_load(&dp->unsent) < cap;
}

/* Stop reading c until may_run() allows it again. */
static void conn_pause(conn_t *c) {
    if (c->paused)
        return;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->paused = true;
    atomic_fetch_add_explicit(&c->lc->dp->paused, 1, memory_order_relaxed);
}

static void on_written(uv_write_t *req, int status) {
    wreq_t *w = (wreq_t *)req;
    conn_t *c = w->c;
    c->wrote_ms = uv_now(&c->lc->loop);
    for (wreq_t *nx; w; w = nx) { /* one reply, or the corked ones written together */
        nx = w->next;
        unsent_sub(c, w->bytes);
        reply_free(c->lc, w);
    }
    if (status < 0) {
        conn_close(c);
        return;
    }
    if (c->paused && !c->closing && !c->finishing)
        conn_continue(c);
}

/* A write of `room` bytes before a frame of `frame` bytes (hdr, payload): from the loop's pool
 * when it is large (an idle allocation of at least its size, at most a quarter more), else new
 * (large ones rounded up to whole pages, so that a pooled one fits replies of nearly its size).
 * w->bytes is the allocation, what unsent_add counts. */
static wreq_t *wreq_new(loopctx_t *lc, size_t room, size_t frame) {
    size_t bytes = sizeof(wreq_t) + room + frame;
    wreq_t *w = NULL;
    if (bytes >= POOL_MIN) {
        for (int i = lc->nidle - 1; i >= 0 && !w; i--) { /* the most recently used first */
            if (lc->idle[i]->bytes >= bytes && lc->idle[i]->bytes - bytes <= bytes / 4) {
                w = lc->idle[i];
                memmove(&lc->idle[i], &lc->idle[i + 1],
                        (size_t)(lc->nidle - i - 1) * sizeof lc->idle[0]);
                lc->nidle--;
                lc->idle_bytes -= w->bytes;
                atomic_fetch_sub_explicit(&lc->dp->pooled, w->bytes, memory_order_relaxed);
            }
        }
        bytes = (bytes + 4095) & ~(size_t)4095;
    }
    if (!w && (w = pc_malloc(PC_MEM_SCRATCH, bytes)) != NULL)
        w->bytes = bytes;
    if (w) {
        w->next = NULL;
        w->hdr = w->data + room;
        w->payload = w->hdr + PC_WIRE_HDR;
    }
    return w;
}

/* Give back reply allocation w (sent or never sent): large ones go to the loop's pool, whose
 * oldest idle allocations are freed to keep it within POOL_SLOTS and POOL_KEEP bytes. A reply
 * allocation freed to the C heap and allocated again costs a page fault per 4 KiB (glibc hands
 * large blocks back to the kernel): kept, its pages stay mapped. */
static void reply_free(loopctx_t *lc, wreq_t *w) {
    if (w->bytes < POOL_MIN || w->bytes > POOL_KEEP || lc->stopping) {
        pc_free(PC_MEM_SCRATCH, w, w->bytes);
        return;
    }
    while (lc->nidle && (lc->nidle == POOL_SLOTS || lc->idle_bytes + w->bytes > POOL_KEEP)) {
        wreq_t *old = lc->idle[0];
        memmove(&lc->idle[0], &lc->idle[1], (size_t)(lc->nidle - 1) * sizeof old);
        lc->nidle--;
        lc->idle_bytes -= old->bytes;
        atomic_fetch_sub_explicit(&lc->dp->pooled, old->bytes, memory_order_relaxed);
        pc_free(PC_MEM_SCRATCH, old, old->bytes);
    }
    lc->idle[lc->nidle++] = w;
    lc->idle_bytes += w->bytes;
    atomic_fetch_add_explicit(&lc->dp->pooled, w->bytes, memory_order_relaxed);
}

/* Free every idle allocation of lc's pool (its loop has ended). */
static void pool_drain(loopctx_t *lc) {
    while (lc->nidle) {
        wreq_t *w = lc->idle[--lc->nidle];
        atomic_fetch_sub_explicit(&lc->dp->pooled, w->bytes, memory_order_relaxed);
        pc_free(PC_MEM_SCRATCH, w, w->bytes);
    }
    lc->idle_bytes = 0;
}

/* A reply to c with `payload_len` bytes of payload to fill in at w->payload. On a TLS
 * connection the frame sits at the end of the allocation behind room for its ciphertext, which
 * pc_tls_seal writes from data[0] on without overtaking the plaintext it has yet to read: one
 * allocation per reply, TLS or not, and no pages touched twice. */
static wreq_t *reply_alloc(conn_t *c, size_t payload_len) {
    const size_t frame = PC_WIRE_HDR + payload_len;
    const size_t room =
        c->tls ? (pc_tls_pending(c->tls) + pc_tls_sealed_max(frame) - frame + 7) & ~(size_t)7 : 0;
    return wreq_new(c->lc, room, frame);
}

/* TLS: write len ciphertext bytes at p (inside w, taken) as one write, counted as unsent like a
 * plain reply. PC_EIO: the connection must close. */
static int tls_write(conn_t *c, wreq_t *w, uint8_t *p, size_t len) {
    uv_buf_t b = uv_buf_init((char *)p, (unsigned)len);
    unsent_add(c, w->bytes);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_written) < 0) {
        unsent_sub(c, w->bytes);
        reply_free(c->lc, w);
        return PC_EIO;
    }
    return 0;
}

/* TLS: write the session's pending ciphertext as one write, counted as unsent like a reply.
 * PC_ENOMEM or PC_EIO (the connection must close). */
static int tls_flush(conn_t *c) {
    const size_t n = pc_tls_pending(c->tls);
    if (!n)
        return 0;
    wreq_t *w = wreq_new(c->lc, 0, n);
    if (!w)
        return PC_ENOMEM;
    w->c = c;
    const size_t got = pc_tls_take(c->tls, w->hdr, n);
    return tls_write(c, w, w->hdr, got);
}

/* TLS: encrypt reply w's frame (len bytes) in place (reply_alloc) into one write, with what the
 * session had pending, counted as unsent like a plain reply. Takes w. PC_ETLS, PC_EIO (the
 * connection must close). */
static int tls_send(conn_t *c, wreq_t *w, size_t len) {
    size_t n;
    int rc = pc_tls_seal(c->tls, w->hdr, len, w->data, (size_t)(w->hdr - w->data) + len, &n);
    if (rc) {
        reply_free(c->lc, w);
        return rc;
    }
    return tls_write(c, w, w->data, n);
}

/* Send reply w to request req; flags beside PC_WIRE_RESPONSE: a batch's element type. */
static void reply_send_flags(conn_t *c, wreq_t *w, const pc_wire_hdr_t *req, int32_t status,
                             size_t payload_len, uint16_t flags) {
    ps_dp_t *dp = c->lc->dp;
    pthread_rwlock_rdlock(&dp->map_lock);
    uint64_t mv = pc_cmap_version(dp->map);
    pthread_rwlock_unlock(&dp->map_lock);
    pc_wire_hdr_t h = {.op = req->op,
                       .flags = PC_WIRE_RESPONSE | flags,
                       .id = req->id,
                       .status = status,
                       .body_len = (uint32_t)payload_len,
                       .map_version = mv};
    pc_wire_hdr_encode(&h, w->hdr);
    w->c = c;
    uv_buf_t bufs[2] = {uv_buf_init((char *)w->hdr, PC_WIRE_HDR),
                        uv_buf_init((char *)w->payload, (unsigned)payload_len)};
    atomic_fetch_add_explicit(&dp->requests, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&dp->bytes_out, PC_WIRE_HDR + payload_len, memory_order_relaxed);
    if (status)
        atomic_fetch_add_explicit(&dp->errors, 1, memory_order_relaxed);
    if (c->tls) { /* encrypted now: the ciphertext is what waits (tls_flush) */
        if (tls_send(c, w, PC_WIRE_HDR + payload_len))
            conn_close(c);
        return;
    }
    unsent_add(c, w->bytes);
    if (c->corked) { /* written with the other replies of this read (cork_flush) */
        w->len = PC_WIRE_HDR + payload_len;
        if (c->cork_tail)
            c->cork_tail->next = w;
        else
            c->cork_head = w;
        c->cork_tail = w;
        c->cork_bytes += w->len;
        if (++c->ncork == CORK_MAX || c->cork_bytes >= CORK_BYTES)
            cork_flush(c);
        return;
    }
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, bufs, payload_len ? 2 : 1, on_written) < 0) {
        unsent_sub(c, w->bytes);
        reply_free(c->lc, w);
        conn_close(c);
    }
}

static void reply_send(conn_t *c, wreq_t *w, const pc_wire_hdr_t *req, int32_t status,
                       size_t payload_len) {
    reply_send_flags(c, w, req, status, payload_len, 0);
}

/* Write the corked replies of c as one write (one writev for all of them while the socket takes
 * them), the request of the first one carrying the rest (on_written). */
static void cork_flush(conn_t *c) {
    wreq_t *w = c->cork_head;
    const int n = c->ncork;
    c->cork_head = c->cork_tail = NULL;
    c->ncork = 0;
    c->cork_bytes = 0;
    if (!w)
        return;
    uv_buf_t bufs[CORK_MAX];
    int i = 0;
    for (wreq_t *p = w; p; p = p->next)
        bufs[i++] = uv_buf_init((char *)p->hdr, (unsigned)p->len);
    if (c->closing ||
        uv_write(&w->req, (uv_stream_t *)&c->tcp, bufs, (unsigned)n, on_written) < 0) {
        for (wreq_t *nx; w; w = nx) {
            nx = w->next;
            unsent_sub(c, w->bytes);
            reply_free(c->lc, w);
        }
        conn_close(c);
    }
}

/* Answer with an error status and a message (or, for PC_EWRONGSLOT, the map text). */
static void reply_error(conn_t *c, const pc_wire_hdr_t *req, int rc, const char *msg) {
    ps_dp_t *dp = c->lc->dp;
    char text[PC_WIRE_MSG_MAX];
    size_t len;
    wreq_t *w;
    if (rc == PC_EWRONGSLOT) {
        pthread_rwlock_rdlock(&dp->map_lock);
        len = dp->map_text_len;
        w = reply_alloc(c, len);
        if (w)
            memcpy(w->payload, dp->map_text, len);
        pthread_rwlock_unlock(&dp->map_lock);
    } else {
        int n = snprintf(text, sizeof text, "%s: %s", pc_strerror(rc), msg ? msg : "");
        len = n < 0 ? 0 : (size_t)n < sizeof text ? (size_t)n : sizeof text - 1;
        w = reply_alloc(c, len);
        if (w)
            memcpy(w->payload, text, len);
    }
    if (!w) {
        conn_close(c);
        return;
    }
    reply_send(c, w, req, rc, len);
}

static void reply_map(conn_t *c, const pc_wire_hdr_t *req) {
    ps_dp_t *dp = c->lc->dp;
    pthread_rwlock_rdlock(&dp->map_lock);
    const size_t len = dp->map_text_len;
    wreq_t *w = reply_alloc(c, len);
    if (w)
        memcpy(w->payload, dp->map_text, len);
    pthread_rwlock_unlock(&dp->map_lock);
    if (!w)
        reply_error(c, req, PC_ENOMEM, "reply");
    else
        reply_send(c, w, req, 0, len);
}

/* ==== requests ============================================================================= */

static bool token_ok(const ps_dp_t *dp, const uint8_t *body, uint32_t len) {
    /* Constant time in the token's length: no early exit on the first difference. */
    unsigned diff = len != dp->token_len;
    for (size_t i = 0; i < dp->token_len; i++)
        diff |= (unsigned)(dp->token[i] ^ (i < len ? body[i] : 0));
    return diff == 0;
}

/* Under map_lock (read), or with a map of one's own: whether server self is the primary of
 * key's slot. */
static bool primary_of(const pc_cluster_map_t *m, uint32_t self, uint64_t key) {
    return pc_cmap_key_owner(m, key) == self;
}

/* A request for keys this server does not own came under map version v: note it when newer. */
static void note_newer_map(ps_dp_t *dp, uint64_t v) {
    pthread_rwlock_rdlock(&dp->map_lock);
    const uint64_t mine = pc_cmap_version(dp->map);
    pthread_rwlock_unlock(&dp->map_lock);
    uint64_t seen = atomic_load(&dp->newer_map);
    while (v > mine && v > seen && !atomic_compare_exchange_weak(&dp->newer_map, &seen, v))
        ;
}

uint64_t ps_dp_newer_map(ps_dp_t *dp) {
    return atomic_load(&dp->newer_map);
}

bool ps_dp_owns(ps_dp_t *dp, const uint64_t *keys, size_t n) {
    pthread_rwlock_rdlock(&dp->map_lock);
    bool ok = true;
    if (dp->owns_all)
        n = 0;
    for (size_t i = 0; i < n && ok; i++)
        ok = primary_of(dp->map, dp->o.self, keys[i]);
    pthread_rwlock_unlock(&dp->map_lock);
    return ok;
}

char *ps_dp_map_text(ps_dp_t *dp, uint64_t *version) {
    pthread_rwlock_rdlock(&dp->map_lock);
    char *t = strdup(dp->map_text);
    if (version)
        *version = pc_cmap_version(dp->map);
    pthread_rwlock_unlock(&dp->map_lock);
    return t;
}

/* The loop's conversion buffer (see DESIGN) with room for `bytes`; NULL when out of memory. */
static float *conv_buf(loopctx_t *lc, size_t bytes) {
    if (lc->conv_cap < bytes) {
        pc_free(PC_MEM_SCRATCH, lc->conv, lc->conv_cap);
        lc->conv_cap = (bytes + 4095) & ~(size_t)4095;
        if (!(lc->conv = pc_malloc(PC_MEM_SCRATCH, lc->conv_cap)))
            lc->conv_cap = 0;
    }
    return lc->conv;
}

/* After a call: a conversion buffer over POOL_KEEP bytes is not kept. */
static void conv_trim(loopctx_t *lc) {
    if (lc->conv_cap > POOL_KEEP) {
        pc_free(PC_MEM_SCRATCH, lc->conv, lc->conv_cap);
        lc->conv = NULL;
        lc->conv_cap = 0;
    }
}

/* ==== replication (see DESIGN) ============================================================= */

/* Whether every in-sync backup of this server holds table uid's changes before `target`. */
static bool backups_hold(ps_dp_t *dp, uint64_t uid, uint64_t target) {
    bool ok = true;
    pthread_rwlock_rdlock(&dp->map_lock);
    pthread_mutex_lock(&dp->ack_mu);
    for (uint32_t b = 0; ok && b < PC_MAX_SERVERS; b++) {
        if (!dp->backups[b / 64]) { /* a word of no backups: skip it whole */
            b |= 63;
            continue;
        }
        if (!(dp->backups[b / 64] >> (b % 64) & 1))
            continue;
        /* one that has not acknowledged since it became a backup holds pushes back, unless it
         * joined a running primary (still copying: see ps_dp_set_map_from) */
        ok = dp->joining[b / 64] >> (b % 64) & 1;
        for (size_t i = 0; i < dp->nacks; i++)
            if (dp->acks[i].uid == uid && dp->acks[i].server == b && dp->acks[i].in_sync)
                ok = dp->acks[i].pos >= target;
    }
    pthread_mutex_unlock(&dp->ack_mu);
    pthread_rwlock_unlock(&dp->map_lock);
    return ok;
}

/* After a push to t: whether its answer waits for the backups, and for which position. */
static const char k_push_fenced[] =
    "this server takes no pushes now: its lease lapsed (until it is confirmed as the primary "
    "again, or another server is), or its slots are being handed to another server";

/* A push begins: counted first (see ps_dp_pushes_idle), then the lease looked at; false (not
 * counted) while pushes are refused. Any thread; each true is ended by pushing's decrement once
 * the push is in the change log. */
static bool push_enter(ps_dp_t *dp) {
    atomic_fetch_add(&dp->pushing, 1);
    if (pc_time_mono_ns() < atomic_load(&dp->write_until))
        return true;
    atomic_fetch_sub(&dp->pushing, 1);
    return false;
}

int ps_dp_push(ps_dp_t *dp, ps_table_t *t, const uint64_t *keys, size_t n, const float *grads,
               size_t nf, ps_push_result_t *res, char *why, size_t cap) {
    if (atomic_load(&dp->has_backups)) {
        snprintf(why, cap,
                 "this server's slots have backups: a push is answered once they hold it, "
                 "which only the data plane does (libpsclient's psc_push)");
        return PC_EUNSUPPORTED;
    }
    if (!push_enter(dp)) {
        snprintf(why, cap, "%s", k_push_fenced);
        return PC_EUNAVAIL;
    }
    if (!ps_dp_owns(dp, keys, n)) { /* checked once counted (see do_batch): a handover waits */
        atomic_fetch_sub(&dp->pushing, 1);
        snprintf(why, cap, "a key's slot is not this server's (the map changed)");
        return PC_EWRONGSLOT;
    }
    const int rc = ps_table_push(t, keys, n, grads, nf, res);
    atomic_fetch_sub(&dp->pushing, 1); /* applied and in the change log */
    if (!rc)
        atomic_fetch_add_explicit(&dp->pushed, n, memory_order_relaxed);
    else
        snprintf(why, cap, "%s", pc_strerror(rc));
    return rc;
}

static bool push_target(ps_dp_t *dp, ps_table_t *t, uint64_t *uid, uint64_t *target) {
    if (!atomic_load_explicit(&dp->has_backups, memory_order_relaxed))
        return false;
    uint64_t oldest = 0, head = 0; /* no log yet: no backup has read the table; its scan will */
    ps_changelog_t *log = ps_table_changelog(t);
    if (log)
        ps_changelog_bounds(log, &oldest, &head);
    const uint64_t lag = (uint64_t)ps_table_config(t)->replication_lag;
    *uid = ps_table_uid(t);
    *target = head > lag ? head - lag : 0;
    return !backups_hold(dp, *uid, *target);
}

static void on_park_timer(uv_timer_t *tm);

/* What parked reply p holds: itself, its keys, the reply. */
static size_t parked_bytes(const parked_t *p) {
    return sizeof *p + (size_t)p->n * 8 + p->w->bytes;
}

/* Keep push reply w until the backups hold uid up to target; false (w untouched) on ENOMEM. */
static bool park_push(conn_t *c, wreq_t *w, const pc_wire_hdr_t *h, size_t plen, uint16_t flags,
                      uint64_t uid, uint64_t target, const uint64_t *keys, uint32_t n) {
    ps_dp_t *dp = c->lc->dp;
    parked_t *p = pc_malloc(PC_MEM_OTHER, sizeof *p + (size_t)n * 8);
    if (!p)
        return false;
    *p = (parked_t){.next = c->lc->parked,
                    .n = n,
                    .c = c,
                    .w = w,
                    .h = *h,
                    .plen = plen,
                    .flags = flags,
                    .uid = uid,
                    .target = target,
                    .deadline_ns = pc_time_mono_ns() + dp->o.ack_timeout_ms * 1000000ull};
    memcpy(p->keys, keys, (size_t)n * 8);
    if (!c->lc->parked) /* the deadlines' timer runs while something is parked */
        uv_timer_start(&c->lc->park_timer, on_park_timer, PARK_TICK_MS, PARK_TICK_MS);
    c->lc->parked = p;
    c->parked += parked_bytes(p);
    atomic_fetch_add_explicit(&dp->parked_now, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&dp->parked_total, 1, memory_order_relaxed);
    return true;
}

/* Whether the servers now primary of parked push p's keys (this server's backups before: a
 * handover) acknowledged its position: the push is theirs then. */
static bool new_owners_hold(ps_dp_t *dp, const parked_t *p) {
    bool ok = true;
    pthread_rwlock_rdlock(&dp->map_lock);
    pthread_mutex_lock(&dp->ack_mu);
    uint32_t last = PC_NO_SERVER; /* keys of one slot range share an owner: checked once */
    for (uint32_t k = 0; ok && k < p->n; k++) {
        const uint32_t o = pc_cmap_key_owner(dp->map, p->keys[k]);
        if (o == dp->o.self || o == last)
            continue;
        bool held = false;
        for (size_t i = 0; i < dp->nacks && !held; i++)
            held = dp->acks[i].uid == p->uid && dp->acks[i].server == o &&
                   dp->acks[i].pos >= p->target;
        ok = held;
        last = o;
    }
    pthread_mutex_unlock(&dp->ack_mu);
    pthread_rwlock_unlock(&dp->map_lock);
    return ok;
}

/* Answer lc's parked replies: those held by the backups while this server is still the primary
 * of their keys (0), or whose keys went to a server that acknowledged them (0, a handover), those
 * past their deadline or whose keys this server lost otherwise (PC_ETIMEDOUT: applied here, never
 * confirmed), every one PC_ETIMEDOUT when `all` (the loop stops), and drop
 * those of connection `gone` or of one closing (nothing to answer). */
static void park_release(loopctx_t *lc, bool all, const conn_t *gone) {
    ps_dp_t *dp = lc->dp;
    const uint64_t now = pc_time_mono_ns();
    for (parked_t **pp = &lc->parked, *p; (p = *pp);) {
        int st = 0;
        bool done = true;
        if (p->c == gone || p->c->closing || p->c->finishing)
            st = 1; /* dropped */
        else if (all)
            st = PC_ETIMEDOUT;
        else if (!ps_dp_owns(dp, p->keys, p->n)) /* handed over, or demoted */
            st = new_owners_hold(dp, p) ? 0 : PC_ETIMEDOUT;
        else if (backups_hold(dp, p->uid, p->target))
            st = 0;
        else if (now >= p->deadline_ns)
            st = PC_ETIMEDOUT;
        else
            done = false;
        if (!done) {
            pp = &p->next;
            continue;
        }
        *pp = p->next;
        conn_t *const c = p->c;
        c->parked -= parked_bytes(p);
        atomic_fetch_sub_explicit(&dp->parked_now, 1, memory_order_relaxed);
        if (st == 1) {
            reply_free(lc, p->w);
        } else if (st) {
            char msg[160];
            atomic_fetch_add_explicit(&dp->park_timeouts, 1, memory_order_relaxed);
            snprintf(msg, sizeof msg, "%s (%llu ms allowed)",
                     all ? "applied here, but the server stopped before its backups confirmed it"
                         : "applied here, but no backup confirmed it while this server was its "
                           "primary",
                     (unsigned long long)dp->o.ack_timeout_ms);
            reply_free(lc, p->w);
            reply_error(p->c, &p->h, st, msg);
        } else {
            reply_send_flags(p->c, p->w, &p->h, 0, p->plen, p->flags);
        }
        pc_free(PC_MEM_OTHER, p, sizeof *p + (size_t)p->n * 8);
        if (st != 1 && c->eof && !c->parked) /* half-closed: its last parked reply is out */
            conn_finish(c);
    }
    if (!lc->parked && !lc->stopping)
        uv_timer_stop(&lc->park_timer);
}

static void on_park_timer(uv_timer_t *tm) {
    park_release(tm->data, false, NULL);
}

/* Every loop looks at its parked replies again, when there are any. */
static void wake_parked(ps_dp_t *dp) {
    if (atomic_load_explicit(&dp->parked_now, memory_order_relaxed))
        wake_all(dp);
}

/* Double the acks table (ack_mu held); false when out of memory. A live entry is never evicted
 * while there is memory (ack_stale's entries are taken over first): a (table, backup) pair
 * without one falls back to its joining bit, which for a backup that joined a running primary
 * lets pushes go unconfirmed by it (a fixed table of 256 evicted its oldest entry, live or not,
 * once full of entries of tables dropped over time). */
static bool acks_grow(ps_dp_t *dp) {
    const size_t cap = dp->acks_cap ? 2 * dp->acks_cap : ACKS_MIN;
    ack_t *a = pc_srealloc(PC_MEM_OTHER, dp->acks, cap * sizeof *a);
    if (!a)
        return false;
    dp->acks = a;
    dp->acks_cap = cap;
    return true;
}

/* An entry whose table is gone from the catalog, or was replaced (ack_mu held), or SIZE_MAX. A
 * new pair takes it over before the table grows, so the table holds about as many entries as
 * there are live pairs (a handover reads them all: ps_dp_repl_lag), not one for every table
 * ever dropped. */
static size_t ack_stale(ps_dp_t *dp) {
    for (size_t i = 0; i < dp->nacks; i++) {
        ps_table_t *t;
        if (ps_catalog_acquire(dp->cat, dp->acks[i].table, &t))
            return i;
        const bool replaced = ps_table_uid(t) != dp->acks[i].uid;
        ps_catalog_release(dp->cat, t);
        if (replaced)
            return i;
    }
    return SIZE_MAX;
}

/* A backup acknowledged table t's changes before pos; `caught`: it had reached the log's head
 * (PC_STREAM_CAUGHT), so pushes wait for it from now on (in_sync). */
static void note_ack(ps_dp_t *dp, ps_table_t *t, const char *table, uint32_t server, uint64_t pos,
                     bool caught) {
    const uint64_t uid = ps_table_uid(t);
    uint64_t oldest = 0, head = 0;
    ps_changelog_t *log = ps_table_changelog(t);
    if (log) /* before the lock: a push appends under no lock of ours */
        ps_changelog_bounds(log, &oldest, &head);
    if (log && pos > head)
        pos = head; /* no backup can have applied what the log has not had yet */
    pthread_rwlock_rdlock(&dp->map_lock);
    const bool backup = server < PC_MAX_SERVERS && dp->backups[server / 64] >> (server % 64) & 1;
    pthread_mutex_lock(&dp->ack_mu);
    if (!backup) { /* not a backup of this server's slots (yet, or any more): nothing to note */
        pthread_mutex_unlock(&dp->ack_mu);
        pthread_rwlock_unlock(&dp->map_lock);
        return;
    }
    size_t i = 0, same = SIZE_MAX, other = SIZE_MAX;
    for (; i < dp->nacks && !(dp->acks[i].uid == uid && dp->acks[i].server == server); i++) {
        const ack_t *a = &dp->acks[i];
        if (a->server == server && strcmp(a->table, table) == 0)
            same = i; /* this table before it was replaced: its entry is taken over */
        else if (other == SIZE_MAX && (a->server >= PC_MAX_SERVERS ||
                                       !(dp->backups[a->server / 64] >> (a->server % 64) & 1)))
            other = i; /* a server that is no backup now */
    }
    const bool fresh = i == dp->nacks; /* a first acknowledgement answers waits for position 0 */
    if (fresh) {
        const size_t stale = same == SIZE_MAX && other == SIZE_MAX ? ack_stale(dp) : SIZE_MAX;
        if (same != SIZE_MAX || other != SIZE_MAX || stale != SIZE_MAX) {
            i = same != SIZE_MAX ? same : other != SIZE_MAX ? other : stale;
        } else if (i < dp->acks_cap || acks_grow(dp)) {
            dp->nacks++;
        } else if (dp->nacks == 0) { /* out of memory, nothing noted: acknowledged again later */
            pthread_mutex_unlock(&dp->ack_mu);
            pthread_rwlock_unlock(&dp->map_lock);
            return;
        } else { /* out of memory: the oldest entry goes (its pair holds pushes back, or, for a
                  * joining backup, none, until it acknowledges again) */
            PC_WARN("replication: no memory for the acknowledgement of backup %u of table %s: "
                    "the oldest entry is dropped",
                    server, table);
            memmove(dp->acks, dp->acks + 1, (dp->nacks - 1) * sizeof *dp->acks);
            i = dp->nacks - 1;
        }
        dp->acks[i] = (ack_t){.uid = uid, .server = server};
        snprintf(dp->acks[i].table, sizeof dp->acks[i].table, "%s", table);
    }
    const bool moved = pos > dp->acks[i].pos || fresh;
    if (moved)
        dp->acks[i].pos = pos;
    if (!dp->acks[i].in_sync && caught) {
        dp->acks[i].in_sync = true;
        PC_INFO("replication: backup %u of table %s caught up with it: pushes wait for it from "
                "now on (at %" PRIu64 ", head %" PRIu64 ")",
                server, table, pos, head);
    }
    pthread_mutex_unlock(&dp->ack_mu);
    pthread_rwlock_unlock(&dp->map_lock);
    if (moved)
        wake_parked(dp);
}

void ps_dp_set_write_until(ps_dp_t *dp, uint64_t until_ns) {
    atomic_store_explicit(&dp->write_until, until_ns, memory_order_release);
}

static void do_batch(conn_t *c, const pc_wire_hdr_t *h, const uint8_t *body) {
    ps_dp_t *dp = c->lc->dp;
    pc_wire_batch_t b;
    int rc = pc_wire_batch_decode((pc_wire_op_t)h->op, body, h->body_len, &dp->o.lim, &b);
    if (rc == PC_EUNSUPPORTED) {
        char why[128];
        uint16_t t;
        memcpy(&t, body + 2, 2);
        snprintf(why, sizeof why,
                 "element type %u is not one this server takes (0 f32, 1 bf16, 2 f16)", t);
        reply_error(c, h, rc, why);
        return;
    }
    if (rc) {
        reply_error(c, h, rc, "malformed batch");
        return;
    }
    char msg[160];
    if ((rc = pc_wire_reply_check_typed((pc_wire_op_t)h->op, b.n, b.dim, b.dtype,
                                        dp->o.lim.max_reply, msg,
                                        sizeof msg))) { /* before any work or allocation */
        reply_error(c, h, rc, msg);
        return;
    }
    /* A push is counted first, then its slots checked: a handover fences and waits for the
     * counted pushes before the map changes, so a push checked under the old map is one it
     * waits for (checked before being counted, one could be applied after the handover) */
    const bool counted = h->op == PC_OP_PUSH;
    if (counted && !push_enter(dp)) {
        reply_error(c, h, PC_EUNAVAIL, k_push_fenced);
        return;
    }
    if (!ps_dp_owns(dp, b.keys, b.n)) {
        if (counted)
            atomic_fetch_sub(&dp->pushing, 1);
        note_newer_map(dp, h->map_version);
        reply_error(c, h, PC_EWRONGSLOT, NULL);
        return;
    }
    ps_table_t *t;
    if ((rc = ps_catalog_acquire(dp->cat, b.name, &t))) {
        char why[96];
        snprintf(why, sizeof why, "no table %s", b.name);
        if (counted)
            atomic_fetch_sub(&dp->pushing, 1);
        reply_error(c, h, rc, why);
        return;
    }
    if (ps_table_dim(t) != b.dim) {
        char msg[128];
        snprintf(msg, sizeof msg, "table %s has dim %u, request %u", b.name, ps_table_dim(t),
                 b.dim);
        ps_catalog_release(dp->cat, t);
        if (counted)
            atomic_fetch_sub(&dp->pushing, 1);
        reply_error(c, h, PC_EDIM, msg);
        return;
    }
    const uint32_t fence = b.epoch ? ps_table_fence(t) : 0;
    if (b.epoch < fence) { /* a generation its job has left behind (docs/wire.md) */
        char msg[PC_WIRE_NAME_MAX + 192];
        snprintf(msg, sizeof msg,
                 "table %s is fenced at generation epoch %u; this push is of epoch %u (its "
                 "worker was left behind by its job's group)",
                 b.name, fence, b.epoch);
        ps_catalog_release(dp->cat, t);
        atomic_fetch_sub(&dp->pushing, 1);
        reply_error(c, h, PC_EFENCED, msg);
        return;
    }
    const size_t nf = (size_t)b.n * b.dim, es = pc_wire_dtype_size(b.dtype);
    size_t plen = h->op == PC_OP_PUSH     ? 3 * sizeof(uint64_t)
                  : h->op == PC_OP_LOOKUP ? nf * es + b.n
                                          : nf * es;
    wreq_t *w = reply_alloc(c, plen);
    /* f32: rows straight into the reply, gradients used in place; else through conv */
    float *conv = b.dtype == PC_WIRE_F32 ? NULL : conv_buf(c->lc, nf * sizeof(float));
    if (!w || (b.dtype != PC_WIRE_F32 && nf && !conv)) {
        if (w)
            reply_free(c->lc, w);
        ps_catalog_release(dp->cat, t);
        if (counted)
            atomic_fetch_sub(&dp->pushing, 1);
        reply_error(c, h, PC_ENOMEM, "reply");
        return;
    }
    const pc_half_kernels_t *k = conv ? pc_half_kernels(NULL) : NULL;
    float *rows = conv ? conv : (float *)(void *)w->payload;
    bool park = false;
    uint64_t uid = 0, target = 0;
    if (h->op == PC_OP_PULL) {
        rc = ps_table_pull(t, b.keys, b.n, rows, nf);
        atomic_fetch_add_explicit(&dp->pulled, b.n, memory_order_relaxed);
    } else if (h->op == PC_OP_LOOKUP) {
        rc = ps_table_lookup(t, b.keys, b.n, rows, nf, w->payload + nf * es);
        atomic_fetch_add_explicit(&dp->looked, b.n, memory_order_relaxed);
    } else {
        if (conv) /* NaN and Inf arrive as such: the table skips and counts them */
            (b.dtype == PC_WIRE_BF16 ? k->from_bf16 : k->from_f16)(b.vals16, conv, nf);
        ps_push_result_t r;
        rc = ps_table_push(t, b.keys, b.n, conv ? conv : b.vals, nf, &r);
        atomic_fetch_sub(&dp->pushing, 1); /* applied and in the change log */
        uint64_t cnt[3] = {r.applied, r.skipped_nonfinite, r.dropped_unadmitted};
        memcpy(w->payload, cnt, sizeof cnt);
        atomic_fetch_add_explicit(&dp->pushed, b.n, memory_order_relaxed);
        if (!rc && push_target(dp, t, &uid, &target))
            park = true;
    }
    ps_catalog_release(dp->cat, t);
    if (!rc && conv && h->op != PC_OP_PUSH)
        (b.dtype == PC_WIRE_BF16 ? k->to_bf16 : k->to_f16)(conv, (uint16_t *)(void *)w->payload,
                                                           nf);
    if (conv)
        conv_trim(c->lc);
    if (rc) {
        reply_free(c->lc, w);
        reply_error(c, h, rc, b.name);
        return;
    }
    const uint16_t flags = (uint16_t)(b.dtype << PC_WIRE_DTYPE_SHIFT);
    if (park && park_push(c, w, h, plen, flags, uid, target, b.keys, b.n))
        return; /* answered once the backups hold it (park_release) */
    if (park) { /* not confirmed, and nothing to wait with: never answered as if it were */
        atomic_fetch_add_explicit(&dp->park_timeouts, 1, memory_order_relaxed);
        reply_free(c->lc, w);
        reply_error(c, h, PC_ETIMEDOUT,
                    "applied here, but out of memory to wait for its backups' confirmation");
        return;
    }
    reply_send_flags(c, w, h, 0, plen, flags);
}

/* A job claims a table (ps_catalog_claim); the reply carries the table's settings. */
static void do_claim(conn_t *c, const pc_wire_hdr_t *h, const uint8_t *body) {
    ps_dp_t *dp = c->lc->dp;
    pc_wire_claim_t q;
    if (pc_wire_claim_decode(body, h->body_len, &q) || q.mode > PS_CLAIM_FENCE) {
        reply_error(c, h, PC_EINVAL, "malformed claim");
        return;
    }
    ps_claim_result_t res = {0};
    char err[PC_WIRE_MSG_MAX] = "";
    int rc = ps_catalog_claim(dp->cat, q.name, q.job, (ps_claim_mode_t)q.mode, q.epoch, &res, err,
                              sizeof err);
    pc_wire_claim_reply_t r = {
        .action = (uint32_t)res.action, .rows = res.rows, .version = res.version};
    ps_table_t *t = NULL;
    if (!rc && (rc = ps_catalog_acquire(dp->cat, q.name, &t)) == 0) {
        r.dim = ps_table_dim(t);
        ps_table_config_format(ps_table_config(t), r.config, sizeof r.config);
        ps_catalog_release(dp->cat, t);
    } else if (rc == PC_ENOTFOUND && !err[0]) { /* dropped since its claim */
        snprintf(err, sizeof err, "no table %s", q.name);
    }
    if (rc) {
        reply_error(c, h, rc, err);
        return;
    }
    snprintf(r.previous, sizeof r.previous, "%s", res.previous);
    const size_t len = pc_wire_claim_reply_len(&r);
    wreq_t *w = reply_alloc(c, len);
    if (!w) {
        reply_error(c, h, PC_ENOMEM, "reply");
        return;
    }
    pc_wire_claim_reply_encode(&r, w->payload);
    reply_send(c, w, h, 0, len);
}

/* TABLES: every table's settings text, a line each, in name order. */
static void do_tables(conn_t *c, const pc_wire_hdr_t *h) {
    ps_dp_t *dp = c->lc->dp;
    const size_t n = ps_catalog_list(dp->cat, NULL, 0);
    char(*names)[PS_TABLE_NAME_MAX] = n ? pc_scalloc(PC_MEM_SCRATCH, n, sizeof *names) : NULL;
    const size_t line = PC_WIRE_CFG_MAX + 2;
    char *text = pc_smalloc(PC_MEM_SCRATCH, n * line + 1);
    if ((n && !names) || !text) {
        pc_sfree(names);
        pc_sfree(text);
        reply_error(c, h, PC_ENOMEM, "table list");
        return;
    }
    size_t len = 0;
    const size_t got = ps_catalog_list(dp->cat, names, n);
    for (size_t i = 0; i < got && i < n; i++) {
        ps_table_t *t;
        if (ps_catalog_acquire(dp->cat, names[i], &t))
            continue; /* dropped meanwhile */
        const size_t m = ps_table_config_format(ps_table_config(t), text + len, line - 1);
        ps_catalog_release(dp->cat, t);
        len += m < line - 2 ? m : line - 2; /* a text over PC_WIRE_CFG_MAX is cut, as in CLAIM */
        text[len++] = '\n';
    }
    wreq_t *w = reply_alloc(c, len);
    if (!w) {
        reply_error(c, h, PC_ENOMEM, "reply");
    } else {
        memcpy(w->payload, text, len);
        reply_send(c, w, h, 0, len);
    }
    pc_sfree(names);
    pc_sfree(text);
}

/* ---- the delta stream (pc_wire_stream_t; docs/wire.md "The delta stream") ---- */

/* The table of a stream request, checked against the uid the subscriber follows; NULL after
 * replying the error. */
static ps_table_t *stream_table(conn_t *c, const pc_wire_hdr_t *h, const uint8_t *body,
                                pc_wire_stream_t *q) {
    char msg[PC_WIRE_MSG_MAX];
    ps_table_t *t = NULL;
    if (pc_wire_stream_decode(body, h->body_len, q)) {
        reply_error(c, h, PC_EINVAL, "malformed stream request");
    } else if (h->op != PC_OP_SCAN && (q->flags & PC_STREAM_COLD)) {
        reply_error(c, h, PC_EINVAL, "a cold store is walked by scans");
    } else if (ps_catalog_acquire(c->lc->dp->cat, q->name, &t)) {
        snprintf(msg, sizeof msg, "no table %s", q->name);
        reply_error(c, h, PC_ENOTFOUND, msg);
        t = NULL;
    } else if (q->uid && q->uid != ps_table_uid(t)) {
        snprintf(msg, sizeof msg, "table %s was replaced (uid %016llx, now %016llx): scan it again",
                 q->name, (unsigned long long)q->uid, (unsigned long long)ps_table_uid(t));
        reply_error(c, h, PC_ESTATE, msg);
        ps_catalog_release(c->lc->dp->cat, t);
        t = NULL;
    }
    return t;
}

/* The rows of keys[0..n) into a stream reply w (prefix r, found and rows as the table holds
 * them now; with their optimizer state when r->dim is the table's dim + state words) and send
 * it. */
static void stream_send(conn_t *c, const pc_wire_hdr_t *h, ps_table_t *t, wreq_t *w,
                        pc_wire_stream_reply_t *r, const uint64_t *keys) {
    uint8_t *b = w->payload;
    pc_wire_stream_reply_encode(r, b);
    if (r->n && keys != (const uint64_t *)(const void *)(b + PC_WIRE_STREAM_REPLY_PREFIX))
        memcpy(b + PC_WIRE_STREAM_REPLY_PREFIX, keys, (size_t)r->n * 8); /* (keys NULL: n 0) */
    uint8_t *found = b + pc_wire_stream_found_off(r->n);
    memset(found, 0, pc_wire_stream_rows_off(r->n) - pc_wire_stream_found_off(r->n));
    float *rows = (float *)(void *)(b + pc_wire_stream_rows_off(r->n));
    const uint64_t *k = (const uint64_t *)(const void *)(b + PC_WIRE_STREAM_REPLY_PREFIX);
    const bool state = r->dim != ps_table_dim(t);
    int rc = !r->n   ? 0
             : state ? ps_table_read_state(t, k, r->n, rows, found)
                     : ps_table_lookup(t, k, r->n, rows, (size_t)r->n * r->dim, found);
    for (uint32_t i = 0; !rc && i < r->n; i++)
        if (!found[i]) /* absent: its row is not sent (zeros), only the fact */
            memset(rows + (size_t)i * r->dim, 0, (size_t)r->dim * 4);
    if (rc) {
        reply_free(c->lc, w); /* never sent */
        reply_error(c, h, rc, "reading the rows of a stream reply");
        return;
    }
    reply_send(c, w, h, 0, pc_wire_stream_reply_len(r->n, r->dim));
}

/* Keep the keys[0..n) of slots this server is primary of (all of them when the map names no
 * backups: nothing else is held here); returns how many are left, in order. */
static size_t keep_primary(ps_dp_t *dp, uint64_t *keys, size_t n) {
    pthread_rwlock_rdlock(&dp->map_lock);
    size_t m = n;
    if (!dp->owns_all && dp->replicated) {
        m = 0;
        for (size_t i = 0; i < n; i++)
            if (primary_of(dp->map, dp->o.self, keys[i]))
                keys[m++] = keys[i];
    }
    pthread_rwlock_unlock(&dp->map_lock);
    return m;
}

/* Floats per row of a stream reply: the table's dim, and its state words when asked for. */
static uint32_t stream_dim(const ps_table_t *t, const pc_wire_stream_t *q) {
    return ps_table_dim(t) + (q->flags & PC_STREAM_STATE ? ps_table_state_len(t) : 0);
}

/* Rows a stream reply of dim may carry: the reply limit's, and at most `want` (0: no wish). */
static uint64_t stream_rows_max(const ps_dp_t *dp, uint32_t dim, uint64_t want) {
    const uint64_t per = 8 + 1 + (uint64_t)dim * 4, room = dp->o.lim.max_reply;
    uint64_t fit = room ? (room - PC_WIRE_STREAM_REPLY_PREFIX - 8) / per : UINT32_MAX;
    if (fit > UINT32_MAX)
        fit = UINT32_MAX;
    if (want && want < fit)
        fit = want;
    return fit ? fit : 1;
}

/* A stream reply without rows: the table's uid and its log's bounds. */
static void stream_send_bounds(conn_t *c, const pc_wire_hdr_t *h, ps_table_t *t,
                               const pc_wire_stream_t *q, uint64_t head, uint64_t oldest) {
    wreq_t *w = reply_alloc(c, pc_wire_stream_reply_len(0, stream_dim(t, q)));
    if (!w) {
        reply_error(c, h, PC_ENOMEM, "reply");
        return;
    }
    pc_wire_stream_reply_t r = {ps_table_uid(t), q->from, q->from,         head,
                                oldest,          0,       stream_dim(t, q)};
    stream_send(c, h, t, w, &r,
                (const uint64_t *)(void *)(w->payload + PC_WIRE_STREAM_REPLY_PREFIX));
}

/* DELTAS: the keys of the table's change log from q.from (at most q.max, and what fits the
 * reply limit), each with its row as the table holds it now. The first DELTAS of a table starts
 * its log and answers PC_ERANGE: the log holds nothing from before, the follower scans first.
 * max 0 asks for the bounds only (head = oldest = 0: no log), and starts nothing. */
static void do_deltas(conn_t *c, const pc_wire_hdr_t *h, const uint8_t *body) {
    ps_dp_t *dp = c->lc->dp;
    pc_wire_stream_t q;
    ps_table_t *t = stream_table(c, h, body, &q);
    if (!t)
        return;
    char msg[PC_WIRE_MSG_MAX];
    const uint32_t dim = stream_dim(t, &q);
    uint64_t max = stream_rows_max(dp, dim, q.max), oldest = 0, head = 0;
    ps_changelog_t *log = NULL;
    bool started = false;
    if (q.flags & PC_STREAM_ACK)
        note_ack(dp, t, q.name, q.part, q.from, q.flags & PC_STREAM_CAUGHT);
    int rc = q.max ? ps_catalog_changelog_start(dp->cat, t, &log, &started) : 0;
    if (!q.max) {
        if ((log = ps_table_changelog(t)))
            ps_changelog_bounds(log, &oldest, &head);
        stream_send_bounds(c, h, t, &q, head, oldest);
    } else if (rc == PC_EUNSUPPORTED) {
        snprintf(msg, sizeof msg, "table %s keeps no change log (ps-server --delta-log-entries=0)",
                 q.name);
        reply_error(c, h, rc, msg);
    } else if (rc) {
        reply_error(c, h, rc, "starting the change log");
    } else if (started) {
        ps_changelog_bounds(log, &oldest, &head);
        snprintf(msg, sizeof msg,
                 "table %s had no change log: its log starts now (oldest %llu, head %llu), "
                 "holding nothing from before: scan it first",
                 q.name, (unsigned long long)oldest, (unsigned long long)head);
        reply_error(c, h, PC_ERANGE, msg);
    } else {
        ps_changelog_bounds(log, &oldest, &head); /* to size the reply: at most up to the head */
        const uint64_t avail = q.from < head ? head - q.from : 0;
        if (max > avail)
            max = avail;
        /* a position the log no longer holds is refused before a reply is allocated for it */
        const bool held = q.from >= oldest && q.from <= head;
        wreq_t *w = held ? reply_alloc(c, pc_wire_stream_reply_len(max, dim)) : NULL;
        size_t n = 0;
        rc = !held ? PC_ERANGE : w ? 0 : PC_ENOMEM;
        uint64_t *keys = w ? (uint64_t *)(void *)(w->payload + PC_WIRE_STREAM_REPLY_PREFIX) : NULL;
        if (!rc)
            rc = ps_changelog_read(log, q.from, (size_t)max, keys, &n, &oldest, &head);
        if (rc == PC_ERANGE) {
            snprintf(msg, sizeof msg,
                     "position %llu of table %s is not held (oldest %llu, head %llu): scan it "
                     "again",
                     (unsigned long long)q.from, q.name, (unsigned long long)oldest,
                     (unsigned long long)head);
            reply_error(c, h, rc, msg);
        } else if (rc) {
            reply_error(c, h, rc, "stream reply");
        }
        if (rc) {
            if (w)
                reply_free(c->lc, w);
        } else {
            /* n <= max: the reply keeps its size; the arrays move to n's offsets (the keys of
             * slots this server only backs up stay out, and `next` passes them too) */
            const size_t kept = keep_primary(dp, keys, n);
            pc_wire_stream_reply_t r = {ps_table_uid(t), q.from,         q.from + n, head,
                                        oldest,          (uint32_t)kept, dim};
            stream_send(c, h, t, w, &r, keys);
        }
    }
    ps_catalog_release(dp->cat, t);
}

typedef struct scan_ctx {
    uint64_t want[PC_NSLOTS / 64]; /* the slots whose rows are sent (bits) */
    size_t n, cap, limit;          /* rows collected, allocated, allowed */
    uint64_t *keys;
    int rc;
} scan_ctx_t;

/* x->want from map m (NULL: every slot): the slots this server is primary of (all when it owns
 * every slot or the map names no backups), and of them only those that server `backup` backs up
 * (PC_NO_SERVER: no such condition). */
static void scan_want(scan_ctx_t *x, const ps_dp_t *dp, const pc_cluster_map_t *m,
                      uint32_t backup) {
    if (!m || ((dp->owns_all || !dp->replicated) && backup == PC_NO_SERVER))
        memset(x->want, 0xff, sizeof x->want);
    else
        pc_cmap_backed_up(m, dp->o.self, backup, x->want);
}

/* Append key to x->keys (below x->limit); false with x->rc PC_ENOMEM. */
static bool scan_add(scan_ctx_t *x, uint64_t key) {
    if (pc_sappend_u64(&x->keys, &x->n, &x->cap, key))
        return true;
    x->rc = PC_ENOMEM;
    return false;
}

static int scan_collect(void *ctx, const ps_row_view_t *rows, size_t n) {
    scan_ctx_t *x = ctx;
    for (size_t i = 0; i < n; i++) {
        if (!pc_slots_has(x->want, pc_key_slot(rows[i].key)))
            continue;
        if (x->n == x->limit) {
            x->rc = PC_ETOOBIG;
            return 1;
        }
        if (!scan_add(x, rows[i].key))
            return 1;
    }
    return 0;
}

/* ps_table_cold_walk of a cold page (PC_STREAM_COLD, part == parts): the wanted keys, until
 * x->limit of them (the walk stops before the next one: the next page starts there). */
static int cold_page_key(void *ctx, uint64_t key) {
    scan_ctx_t *x = ctx;
    if (!pc_slots_has(x->want, pc_key_slot(key)))
        return 0;
    return x->n == x->limit || !scan_add(x, key) ? 1 : 0;
}

/* SCAN: every row in part q.part of q.parts (ps_table_scan_part: with parts a power of two, a
 * part's walk is about 1/parts of the table, so a copy in many parts does not walk the whole
 * table per part, blocking this loop each time), with the change log's head
 * taken before the scan: DELTAS from there bring every change made since. A table without a log
 * gets one first (when the server starts logs): the head is taken after it is installed, so
 * every change the scan may miss is in the log after it. */
static void do_scan(conn_t *c, const pc_wire_hdr_t *h, const uint8_t *body) {
    ps_dp_t *dp = c->lc->dp;
    pc_wire_stream_t q;
    ps_table_t *t = stream_table(c, h, body, &q);
    if (!t)
        return;
    char msg[PC_WIRE_MSG_MAX];
    const uint32_t dim = stream_dim(t, &q);
    uint64_t oldest = 0, head = 0;
    /* at most the reply limit and the subscriber's buffers */
    scan_ctx_t x = {.limit = stream_rows_max(dp, dim, q.max)};
    const bool page = (q.flags & PC_STREAM_COLD) && q.part == q.parts; /* of the cold store */
    uint64_t start = q.start;
    if (!q.parts || (q.part >= q.parts && !page)) {
        reply_error(c, h, PC_EINVAL, "a scan needs part < parts (or part == parts: a cold page)");
    } else if (ps_table_config(t)->cold && !(q.flags & PC_STREAM_COLD)) {
        snprintf(msg, sizeof msg,
                 "table %s spills to the cold tier: only a backup's copy, which walks the cold "
                 "store too, scans it",
                 q.name);
        reply_error(c, h, PC_EUNSUPPORTED, msg);
    } else {
        ps_changelog_t *log = NULL;
        x.rc = ps_catalog_changelog_start(dp->cat, t, &log, NULL);
        if (x.rc == PC_EUNSUPPORTED) /* a server that keeps no logs: a scan, position 0 */
            x.rc = 0;
        else if (!x.rc)
            ps_changelog_bounds(log, &oldest, &head);
        /* the slots sent, from the map as it is now (a map change does not wait for the scan):
         * with backups in the map only those this server is primary of, and for a backup's copy
         * only those it backs up */
        const uint32_t backup = q.flags & PC_STREAM_BACKUP ? (uint32_t)q.from : PC_NO_SERVER;
        pthread_rwlock_rdlock(&dp->map_lock);
        if (!x.rc && (q.flags & PC_STREAM_SAME_MAP) && pc_cmap_version(dp->map) != h->map_version)
            x.rc = PC_EWRONGSLOT; /* a copy under another map: see pc_wire.h */
        if (!x.rc && (q.flags & PC_STREAM_BACKUP) &&
            (!dp->map || q.from >= pc_cmap_nservers(dp->map)))
            x.rc = PC_EINVAL;
        if (!x.rc)
            scan_want(&x, dp, dp->map, backup);
        pthread_rwlock_unlock(&dp->map_lock);
        if (x.rc == PC_EWRONGSLOT)
            note_newer_map(dp, h->map_version);
        if (!x.rc && page) {
            if (x.limit > COLD_PAGE_ROWS)
                x.limit = COLD_PAGE_ROWS;
            const int wrc = ps_table_cold_walk(t, &start, COLD_PAGE_VISIT, cold_page_key, &x);
            if (wrc < 0 && !x.rc)
                x.rc = wrc; /* (1: the page is full, start is the next one's) */
        } else if (!x.rc && ps_table_scan_part(t, PS_SCAN_ALL, q.part, q.parts, scan_collect, &x) &&
                   !x.rc)
            x.rc = PC_EINTERNAL;
        wreq_t *w = x.rc ? NULL : reply_alloc(c, pc_wire_stream_reply_len(x.n, dim));
        if (!x.rc && !w)
            x.rc = PC_ENOMEM;
        if (x.rc == PC_ETOOBIG) {
            snprintf(msg, sizeof msg,
                     "part %u of %u of table %s holds over %llu rows, more than a reply may "
                     "carry: scan it in more parts",
                     q.part, q.parts, q.name, (unsigned long long)x.limit);
            reply_error(c, h, x.rc, msg);
        } else if (x.rc == PC_EINVAL) {
            snprintf(msg, sizeof msg,
                     "a backup's scan names server %llu, which map version %llu "
                     "does not have",
                     (unsigned long long)q.from, (unsigned long long)h->map_version);
            reply_error(c, h, x.rc, msg);
        } else if (x.rc) {
            reply_error(c, h, x.rc, x.rc == PC_EWRONGSLOT ? NULL : "scan");
        } else {
            /* (a cold page's `from`: the next page's start) */
            pc_wire_stream_reply_t r = {ps_table_uid(t), page ? start : 0, head, head,
                                        oldest,          (uint32_t)x.n,    dim};
            stream_send(c, h, t, w, &r, x.keys);
        }
    }
    pc_sfree(x.keys);
    ps_catalog_release(dp->cat, t);
}

static bool do_frame_(conn_t *c, const pc_wire_hdr_t *h, const uint8_t *body);

/* Execute one complete frame (timed). Returns false when the connection must close. */
static bool do_frame(conn_t *c, const pc_wire_hdr_t *h, const uint8_t *body) {
    const uint64_t t0 = pc_time_mono_ns();
    bool ok = do_frame_(c, h, body);
    const int k = h->op == PC_OP_PULL ? 0 : h->op == PC_OP_PUSH ? 1 : h->op == PC_OP_LOOKUP ? 2 : 3;
    pc_hist_add(&c->lc->dp->lat[k], pc_time_mono_ns() - t0);
    return ok;
}

static bool do_frame_(conn_t *c, const pc_wire_hdr_t *h, const uint8_t *body) {
    ps_dp_t *dp = c->lc->dp;
    atomic_fetch_add_explicit(&dp->bytes_in, PC_WIRE_HDR + h->body_len, memory_order_relaxed);
    if (h->flags & PC_WIRE_RESPONSE) {
        reply_error(c, h, PC_EINVAL, "a response sent to the server");
        return false;
    }
    if (h->op == PC_OP_HELLO) {
        if (dp->token_len && !token_ok(dp, body, h->body_len)) {
            reply_error(c, h, PC_EAUTH, "bad token");
            return false;
        }
        c->authed = true;
        reply_map(c, h);
        return true;
    }
    assert(!dp->token_len || c->authed); /* drain_stage_ refuses others at their header */
    switch (h->op) {
        case PC_OP_PING: {
            wreq_t *w = reply_alloc(c, 0);
            if (!w)
                return false;
            reply_send(c, w, h, 0, 0);
            return true;
        }
        case PC_OP_MAP:
            reply_map(c, h);
            return true;
        case PC_OP_CLAIM:
            do_claim(c, h, body);
            return true;
        case PC_OP_TABLES:
            do_tables(c, h);
            return true;
        case PC_OP_DELTAS:
            do_deltas(c, h, body);
            return true;
        case PC_OP_SCAN:
            do_scan(c, h, body);
            return true;
        default:
            do_batch(c, h, body);
            return true;
    }
}

/* ==== connections ========================================================================== */

static void stop_timer_close(loopctx_t *lc) {
    if (!uv_is_closing((uv_handle_t *)&lc->stop_timer))
        uv_close((uv_handle_t *)&lc->stop_timer, NULL);
}

static void on_closed(uv_handle_t *hd) {
    conn_t *c = hd->data;
    loopctx_t *lc = c->lc;
    if (lc->parked)
        park_release(lc, false, c); /* its parked replies have no one to go to */
    if (c->prev)
        c->prev->next = c->next;
    else
        lc->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    pc_free(PC_MEM_SCRATCH, c->stage, STAGE_BYTES);
    body_free(c);
    pc_tls_free(c->tls);
    if (c->paused)
        atomic_fetch_sub_explicit(&lc->dp->paused, 1, memory_order_relaxed);
    pc_free(PC_MEM_OTHER, c, sizeof *c);
    atomic_fetch_sub_explicit(&lc->dp->conns, 1, memory_order_relaxed);
    if (lc->stopping && !lc->conns) /* the last one out: the stop's deadline is not needed */
        stop_timer_close(lc);
}

static void conn_close(conn_t *c) {
    if (c->closing)
        return;
    c->closing = true;
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
    (void)status;
    conn_t *c = req->data;
    free(req);
    conn_close(c);
}

/* Close after the queued replies are written. */
static void conn_finish(conn_t *c) {
    if (c->closing || c->finishing)
        return;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->finishing = true; /* on_shutdown closes the handle once the replies are out */
    uv_shutdown_t *req = malloc(sizeof *req);
    if (!req || uv_shutdown(req, (uv_stream_t *)&c->tcp, on_shutdown) < 0) {
        free(req);
        conn_close(c);
        return;
    }
    req->data = c;
}

/* Where the connection's next plaintext bytes go: the discard area, a large body or the
 * staging buffer. */
static uv_buf_t conn_buf(conn_t *c) {
    if (c->skip) /* discard into the (empty) staging buffer */
        return uv_buf_init((char *)c->stage,
                           (unsigned)(c->skip < STAGE_BYTES ? c->skip : STAGE_BYTES));
    if (c->body)
        return uv_buf_init((char *)c->body + c->body_have,
                           (unsigned)(c->hdr.body_len - c->body_have));
    return uv_buf_init((char *)c->stage + c->stage_len, (unsigned)(STAGE_BYTES - c->stage_len));
}

static void on_alloc(uv_handle_t *hd, size_t suggested, uv_buf_t *buf) {
    (void)suggested;
    conn_t *c = hd->data;
    void *p;
    size_t cap;
    if (!c->tls)
        *buf = conn_buf(c);
    else /* the socket is read straight into the session; no space: the read fails (closed) */
        *buf =
            pc_tls_inbuf(c->tls, &p, &cap) ? uv_buf_init(NULL, 0) : uv_buf_init(p, (unsigned)cap);
}

/* Execute the complete frames in the staging buffer; keep the tail (or move a large body into
 * its own buffer). Returns false when the connection must close. */
static bool drain_stage_(conn_t *c) {
    ps_dp_t *dp = c->lc->dp;
    size_t off = 0;
    bool ok = true;
    /* (a connection closed by a failed reply runs no more frames: their pushes would be
     * applied and never answered) */
    while (ok && !c->closing && c->stage_len - off >= PC_WIRE_HDR) {
        if (!may_run(c)) { /* too many reply bytes unsent: keep the rest for later */
            conn_pause(c);
            break;
        }
        pc_wire_hdr_t h;
        int rc = pc_wire_hdr_decode(c->stage + off, dp->o.lim.max_body, &h);
        /* Before a peer has said the token, no body beyond a HELLO's is held for it, nor one
         * over the limit skipped for it */
        if ((rc == 0 || rc == PC_ETOOBIG) && dp->token_len && !c->authed &&
            (h.op != PC_OP_HELLO || h.body_len > sizeof dp->token)) {
            reply_error(c, &h, PC_EAUTH,
                        h.op == PC_OP_HELLO ? "bad token" : "say HELLO with the token first");
            return false;
        }
        if (rc == PC_ETOOBIG) { /* framing intact: answer, discard the body, go on */
            reply_error(c, &h, rc, "body over the limit");
            const size_t here = c->stage_len - off - PC_WIRE_HDR;
            if (here >= h.body_len) {
                off += PC_WIRE_HDR + h.body_len;
                continue;
            }
            c->skip = h.body_len - here;
            off = c->stage_len;
            break;
        }
        if (rc) { /* not this protocol: say so (best effort) and close */
            h.flags = 0;
            h.op = h.op >= PC_OP_HELLO && h.op <= PC_OP_MAX_ ? h.op : PC_OP_PING;
            reply_error(c, &h, rc, "not an EmberPS frame");
            return false;
        }
        const size_t total = PC_WIRE_HDR + (size_t)h.body_len;
        if (c->stage_len - off < total) {
            if (total > STAGE_BYTES) { /* read the rest of the body straight into its buffer */
                if (!body_admit(c, h.body_len)) { /* over body_total: the frame waits, unread */
                    conn_pause(c);
                    break;
                }
                c->body = pc_malloc(PC_MEM_SCRATCH, h.body_len);
                c->hdr = h;
                if (!c->body) {
                    body_give(dp, h.body_len);
                    return false;
                }
                c->body_ms = uv_now(&c->lc->loop);
                c->body_have = c->stage_len - off - PC_WIRE_HDR;
                memcpy(c->body, c->stage + off + PC_WIRE_HDR, c->body_have);
                off = c->stage_len;
            }
            break;
        }
        const uint8_t *body = c->stage + off + PC_WIRE_HDR;
        if (((uintptr_t)body & 7) && h.body_len) { /* keys are used in place: align them */
            uint8_t *copy = pc_malloc(PC_MEM_SCRATCH, h.body_len);
            if (!copy)
                return false;
            memcpy(copy, body, h.body_len);
            ok = do_frame(c, &h, copy);
            pc_free(PC_MEM_SCRATCH, copy, h.body_len);
        } else {
            ok = do_frame(c, &h, body);
        }
        off += total;
    }
    memmove(c->stage, c->stage + off, c->stage_len - off);
    c->stage_len -= off;
    return ok;
}

/* drain_stage_ with the replies corked: the replies to the frames that one read brought go out
 * together, in as few writes as CORK_MAX and CORK_BYTES allow (plain TCP; a TLS reply is sealed
 * and written as it is made). */
static bool drain_stage(conn_t *c) {
    c->corked = !c->tls;
    const bool ok = drain_stage_(c);
    c->corked = false;
    cork_flush(c);
    return ok;
}

/* Execute the frame whose large body is complete in c->body, then free the body. */
static bool run_body(conn_t *c) {
    bool ok = c->closing || do_frame(c, &c->hdr, c->body);
    body_free(c);
    return ok;
}

/* nread plaintext bytes arrived where conn_buf() said. Returns false when the connection must
 * close (after its replies). */
static bool conn_input(conn_t *c, size_t nread) {
    bool ok = true;
    c->input_ms = uv_now(&c->lc->loop);
    if (c->skip) {
        c->skip -= (uint64_t)nread;
    } else if (c->body) {
        c->body_have += (size_t)nread;
        if (c->body_have == c->hdr.body_len) {
            if (may_run(c)) {
                ok = run_body(c);
            } else { /* executed when the connection continues */
                c->body_ready = true;
                conn_pause(c);
            }
        }
    } else {
        c->stage_len += (size_t)nread;
        ok = drain_stage(c);
    }
    return ok;
}

/* TLS: the address of c's peer, for log lines. */
static void peer_name(conn_t *c, char *buf, size_t cap) {
    struct sockaddr_storage sa;
    int len = sizeof sa;
    char ip[64] = "?";
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &len) == 0 && sa.ss_family == AF_INET)
        uv_ip4_name((const struct sockaddr_in *)&sa, ip, sizeof ip);
    snprintf(buf, cap, "%s:%d", ip,
             sa.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&sa)->sin_port) : 0);
}

/* TLS: advance the handshake, then hand the session's plaintext to conn_input until it has
 * none or the connection pauses. Returns false when the connection must close. */
static bool tls_pump(conn_t *c) {
    if (!pc_tls_established(c->tls)) {
        const int rc = pc_tls_handshake(c->tls);
        if (tls_flush(c)) /* the handshake's answer, or the alert of a failure */
            return false;
        if (rc == PC_EAGAIN)
            return true;
        if (rc) {
            char peer[80];
            peer_name(c, peer, sizeof peer);
            PC_WARN("data plane: %s: %s: closing", peer, pc_tls_error(c->tls));
            return false;
        }
    }
    while (!c->paused && !c->closing && !c->finishing) {
        const uv_buf_t b = conn_buf(c);
        if (!b.len)
            break;
        const ssize_t n = pc_tls_read(c->tls, b.base, b.len);
        if (n == 0)
            break;
        if (n < 0) {
            if (n != PC_ECLOSED) {
                char peer[80];
                peer_name(c, peer, sizeof peer);
                PC_WARN("data plane: %s: %s: closing", peer, pc_tls_error(c->tls));
            }
            return false;
        }
        if (!conn_input(c, (size_t)n))
            return false;
    }
    return c->closing || c->finishing || !tls_flush(c);
}

/* TLS: the connection's first bytes. A TLS ClientHello goes on; a plaintext EmberPS frame gets
 * PC_ETLS in clear (so that the client can say why); anything else is closed. Returns false
 * when the connection must close. */
static bool tls_start(conn_t *c, const uint8_t *data, size_t n) {
    ps_dp_t *dp = c->lc->dp;
    if (pc_tls_looks_like_hello(data, n))
        return c->tls_started = true;
    char peer[80];
    peer_name(c, peer, sizeof peer);
    PC_WARN("data plane: %s sent no TLS ClientHello (a plaintext client?): closing", peer);
    pc_wire_hdr_t h;
    const bool frame = n >= PC_WIRE_HDR && pc_wire_hdr_decode(data, dp->o.lim.max_body, &h) == 0 &&
                       !(h.flags & PC_WIRE_RESPONSE);
    pc_tls_free(c->tls); /* data points into it: decoded first. Replies go out in clear now */
    c->tls = NULL;
    if (frame)
        reply_error(c, &h, PC_ETLS,
                    "this server takes TLS connections only (give the client "
                    "the CA file of the server's certificate)");
    return false;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
    conn_t *c = s->data;
    if (nread < 0) { /* its end (a half-close: the replies of what it sent still go out) or an
                      * error (they could not) */
        if (nread != UV_EOF) {
            conn_close(c);
        } else if (c->parked) { /* its push replies wait for the backups: finished after them */
            c->eof = true;
            uv_read_stop(s);
        } else {
            conn_finish(c);
        }
        return;
    }
    c->lc->reads += nread > 0;
    bool ok;
    if (!c->tls)
        ok = conn_input(c, (size_t)nread);
    else if (!c->tls_started && nread && !tls_start(c, (const uint8_t *)buf->base, (size_t)nread))
        ok = false;
    else
        ok = (pc_tls_received(c->tls, (size_t)nread), tls_pump(c));
    if (!ok)
        conn_finish(c);
}

static void conn_resume(conn_t *c) {
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0)
        conn_close(c);
}

/* A paused connection goes on if may_run() allows: the complete body first, then the frames
 * in the staging buffer, then reading (unless that paused it again). */
static void conn_continue(conn_t *c) {
    if (!c->paused || c->closing || c->finishing || !may_run(c))
        return;
    c->paused = false;
    c->input_ms = uv_now(&c->lc->loop); /* (the frame deadline: not for its pause) */
    atomic_fetch_sub_explicit(&c->lc->dp->paused, 1, memory_order_relaxed);
    bool ok = true;
    if (c->body_ready) {
        c->body_ready = false;
        ok = run_body(c);
    }
    if (ok)
        ok = drain_stage(c);
    if (ok && !c->paused && c->tls) /* records read before the pause */
        ok = tls_pump(c);
    if (!ok)
        conn_finish(c);
    else if (!c->paused)
        conn_resume(c);
}

static void on_wake(uv_async_t *a) {
    loopctx_t *lc = a->data;
    if (lc->parked)
        park_release(lc, false, NULL);
    for (conn_t *c = lc->conns; c; c = c->next)
        conn_continue(c);
}

static void spare_reject(loopctx_t *lc);

static void on_spare_closed(uv_handle_t *hd) {
    loopctx_t *lc = hd->data;
    lc->spare_busy = false; /* (the handle is off libuv's queues only now) */
    if (lc->spare_pending && !lc->stopping) {
        lc->spare_pending = false;
        spare_reject(lc); /* the one that came meanwhile waits, unaccepted (the listener too) */
    }
}

/* No memory for a connection: accept it into the loop's spare handle and close it. A connection
 * left unaccepted would make libuv stop watching this loop's listener for good. */
static void spare_reject(loopctx_t *lc) {
    if (lc->spare_busy) {
        lc->spare_pending = true; /* on_spare_closed takes it */
        return;
    }
    uv_tcp_init(&lc->loop, &lc->spare);
    lc->spare.data = lc;
    lc->spare_busy = true;
    if (uv_accept((uv_stream_t *)&lc->listener, (uv_stream_t *)&lc->spare) == 0)
        PC_WARN("data plane: out of memory for a new connection: closed");
    uv_close((uv_handle_t *)&lc->spare, on_spare_closed);
}

static void on_connection(uv_stream_t *server, int status) {
    loopctx_t *lc = server->data;
    if (status < 0 || lc->stopping)
        return;
    conn_t *c = pc_calloc(PC_MEM_OTHER, 1, sizeof *c);
    if (!c) {
        spare_reject(lc);
        return;
    }
    c->lc = lc;
    c->born_ns = pc_time_mono_ns();
    c->input_ms = c->wrote_ms = uv_now(&lc->loop);
    c->stage = pc_malloc(PC_MEM_SCRATCH, STAGE_BYTES);
    if (lc->dp->tls && pc_tls_new(lc->dp->tls, NULL, &c->tls))
        c->tls = NULL; /* checked below */
    uv_tcp_init(&lc->loop, &c->tcp);
    c->tcp.data = c;
    c->next = lc->conns;
    if (lc->conns)
        lc->conns->prev = c;
    lc->conns = c;
    atomic_fetch_add_explicit(&lc->dp->conns, 1, memory_order_relaxed);
    /* accepted first, also when it is closed at once (see spare_reject) */
    if (uv_accept(server, (uv_stream_t *)&c->tcp) < 0 || !c->stage || (lc->dp->tls && !c->tls)) {
        conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_os_fd_t fd;
    if (uv_fileno((const uv_handle_t *)&c->tcp, &fd) == 0 &&
        pc_wire_watch_peer(fd, lc->dp->o.dead_peer_ms ? lc->dp->o.dead_peer_ms : 60000u))
        PC_WARN("data plane: cannot watch a connection for a dead client (%s)", strerror(errno));
    conn_resume(c);
}

/* ==== loops ================================================================================ */

/* Whether connection c is past its handshake: TLS established and, with a token, HELLO said. */
static bool admitted(const conn_t *c) {
    const ps_dp_t *dp = c->lc->dp;
    return (!dp->token_len || c->authed) && (!c->tls || pc_tls_established(c->tls));
}

/* Whether c holds part of a request frame: a header or body begun in its stage, a large body,
 * or an oversized one being discarded (a complete body waiting for a pause to end is not). */
static bool mid_frame(const conn_t *c) {
    return c->skip || (c->body && !c->body_ready) || (!c->body && c->stage_len > 0);
}

/* Whether c's large body, still being read, is past its deadline from its header on: frame_ms
 * plus 1 ms per KiB (about 1 MB/s; a sender that trickles bytes renews input_ms for ever). */
static bool body_late(const conn_t *c, uint64_t now_ms) {
    return c->body && !c->body_ready &&
           now_ms - c->body_ms > c->lc->dp->o.frame_ms + (c->hdr.body_len >> 10);
}

/* Whether paused c holds a complete large body that waits on replies its peer does not take:
 * none of them written for frame_ms (a peer that stopped reading held its share of body_total,
 * and with it every other connection's large requests, for as long as it lived). */
static bool body_stuck(const conn_t *c, uint64_t now_ms) {
    const uint64_t frame_ms = c->lc->dp->o.frame_ms;
    return c->body_ready && c->unsent && now_ms - c->wrote_ms > frame_ms &&
           now_ms - c->body_ms > frame_ms;
}

/* Every quarter of the shorter deadline: with a token or TLS, the connections not admitted
 * within hello_ms of their accept are closed; and every connection that holds part of a frame
 * and sent nothing for frame_ms. Not one paused by may_run: it is the server that does not read
 * it (its HELLO, or the rest of its frame, waits for its replies to drain); unless it holds a
 * complete large body and its peer takes none of its replies (body_stuck). */
static void on_deadline_timer(uv_timer_t *tm) {
    loopctx_t *lc = tm->data;
    const ps_dp_t *dp = lc->dp;
    const bool hello = dp->token_len || dp->tls;
    const uint64_t now = pc_time_mono_ns(), hello_ns = (uint64_t)dp->o.hello_ms * 1000000u,
                   now_ms = uv_now(&lc->loop);
    size_t late_hello = 0, late_frame = 0, stuck = 0;
    for (conn_t *c = lc->conns; c; c = c->next) {
        if (c->closing)
            continue;
        if (c->paused) {
            if (body_stuck(c, now_ms)) {
                stuck++;
                conn_close(c);
            }
            continue;
        }
        if (hello && !admitted(c) && now - c->born_ns > hello_ns) {
            late_hello++;
            conn_close(c);
        } else if (mid_frame(c) &&
                   (now_ms - c->input_ms > dp->o.frame_ms || body_late(c, now_ms))) {
            late_frame++;
            conn_close(c);
        }
    }
    if (late_hello)
        PC_WARN("data plane: %zu connection(s) did not finish the TLS handshake and HELLO within "
                "%u ms: closed",
                late_hello, dp->o.hello_ms);
    if (late_frame)
        PC_WARN("data plane: %zu connection(s) sent part of a request and then nothing for %u "
                "ms, or a large body slower than 1 KiB/ms: closed",
                late_frame, dp->o.frame_ms);
    if (stuck)
        PC_WARN("data plane: %zu connection(s) held a large request body while taking none of "
                "their replies for %u ms: closed",
                stuck, dp->o.frame_ms);
}

/* STOP_FLUSH_MS after a stop: a peer that does not read (stopped, stuck, partitioned) would hold
 * its connection's shutdown, the loop and the server's exit checkpoint forever. */
static void on_stop_timer(uv_timer_t *tm) {
    loopctx_t *lc = tm->data;
    size_t n = 0;
    for (conn_t *c = lc->conns; c; c = c->next) {
        n += !c->closing;
        conn_close(c);
    }
    if (n)
        PC_WARN("data plane: %zu connections did not take their replies within %d ms of the "
                "stop: closed",
                n, STOP_FLUSH_MS);
    stop_timer_close(lc);
}

static void on_stop(uv_async_t *a) {
    loopctx_t *lc = a->data;
    lc->stopping = true;
    uv_close((uv_handle_t *)&lc->listener, NULL);
    uv_close((uv_handle_t *)&lc->stop, NULL);
    uv_close((uv_handle_t *)&lc->wake, NULL);
    park_release(lc, true, NULL); /* pushes applied here, not confirmed by a backup */
    uv_close((uv_handle_t *)&lc->park_timer, NULL);
    uv_close((uv_handle_t *)&lc->deadline_timer, NULL);
    /* Frames already read were executed in their read callback (except those a paused
     * connection holds back: they are dropped): flush replies and close, within a bound. */
    for (conn_t *c = lc->conns; c; c = c->next)
        conn_finish(c);
    if (lc->conns)
        uv_timer_start(&lc->stop_timer, on_stop_timer, STOP_FLUSH_MS, 0);
    else
        stop_timer_close(lc);
}

static void *loop_main(void *arg) {
    loopctx_t *lc = arg;
    const uint64_t poll_ns = (uint64_t)lc->dp->o.poll_us * 1000u;
    if (!poll_ns) {
        uv_run(&lc->loop, UV_RUN_DEFAULT);
    } else {
        /* Busy polling: after input, epoll with no timeout until poll_ns pass without any,
         * yielding between polls to any thread waiting for this CPU. */
        uint64_t seen = lc->reads, last = 0;
        for (int alive = 1; alive;) {
            const uint64_t now = pc_time_mono_ns();
            const bool poll = now - last < poll_ns;
            if (poll)
                sched_yield();
            alive = uv_run(&lc->loop, poll ? UV_RUN_NOWAIT : UV_RUN_ONCE);
            if (lc->reads != seen) {
                seen = lc->reads;
                last = pc_time_mono_ns();
            }
        }
    }
    pool_drain(lc);
    pc_free(PC_MEM_SCRATCH, lc->conv, lc->conv_cap);
    lc->conv = NULL;
    lc->conv_cap = 0;
    return NULL;
}

/* The listening socket on host:port, which every event loop watches (a duplicate descriptor
 * each: a connection wakes the loops, the first to accept takes it). SO_REUSEADDR (a restarted
 * server binds at once, whatever its old connections' TIME_WAIT), not SO_REUSEPORT: with it, a
 * second server of the same user could bind the same port and silently take part of the
 * connections (seen when two tests' servers drew the same free port); a port in use is an
 * error. */
static int listen_fd(const char *host, int port, int *bound) {
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    if (inet_pton(AF_INET, host, &a.sin_addr) != 1) {
        PC_ERROR("data plane: bad IPv4 address %s", host);
        return PC_EINVAL;
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        bind(fd, (struct sockaddr *)&a, sizeof a) || listen(fd, 1024)) {
        PC_ERROR("data plane: cannot listen on %s:%d: %m", host, port);
        if (fd >= 0)
            close(fd);
        return PC_EIO;
    }
    socklen_t len = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &len);
    *bound = ntohs(a.sin_port);
    return fd;
}

static int set_map(ps_dp_t *dp, const pc_cluster_map_t *map, const pc_cluster_map_t *prev) {
    pc_cluster_map_t *m;
    int rc = pc_cmap_copy(map, &m);
    if (rc)
        return rc;
    size_t len = pc_cmap_format(m, NULL, 0);
    char *text = malloc(len + 1);
    if (!text) {
        pc_cmap_destroy(m);
        return PC_ENOMEM;
    }
    pc_cmap_format(m, text, len + 1);
    const bool all = pc_cmap_server_slots(m, dp->o.self) == PC_NSLOTS;
    uint64_t bk[PC_MAX_SERVERS / 64] = {0}, old[PC_MAX_SERVERS / 64] = {0};
    bool has = false;
    for (uint32_t slot = 0; prev && slot < PC_NSLOTS; slot++) { /* prev's backups of ours */
        uint32_t b[PC_MAX_BACKUPS];
        const uint32_t nb =
            pc_cmap_slot_owner(prev, slot) == dp->o.self ? pc_cmap_slot_backups(prev, slot, b) : 0;
        for (uint32_t j = 0; j < nb; j++)
            old[b[j] / 64] |= 1ull << (b[j] % 64);
    }
    for (uint32_t slot = 0; slot < PC_NSLOTS; slot++) {
        uint32_t b[PC_MAX_BACKUPS];
        const uint32_t nb =
            pc_cmap_slot_owner(m, slot) == dp->o.self ? pc_cmap_slot_backups(m, slot, b) : 0;
        for (uint32_t j = 0; j < nb; j++, has = true)
            bk[b[j] / 64] |= 1ull << (b[j] % 64);
    }
    pthread_rwlock_wrlock(&dp->map_lock);
    pthread_mutex_lock(&dp->ack_mu);
    for (size_t i = 0; i < dp->nacks; i++) /* a backup no more: in sync again only when caught up */
        if (!(bk[dp->acks[i].server / 64] >> (dp->acks[i].server % 64) & 1))
            dp->acks[i].in_sync = false;
    pthread_mutex_unlock(&dp->ack_mu);
    pc_cmap_destroy(dp->map);
    free(dp->map_text);
    for (size_t w = 0; w < PC_MAX_SERVERS / 64; w++) /* new since prev: joining */
        dp->joining[w] = (dp->joining[w] | (prev ? bk[w] & ~old[w] : 0)) & bk[w];
    memcpy(dp->backups, bk, sizeof bk);
    atomic_store(&dp->has_backups, has);
    dp->replicated = pc_cmap_replicated(m);
    dp->owns_all = all;
    dp->map = m;
    dp->map_text = text;
    dp->map_text_len = len;
    pthread_rwlock_unlock(&dp->map_lock);
    return 0;
}

int ps_dp_set_map(ps_dp_t *dp, const pc_cluster_map_t *map) {
    return ps_dp_set_map_from(dp, map, NULL);
}

int ps_dp_set_map_from(ps_dp_t *dp, const pc_cluster_map_t *map, const pc_cluster_map_t *prev) {
    int rc = set_map(dp, map, prev);
    if (!rc)
        wake_parked(dp); /* a backup dropped or added: parked replies may be answered */
    return rc;
}

int ps_dp_start(ps_catalog_t *cat, const pc_cluster_map_t *map, const ps_dp_opts_t *o,
                ps_dp_t **out) {
    if (!cat || !map || !o || !out || o->threads < 1 || o->threads > 64 ||
        o->self >= pc_cmap_nservers(map) || (o->token && strlen(o->token) >= 256))
        return PC_EINVAL;
    ps_dp_t *dp = pc_calloc(PC_MEM_OTHER, 1, sizeof *dp);
    if (!dp)
        return PC_ENOMEM;
    dp->cat = cat;
    dp->o = *o;
    if (o->token) {
        dp->token_len = strlen(o->token);
        memcpy(dp->token, o->token, dp->token_len);
    }
    dp->o.token = NULL;
    if (o->tls_cert && o->tls_cert[0]) {
        pc_tls_opts_t to = {.server = true,
                            .cert = o->tls_cert,
                            .key = o->tls_key,
                            .ca = o->tls_ca,
                            .client_auth = (pc_tls_auth_t)o->tls_client_auth};
        char err[400];
        int rc = pc_tls_ctx_create(&to, &dp->tls, err, sizeof err);
        if (rc) {
            PC_ERROR("data plane: %s", err);
            pc_free(PC_MEM_OTHER, dp, sizeof *dp);
            return rc;
        }
    }
    dp->o.tls_cert = dp->o.tls_key = dp->o.tls_ca = NULL;
    if (!dp->o.reply_queue) /* 0: no cap (halved: cap + cap / 8 must not overflow) */
        dp->o.reply_queue = UINT64_MAX / 2;
    if (!dp->o.hello_ms)
        dp->o.hello_ms = 10000;
    if (!dp->o.frame_ms)
        dp->o.frame_ms = 30000;
    if (!dp->o.reply_queue_total)
        dp->o.reply_queue_total = UINT64_MAX / 2;
    if (!dp->o.body_total)
        dp->o.body_total = UINT64_MAX / 2;
    pthread_rwlock_init(&dp->map_lock, NULL);
    pthread_mutex_init(&dp->ack_mu, NULL);
    /* no lease: pushes always taken; one to come (ps_repl.h): none until it is held */
    atomic_store(&dp->write_until, o->fenced ? 0 : UINT64_MAX);
    if (!dp->o.ack_timeout_ms)
        dp->o.ack_timeout_ms = 10000;
    int rc = set_map(dp, map, NULL);
    dp->loops = pc_calloc(PC_MEM_OTHER, (size_t)o->threads, sizeof *dp->loops);
    if (!rc && !dp->loops)
        rc = PC_ENOMEM;
    int port = o->port, fd0 = -1;
    for (int i = 0; !rc && i < o->threads; i++) {
        loopctx_t *lc = &dp->loops[i];
        lc->dp = dp;
        /* loop 0 binds, the rest watch the same socket */
        int fd = i == 0 ? (fd0 = listen_fd(o->host, port, &port)) : fcntl(fd0, F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
            rc = i == 0 ? fd : PC_ESYS;
            break;
        }
        uv_loop_init(&lc->loop);
        uv_tcp_init(&lc->loop, &lc->listener);
        lc->listener.data = lc;
        uv_async_init(&lc->loop, &lc->stop, on_stop);
        lc->stop.data = lc;
        uv_async_init(&lc->loop, &lc->wake, on_wake);
        lc->wake.data = lc;
        uv_timer_init(&lc->loop, &lc->park_timer); /* started by park_push */
        lc->park_timer.data = lc;
        uv_timer_init(&lc->loop, &lc->stop_timer); /* started by on_stop */
        lc->stop_timer.data = lc;
        uv_timer_init(&lc->loop, &lc->deadline_timer);
        lc->deadline_timer.data = lc;
        {
            uint64_t every = dp->o.frame_ms;
            if ((dp->token_len || dp->tls) && dp->o.hello_ms < every)
                every = dp->o.hello_ms;
            every = every / 4 ? every / 4 : 1;
            uv_timer_start(&lc->deadline_timer, on_deadline_timer, every, every);
            uv_unref((uv_handle_t *)&lc->deadline_timer); /* (the loop's life is its listener's) */
        }
        if (uv_tcp_open(&lc->listener, fd) < 0) {
            close(fd); /* (not the listener's yet) */
            rc = PC_EIO;
        } else if (uv_listen((uv_stream_t *)&lc->listener, 1024, on_connection) < 0) {
            rc = PC_EIO; /* the listener's: closed with it below */
        }
        dp->nloops = i + 1;
        if (rc || pthread_create(&lc->thread, NULL, loop_main, lc)) {
            uv_close((uv_handle_t *)&lc->listener, NULL);
            uv_close((uv_handle_t *)&lc->stop, NULL);
            uv_close((uv_handle_t *)&lc->wake, NULL);
            uv_close((uv_handle_t *)&lc->park_timer, NULL);
            uv_close((uv_handle_t *)&lc->stop_timer, NULL);
            uv_close((uv_handle_t *)&lc->deadline_timer, NULL);
            uv_run(&lc->loop, UV_RUN_DEFAULT);
            uv_loop_close(&lc->loop);
            dp->nloops = i;
            rc = rc ? rc : PC_ESYS;
        }
    }
    dp->port = port;
    if (rc) {
        ps_dp_stop(dp);
        return rc;
    }
    PC_INFO("data plane on %s:%d, %d event loops%s%s", o->host, port, o->threads,
            dp->token_len ? ", token required" : "", dp->tls ? ", TLS" : "");
    *out = dp;
    return 0;
}

int ps_dp_port(const ps_dp_t *dp) {
    return dp->port;
}

void ps_dp_stats(ps_dp_t *dp, ps_dp_stats_t *s) {
    s->connections = atomic_load(&dp->conns);
    s->requests = atomic_load(&dp->requests);
    s->errors = atomic_load(&dp->errors);
    s->rows_pulled = atomic_load(&dp->pulled);
    s->rows_pushed = atomic_load(&dp->pushed);
    s->rows_looked_up = atomic_load(&dp->looked);
    s->bytes_in = atomic_load(&dp->bytes_in);
    s->bytes_out = atomic_load(&dp->bytes_out);
    s->reply_queue_bytes = atomic_load(&dp->unsent);
    s->reply_queue_peak_bytes = atomic_load(&dp->unsent_peak);
    s->paused_connections = atomic_load(&dp->paused);
    s->body_bytes = atomic_load(&dp->bodies);
    s->body_waits = atomic_load(&dp->body_waits);
    s->reply_pool_bytes = atomic_load(&dp->pooled);
    s->repl_waiting = atomic_load(&dp->parked_now);
    s->repl_waited = atomic_load(&dp->parked_total);
    s->repl_timeouts = atomic_load(&dp->park_timeouts);
}

bool ps_dp_pushes_idle(ps_dp_t *dp) {
    /* a store-load pair with the push side (count, then read write_until): the caller's
     * ps_dp_set_write_until (a release store) must be visible before `pushing` is read */
    atomic_thread_fence(memory_order_seq_cst);
    return atomic_load(&dp->pushing) == 0;
}

typedef struct synced_ctx {
    ps_dp_t *dp;
    uint32_t server;
    uint64_t slack;
    char *behind; /* the first table behind (may be NULL) */
    size_t cap;
} synced_ctx_t;

/* ps_catalog_each: 1 when backup x->server is not close behind table t. */
static int table_behind(void *ctx, ps_table_t *t) {
    const synced_ctx_t *x = ctx;
    ps_changelog_t *log = ps_table_changelog(t);
    if (!log)
        return 1; /* nobody follows it yet */
    uint64_t oldest, head;
    ps_changelog_bounds(log, &oldest, &head);
    const uint64_t uid = ps_table_uid(t);
    bool held = false;
    pthread_mutex_lock(&x->dp->ack_mu);
    for (size_t i = 0; i < x->dp->nacks && !held; i++) {
        const ack_t *a = &x->dp->acks[i];
        held = a->uid == uid && a->server == x->server && a->in_sync && a->pos + x->slack >= head;
    }
    pthread_mutex_unlock(&x->dp->ack_mu);
    if (!held && x->behind)
        snprintf(x->behind, x->cap, "%s", ps_table_config(t)->name);
    return !held;
}

bool ps_dp_backup_synced(ps_dp_t *dp, uint32_t server, uint64_t slack, char *behind, size_t cap) {
    if (behind && cap)
        behind[0] = '\0';
    synced_ctx_t x = {dp, server, slack, behind, cap};
    return ps_catalog_each(dp->cat, table_behind, &x) == 0;
}

size_t ps_dp_repl_lag(ps_dp_t *dp, ps_dp_lag_t *out, size_t cap) {
    pthread_rwlock_rdlock(&dp->map_lock);
    pthread_mutex_lock(&dp->ack_mu);
    size_t n = 0;
    for (size_t i = 0; i < dp->nacks; i++) {
        const ack_t *a = &dp->acks[i];
        if (a->server >= PC_MAX_SERVERS || !(dp->backups[a->server / 64] >> (a->server % 64) & 1))
            continue; /* no backup of this server any more */
        if (n < cap)
            out[n] = (ps_dp_lag_t){.uid = a->uid, .server = a->server, .acked = a->pos};
        if (n < cap)
            snprintf(out[n].table, sizeof out[n].table, "%s", a->table);
        n++;
    }
    pthread_mutex_unlock(&dp->ack_mu);
    pthread_rwlock_unlock(&dp->map_lock);
    for (size_t i = 0; i < n && i < cap; i++) { /* the heads, outside the locks */
        ps_table_t *t;
        out[i].head = out[i].acked;
        if (ps_catalog_acquire(dp->cat, out[i].table, &t))
            continue;
        ps_changelog_t *log = ps_table_changelog(t);
        uint64_t oldest;
        if (log && ps_table_uid(t) == out[i].uid)
            ps_changelog_bounds(log, &oldest, &out[i].head);
        ps_catalog_release(dp->cat, t);
    }
    return n;
}

size_t ps_dp_render_metrics(ps_dp_t *dp, char *buf, size_t cap, size_t len) {
    ps_dp_stats_t s;
    ps_dp_stats(dp, &s);
    len = pc_prom_appendf(
        buf, cap, len,
        "# TYPE emberps_dataplane_connections gauge\n"
        "emberps_dataplane_connections %llu\n"
        "# TYPE emberps_dataplane_requests_total counter\n"
        "emberps_dataplane_requests_total %llu\n"
        "# TYPE emberps_dataplane_errors_total counter\n"
        "emberps_dataplane_errors_total %llu\n"
        "# TYPE emberps_dataplane_rows_total counter\n"
        "emberps_dataplane_rows_total{op=\"pull\"} %llu\n"
        "emberps_dataplane_rows_total{op=\"push\"} %llu\n"
        "emberps_dataplane_rows_total{op=\"lookup\"} %llu\n"
        "# TYPE emberps_dataplane_bytes_total counter\n"
        "emberps_dataplane_bytes_total{dir=\"in\"} %llu\n"
        "emberps_dataplane_bytes_total{dir=\"out\"} %llu\n"
        "# TYPE emberps_dataplane_reply_queue_bytes gauge\n"
        "emberps_dataplane_reply_queue_bytes %llu\n"
        "# TYPE emberps_dataplane_reply_queue_peak_bytes gauge\n"
        "emberps_dataplane_reply_queue_peak_bytes %llu\n"
        "# TYPE emberps_dataplane_paused_connections gauge\n"
        "emberps_dataplane_paused_connections %llu\n"
        "# TYPE emberps_dataplane_reply_pool_bytes gauge\n"
        "emberps_dataplane_reply_pool_bytes %llu\n"
        "# TYPE emberps_dataplane_body_bytes gauge\n"
        "emberps_dataplane_body_bytes %llu\n"
        "# TYPE emberps_dataplane_body_waits_total counter\n"
        "emberps_dataplane_body_waits_total %llu\n"
        "# TYPE emberps_dataplane_request_seconds histogram\n",
        (unsigned long long)s.connections, (unsigned long long)s.requests,
        (unsigned long long)s.errors, (unsigned long long)s.rows_pulled,
        (unsigned long long)s.rows_pushed, (unsigned long long)s.rows_looked_up,
        (unsigned long long)s.bytes_in, (unsigned long long)s.bytes_out,
        (unsigned long long)s.reply_queue_bytes, (unsigned long long)s.reply_queue_peak_bytes,
        (unsigned long long)s.paused_connections, (unsigned long long)s.reply_pool_bytes,
        (unsigned long long)s.body_bytes, (unsigned long long)s.body_waits);
    len = pc_prom_appendf(buf, cap, len,
                          "# TYPE emberps_replication_waiting_pushes gauge\n"
                          "emberps_replication_waiting_pushes %llu\n"
                          "# TYPE emberps_replication_waited_pushes_total counter\n"
                          "emberps_replication_waited_pushes_total %llu\n"
                          "# TYPE emberps_replication_unconfirmed_pushes_total counter\n"
                          "emberps_replication_unconfirmed_pushes_total %llu\n"
                          "# TYPE emberps_replication_lag_entries gauge\n",
                          (unsigned long long)s.repl_waiting, (unsigned long long)s.repl_waited,
                          (unsigned long long)s.repl_timeouts);
    ps_dp_lag_t lag[16];
    const size_t nl = ps_dp_repl_lag(dp, lag, 16);
    for (size_t i = 0; i < nl && i < 16; i++)
        len = pc_prom_appendf(
            buf, cap, len, "emberps_replication_lag_entries{table=\"%s\",backup=\"%u\"} %llu\n",
            lag[i].table, lag[i].server, (unsigned long long)(lag[i].head - lag[i].acked));
    static const char *const ops[4] = {"op=\"pull\"", "op=\"push\"", "op=\"lookup\"",
                                       "op=\"other\""};
    for (int i = 0; i < 4; i++)
        len =
            pc_hist_render(&dp->lat[i], "emberps_dataplane_request_seconds", ops[i], buf, cap, len);
    return len;
}

void ps_dp_stop(ps_dp_t *dp) {
    if (!dp)
        return;
    for (int i = 0; i < dp->nloops; i++)
        uv_async_send(&dp->loops[i].stop);
    /* Every thread first: a loop still flushing may wake the others (unsent_sub). */
    for (int i = 0; i < dp->nloops; i++)
        pthread_join(dp->loops[i].thread, NULL);
    for (int i = 0; i < dp->nloops; i++)
        if (uv_loop_close(&dp->loops[i].loop) != 0)
            PC_ERROR("data plane: loop %d closed with handles open", i);
    pc_free(PC_MEM_OTHER, dp->loops, (size_t)dp->o.threads * sizeof *dp->loops);
    pc_cmap_destroy(dp->map);
    free(dp->map_text);
    pthread_rwlock_destroy(&dp->map_lock);
    pthread_mutex_destroy(&dp->ack_mu);
    pc_sfree(dp->acks);
    pc_tls_ctx_destroy(dp->tls);
    pc_free(PC_MEM_OTHER, dp, sizeof *dp);
}
