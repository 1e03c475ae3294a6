/* pw_model_card.h: the model card: everything a process other than the trainer (a serving
 * replica) needs to rebuild the trainer's model and feed it samples the way the trainer does.
 *
 * The trainer builds its model from a card (pw_model_card_from_config: the one place where the
 * trainer's settings and the stream's format become model settings), and writes the same card
 * beside every dense model it publishes (--publish-dir) and every coordinated checkpoint
 * (pw_jobckpt.h). A reader parses the stream's lines with `format` and `csv` (pw_parse.h),
 * creates the model from `model` (pw_model.h: max_batch is the training batch), feeds it `ndense`
 * dense values per sample (0: a constant 1 stands in, as the trainer does) and looks rows up in
 * the servers' table `table_name`, `row_dim` floats each.
 *
 * DESIGN
 * - File format: text, one field per line, written atomically (pc_fs_write_atomic):
 *
 *       emberps-model-card 1
 *       format criteo              criteo | libsvm | libffm | csv
 *       csv                        the CSV column spec (the rest of the line; empty unless csv)
 *       model dlrm                 dlrm | deepfm | fm | lr
 *       model_ndense 13            the model's dense inputs (>= 1)
 *       nfields 26
 *       dim 16
 *       pooling sum                sum | mean
 *       bottom 64,16               widths, comma-separated ("-": none)
 *       top 128,64,1
 *       max_batch 1024
 *       seed 1
 *       ndense 13                  dense values per sample of the stream (0: none)
 *       table emb
 *       row_dim 16
 *
 *   A line is `name value` (the value: the rest of the line after one space; it may be empty);
 *   every name exactly once, in any order; a name this version does not know is an error (a
 *   card a newer trainer wrote with more in it says so by its version, the magic line's number).
 * - Reading checks the card whole: the magic line, every line present once, numbers in range,
 *   a known format and model, a CSV spec that parses (and only for CSV), the stream's dense width
 *   against the format's, the model's dense inputs against it (max(ndense, 1)), widths that fit
 *   the model (DLRM's bottom ends at dim, DLRM's and DeepFM's top at 1), fields for the models
 *   that pool per field, and row_dim against pw_model_row_dim. Each failure gives one line of
 *   reason (the line number and what is wrong).
 *
 * Thread rule: pure functions over the caller's memory; thread-safe.
 */
#ifndef PW_MODEL_CARD_H
#define PW_MODEL_CARD_H

#include <stddef.h>

#include "pw_model.h"
#include "pw_parse.h"
#include "pw_train.h"

#define PW_MODEL_CARD_MAGIC "emberps-model-card 1"

typedef struct pw_model_card {
    pw_format_t format;      /* the training stream's format (pw_parse.h) */
    char csv[2048];          /* its CSV column spec text ("" unless CSV) */
    pw_model_config_t model; /* as the trainer creates it (max_batch = the training batch) */
    int ndense;              /* dense values per sample of the stream (0: none, a constant 1
                              * stands in) */
    char table_name[64];     /* the servers' embedding table */
    int row_dim;             /* its row width (pw_model_row_dim) */
} pw_model_card_t;

/* The card of training settings c on a stream of format fmt: the CSV spec parsed (fmt CSV), the
 * field count from c->fields or the format, the widths parsed, the model name checked, the row
 * width. PC_EINVAL (logged: a bad CSV spec, bad widths, an unknown model). */
int pw_model_card_from_config(const pw_train_config_t *c, pw_format_t fmt, pw_model_card_t *out);

/* Write the card to path atomically (the format above). PC_EINVAL (a card that would not read
 * back: the checks of pw_model_card_read), PC_EIO, PC_ENOSPC. */
int pw_model_card_write(const char *path, const pw_model_card_t *card);

/* Read and check the card at path into *out. PC_ENOTFOUND (no file), PC_EPARSE (not a card: the
 * magic line, a line without a known name, a missing or repeated line, a value that is not of
 * its kind), PC_ECORRUPT (values that do not fit together: widths, dims, the format's shape);
 * err (may be NULL with errlen 0) gets one line of reason. PC_EIO, PC_ENOMEM. */
int pw_model_card_read(const char *path, pw_model_card_t *out, char *err, size_t errlen);

#endif
