/* The sharded model (include/ctorch/fsdp.h) in one process: at one rank its gradients, loss
 * and AdamW step are bitwise those of the one-process model (the reference), in every mode
 * and option (prefetch, no overlap, no reshard, shared communicator, data parallel, no-sync
 * accumulation); bf16 all-gathers are close; options and sharded checkpoint directories that
 * break a rule are refused with a message. (Several ranks: tests/python/test_fsdp.py.) */
#include "test_util.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

static ct_gpt_config cfg_small(void)
{
    ct_gpt_config c = ct_gpt_config_default();
    c.vocab_size = 50;
    c.context = 8;
    c.n_layer = 3;
    c.d_model = 16;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_ff = 20;
    c.tied = false;
    c.qkv_bias = true;
    c.init_std = 0.3f;
    return c;
}

static ct_store_server *srv;
static ct_store *store;

static ct_comm *world1(void)
{
    ct_comm *c = NULL;
    ct_comm_options o = ct_comm_options_default();
    static int k;
    char name[32];
    snprintf(name, sizeof name, "t%d", k++);
    o.name = name;
    CHECK_OK(ct_comm_init(store, 0, 1, &o, &c));
    return c;
}

static void test_matches_one_process(ct_fsdp_options fo, bool exact, int accum, ct_dtype dtype)
{
    ct_gpt_config c = cfg_small();
    ct_gpt_options mo = ct_gpt_options_default();
    mo.batch = 3;
    mo.eos_token = 0;
    mo.dtype = dtype; /* bf16: both round their weights' copies and activations the same way */
    ct_gpt *m;
    CHECK_OK(ct_gpt_create(&c, &mo, &m));
    CHECK_OK(ct_gpt_init(m, 7));
    ct_comm *w = world1();
    ct_fsdp *f = NULL;
    CHECK_OK(ct_fsdp_create(w, &c, &mo, &fo, &f));
    if (!f) {
        ct_gpt_free(m);
        ct_comm_free(w);
        return;
    }
    CHECK_OK(ct_fsdp_init(f, 7));
    int32_t tok[3 * 9];
    for (int i = 0; i < 27; i++)
        tok[i] = (i * 7 + 3) % 50;
    ct_adamw_options ao = ct_adamw_options_default();
    for (int step = 1; step <= 2; step++) {
        ct_gpt_zero_grad(m);
        ct_fsdp_zero_grad(f);
        float l1 = 0, l2 = 0;
        for (int k = 0; k < accum; k++) {
            tok[k] = (tok[k] + step) % 50;
            float a, b;
            CHECK_OK(ct_gpt_forward_backward(m, tok, 3, 8, 1.0f / (float)accum, &a));
            ct_fsdp_set_requires_gradient_sync(f, k == accum - 1);
            CHECK_OK(ct_fsdp_forward_backward(f, tok, 3, 8, 1.0f / (float)accum, &b));
            l1 += a, l2 += b;
        }
        CHECK(exact ? l1 == l2 : fabsf(l1 - l2) <= 1e-2f * fabsf(l1));
        double n1, n2;
        CHECK_OK(ct_clip_grad_norm(ct_gpt_grads(m), ct_gpt_num_params(m), 1.0f, &n1));
        CHECK_OK(ct_fsdp_clip_grad_norm(f, 1.0f, &n2));
        CHECK(exact ? fabs(n1 - n2) <= 1e-12 * n1 : fabs(n1 - n2) <= 0.05 * n1);
        int64_t P = ct_gpt_num_params(m), D = ct_gpt_num_decayed(m);
        float *p = ct_gpt_params(m), *g = ct_gpt_grads(m);
        static float mm[1 << 16], vv[1 << 16];
        if (step == 1) memset(mm, 0, sizeof mm), memset(vv, 0, sizeof vv);
        CHECK(P <= (1 << 16));
        CHECK_OK(ct_adamw_step(p, g, mm, vv, D, step, &ao));
        ct_adamw_options nd = ao;
        nd.weight_decay = 0;
        CHECK_OK(ct_adamw_step(p + D, g + D, mm + D, vv + D, P - D, step, &nd));
        CHECK_OK(ct_fsdp_adamw_step(f, step, &ao));
    }
    /* every tensor's parameters after two steps */
    for (int i = 0; i < ct_gpt_num_tensors(m); i++) {
        const char *name;
        ct_tensor pt;
        CHECK_OK(ct_gpt_tensor(m, i, &name, &pt, NULL));
        float *sp;
        int64_t r0, r1;
        CHECK_OK(ct_fsdp_tensor(f, i, NULL, NULL, NULL, &r0, &r1, &sp, NULL, NULL));
        CHECK(r0 == 0 && r1 == pt.shape[0]);
        size_t n = (size_t)ct_tensor_numel(&pt);
        if (exact) {
            CHECK(!memcmp(sp, pt.data, n * sizeof(float)));
        } else {
            CHECK(t_close(sp, pt.data, n, 2e-2, 2e-2, name));
        }
    }
    ct_fsdp_stats st;
    ct_fsdp_get_stats(f, &st);
    CHECK(st.collectives > 0 && st.state_bytes >= 4 * (size_t)ct_gpt_num_params(m) * 4);
    /* sharded: gathered buffers (with a bf16 run's per-group bf16 copies) for at most
     * prefetch + 1 blocks and the root at once */
    int pf = fo.forward_prefetch > fo.backward_prefetch ? fo.forward_prefetch : fo.backward_prefetch;
    if (fo.mode == CT_FSDP_FULL_SHARD && fo.reshard_after_forward)
        CHECK(st.peak_gathered_bytes <= (size_t)(pf + 2) * st.block_bytes);
    ct_fsdp_free(f);
    ct_comm_free(w);
    ct_gpt_free(m);
}

