/* pw_group.h: a job's worker membership, kept at the coordinator, and its collective group.
 *
 * Workers of a job form numbered generations. Generation G is decided once, by the first writer
 * of its member list (KvSet if_absent: racing proposals cannot disagree), and its collective
 * group rendezvouses under its own key prefix, so a group is never formed twice under one
 * prefix: a rank records the newest generation it tries (tried/<rank>), and one that finds a
 * generation tried (an earlier process of the rank tried it: its rendezvous keys name a process
 * that is gone) proposes the next generation instead, as does a member whose job's first formation
 * failed otherwise than by the timeout (it met such a key). A member's rank in the group is its
 * position in the member list; its data rank (which files it reads) stays the rank it was started
 * with.
 *
 * When a collective fails (a peer died) or a newer generation appears (a worker came back),
 * members call pw_group_recover:
 *   - a newer generation that lists this worker and has not formed yet: join it;
 *   - one that does not list it, or formed already: propose the next one with this worker added;
 *   - none: register as alive in the current generation and wait for rejoin_timeout_ms for a
 *     replacement to propose (once every member registered, nobody was lost: the next
 *     generation, of them all, at once); then, with `shrink`, propose the next generation made of
 * the workers that registered as alive (the job goes on without the lost ones; a lost worker that
 *     comes back later is added again), else keep waiting (a warning every rejoin_timeout_ms).
 * A worker started into a running job (its rank's generation formed already: it was restarted)
 * proposes the next generation with itself added, so the survivors re-form with it.
 *
 * Membership lease: from join to close a thread of the group sets "live/<rank>" every
 * lease_ms / 4 with a lease of lease_ms (the coordinator drops the key when the heartbeats stop:
 * the process died, hung or lost its network). Its value is a JSON object: {"rank", "gen",
 * "step", "state" ("joining", "training", "recovering", "exited"), "host", "pid", "start" (when
 * that process started, clock ticks after boot: a later process given its pid is not it), "node"
 * (the machine's name and pid namespace, "host/4026531836": where the pid means this process),
 * "note" (pw_group_note), "id" (random, this join's own)}; `psctl workers JOB` lists them. Each
 * heartbeat is a compare-and-set at the revision it read, and only while the key holds this
 * join's id (or is absent: its lease ran out while the coordinator was out of reach), so a worker
 * whose rank was taken over while it stalled never writes over its successor: it learns it lost
 * the rank (logged; pw_group_stale says true, pw_group_recover fails with PC_EEXIST) and leaves
 * the job. Joining takes the lease first (if absent): a rank whose lease a live worker holds is
 * refused with PC_EEXIST, so two workers given one rank fail at once instead of timing out; a
 * dead holder's lease (its process gone or its pid another process's now, checked on the same
 * node only, or not renewed within a heartbeat period) is taken over, by a compare-and-set at the
 * revision watched. A shrink takes only workers that registered as alive AND hold a live lease (one
 * that registered and died since is left out, so the new generation can form), and the survivors'
 * warnings say what is known of each one left out: lease expired, process gone, heartbeats stopped
 * (lost), or alive but busy elsewhere, with its note.
 *
 * Keys (all under "<job>/run/<k>", k = the job's finished runs, "<job>/runs"): "g/<G>" member
 * list, "g/<G>/formed", "g/<G>/alive/<rank>", "g/<G>/rdv/..." (the group's rendezvous), "cur"
 * (a hint of the newest G), "off/<rank>" (this rank's reader position after its last step),
 * "live/<rank>" (the membership lease), "takeover/<rank>" (a lease: the claimant that takes a
 * dead holder's rank over, so that of two workers given one rank one is refused).
 * A finished run (pw_group_finish) bumps "runs", so the next run of the same job name starts
 * fresh.
 *
 * Errors: PC_EEXIST (join: a live worker holds this rank; recover: another process took this
 * rank over while this one stalled), PC_ETIMEDOUT (the first generation
 * did not form within the timeout: a worker never came), PC_EUNAVAIL (the coordinator is
 * unreachable for longer than rejoin_timeout_ms), and the errors of pw_coll_create.
 *
 * Thread rule: a group is used by one thread (its heartbeat thread is internal).
 */
