/* pw_jobckpt.h: coordinated checkpoints of a distributed job, the worker side; each is also a
 * model version a serving replica can load.
 *
 * At a step boundary where every push of the step is applied and no push of the next one has
 * been sent (the trainer holds the workers at barriers around it), the group's rank 0 asks every
 * server to write a checkpoint (gRPC Checkpoint: its id, and its checkpoint directory) and writes
 * DIR/step-<S>/ (S in 20 digits) with
 *   dense.state  the dense state (weights, optimizer state, step count): pw_state_save
 *                (pw_model_io.h);
 *   model        the dense model file of the same weights (pw_model_save), when given;
 *   card         the model card (pw_model_card.h), when given;
 *   manifest     text lines "emberps-job-checkpoint 1", "step S", "servers ID0 ID1 ..." (each
 *                server's checkpoint id, in cluster-map order), "positions L0 L1 ..." (lines of
 *                each data rank's share read through step S), then one "server-dir I PATH" per
 *                server that said where its checkpoints are (PATH: the rest of the line, the
 *                server's checkpoint directory, ckpt-<20-digit id>/ under it; none from servers
 *                that do not say, and none in manifests written before them: both still read),
 *                and "run NAME" when the job's run is known (pw_group_run_name: a rollback
 *                goes only to a checkpoint of its own run, or the one it resumed from);
 * then DIR/LATEST ("S\n"); the step's directory is written whole as step-<S>.tmp/ and renamed
 * into place (a step written again replaces the old one at once), LATEST last, so a crash
 * leaves the previous checkpoint the latest. Of the step directories, the latest and the `keep` - 1
 * before it stay (later ones, abandoned by a rollback or half-written, go). DIR must be reachable
 * by every worker (one machine, or a shared file system) for a rollback.
 *
 * Rolling a job back to it: start server i with --restore-id=IDi, every worker with
 * --resume=checkpoint; or, while the job runs (--on-server-loss=rollback), restore the running
 * servers (pw_jobckpt_restore_servers) and load every worker's state and position
 * (docs/training.md).
 *
 * A model version (serving): a step directory with a manifest, a `model` and a `card` is the
 * job's model at step S: the dense part from `model` (pw_model_load into the model the card
 * describes), the sparse part by restoring server i's checkpoint id IDi from its server-dir
 * (docs/checkpoints.md). pw_jobckpt_read reads any step's manifest, pw_jobckpt_read_latest the
 * latest's.
 *
 * The manifest's last line "map TEXT" (when the trainer knows it) is the cluster map the servers
 * were cut under: a replica that loads the version without asking the servers routes keys by it.
 *
 * DESIGN (memory): pw_jobckpt_t is a value of fixed size (about 370 KiB: callers allocate it on
 * the heap) with no pointers to free: the server directories are NUL-terminated strings in one
 * arena of PW_JOBCKPT_DIRS_BYTES inside it (dir_off[i]: where server i's starts, 0: none), so a
 * job of 1024 servers may give each a path of 256 bytes on average, and one server a path of up
 * to PW_JOBCKPT_DIR_MAX - 1. Over the arena: PC_ETOOBIG.
 *
 * Errors: PC_ENOTFOUND (no checkpoint), PC_ECORRUPT (a damaged file), PC_EDIM (a dense state of
 * another size: another model), PC_EIO, PC_EUNAVAIL / PC_ETIMEDOUT (a server did not answer).
 *
 * Thread rule: pure functions over the caller's memory and files; a pw_jobckpt_t has one owner.
 */
#ifndef PW_JOBCKPT_H
#define PW_JOBCKPT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "emberps/psgrpc.h"
#include "pw_model.h"
#include "pw_model_card.h"

#define PW_JOBCKPT_MAX_SERVERS 1024
#define PW_JOBCKPT_MAX_RANKS   4096
#define PW_JOBCKPT_DIRS_BYTES  (256 << 10) /* the server directories, all together */
#define PW_JOBCKPT_DIR_MAX     4096        /* one server directory, its NUL included */
#define PW_JOBCKPT_MAP_MAX     (64 << 10)  /* the cluster map's text, its NUL included */
#define PW_JOBCKPT_RUN_MAX     256         /* the run's name, its NUL included */