static float round_bf16(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fffu + ((u >> 16) & 1u); /* nearest even (finite values) */
    u &= 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* One step of a bf16 model with bf16 all-gathers against f32 all-gathers. Rounding the
 * gathered bf16 values again is the identity, so the matrices' bf16 copies are the same
 * bits; the tensors the bf16 model keeps in f32 (embedding table, norms, biases) arrive
 * rounded from a bf16 gather, so the runs agree bitwise exactly when those are bf16 values
 * already (rounded here), and differ otherwise (the control). */
static void test_bf16_gathers_in_bf16_compute(void)
{
    ct_gpt_config c = cfg_small();
    ct_gpt_options mo = ct_gpt_options_default();
    mo.batch = 3;
    mo.dtype = CT_DTYPE_BF16;
    int32_t tok[3 * 9];
    for (int i = 0; i < 27; i++)
        tok[i] = (i * 5 + 1) % 50;
    for (int pre_round = 1; pre_round >= 0; pre_round--) {
        float loss[2];
        double norm[2];
        float *after[2] = {NULL, NULL};
        int64_t total = 0;
        for (int v = 0; v < 2; v++) {
            ct_fsdp_options fo = ct_fsdp_options_default();
            fo.param_dtype = v ? CT_DTYPE_BF16 : CT_DTYPE_F32;
            ct_comm *w = world1();
            ct_fsdp *f = NULL;
            CHECK_OK(ct_fsdp_create(w, &c, &mo, &fo, &f));
            if (!f) {
                ct_comm_free(w);
                return;
            }
            CHECK_OK(ct_fsdp_init(f, 11));
            int nt = ct_fsdp_num_tensors(f);
            for (int i = 0; i < nt && pre_round; i++) {
                const char *name;
                int nd;
                int64_t sh[2], r0, r1;
                float *p;
                CHECK_OK(ct_fsdp_tensor(f, i, &name, &nd, sh, &r0, &r1, &p, NULL, NULL));
                if (nd == 2 && !strstr(name, "embed")) continue; /* a matrix: left in f32 */
                for (int64_t e = 0; e < (r1 - r0) * (nd == 2 ? sh[1] : 1); e++)
                    p[e] = round_bf16(p[e]);
            }
            ct_fsdp_zero_grad(f);
            CHECK_OK(ct_fsdp_forward_backward(f, tok, 3, 8, 1.0f, &loss[v]));
            CHECK_OK(ct_fsdp_clip_grad_norm(f, 0.0f, &norm[v]));
            ct_adamw_options ao = ct_adamw_options_default();
            CHECK_OK(ct_fsdp_adamw_step(f, 1, &ao));
            total = 0;
            for (int i = 0; i < nt; i++) {
                int64_t sh[2], r0, r1;
                int nd;
                CHECK_OK(ct_fsdp_tensor(f, i, NULL, &nd, sh, &r0, &r1, NULL, NULL, NULL));
                total += (r1 - r0) * (nd == 2 ? sh[1] : 1);
            }
            CHECK_OK(ct_alloc((void **)&after[v], (size_t)total * sizeof(float)));
            for (int i = 0, o = 0; i < nt; i++) {
                int64_t sh[2], r0, r1, n;
                int nd;
                float *p;
                CHECK_OK(ct_fsdp_tensor(f, i, NULL, &nd, sh, &r0, &r1, &p, NULL, NULL));
                n = (r1 - r0) * (nd == 2 ? sh[1] : 1);
                memcpy(after[v] + o, p, (size_t)n * sizeof(float));
                o += (int)n;
            }
            ct_fsdp_free(f);
            ct_comm_free(w);
        }
        bool same = loss[0] == loss[1] && norm[0] == norm[1] &&
                    !memcmp(after[0], after[1], (size_t)total * sizeof(float));
        CHECK(pre_round ? same : !same);
        CHECK(fabsf(loss[0] - loss[1]) <= 1e-2f * fabsf(loss[0]));
        ct_free(after[0]);
        ct_free(after[1]);
    }
}

/* FSDP in bf16 holds a bf16 copy per gathered group (not a whole bf16 model): its block
 * grows by half of the f32 block's parameters at most. */
static void test_bf16_memory(void)
{
    ct_gpt_config c = cfg_small();
    c.n_layer = 6;
    size_t block[2];
    for (int d = 0; d < 2; d++) {
        ct_gpt_options mo = ct_gpt_options_default();
        mo.batch = 2;
        mo.dtype = d ? CT_DTYPE_BF16 : CT_DTYPE_F32;
        ct_comm *w = world1();
        ct_fsdp *f = NULL;
        CHECK_OK(ct_fsdp_create(w, &c, &mo, NULL, &f));
        if (!f) {
            ct_comm_free(w);
            return;
        }
        ct_fsdp_stats st;
        ct_fsdp_get_stats(f, &st);
        block[d] = st.block_bytes;
        if (d) {
            CHECK(block[1] > block[0] && block[1] - block[0] <= block[0] / 2);
            /* far less than a whole bf16 copy of the model */
            CHECK(block[1] - block[0] < st.state_bytes / 16 * 2 / 2);
        }
        ct_fsdp_free(f);
        ct_comm_free(w);
    }
}

static void test_bad_options(void)
{
    ct_gpt_config c = cfg_small();
    ct_comm *w = world1();
    ct_fsdp *f = (ct_fsdp *)1;
    ct_fsdp_options o = ct_fsdp_options_default();
    o.forward_prefetch = 9;
    CHECK_STATUS(ct_fsdp_create(w, &c, NULL, &o, &f), CT_EINVAL);
    CHECK(f == NULL);
    o = ct_fsdp_options_default();
    o.param_dtype = CT_DTYPE_I32;
    CHECK_STATUS(ct_fsdp_create(w, &c, NULL, &o, &f), CT_EINVAL);
    o = ct_fsdp_options_default();
    o.reduce_dtype = CT_DTYPE_BF16;
    CHECK_STATUS(ct_fsdp_create(w, &c, NULL, &o, &f), CT_EINVAL);
    o = ct_fsdp_options_default();
    o.gradient_divide_factor = -1;
    CHECK_STATUS(ct_fsdp_create(w, &c, NULL, &o, &f), CT_EINVAL);
    o = ct_fsdp_options_default();
    o.mode = CT_FSDP_REPLICATE;
    o.param_dtype = CT_DTYPE_BF16;
    CHECK_STATUS(ct_fsdp_create(w, &c, NULL, &o, &f), CT_EINVAL);
    o = ct_fsdp_options_default();
    o.mode = (ct_fsdp_mode)7;
    CHECK_STATUS(ct_fsdp_create(w, &c, NULL, &o, &f), CT_EINVAL);
    CHECK_STATUS(ct_fsdp_create(NULL, &c, NULL, NULL, &f), CT_EINVAL);
    ct_fsdp_mode md;
    CHECK_STATUS(ct_fsdp_mode_from_name("zero3", &md), CT_EINVAL);
    CHECK_OK(ct_fsdp_mode_from_name("dp", &md));
    CHECK(md == CT_FSDP_REPLICATE && !strcmp(ct_fsdp_mode_name(md), "dp"));
    /* the trainer: a global batch the ranks cannot split; a token out of the vocabulary */
    ct_train_options to = ct_train_options_default();
    to.batch = 2;
    to.seq = 4;
    int32_t data[64];
    for (int i = 0; i < 64; i++)
        data[i] = i % 50;
    ct_fsdp_trainer *t = NULL;
    data[5] = 50;
    CHECK_STATUS(ct_fsdp_trainer_create(w, &c, &to, NULL, data, 64, NULL, 0, &t), CT_EINVAL);
    data[5] = 5;
    CHECK_OK(ct_fsdp_trainer_create(w, &c, &to, NULL, data, 64, NULL, 0, &t));
    float loss;
    CHECK_STATUS(ct_fsdp_trainer_evaluate(t, &loss), CT_EINVAL);
    ct_train_step_info info;
    CHECK_OK(ct_fsdp_trainer_step(t, &info));
    CHECK(info.step == 1 && isfinite(info.loss));
    ct_fsdp_trainer_free(t);
    ct_comm_free(w);
}

static void write_text(const char *path, const char *text)
{
    FILE *fp = fopen(path, "w");
    if (!fp) return;
    fputs(text, fp);
    fclose(fp);
}

static void test_bad_checkpoints(void)
{
    char dir[] = "/tmp/ct-test-fsdp-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    char p[256], *s = NULL;
    bool isdir;
    snprintf(p, sizeof p, "%s/missing", dir);
    CHECK_STATUS(ct_sharded_checkpoint_resolve(p, &s, &isdir), CT_EIO);
    /* a directory without COMMITTED (a save that was interrupted) */
    CHECK_STATUS(ct_sharded_checkpoint_verify(dir, &s), CT_EFORMAT);
    snprintf(p, sizeof p, "%s/COMMITTED", dir);
    write_text(p, "x");
    snprintf(p, sizeof p, "%s/index.json", dir);
    write_text(p, "{not json");
    CHECK_STATUS(ct_sharded_checkpoint_verify(dir, &s), CT_EFORMAT);
    write_text(p, "{\"format\": \"other\", \"world_size\": 1, \"tensors\": {}, \"metadata\": {}}");
    CHECK_STATUS(ct_sharded_checkpoint_verify(dir, &s), CT_EFORMAT);
    /* shard file names are plain names inside the directory */
    write_text(p, "{\"format\": \"ctorch-sharded\", \"world_size\": 1, \"metadata\": {}, "
                  "\"tensors\": {\"w\": {\"shape\": [2, 2], \"dtype\": \"F32\", \"shards\": "
                  "[{\"file\": \"../x.safetensors\", \"begin\": 0, \"end\": 2}]}}}");
    CHECK_STATUS(ct_sharded_checkpoint_verify(dir, &s), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "plain name") != NULL);
    /* rows that do not tile the tensor */
    write_text(p, "{\"format\": \"ctorch-sharded\", \"world_size\": 2, \"metadata\": {}, "
                  "\"tensors\": {\"w\": {\"shape\": [4, 2], \"dtype\": \"F32\", \"shards\": "
                  "[{\"file\": \"a.safetensors\", \"begin\": 0, \"end\": 1}, "
                  "{\"file\": \"b.safetensors\", \"begin\": 2, \"end\": 4}]}}}");
    CHECK_STATUS(ct_sharded_checkpoint_verify(dir, &s), CT_EFORMAT);
    snprintf(p, sizeof p, "%s/out.safetensors", dir);
    CHECK_STATUS(ct_sharded_checkpoint_consolidate(dir, p), CT_EFORMAT);
    CHECK(access(p, F_OK) != 0);
    CHECK_STATUS(ct_sharded_checkpoint_metadata(dir, "config", &s), CT_EFORMAT);
    /* an empty valid index */
    snprintf(p, sizeof p, "%s/index.json", dir);
    write_text(p, "{\"format\": \"ctorch-sharded\", \"world_size\": 1, \"step\": 3, "
                  "\"metadata\": {\"config\": \"{}\"}, \"tensors\": {}}");
    CHECK_OK(ct_sharded_checkpoint_verify(dir, &s));
    CHECK(s && strstr(s, "\"step\": 3"));
    ct_free(s);
    CHECK_OK(ct_sharded_checkpoint_metadata(dir, "config", &s));
    CHECK(s && !strcmp(s, "{}"));
    ct_free(s);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    CHECK(system(cmd) == 0);
}

