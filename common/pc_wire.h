/* pc_wire.h: the binary data plane's frames (EmberPS workers <-> servers). docs/wire.md is the
 * specification; this is its one implementation, shared by server and client.
 *
 * Every frame is a 32-byte header followed by `body_len` bytes, all little-endian:
 *   0  u32 magic "EMBR"        16 i32 status (responses; 0 or a negative PC_E* code)
 *   4  u8  version (1)         20 u32 body_len
 *   5  u8  op                  24 u64 map version (request: the client's; response: server's)
 *   6  u16 flags (bit 0: response; bits 1-2: a reply's element type, pc_wire_dtype_t)
 *   8  u64 request id (a response echoes its request's)
 * Requests are answered in any order (match by id); many may be in flight per connection.
 *
 * Batch bodies (PULL, PUSH, LOOKUP requests): a 16-byte prefix {u16 name_len, u16 type, u32 n,
 * u32 dim, u32 epoch} (epoch: PUSH only, the generation fence, else 0), the table name padded with
 * zeros to a multiple of 8, then n u64 keys, then (PUSH) n * dim f32 gradients. So keys and floats
 * start 8-aligned in an aligned buffer and both ends use the arrays in place: no per-element
 * encoding. Responses: PULL n * dim f32 rows; LOOKUP rows then n found bytes; PUSH three u64
 * counters (applied, skipped_nonfinite, dropped_unadmitted). CLAIM: see pc_wire_claim_t. TABLES:
 * each table's settings text ("name=emb,dim=16,...") followed by '\n'. HELLO carries the token and
 * is answered with the server's cluster map text, as is MAP. An error response's body is a one-line
 * message, except PC_EWRONGSLOT whose body is the server's current cluster map text.
 *
 * Every length is checked against limits before anything is allocated for it.
 *
 * Compressed rows (docs/wire.md "Compressed rows"): a batch names the element type of its rows
 * and gradients in the prefix's u16 at offset 2 (0: f32, what a server of wire v1 requires
 * there, so an old server refuses any other with PC_EINVAL and the connection lives); a reply of
 * status 0 to such a batch carries the type in its header's flags (bits 1-2), which only a
 * client that asked for it ever sees. PUSH gradients and PULL/LOOKUP rows then take 2 bytes an
 * element; conversions are pc_half.h's.
 *
 * Generation fences (docs/wire.md "Generation fences"): a PUSH may carry its job generation's
 * epoch in the prefix's last u32 (0: none, what a server before fences requires there); a
 * server refuses one below the epoch its table was fenced at (a CLAIM of mode 4) with
 * PC_EFENCED. A client stamps epochs only once its fence claim succeeded.
 */
#ifndef PC_WIRE_H
#define PC_WIRE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PC_WIRE_MAGIC    0x52424D45u /* "EMBR" as bytes E M B R */
#define PC_WIRE_VERSION  1
#define PC_WIRE_HDR      32u
#define PC_WIRE_PREFIX   16u
#define PC_WIRE_NAME_MAX 64u
#define PC_WIRE_DIM_MAX  1024u
#define PC_WIRE_MSG_MAX  512u  /* error message bodies */
#define PC_WIRE_JOB_MAX  127u  /* bytes of a job name in a claim */
#define PC_WIRE_CFG_MAX  2047u /* bytes of a table's settings text in a claim reply */
#define PC_WIRE_RESPONSE 0x1u

typedef enum {
    PC_OP_HELLO = 1,  /* body: token (may be empty) -> cluster map text */
    PC_OP_PULL = 2,   /* batch -> rows */
    PC_OP_PUSH = 3,   /* batch + gradients -> counters */
    PC_OP_LOOKUP = 4, /* batch -> rows + found */
    PC_OP_MAP = 5,    /* empty -> cluster map text */
    PC_OP_PING = 6,   /* empty -> empty */
    PC_OP_CLAIM = 7,  /* claim -> claim reply: a job claims a table (ps_catalog_claim) */
    PC_OP_TABLES = 8, /* empty -> the tables' settings texts, one line each (sorted by name) */
    PC_OP_DELTAS = 9, /* stream request -> stream reply: keys changed since a position */
    PC_OP_SCAN = 10,  /* stream request -> stream reply: one part of every row (a resync) */
    PC_OP_MAX_ = 10
} pc_wire_op_t;

/* Element types of rows and gradients (PULL, PUSH, LOOKUP). */
typedef enum {
    PC_WIRE_F32 = 0,
    PC_WIRE_BF16 = 1,
    PC_WIRE_F16 = 2,
    PC_WIRE_DTYPE_MAX_ = 2
} pc_wire_dtype_t;
#define PC_WIRE_DTYPE_SHIFT 1
#define PC_WIRE_DTYPE_MASK  0x6u /* flags bits of a reply's element type */