#ifndef PW_GROUP_H
#define PW_GROUP_H

#include <stdbool.h>
#include <stdint.h>

#include "emberps/psgrpc.h"
#include "pw_coll.h"

typedef struct pw_group_opts {
    const char *coordinator; /* host:gRPC port */
    const psg_opts_t *sec;   /* token, TLS of coordinator calls (borrowed for join); NULL: none */
    const char *job;         /* the job's key prefix */
    const char *host;        /* this worker's address as its peers reach it */
    int rank, world;         /* the data rank, and the workers the job starts with */
    int timeout_ms;          /* coordinator calls, collectives, every group formation */
    int rejoin_timeout_ms;   /* survivors wait this long for a lost worker */
    int lease_ms;            /* membership lease (heartbeats every lease_ms / 4); >= 100 */
    bool shrink;             /* then continue without it (else keep waiting) */
} pw_group_opts_t;

typedef struct pw_group pw_group_t;

/* Join the job: form its first generation, or, when it runs already, rejoin it. */
int pw_group_join(const pw_group_opts_t *o, pw_group_t **out);
void pw_group_close(pw_group_t *g);

/* The collective group of the current generation (valid until the next recover). */
pw_coll_t *pw_group_coll(pw_group_t *g);
/* A rendezvous for another collective backend of the current generation (NCCL's unique id):
 * the coordinator as a store, and a key prefix "<...>/g/<G>/<name>" new for every generation.
 * The kv is valid while the group is. */
void pw_group_rendezvous(pw_group_t *g, const char *name, pw_kv_t *kv, char *prefix, size_t cap);
int pw_group_rank(const pw_group_t *g); /* in the current generation */
/* This run of the job, "<job>/run/<k>": the same for every worker of the run, restarted ones
 * too; the next run of the job name gets a new one. Valid while the group is. */
const char *pw_group_run_name(const pw_group_t *g);
int pw_group_size(const pw_group_t *g);
uint64_t pw_group_gen(const pw_group_t *g);

/* After a collective failed, or when pw_group_stale: form the next generation (see above). */
int pw_group_recover(pw_group_t *g);

/* Propose the next generation with the current members (a voluntary re-formation, e.g. for a
 * job rollback: every member sees it as stale and regroups); then call pw_group_recover. A newer
 * proposal already there wins. */
int pw_group_reform(pw_group_t *g);

/* Whether a newer generation was proposed (asks the coordinator at most once a second, each ask
 * bounded by a quarter lease like the heartbeats: an unreachable coordinator costs the training
 * thread that, not --timeout-ms; a failed ask says no), or this process lost its rank (at once:
 * pw_group_recover then fails). */
bool pw_group_stale(pw_group_t *g);

/* What this worker is stuck on, for its heartbeats ("server 127.0.0.1:7401 unreachable since
 * ..."; NULL or "": nothing): peers that find it missing from a recovery name it. */
void pw_group_note(pw_group_t *g, const char *note);

/* The step this worker completed last, for its heartbeats. */
void pw_group_progress(pw_group_t *g, uint64_t step);

/* This rank's reader position after its last completed step, so that a restarted worker
 * continues from there (save: bounded by a quarter lease, as pw_group_stale); load reads data
 * rank `rank`'s: PC_ENOTFOUND when none was saved in this run. */
int pw_group_offset_save(pw_group_t *g, uint64_t step, uint64_t lines);
int pw_group_offset_load(pw_group_t *g, int rank, uint64_t *step, uint64_t *lines);
/* Set data rank `rank`'s saved position (a job rollback, from its rank 0: every rank's goes back
 * to the checkpoint's, so that a rank missing from the group, restarted later, resumes from the
 * checkpoint's position and not from where the abandoned run left it). */
int pw_group_offset_set(pw_group_t *g, int rank, uint64_t step, uint64_t lines);

/* The run is over (call once, from group rank 0): the job's name starts a new run next. */
int pw_group_finish(pw_group_t *g);

#endif
