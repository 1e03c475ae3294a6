/* libFuzzer target: the gRPC API's request decoding and handling (ps_api_call) on arbitrary
 * bytes, in process, against a small catalog: the first input byte picks the method, the rest
 * is the request message (the coordinator's KvSet/KvGet/KvList included). Tables the input creates
 * are dropped after each run and the base table has a row budget, so memory stays bounded. Never
 * crashes, never leaks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "pc_log.h"
#include "ps_api.h"
#include "ps_coord.h"

static ps_catalog_t *g_cat;

static void setup(void) {
    pc_log_set_level(PC_LOG_ERROR);
    if (ps_catalog_create(&g_cat))
        abort();
    ps_table_config_t c;
    ps_table_config_defaults(&c);
    if (ps_table_config_parse(&c, "name=emb,dim=4,optimizer=adam,capacity_rows=4096,shards=2", NULL,
                              0) ||
        ps_catalog_add(g_cat, &c))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_cat)
        setup();
    if (size < 1)
        return 0;
    ps_coord_store_t kv; /* a fresh coordinator store per input: memory stays bounded */
    if (ps_coord_store_memory(&kv))
        abort();
    ps_api_env_t env = {.cat = g_cat, .max_keys = 1024, .shard = 0, .coord = &kv};
    ps_api_reply_t r;
    ps_api_call(&env, data[0] % (PS_API_NMETHODS + 1), data + 1, size - 1, data[0] & 0x80, &r);
    kv.destroy(kv.ctx);
    if (r.status == PS_ST_OK && !r.body && r.len)
        abort(); /* a reply claims bytes it does not have */
    ps_api_reply_free(&r);
    char names[16][PS_TABLE_NAME_MAX];
    size_t n = ps_catalog_list(g_cat, names, 16);
    for (size_t i = 0; i < n && i < 16; i++)
        if (strcmp(names[i], "emb") != 0)
            ps_catalog_drop(g_cat, names[i]);
    return 0;
}