/* Bytes of an element: 4 (f32) or 2. */
static inline size_t pc_wire_dtype_size(pc_wire_dtype_t t) {
    return t == PC_WIRE_F32 ? 4 : 2;
}
/* "f32", "bf16", "f16" ("?" for another value). Static storage. */
const char *pc_wire_dtype_name(unsigned t);

typedef struct pc_wire_hdr {
    uint8_t op;
    uint16_t flags;
    uint64_t id;
    int32_t status;
    uint32_t body_len;
    uint64_t map_version;
} pc_wire_hdr_t;

typedef struct pc_wire_limits {
    uint32_t max_body;  /* bytes */
    uint32_t max_keys;  /* per batch */
    uint32_t max_reply; /* bytes of a reply's body (rows, found bytes); 0: no limit */
} pc_wire_limits_t;

void pc_wire_hdr_encode(const pc_wire_hdr_t *h, uint8_t out[PC_WIRE_HDR]);

/* Every field is filled in, then checked. PC_EPARSE: not a frame of this protocol (magic,
 * version, unknown op or flags; the element type bits only in a response, with a known type; a
 * status only in a response, and then 0 or negative):
 * the stream cannot be trusted any more. PC_ETOOBIG: body_len over max_body (the framing is
 * intact: the body can be skipped). */
int pc_wire_hdr_decode(const uint8_t in[PC_WIRE_HDR], uint32_t max_body, pc_wire_hdr_t *h);

/* The element type a reply's flags carry (PC_WIRE_F32 when none). */
static inline pc_wire_dtype_t pc_wire_hdr_dtype(const pc_wire_hdr_t *h) {
    return (pc_wire_dtype_t)((h->flags & PC_WIRE_DTYPE_MASK) >> PC_WIRE_DTYPE_SHIFT);
}

/* A batch body, decoded in place (pointers into the body). */
typedef struct pc_wire_batch {
    char name[PC_WIRE_NAME_MAX + 1];
    uint32_t n, dim;
    pc_wire_dtype_t dtype; /* of vals (PUSH) and of the reply's rows (PULL, LOOKUP) */
    const uint64_t *keys;
    const float *vals;      /* PUSH in f32: n * dim gradients; NULL otherwise */
    const uint16_t *vals16; /* PUSH in bf16 or f16: n * dim gradients; NULL otherwise */
    uint32_t epoch;         /* PUSH: the pushing job generation's fence epoch (0: none) */
} pc_wire_batch_t;

/* Bytes of the prefix and padded name of a batch body. */
size_t pc_wire_batch_head_len(size_t name_len);

/* Total body bytes of a batch request (f32; _typed: gradients of element type t). */
uint64_t pc_wire_batch_body_len(pc_wire_op_t op, size_t name_len, uint32_t n, uint32_t dim);
uint64_t pc_wire_batch_body_len_typed(pc_wire_op_t op, size_t name_len, uint32_t n, uint32_t dim,
                                      pc_wire_dtype_t t);

/* Write the prefix and padded name (pc_wire_batch_head_len bytes) into out. The name must be
 * 1..PC_WIRE_NAME_MAX bytes. _typed: rows and gradients of element type t. */
size_t pc_wire_batch_head_encode(const char *name, uint32_t n, uint32_t dim, uint8_t *out);
size_t pc_wire_batch_head_encode_typed(const char *name, uint32_t n, uint32_t dim,
                                       pc_wire_dtype_t t, uint8_t *out);
/* A PUSH's fence epoch (docs/wire.md "Generation fences"), the prefix's last u32, into an
 * encoded head (0: not fenced, as encoded). PULL and LOOKUP carry 0. */
void pc_wire_batch_set_epoch(uint8_t *head, uint32_t epoch);

/* Decode a batch request body of `op` (8-aligned `body`): PC_EINVAL for a malformed body (the
 * frame boundaries are intact, so the connection can go on), PC_EUNSUPPORTED for an element type
 * this codec does not know (over PC_WIRE_DTYPE_MAX_), PC_ETOOBIG for n over max_keys, PC_EDIM
 * for a dim outside 1..PC_WIRE_DIM_MAX. */
int pc_wire_batch_decode(pc_wire_op_t op, const uint8_t *body, uint32_t len,
                         const pc_wire_limits_t *lim, pc_wire_batch_t *out);

/* Bytes of the reply body a PULL (n * dim f32) or LOOKUP (the same plus n found bytes) of n rows
 * of dim produces; 3 * 8 for PUSH, 0 for other ops. */
uint64_t pc_wire_reply_len(pc_wire_op_t op, uint64_t n, uint32_t dim);
/* The same with rows of element type t. */
uint64_t pc_wire_reply_len_typed(pc_wire_op_t op, uint64_t n, uint32_t dim, pc_wire_dtype_t t);

