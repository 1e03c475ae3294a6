/* pw_model_io.c: see pw_model_io.h. */
#include "pw_model_io.h"

#include "pc_error.h"
#include "pc_fs.h"
#include "pc_hash.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC  "EMBRDNS1"
#define FORMAT 1u

/* The whole file image in memory (models are small: MLPs). */
static size_t image_size(const pw_linear_t *l, int n) {
    size_t s = 8 + 8 + (size_t)n * 8 + 8;
    for (int i = 0; i < n; i++)
        s += ((size_t)l[i].in * l[i].out + (size_t)l[i].out) * sizeof(float);
    return s;
}

int pw_dense_save(const char *path, const pw_linear_t *l, int n) {
    const size_t size = image_size(l, n);
    uint8_t *img = malloc(size), *p = img;
    if (!img)
        return PC_ENOMEM;
    const uint32_t hdr[2] = {FORMAT, (uint32_t)n};
    memcpy(p, MAGIC, 8);
    memcpy(p + 8, hdr, 8);
    p += 16;
    for (int i = 0; i < n; i++) {
        const uint32_t shape[2] = {(uint32_t)l[i].in, (uint32_t)l[i].out};
        memcpy(p, shape, 8);
        p += 8;
    }
    for (int i = 0; i < n; i++) {
        const size_t nw = (size_t)l[i].in * l[i].out * sizeof(float);
        memcpy(p, l[i].w, nw);
        memcpy(p + nw, l[i].b, (size_t)l[i].out * sizeof(float));
        p += nw + (size_t)l[i].out * sizeof(float);
    }
    const uint64_t h = pc_hash64(img, size - 8, 0);
    memcpy(p, &h, 8);
    int rc = pc_fs_write_atomic(path, img, size);
    free(img);
    return rc;
}

int pw_dense_load(const char *path, pw_linear_t *l, int n) {
    FILE *f = fopen(path, "rb");
    if (!f)
        return PC_ENOTFOUND;
    const size_t want = image_size(l, n);
    uint8_t *img = malloc(want + 1);
    size_t got = img ? fread(img, 1, want + 1, f) : 0;
    fclose(f);
    int rc = !img ? PC_ENOMEM : got < 16 || memcmp(img, MAGIC, 8) ? PC_ECORRUPT : 0;
    uint32_t hdr[2] = {0, 0};
    if (!rc) {
        memcpy(hdr, img + 8, 8);
        rc = hdr[0] != FORMAT ? PC_ECORRUPT : hdr[1] != (uint32_t)n ? PC_EDIM : 0;
    }
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
        rc = PC_ECORRUPT;
    if (!rc) {
        uint64_t h;
        memcpy(&h, img + want - 8, 8);
        if (h != pc_hash64(img, want - 8, 0))
            rc = PC_ECORRUPT;
    }
    for (int i = 0, off = 16 + n * 8; !rc && i < n; i++) {
        const size_t nw = (size_t)l[i].in * l[i].out * sizeof(float);
        memcpy(l[i].w, img + off, nw);
        memcpy(l[i].b, img + off + nw, (size_t)l[i].out * sizeof(float));
        off += (int)(nw + (size_t)l[i].out * sizeof(float));
    }
    free(img);
    return rc;
}
