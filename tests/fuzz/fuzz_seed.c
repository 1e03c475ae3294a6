/* Writes the seed corpus of fuzz_store into argv[1]: a valid table export (target 0 and 1)
 * and a valid manifest (target 2), each prefixed with its target byte; and fuzz_wire's into
 * argv[2]: MAP frames carrying cluster maps (whole, and the slots part alone) with backups and
 * in-sync marks. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "pc_fs.h"
#include "pc_wire.h"
#include "ps_catalog.h"
#include "ps_ckpt.h"

#include "fuzz_seed_table.h"

static int prefix_copy(const char *src, const char *dst, unsigned char target) {
    FILE *in = fopen(src, "rb"), *out = fopen(dst, "wb");
    if (!in || !out)
        return 1;
    fputc(target, out);
    int c;
    while ((c = fgetc(in)) != EOF)
        fputc(c, out);
    fclose(in);
    fclose(out);
    return 0;
}

/* A MAP frame whose body is text, into dir/name. */
static int map_frame(const char *dir, const char *name, const char *text) {
    char path[700];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    pc_wire_hdr_t h = {.op = PC_OP_MAP, .body_len = (uint32_t)strlen(text)};
    uint8_t hdr[PC_WIRE_HDR];
    pc_wire_hdr_encode(&h, hdr);
    FILE *f = fopen(path, "wb");
    if (!f)
        return 1;
    fwrite(hdr, 1, sizeof hdr, f);
    fwrite(text, 1, h.body_len, f);
    return fclose(f) != 0;
}

static int wire_seeds(const char *dir) {
    mkdir(dir, 0755);
    return map_frame(dir, "seed-map",
                     "version=7;servers=a:1,b:2,c:3;slots=0-8191:0/1~/2,8192-16383:2/0") ||
           map_frame(dir, "seed-slots", "0-99:0/1,100-16000:1/2~,16001-16383:2/0~/1~");
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3)
        return 2;
    if (argc == 3 && wire_seeds(argv[2]))
        return 1;
    mkdir(argv[1], 0755);
    ps_catalog_t *cat;
    if (ps_catalog_create(&cat))
        return 1;
    ps_table_t *t = fuzz_seed_table(cat);
    char tmp[600], dst[700];
    snprintf(tmp, sizeof tmp, "%s/export.tmp", argv[1]);
    if (ps_table_export(t, NULL, tmp, true))
        return 1;
    snprintf(dst, sizeof dst, "%s/seed-rows", argv[1]);
    prefix_copy(tmp, dst, 0);
    snprintf(dst, sizeof dst, "%s/seed-import", argv[1]);
    prefix_copy(tmp, dst, 1);
    remove(tmp);
    snprintf(tmp, sizeof tmp, "%s/ck", argv[1]);
    ps_ckpt_t *ck;
    ps_ckpt_opts_t o = {.dir = tmp, .keep = 2, .full_every = 1};
    if (ps_ckpt_create(cat, &o, &ck) || ps_ckpt_write(ck, NULL))
        return 1;
    char man[800];
    snprintf(man, sizeof man, "%s/ckpt-00000000000000000001/MANIFEST.json", tmp);
    snprintf(dst, sizeof dst, "%s/seed-manifest", argv[1]);
    char *text; /* its text without the seal line: the fuzz target seals what it is given */
    size_t len;
    FILE *out = fopen(dst, "wb");
    if (!out || pc_fs_read_all(man, 1 << 20, &text, &len) || len < PC_FS_SEAL_LEN)
        return 1;
    fputc(2, out);
    fwrite(text, 1, len - PC_FS_SEAL_LEN, out);
    fclose(out);
    free(text);
    ps_ckpt_destroy(ck);
    ps_catalog_destroy(cat);
    char cmd[800];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    return system(cmd) == 0 ? 0 : 1;
}