/* Whether the reply of `op` for n rows of dim fits max_reply (0: no limit): 0, or PC_ETOOBIG
 * with msg (cap bytes, may be NULL) naming the sizes, "lookup of 2097152 rows x dim 1024 = 8 GiB
 * over the reply limit of 64 MiB". Servers check it before any work or allocation. */
int pc_wire_reply_check(pc_wire_op_t op, uint64_t n, uint32_t dim, uint64_t max_reply, char *msg,
                        size_t cap);
int pc_wire_reply_check_typed(pc_wire_op_t op, uint64_t n, uint32_t dim, pc_wire_dtype_t t,
                              uint64_t max_reply, char *msg, size_t cap);

/* A claim (request body): a 16-byte prefix {u16 name_len, u16 mode, u32 job_len, u32 epoch,
 * u32 0}, the table name padded with zeros to a multiple of 8, then the job name (job_len bytes,
 * no NUL). mode is ps_claim_mode_t (0 check, 1 warm-start, 2 fresh, 3 inspect, 4 fence); epoch
 * is the fence's (mode 4 only, else 0). */
typedef struct pc_wire_claim {
    char name[PC_WIRE_NAME_MAX + 1];
    char job[PC_WIRE_JOB_MAX + 1];
    uint32_t mode, epoch;
} pc_wire_claim_t;

/* A claim reply (status 0): a 32-byte prefix {u32 action, u32 dim, u64 rows, u64 version,
 * u16 previous_len, u16 config_len, u32 0}, the previous owner (previous_len bytes), then the
 * table's settings text (config_len bytes). action is ps_claim_action_t (below
 * PC_WIRE_CLAIM_ACTIONS); rows and version are the table's before the claim. */
#define PC_WIRE_CLAIM_ACTIONS 5
typedef struct pc_wire_claim_reply {
    uint32_t action, dim;
    uint64_t rows, version;
    char previous[PC_WIRE_JOB_MAX + 1];
    char config[PC_WIRE_CFG_MAX + 1];
} pc_wire_claim_reply_t;

/* Encode into out (at least pc_wire_claim_len bytes); returns the bytes written. name must be
 * 1..PC_WIRE_NAME_MAX bytes, job at most PC_WIRE_JOB_MAX (else 0 is returned). */
size_t pc_wire_claim_len(size_t name_len, size_t job_len);
size_t pc_wire_claim_encode(const char *name, const char *job, uint32_t mode, uint32_t epoch,
                            uint8_t *out);
/* PC_EINVAL for a malformed body. */
int pc_wire_claim_decode(const uint8_t *body, uint32_t len, pc_wire_claim_t *out);

/* Same for the reply (previous and config are cut to their maximum lengths). */
size_t pc_wire_claim_reply_len(const pc_wire_claim_reply_t *r);
size_t pc_wire_claim_reply_encode(const pc_wire_claim_reply_t *r, uint8_t *out);
int pc_wire_claim_reply_decode(const uint8_t *body, uint32_t len, pc_wire_claim_reply_t *out);

/* The delta stream (docs/wire.md "The delta stream"). A request: a 16-byte prefix {u16 name_len,
 * u16 flags, u32 max, u32 part, u32 parts}, the table name padded to a multiple of 8, then u64
 * from and u64 uid (and u64 start with PC_STREAM_COLD). DELTAS reads up to `max` keys of the
 * table's change log from position `from`; SCAN sends every row whose key's slot hash falls in part
 * `part` of `parts`. uid: the table the subscriber follows (0: any; another one answers PC_ESTATE:
 * the table was replaced). flags (docs/server.md "Replicas and failover"): PC_STREAM_STATE, the
 * rows carry their optimizer state (the reply's dim is then dim + state words); PC_STREAM_ACK
 * (DELTAS only), the request comes from the backup whose server index is `part` (below
 * PC_MAX_SERVERS; parts 0), which has applied every position before `from`; PC_STREAM_SAME_MAP
 * (SCAN only), the frame header's map_version is the map the requester copies under, and a server
 * with another map answers PC_EWRONGSLOT with its own (a copy erases what the primary does not
 * send: under another map that could be rows it still has); PC_STREAM_BACKUP (SCAN with
 * PC_STREAM_SAME_MAP only), the requester is the server whose index is `from`, and only rows of
 * slots it backs up of this server under that map are sent (a backup's copy; a server the map does
 * not have: PC_EINVAL); PC_STREAM_CAUGHT (DELTAS with PC_STREAM_ACK only), the backup's previous
 * reply of this table reached the log's head and no copy of it is under way: from this
 * acknowledgement on the primary's pushes wait for it (before, a backup that joined a running
 * primary holds none back; one the primary's first map named holds every push back until then);
 * PC_STREAM_COLD (SCAN only), the requester walks a cold table's cold store too, so the table is
 * scanned in two passes: `parts` parts of the rows in RAM (part < parts, start 0), then pages of
 * the cold store's keys (part == parts) from key `start` (0 first) up to `max` rows, whose reply's
 * `from` is the next page's start (0: the walk is done); the rows are read as they are now, from
 * RAM or the cold store, and the changes made meanwhile come through DELTAS from the first part's
 * `next`, as for any scan. A page of a table that is not cold is empty and done; a scan of a cold
 * table without this flag is PC_EUNSUPPORTED. Other bits: PC_EINVAL. Every server of a cluster runs
 * the same release: an older one refuses these flags (PC_EINVAL). */