int main(void)
{
    CHECK_OK(ct_store_server_start("127.0.0.1", 0, &srv));
    CHECK_OK(ct_store_connect("127.0.0.1", ct_store_server_port(srv), 10, &store));
    for (int d = 0; d < 2; d++) { /* compute in f32, then in bf16: bitwise either way */
        ct_dtype dt = d ? CT_DTYPE_BF16 : CT_DTYPE_F32;
        ct_fsdp_options o = ct_fsdp_options_default();
        test_matches_one_process(o, true, 1, dt);
        o.forward_prefetch = o.backward_prefetch = 3;
        o.reshard_after_forward = false;
        o.root_reshard_after_forward = true;
        test_matches_one_process(o, true, 2, dt);
        o = ct_fsdp_options_default();
        o.overlap = false;
        o.separate_reduce_scatter_comm = false;
        test_matches_one_process(o, true, 3, dt);
        o = ct_fsdp_options_default();
        o.mode = CT_FSDP_REPLICATE;
        test_matches_one_process(o, true, 2, dt);
    }
    ct_fsdp_options o = ct_fsdp_options_default();
    o.param_dtype = CT_DTYPE_BF16;
    test_matches_one_process(o, false, 1, CT_DTYPE_F32);
    test_matches_one_process(o, false, 1, CT_DTYPE_BF16);
    test_bf16_gathers_in_bf16_compute();
    test_bf16_memory();
    test_bad_options();
    test_bad_checkpoints();
    ct_store_free(store);
    ct_store_server_free(srv);
    return t_report("test_dist_fsdp");
}
