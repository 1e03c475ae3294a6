/* pw_model_io.h: the dense model file (MLP weights and biases), versioned and checksummed, and
 * the dense state file (any float vector: weights with optimizer state, for job checkpoints).
 *
 * Layout, little-endian: magic "EMBRDNS1" (8 bytes), u32 format (1), u32 layer count, per layer
 * u32 in, u32 out; then per layer in*out weights and out biases as f32; then the XXH3-64 of
 * everything before it. Written to PATH.tmp, fsynced and renamed, so a crash leaves the old file
 * or the new one. Loading checks the magic and the checksum (PC_ECORRUPT) first, then the
 * format, the shapes against the model (PC_EDIM when they differ) and the exact size, before
 * touching any weight. A model
 * with a NaN or infinite weight (a diverged one) is neither written nor loaded: PC_ERANGE.
 */
#ifndef PW_MODEL_IO_H
#define PW_MODEL_IO_H

#include "pw_layers.h"

int pw_dense_save(const char *path, const pw_linear_t *layers, int n);
/* The file pw_dense_save writes, in memory: *img (malloc'ed, the caller frees it) of *size
 * bytes, checksum included (a snapshot of the weights to write later, from another thread).
 * PC_ENOMEM, PC_ERANGE (not finite). */
int pw_dense_image(const pw_linear_t *layers, int n, uint8_t **img, size_t *size);
int pw_dense_load(const char *path, pw_linear_t *layers, int n);
/* pw_dense_load in two steps, for a file loaded into several models of one shape: the file read
 * whole (as large as layers' model at most, or 4 GiB) and its seal checked (*img, malloc'ed, of
 * *size bytes: PC_ENOTFOUND, PC_EIO, PC_ECORRUPT), then an image checked against layers and
 * uploaded into them (PC_ECORRUPT, PC_EDIM, PC_ERANGE; no weight written unless every check
 * passed). */
int pw_dense_read(const char *path, const pw_linear_t *layers, int n, uint8_t **img, size_t *size);
int pw_dense_load_image(const uint8_t *img, size_t size, pw_linear_t *layers, int n);

/* The state file: magic "EMBRSTA1", u64 count, the floats, XXH3-64 of all before it; written
 * like the model file. Loading n floats: PC_EDIM when the file holds another count,
 * PC_ECORRUPT (size, checksum), PC_ENOTFOUND. */
int pw_state_save(const char *path, const float *v, size_t n);
int pw_state_load(const char *path, float *v, size_t n);

#endif
