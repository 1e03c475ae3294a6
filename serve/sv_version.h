/* sv_version.h: what a trainer leaves for serving, read from its directories.
 *
 * Two kinds (docs/serving.md, "Versions and published models"):
 *  - published dense models (ps-worker --publish-dir=DIR): DIR/dense-<20-digit step>/ with
 *    `model` (pw_model_io.h), `card` (pw_model_card.h) and `watermark`, the sparse state the
 *    model goes with: text lines "emberps-watermark 1", "table NAME", then per training server
 *    in cluster-map order "server I UID HEAD" (the table's uid and its change log's head when
 *    the model was published; HEAD 0: the server kept no log yet, so any follower that started
 *    later scanned after it). Written by worker/train's publisher, atomically (a directory
 *    renamed into place).
 *  - versions: the job's coordinated checkpoints (ps-worker --ckpt-dir=DIR, pw_jobckpt.h):
 *    DIR/step-<S>/ with `model`, `card` and the manifest naming every server's checkpoint id
 *    and directory: a dense model and the embedding rows of one cut.
 *
 * Thread rule: pure functions over the file system.
 */
#ifndef SV_VERSION_H
#define SV_VERSION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SV_PATH_MAX 1024

typedef struct sv_watermark {
    char table[64];
    size_t n;      /* servers */
    uint64_t *uid; /* n each (malloc'ed: sv_watermark_free) */
    uint64_t *head;
} sv_watermark_t;

/* The newest published model of dir with a step above `after`: its directory into path (cap
 * bytes) and its step. PC_ENOTFOUND when there is none newer. */
int sv_published_newest(const char *dir, uint64_t after, char *path, size_t cap, uint64_t *step);
/* Whether dir holds published model `step` (whole: its watermark is there). */
bool sv_published_has(const char *dir, uint64_t step);
/* Read dir/watermark. PC_ENOTFOUND, PC_EPARSE (why gets the line). */
int sv_watermark_read(const char *dir, sv_watermark_t *w, char *why, size_t cap);
void sv_watermark_free(sv_watermark_t *w);

/* A directory as written (inode and change time): the trainer replaces a step's directory whole
 * when it writes the step again (a rollback), so a load that read files of one identity and finds
 * another (or none) may have read two writes. ino 0: unknown. */
typedef struct sv_dir_id {
    uint64_t dev, ino;
    int64_t ctime_ns;
} sv_dir_id_t;

/* dir's identity now; {0} when it cannot be read (gone). */
sv_dir_id_t sv_dir_id(const char *dir);
/* Whether a and b are one directory as written (false when either is unknown). */
bool sv_dir_id_same(sv_dir_id_t a, sv_dir_id_t b);

/* A version: its directory and every server's checkpoint (id, directory), map order. */
typedef struct sv_version {
    uint64_t step;
    char dir[SV_PATH_MAX];
    sv_dir_id_t id; /* dir's identity before its manifest was read (sv_version_replaced) */
    char *map;      /* the training cluster's map text, NULL when the manifest has none */
    size_t nservers;
    uint64_t *ckpt_ids; /* nservers each (malloc'ed: sv_version_free) */
    char **ckpt_dirs;
} sv_version_t;

/* Steps of the versions of dir (step-<S> directories holding model, card and manifest), oldest
 * first: up to cap into steps (and their creation times into created_ns, may be NULL); returns
 * how many there are. */
size_t sv_versions_list(const char *dir, uint64_t *steps, uint64_t *created_ns, size_t cap);
/* Read version `step` (0: the newest) of dir. PC_ENOTFOUND, PC_ECORRUPT (a manifest without the
 * servers' checkpoint directories, or damaged: why says which). */
int sv_version_read(const char *dir, uint64_t step, sv_version_t *v, char *why, size_t cap);
void sv_version_free(sv_version_t *v);
/* Whether v's directory was replaced (or removed) since sv_version_read read its manifest: the
 * model and card read after it may then be another write's. */
bool sv_version_replaced(const sv_version_t *v);

#endif
