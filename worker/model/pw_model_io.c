/* pw_model_io.c: see pw_model_io.h. */
#include "pw_model_io.h"

#include "pc_error.h"
#include "pc_fs.h"
#include "pc_hash.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DENSE_MAGIC "EMBRDNS1"
#define STATE_MAGIC "EMBRSTA1"
#define FORMAT      1u

/* Both files are one image in memory (dense models are small): an 8-byte magic, a body, and the
 * XXH3-64 of everything before it in the last 8 bytes. */

/* Seal img (size bytes, the hash's 8 included) and write it atomically; frees img. */
static int image_write(const char *path, uint8_t *img, size_t size) {
    const uint64_t h = pc_hash64(img, size - 8, 0);
    memcpy(img + size - 8, &h, 8);
    int rc = pc_fs_write_atomic(path, img, size);
    free(img);
    return rc;
}

/* Read path whole (at most IMAGE_MAX bytes, or `want`, the size the caller expects, when more:
 * a large dense state saves and loads alike) and check it is sealed: *img (free it) of *got
 * bytes, with `magic` first and the XXH3 of the rest last, before anything inside is believed
 * (a damaged header is damage, not another model). PC_ENOTFOUND, PC_ENOMEM, PC_EIO,
 * PC_ECORRUPT. */
#define IMAGE_MAX (4ull << 30)
static int image_read(const char *path, const char *magic, size_t want, uint8_t **img,
                      size_t *got) {
    char *text = NULL;
    int rc = pc_fs_read_all(path, want > IMAGE_MAX ? want : IMAGE_MAX, &text, got);
    *img = (uint8_t *)text;
    if (rc)
        return rc == PC_ETOOBIG ? PC_ECORRUPT : rc; /* no file of ours is that big */
    uint64_t h = 0;
    if (*got >= 24)
        memcpy(&h, *img + *got - 8, 8);
    return *got < 24 || memcmp(*img, magic, 8) || h != pc_hash64(*img, *got - 8, 0) ? PC_ECORRUPT
                                                                                    : 0;
}

/* Whether the n floats at p (any alignment) are all finite. */
static bool all_finite(const uint8_t *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        float v;
        memcpy(&v, p + i * sizeof v, sizeof v);
        if (!isfinite(v))
            return false;
    }
    return true;
}

static size_t dense_size(const pw_linear_t *l, int n) {
    size_t s = 8 + 8 + (size_t)n * 8 + 8;
    for (int i = 0; i < n; i++)
        s += ((size_t)l[i].in * l[i].out + (size_t)l[i].out) * sizeof(float);
    return s;
}

int pw_dense_image(const pw_linear_t *l, int n, uint8_t **out, size_t *out_size) {
    const size_t size = dense_size(l, n);
    uint8_t *img = malloc(size), *p = img;
    if (!img)
        return PC_ENOMEM;
    const uint32_t hdr[2] = {FORMAT, (uint32_t)n};
    memcpy(p, DENSE_MAGIC, 8);
    memcpy(p + 8, hdr, 8);
    p += 16;
    for (int i = 0; i < n; i++) {
        const uint32_t shape[2] = {(uint32_t)l[i].in, (uint32_t)l[i].out};
        memcpy(p, shape, 8);
        p += 8;
    }
    for (int i = 0; i < n; i++) {
        const size_t nw = (size_t)l[i].in * l[i].out * sizeof(float);
        l[i].be->download(l[i].be, p, l[i].w, nw);
        l[i].be->download(l[i].be, p + nw, l[i].b, (size_t)l[i].out * sizeof(float));
        p += nw + (size_t)l[i].out * sizeof(float);
    }
    const size_t head = 16 + (size_t)n * 8;
    if (!all_finite(img + head, (size - head - 8) / sizeof(float))) {
        free(img);
        return PC_ERANGE; /* a diverged model is not written anywhere */
    }
    const uint64_t h = pc_hash64(img, size - 8, 0);
    memcpy(img + size - 8, &h, 8);
    *out = img;
    *out_size = size;
    return 0;
}

int pw_dense_save(const char *path, const pw_linear_t *l, int n) {
    uint8_t *img;
    size_t size;
    int rc = pw_dense_image(l, n, &img, &size);
    if (rc)
        return rc;
    rc = pc_fs_write_atomic(path, img, size);
    free(img);
    return rc;
}

int pw_dense_read(const char *path, const pw_linear_t *l, int n, uint8_t **img, size_t *size) {
    return image_read(path, DENSE_MAGIC, dense_size(l, n), img, size);
}

int pw_dense_load_image(const uint8_t *img, size_t got, pw_linear_t *l, int n) {
    const size_t want = dense_size(l, n);
    uint32_t hdr[2] = {0, 0};
    memcpy(hdr, img + 8, 8);
    int rc = hdr[0] != FORMAT ? PC_ECORRUPT : hdr[1] != (uint32_t)n ? PC_EDIM : 0;
    for (int i = 0; !rc && i < n; i++) {
        uint32_t shape[2];
        if (got < 16 + (size_t)(i + 1) * 8) {
            rc = PC_ECORRUPT;
            break;
        }
        memcpy(shape, img + 16 + (size_t)i * 8, 8);
        if (shape[0] != (uint32_t)l[i].in || shape[1] != (uint32_t)l[i].out)
            rc = PC_EDIM;
    }
    if (!rc && got != want)
        rc = PC_ECORRUPT; /* sealed, of the right shapes, and yet another size */
    size_t off = 16 + (size_t)n * 8;
    if (!rc && !all_finite(img + off, (want - off - 8) / sizeof(float)))
        rc = PC_ERANGE;
    for (int i = 0; !rc && i < n; i++) {
        const size_t nw = (size_t)l[i].in * l[i].out * sizeof(float);
        l[i].be->upload(l[i].be, l[i].w, img + off, nw);
        l[i].be->upload(l[i].be, l[i].b, img + off + nw, (size_t)l[i].out * sizeof(float));
        off += nw + (size_t)l[i].out * sizeof(float);
    }
    return rc;
}

int pw_dense_load(const char *path, pw_linear_t *l, int n) {
    uint8_t *img = NULL;
    size_t got = 0;
    int rc = pw_dense_read(path, l, n, &img, &got);
    if (!rc)
        rc = pw_dense_load_image(img, got, l, n);
    free(img);
    return rc;
}

int pw_state_save(const char *path, const float *v, size_t n) {
    const size_t size = 16 + n * sizeof(float) + 8;
    uint8_t *img = malloc(size);
    if (!img)
        return PC_ENOMEM;
    const uint64_t count = n;
    memcpy(img, STATE_MAGIC, 8);
    memcpy(img + 8, &count, 8);
    memcpy(img + 16, v, n * sizeof(float));
    return image_write(path, img, size);
}

int pw_state_load(const char *path, float *v, size_t n) {
    const size_t want = 16 + n * sizeof(float) + 8;
    uint8_t *img = NULL;
    size_t got = 0;
    int rc = image_read(path, STATE_MAGIC, want, &img, &got);
    uint64_t count = 0;
    if (!rc) {
        memcpy(&count, img + 8, 8);
        rc = count != n ? PC_EDIM : got != want ? PC_ECORRUPT : 0;
    }
    if (!rc)
        memcpy(v, img + 16, n * sizeof(float));
    free(img);
    return rc;
}