#define PC_STREAM_STATE    1u
#define PC_STREAM_ACK      2u
#define PC_STREAM_SAME_MAP 4u
#define PC_STREAM_BACKUP   8u
#define PC_STREAM_CAUGHT   16u
#define PC_STREAM_COLD     32u
#define PC_STREAM_FLAGS                                                                           \
    (PC_STREAM_STATE | PC_STREAM_ACK | PC_STREAM_SAME_MAP | PC_STREAM_BACKUP | PC_STREAM_CAUGHT | \
     PC_STREAM_COLD)
typedef struct pc_wire_stream {
    char name[PC_WIRE_NAME_MAX + 1];
    uint32_t flags, max, part, parts;
    uint64_t from, uid;
    uint64_t start; /* PC_STREAM_COLD only */
} pc_wire_stream_t;

size_t pc_wire_stream_len(size_t name_len, uint32_t flags);
/* Encode into out (pc_wire_stream_len bytes); 0 for a name of 0 or over PC_WIRE_NAME_MAX bytes. */
size_t pc_wire_stream_encode(const pc_wire_stream_t *q, uint8_t *out);
/* PC_EINVAL for a malformed body (PC_STREAM_COLD with ACK, or with start on a part of RAM rows). */
int pc_wire_stream_decode(const uint8_t *body, uint32_t len, pc_wire_stream_t *out);

/* A stream reply (status 0): a 48-byte prefix {u64 uid, u64 from, u64 next, u64 head, u64 oldest,
 * u32 n, u32 dim}, n u64 keys, n found bytes (1: the row follows as the table holds it; 0: the
 * key is absent: erased or evicted, its row zeros) padded with zeros to a multiple of 8, then n x
 * dim f32 rows. next: the position to ask from next (DELTAS), or (SCAN) the log's head before
 * the scan began, from which DELTAS continue; head and oldest: the log's bounds. */
typedef struct pc_wire_stream_reply {
    uint64_t uid, from, next, head, oldest;
    uint32_t n, dim;
} pc_wire_stream_reply_t;

#define PC_WIRE_STREAM_REPLY_PREFIX 48u
/* The widest row a stream reply carries: a row with Adam's state (dim + 2 dim + 1 words). */
#define PC_WIRE_STREAM_STRIDE_MAX (3u * PC_WIRE_DIM_MAX + 1u)
/* Bytes of a reply of n rows of dim; the offsets of its arrays. */
uint64_t pc_wire_stream_reply_len(uint64_t n, uint32_t dim);
uint64_t pc_wire_stream_found_off(uint64_t n);
uint64_t pc_wire_stream_rows_off(uint64_t n);
/* Write the prefix (the arrays are the caller's to fill at their offsets). */
void pc_wire_stream_reply_encode(const pc_wire_stream_reply_t *r, uint8_t *out);
/* Read the prefix and check len against n and dim (and dim <= PC_WIRE_STREAM_STRIDE_MAX):
 * PC_EINVAL. */
int pc_wire_stream_reply_decode(const uint8_t *body, uint32_t len, pc_wire_stream_reply_t *out);

/* ---- dead peers ----
 * A data-plane connection whose peer is gone without a word (its host lost power, a network cut
 * that drops packets instead of refusing them) would otherwise live on for the kernel's
 * retransmission limit (about 15 minutes) with its requests in flight, or for ever when idle.
 * pc_wire_watch_peer makes the kernel end it within about dead_ms of the peer's last
 * acknowledgement: TCP_USER_TIMEOUT (sent bytes unacknowledged for dead_ms), and keepalive
 * probes from dead_ms / 2 of silence, every dead_ms / 6, so that an idle connection is ended too.
 * Both ends call it on every data-plane socket (docs/wire.md "Dead peers"). 0, or PC_ESYS when
 * the socket takes an option (the connection still works, unwatched). */
int pc_wire_watch_peer(int fd, uint32_t dead_ms);

#endif