typedef struct pw_jobckpt {
    uint64_t step;
    size_t nservers, nranks;
    uint64_t servers[PW_JOBCKPT_MAX_SERVERS];
    uint64_t positions[PW_JOBCKPT_MAX_RANKS];
    /* server i's checkpoint directory: dirs + dir_off[i] when dir_off[i] > 0 (see DESIGN) */
    uint32_t dir_off[PW_JOBCKPT_MAX_SERVERS];
    size_t dirs_used; /* bytes of dirs taken (dirs[0] is a NUL: offset 0 means none) */
    char dirs[PW_JOBCKPT_DIRS_BYTES];
    /* the cluster map the servers' checkpoints were cut under ("" none): a serving replica
     * routes keys by it (pc_cluster.h text; the manifest's "map TEXT" line) */
    char map[PW_JOBCKPT_MAP_MAX];
    /* the job's run that wrote it ("<job>/run/<k>"; "" unknown: a lone worker, or a manifest
     * written before runs were recorded) */
    char run[PW_JOBCKPT_RUN_MAX];
} pw_jobckpt_t;

/* Server i's checkpoint directory in ck ("" when it gave none); valid while ck is unchanged. */
const char *pw_jobckpt_server_dir(const pw_jobckpt_t *ck, size_t i);

/* Set server i's directory (i < PW_JOBCKPT_MAX_SERVERS; path without a newline, shorter than
 * PW_JOBCKPT_DIR_MAX; "" clears it). PC_EINVAL, PC_ETOOBIG (the arena is full: a directory set
 * again takes new room). Every field of a zeroed pw_jobckpt_t is an empty checkpoint. */
int pw_jobckpt_server_dir_set(pw_jobckpt_t *ck, size_t i, const char *path);

/* Whether a comma-separated server list has no empty entry ("a,,b", "a,", ",a"); "" is fine. */
bool pw_jobckpt_list_ok(const char *grpc);

/* Ask every server of `grpc` (comma-separated host:gRPC port, cluster-map order) to write a
 * checkpoint now; their ids go to ck->servers, the directories they give to ck's server dirs. sec
 * (may be NULL: plaintext, no token) gives the token and TLS files of the calls (psg_opts_t; its
 * addr is not used). A server busy with other administrative calls (UNAVAILABLE "busy: ",
 * ps_grpc.h) is asked again within the call's timeout_ms (each try's deadline the time left);
 * a call that fails fails the checkpoint, and the job takes the next one. */
int pw_jobckpt_servers(const char *grpc, const psg_opts_t *sec, int timeout_ms, pw_jobckpt_t *ck);

/* Have every server of `grpc` (as above) go back to its checkpoint of ck (gRPC Restore of
 * ck->servers[i], each call bounded by timeout_ms): a job rollback while the servers run. A
 * server that cannot be reached (PC_EUNAVAIL: still restarting, or busy) is asked again every
 * 200 ms for up to wait_ms. PC_EINVAL (nothing restored) when the list and the checkpoint's servers
 * differ in number; an error after the first call may leave some servers restored and others
 * not. */
int pw_jobckpt_restore_servers(const char *grpc, const psg_opts_t *sec, int timeout_ms, int wait_ms,
                               const pw_jobckpt_t *ck);

/* Write DIR/step-<ck->step>/ and LATEST; keep `keep` (>= 1) step directories (see above).
 * model and card (borrowed; both or neither may be NULL) make the step a model version: `model`
 * (pw_model_save) and `card` written before the manifest. */
int pw_jobckpt_write(const char *dir, const pw_jobckpt_t *ck, const float *state, size_t n,
                     const pw_model_t *model, const pw_model_card_t *card, int keep);

/* A rollback to `step` (LATEST's): remove the step directories after it, the abandoned run's
 * (one written whose LATEST write then failed, or a crash in between, would otherwise stay the
 * highest step: what a serving replica loads). */
void pw_jobckpt_abandon_after(const char *dir, uint64_t step);

/* Read checkpoint `step` of dir: its manifest into ck and its n-float dense state into state
 * (state NULL: not read; a serving replica loads `model` instead). PC_ENOTFOUND (no manifest for
 * that step), PC_ECORRUPT (a damaged manifest or state), PC_EDIM (a state of another size). */
int pw_jobckpt_read(const char *dir, uint64_t step, pw_jobckpt_t *ck, float *state, size_t n);

/* Read the latest checkpoint (LATEST's step) as pw_jobckpt_read does; PC_ENOTFOUND without
 * LATEST, PC_ECORRUPT when LATEST names a step whose manifest is not there. */
int pw_jobckpt_read_latest(const char *dir, pw_jobckpt_t *ck, float *state, size_t n);

#endif
