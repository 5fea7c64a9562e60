/* A sharded checkpoint is written only into a directory the save made or found as a real
 * directory (issue 20, item 7): OUT/checkpoint-<step> planted as a symbolic link (or a file)
 * is refused with a message naming it, and nothing is written where the link points; a
 * plain save still lands in OUT/checkpoint-<step> with OUT/latest pointing at it, and a
 * save over an existing step directory works. One rank in this process. */
#include "test_util.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

static int count_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.' || (e->d_name[1] && (e->d_name[1] != '.' || e->d_name[2]))) n++;
    closedir(d);
    return n;
}

int main(void)
{
    ct_store_server *srv;
    ct_store *store;
    CHECK_OK(ct_store_server_start("127.0.0.1", 0, &srv));
    CHECK_OK(ct_store_connect("127.0.0.1", ct_store_server_port(srv), 10, &store));
    ct_comm *w = NULL;
    ct_comm_options co = ct_comm_options_default();
    co.name = "ckpt-link";
    CHECK_OK(ct_comm_init(store, 0, 1, &co, &w));
    ct_gpt_config c = ct_gpt_config_default();
    c.vocab_size = 50;
    c.context = 8;
    c.n_layer = 1;
    c.d_model = 16;
    c.n_head = 2;
    c.n_kv_head = 2;
    c.d_ff = 20;
    ct_train_options to = ct_train_options_default();
    to.batch = 2;
    to.seq = 4;
    int32_t data[64];
    for (int i = 0; i < 64; i++)
        data[i] = i % 50;
    ct_fsdp_trainer *t = NULL;
    CHECK_OK(ct_fsdp_trainer_create(w, &c, &to, NULL, data, 64, NULL, 0, &t));
    ct_train_step_info info;
    CHECK_OK(ct_fsdp_trainer_step(t, &info));
    CHECK(info.step == 1);

    char base[] = "/tmp/ctorch-ckpt-link-XXXXXX";
    CHECK(mkdtemp(base) != NULL);
    char out[128], elsewhere[128], link[160], p[256];
    snprintf(out, sizeof out, "%s/out", base);
    snprintf(elsewhere, sizeof elsewhere, "%s/elsewhere", base);
    snprintf(link, sizeof link, "%s/checkpoint-1", out);
    CHECK(mkdir(out, 0755) == 0 && mkdir(elsewhere, 0755) == 0);
    /* a link planted as the step's directory */
    CHECK(symlink(elsewhere, link) == 0);
    CHECK_STATUS(ct_fsdp_trainer_save(t, out, 0, NULL, NULL), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "checkpoint-1") && strstr(ct_last_error(), "symbolic link"));
    CHECK(count_files(elsewhere) == 0);
    /* a file there */
    CHECK(unlink(link) == 0);
    FILE *f = fopen(link, "w");
    CHECK(f != NULL);
    if (f) fclose(f);
    CHECK_STATUS(ct_fsdp_trainer_save(t, out, 0, NULL, NULL), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "not a directory") != NULL);
    CHECK(unlink(link) == 0);
    /* a plain save, twice (the second over the existing directory) */
    for (int k = 0; k < 2; k++) {
        CHECK_OK(ct_fsdp_trainer_save(t, out, 0, NULL, NULL));
        snprintf(p, sizeof p, "%s/model-00000-of-00001.safetensors", link);
        CHECK(access(p, F_OK) == 0);
        snprintf(p, sizeof p, "%s/COMMITTED", link);
        CHECK(access(p, F_OK) == 0);
        snprintf(p, sizeof p, "%s/latest", out);
        char target[64] = "";
        CHECK(readlink(p, target, sizeof target - 1) > 0 && !strcmp(target, "checkpoint-1"));
        char *res = NULL;
        bool isdir = false;
        CHECK_OK(ct_sharded_checkpoint_resolve(out, &res, &isdir));
        CHECK(isdir && res != NULL); /* committed, through OUT/latest */
        ct_free(res);
    }
    CHECK(count_files(elsewhere) == 0);
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);
    CHECK(system(cmd) == 0);
    ct_fsdp_trainer_free(t);
    ct_comm_free(w);
    ct_store_free(store);
    ct_store_server_free(srv);
    return t_report("test_dist_checkpoint_link");
}
