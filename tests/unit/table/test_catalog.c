/* Named tables: add, acquire, drop while held, list, reuse of a dropped name. */
#include "test_util.h"

#include <string.h>

#include "pc_error.h"
#include "ps_catalog.h"

static void cfg_named(ps_table_config_t *c, const char *spec) {
    ps_table_config_defaults(c);
    assert_int_equal(ps_table_config_parse(c, spec, NULL, 0), 0);
}

static void test_catalog(void **state) {
    (void)state;
    ps_catalog_t *cat;
    assert_int_equal(ps_catalog_create(&cat), 0);
    ps_table_config_t c;
    cfg_named(&c, "name=users,dim=8");
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    assert_int_equal(ps_catalog_add(cat, &c), PC_EEXIST);
    cfg_named(&c, "name=ads,dim=16,optimizer=ftrl");
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    c.dim = 0;
    assert_int_equal(ps_catalog_add(cat, &c), PC_EINVAL);

    char names[4][PS_TABLE_NAME_MAX];
    assert_int_equal(ps_catalog_list(cat, names, 4), 2);
    assert_string_equal(names[0], "ads");
    assert_string_equal(names[1], "users");

    ps_table_t *t;
    assert_int_equal(ps_catalog_acquire(cat, "nope", &t), PC_ENOTFOUND);
    assert_int_equal(ps_catalog_acquire(cat, "users", &t), 0);
    assert_int_equal(ps_table_dim(t), 8);
    uint64_t k = 1;
    float row[8];
    assert_int_equal(ps_catalog_drop(cat, "users"), 0);
    assert_int_equal(ps_catalog_acquire(cat, "users", &t) == PC_ENOTFOUND, 1);
    /* still usable by its holder after the drop */
    assert_int_equal(ps_table_pull(t, &k, 1, row, 8), 0);
    /* the name can be reused at once, with another shape */
    cfg_named(&c, "name=users,dim=4");
    assert_int_equal(ps_catalog_add(cat, &c), 0);
    ps_table_t *t2;
    assert_int_equal(ps_catalog_acquire(cat, "users", &t2), 0);
    assert_int_equal(ps_table_dim(t2), 4);
    ps_catalog_release(cat, t); /* destroys the dropped table */
    ps_catalog_release(cat, t2);
    assert_int_equal(ps_catalog_drop(cat, "users"), 0);
    assert_int_equal(ps_catalog_drop(cat, "users"), PC_ENOTFOUND);
    assert_int_equal(ps_catalog_list(cat, names, 4), 1);
    ps_catalog_destroy(cat);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_catalog)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
