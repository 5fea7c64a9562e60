/* The store's limits on what it holds (issue 20, item 6): one authenticated client could grow
 * a store without bound (1.3 GB seen). A store holds at most 65536 keys and 256 MiB of keys
 * and values: a write past either fails with CT_ENOMEM and a message naming the key and the
 * limits, changes nothing, and leaves the connection working; replacing a value counts it
 * once; deleting keys makes room again. The keys are found through a hash index: the chains
 * stay right as deletions move entries (every key checked after deleting a spread of them). */
#include "test_util.h"

#include <ctorch/ctorch.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_bytes(ct_store *s)
{
    size_t mib16 = (size_t)16 << 20;
    char *big = malloc(mib16);
    memset(big, 'x', mib16);
    char key[64];
    /* one key replaced many times is counted once */
    for (int i = 0; i < 20; i++)
        CHECK_OK(ct_store_set(s, "bytes/same", big, mib16));
    CHECK_OK(ct_store_delete(s, "bytes/same"));
    int stored = 0;
    ct_status st = CT_OK;
    for (int i = 0; i < 40 && st == CT_OK; i++) {
        snprintf(key, sizeof key, "bytes/%d", i);
        st = ct_store_set(s, key, big, mib16);
        if (st == CT_OK) stored++;
    }
    CHECK(st == CT_ENOMEM);
    CHECK(stored == 15); /* 16 x 16 MiB and their keys pass 256 MiB */
    const char *m = ct_last_error();
    CHECK(strstr(m, "is full") && strstr(m, "256 MiB") && strstr(m, "bytes/15") &&
          strstr(m, "delete keys"));
    if (!strstr(m, "is full")) fprintf(stderr, "  message: %s\n", m);
    bool ex = true;
    CHECK_OK(ct_store_check(s, "bytes/15", &ex)); /* nothing written; the connection works */
    CHECK(!ex);
    CHECK_OK(ct_store_set(s, "bytes/small", "v", 1)); /* there is room for a little */
    /* a compare-set and an add past the limit fail the same way */
    CHECK_STATUS(ct_store_compare_set(s, "bytes/15", "", 0, big, mib16, NULL, NULL), CT_ENOMEM);
    CHECK_OK(ct_store_delete(s, "bytes/0"));
    CHECK_OK(ct_store_set(s, "bytes/15", big, mib16)); /* room again */
    for (int i = 0; i < 16; i++) {
        snprintf(key, sizeof key, "bytes/%d", i);
        CHECK_OK(ct_store_delete(s, key));
    }
    CHECK_OK(ct_store_delete(s, "bytes/small"));
    free(big);
}

static void check_keys(ct_store *s)
{
    char key[64];
    int n = 0;
    ct_status st = CT_OK;
    for (int i = 0; i < 70000 && st == CT_OK; i++) {
        snprintf(key, sizeof key, "k%d", i);
        st = ct_store_set(s, key, &i, sizeof i);
        if (st == CT_OK) n++;
    }
    CHECK(st == CT_ENOMEM && n == 65536);
    CHECK(strstr(ct_last_error(), "65536 keys") != NULL);
    CHECK_STATUS(ct_store_add(s, "another", 1, NULL), CT_ENOMEM);
    CHECK_OK(ct_store_set(s, "k7", "new", 3)); /* replacing is not adding */
    /* delete a spread of keys (entries move into the holes), then the keys are where they were */
    for (int i = 0; i < 65536; i += 97) {
        snprintf(key, sizeof key, "k%d", i);
        CHECK_OK(ct_store_delete(s, key));
    }
    int bad = 0;
    for (int i = 0; i < 65536; i++) {
        if (i % 7 && i % 97) continue; /* a seventh of the kept ones, every deleted one */
        snprintf(key, sizeof key, "k%d", i);
        bool ex = false;
        if (ct_store_check(s, key, &ex) != CT_OK || ex != (i % 97 != 0)) bad++;
    }
    CHECK(bad == 0);
    void *v = NULL;
    size_t len = 0;
    CHECK_OK(ct_store_get(s, "k12345", 1, &v, &len));
    CHECK(len == sizeof(int) && *(int *)v == 12345);
    ct_free(v);
    CHECK_OK(ct_store_get(s, "k7", 1, &v, &len));
    CHECK(len == 3 && !memcmp(v, "new", 3));
    ct_free(v);
    CHECK_OK(ct_store_add(s, "another", 1, NULL)); /* room again */
}

int main(void)
{
    ct_store_server *srv;
    ct_store *s;
    if (ct_store_server_start("127.0.0.1", 0, &srv) != CT_OK ||
        ct_store_connect("127.0.0.1", ct_store_server_port(srv), 5, &s) != CT_OK) {
        fprintf(stderr, "cannot start the store: %s\n", ct_last_error());
        return 1;
    }
    check_bytes(s);
    check_keys(s);
    ct_store_free(s);
    ct_store_server_free(srv);
    return t_report("test_comm_store_limits");
}
