/* The GPT model and trainer: finite-difference gradients, bitwise reproducibility across
 * thread counts, exact resume from a checkpoint, and bad input. (The match against PyTorch
 * is tests/python/test_train.py.) */
#include "test_util.h"

#include <unistd.h>

static ct_gpt_config tiny_config(void)
{
    ct_gpt_config c = ct_gpt_config_default();
    c.vocab_size = 40;
    c.context = 12;
    c.n_layer = 2;
    c.d_model = 16;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.d_ff = 12;
    c.window = 5;
    c.init_std = 0.3f; /* large weights: every path carries gradient */
    return c;
}

/* Finite differences of the loss against the analytic gradient on a few coordinates of
 * every tensor, in a configuration with GQA, a sliding window, documents, z-loss and label
 * smoothing, for the fused and the unfused head, flex and dense attention. */
static void test_gradients(bool fused, bool dense, bool tied, int hf)
{
    ct_gpt_config c = tiny_config();
    c.tied = tied;
    if (hf) { /* Hugging Face features: H E != C, q/k/v and o biases, scaled RoPE */
        c.head_dim = 6;
        c.qkv_bias = true;
        c.o_bias = hf == 2;
        c.rope_scaling = hf == 1 ? CT_ROPE_SCALING_LINEAR : CT_ROPE_SCALING_LLAMA3;
        c.rope_factor = 4.0f;
        c.rope_original_context = 8;
        c.rope_base = 50.0f; /* wavelengths on both sides of the llama3 bounds */
    }
    ct_gpt_options o = ct_gpt_options_default();
    o.batch = 2;
    o.fused_head = fused;
    o.dense_attention = dense;
    o.eos_token = 3;
    o.z_loss = 0.01f;
    o.label_smoothing = 0.1f;
    ct_gpt *m;
    CHECK_OK(ct_gpt_create(&c, &o, &m));
    CHECK_OK(ct_gpt_init(m, 7));
    if (hf) /* biases start at zero: give them values so their effect on the input grads shows */
        for (int i = 0; i < ct_gpt_num_tensors(m); i++) {
            const char *name;
            ct_tensor p;
            CHECK_OK(ct_gpt_tensor(m, i, &name, &p, NULL));
            if (strstr(name, ".bias"))
                for (int64_t j = 0; j < ct_tensor_numel(&p); j++)
                    ((float *)p.data)[j] = 0.2f * (float)((j % 7) - 3);
        }
    int64_t B = 2, T = 9;
    int32_t tok[2 * 10];
    for (int i = 0; i < 20; i++)
        tok[i] = (int32_t)(t_next() % 40);
    tok[4] = 3, tok[13] = 3; /* document boundaries */
    float loss;
    CHECK_OK(ct_gpt_forward_backward(m, tok, B, T, 1.0f, &loss));
    /* forward alone gives the plain loss: without z-loss and smoothing it must differ */
    float plain;
    CHECK_OK(ct_gpt_forward(m, tok, B, T, &plain));
    CHECK(plain != loss && isfinite(plain));
    int nt = ct_gpt_num_tensors(m);
    for (int i = 0; i < nt; i++) {
        const char *name;
        ct_tensor p, g;
        CHECK_OK(ct_gpt_tensor(m, i, &name, &p, &g));
        int64_t n = ct_tensor_numel(&p);
        for (int k = 0; k < 3; k++) {
            int64_t j = (int64_t)(t_next() % (uint64_t)n);
            float *x = (float *)p.data + j, x0 = *x, h = 1e-2f;
            double an =
                ((float *)g.data)[j]; /* grad_scale 0 below leaves the gradients as they are */
            float lp, lm;
            *x = x0 + h;
            CHECK_OK(ct_gpt_forward_backward(m, tok, B, T, 0.0f, &lp));
            *x = x0 - h;
            CHECK_OK(ct_gpt_forward_backward(m, tok, B, T, 0.0f, &lm));
            *x = x0;
            double fd = ((double)lp - lm) / (2.0 * h);
            double err = fabs(fd - an) / (1e-3 + fabs(an));
            if (err > 2e-2) {
                fprintf(stderr,
                        "  %s[%lld]: finite difference %.6g vs analytic %.6g (fused %d dense %d)\n",
                        name, (long long)j, fd, an, fused, dense);
                CHECK(0);
            }
        }
    }
    ct_gpt_free(m);
}

static int32_t *make_tokens(int64_t n, uint64_t stream)
{
    ct_corpus_options co = ct_corpus_options_default();
    co.vocab_size = 40;
    co.classes = 4;
    co.sentence = 4;
    co.repeats = 2;
    ct_corpus *cp;
    int32_t *x = malloc((size_t)n * sizeof *x);
    CHECK_OK(ct_corpus_create(&co, &cp));
    CHECK_OK(ct_corpus_generate(cp, stream, n, x));
    ct_corpus_free(cp);
    return x;
}

static ct_train_options tiny_train(void)
{
    ct_train_options o = ct_train_options_default();
    o.batch = 2;
    o.seq = 8;
    o.accum = 2;
    o.steps = 6;
    o.warmup = 2;
    o.eos_token = 0;
    o.z_loss = 1e-3f;
    o.eval_batches = 2;
    o.lr = 1e-2f;
    return o;
}

/* Bitwise: the same seed gives the same losses and weights at 1 and 2 threads. */
static void test_threads(void)
{
    ct_gpt_config c = tiny_config();
    ct_train_options o = tiny_train();
    int32_t *tr = make_tokens(200, 0), *ev = make_tokens(50, 1);
    float loss[2][4], eval[2];
    float *w[2];
    int64_t P = 0;
    int prev = ct_num_threads();
    for (int k = 0; k < 2; k++) {
        CHECK_OK(ct_set_num_threads(k + 1));
        ct_trainer *t;
        CHECK_OK(ct_trainer_create(&c, &o, tr, 200, ev, 50, &t));
        for (int s = 0; s < 4; s++) {
            ct_train_step_info info;
            CHECK_OK(ct_trainer_step(t, &info));
            loss[k][s] = info.loss;
        }
        CHECK_OK(ct_trainer_evaluate(t, &eval[k]));
        P = ct_gpt_num_params(ct_trainer_model(t));
        w[k] = malloc((size_t)P * sizeof(float));
        memcpy(w[k], ct_gpt_params(ct_trainer_model(t)), (size_t)P * sizeof(float));
        ct_trainer_free(t);
    }
    ct_set_num_threads(prev);
    CHECK(!memcmp(loss[0], loss[1], sizeof loss[0]));
    CHECK(eval[0] == eval[1]);
    CHECK(!memcmp(w[0], w[1], (size_t)P * sizeof(float)));
    free(w[0]);
    free(w[1]);
    free(tr);
    free(ev);
}

/* dtype bf16 through the library: the same bits at 1 and 2 threads (accumulation over 2
 * micro-batches, evaluation); losses near f32's but not equal (the GEMMs' operands rounded);
 * the bf16 copy follows weights written between forwards; every path of the layer (q/k/v and o
 * biases, head_dim != d_model / heads, untied head) gives gradients near f32's; bad dtypes. */
static void test_bf16(void)
{
    ct_gpt_config c = tiny_config();
    ct_train_options o = tiny_train();
    int32_t *tr = make_tokens(200, 0), *ev = make_tokens(50, 1);
    float loss[3][4], eval[3];
    float *w[3];
    int64_t P = 0;
    int prev = ct_num_threads();
    for (int k = 0; k < 3; k++) { /* bf16 at 1 and 2 threads, then f32 */
        CHECK_OK(ct_set_num_threads(k == 1 ? 2 : 1));
        o.dtype = k < 2 ? CT_DTYPE_BF16 : CT_DTYPE_F32;
        ct_trainer *t;
        CHECK_OK(ct_trainer_create(&c, &o, tr, 200, ev, 50, &t));
        for (int s = 0; s < 4; s++) {
            ct_train_step_info info;
            CHECK_OK(ct_trainer_step(t, &info));
            loss[k][s] = info.loss;
        }
        CHECK_OK(ct_trainer_evaluate(t, &eval[k]));
        P = ct_gpt_num_params(ct_trainer_model(t));
        w[k] = malloc((size_t)P * sizeof(float));
        memcpy(w[k], ct_gpt_params(ct_trainer_model(t)), (size_t)P * sizeof(float));
        ct_trainer_free(t);
    }
    ct_set_num_threads(prev);
    CHECK(!memcmp(loss[0], loss[1], sizeof loss[0]));
    CHECK(eval[0] == eval[1]);
    CHECK(!memcmp(w[0], w[1], (size_t)P * sizeof(float)));
    CHECK(memcmp(loss[0], loss[2], sizeof loss[0]) != 0);
    for (int s = 0; s < 4; s++)
        CHECK(fabsf(loss[0][s] - loss[2][s]) < 0.02f * loss[2][s]);
    for (int k = 0; k < 3; k++)
        free(w[k]);

    /* options: the trainer's JSON keeps the dtype; bad ones are refused */
    char *js = NULL;
    o.dtype = CT_DTYPE_BF16;
    CHECK_OK(ct_train_options_to_json(&o, &js));
    CHECK(strstr(js, "\"dtype\":\"bf16\"") != NULL);
    ct_train_options back = ct_train_options_default();
    CHECK_OK(ct_train_options_from_json(js, &back));
    CHECK(back.dtype == CT_DTYPE_BF16);
    ct_free(js);
    CHECK_STATUS(ct_train_options_from_json("{\"dtype\":\"f16\"}", &back), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "dtype") != NULL);
    CHECK_STATUS(ct_train_options_from_json("{\"dtype\":3}", &back), CT_EFORMAT);
    o.dtype = CT_DTYPE_F16;
    ct_trainer *bad = NULL;
    CHECK_STATUS(ct_trainer_create(&c, &o, tr, 200, ev, 50, &bad), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "dtype") != NULL && !bad);
    ct_gpt_options mo = ct_gpt_options_default();
    mo.dtype = CT_DTYPE_I32;
    ct_gpt *bm = NULL;
    CHECK_STATUS(ct_gpt_create(&c, &mo, &bm), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "dtype") != NULL && !bm);

    /* a model outside a trainer: weights written between forwards are seen (the copy is
     * refreshed at every forward), and the layer's every path stays near f32 */
    c.head_dim = 6;
    c.qkv_bias = true;
    c.o_bias = true;
    c.tied = false;
    ct_gpt *m[2];
    float lm[2];
    int32_t toks[2 * 9];
    memcpy(toks, tr, sizeof toks);
    for (int k = 0; k < 2; k++) {
        mo = ct_gpt_options_default();
        mo.batch = 2;
        mo.seq = 8;
        mo.dtype = k ? CT_DTYPE_BF16 : CT_DTYPE_F32;
        CHECK_OK(ct_gpt_create(&c, &mo, &m[k]));
        CHECK_OK(ct_gpt_init(m[k], 3));
    }
    P = ct_gpt_num_params(m[0]);
    float l0;
    CHECK_OK(ct_gpt_forward(m[1], toks, 2, 8, &l0));
    for (int64_t i = 0; i < P; i++) { /* biases non-zero: their paths carry gradient */
        float *p0 = ct_gpt_params(m[0]) + i;
        *p0 = *p0 == 0.0f ? 0.05f * (float)((i % 7) - 3) : *p0 * 0.75f;
        ct_gpt_params(m[1])[i] = *p0;
    }
    for (int k = 0; k < 2; k++) {
        ct_gpt_zero_grad(m[k]);
        CHECK_OK(ct_gpt_forward_backward(m[k], toks, 2, 8, 1.0f, &lm[k]));
    }
    CHECK(lm[1] != l0 && lm[1] != lm[0] && fabsf(lm[1] - lm[0]) < 0.02f * lm[0]);
    for (int i = 0; i < ct_gpt_num_tensors(m[0]); i++) {
        ct_tensor g0, g1;
        const char *name;
        CHECK_OK(ct_gpt_tensor(m[0], i, &name, NULL, &g0));
        CHECK_OK(ct_gpt_tensor(m[1], i, NULL, NULL, &g1));
        int64_t n = ct_tensor_numel(&g0);
        double d = 0, r = 0;
        for (int64_t j = 0; j < n; j++) {
            double a = ((float *)g0.data)[j], b = ((float *)g1.data)[j];
            d += (a - b) * (a - b);
            r += a * a;
        }
        if (!(r > 0 && d > 0 && d < 0.05 * 0.05 * r))
            fprintf(stderr, "test_bf16: %s: relative gradient error %.3g\n", name, sqrt(d / r));
        CHECK(r > 0 && d > 0 && d < 0.05 * 0.05 * r);
    }
    ct_gpt_free(m[0]);
    ct_gpt_free(m[1]);
    free(tr);
    free(ev);
}

/* Resume: 2 steps, save, a fresh trainer loads and takes steps 3 and 4: the same bits as 4
 * uninterrupted steps. Then bad checkpoints. */
static void test_resume(void)
{
    ct_gpt_config c = tiny_config();
    ct_train_options o = tiny_train();
    o.batch = 3; /* 3 x 8 x 2 tokens per step: the 100-token stream wraps into a new epoch */
    int32_t *tr = make_tokens(100, 0), *ev = make_tokens(50, 1);
    char path[64], bad[64];
    snprintf(path, sizeof path, "/tmp/ct_test_resume_%d.safetensors", (int)getpid());
    snprintf(bad, sizeof bad, "/tmp/ct_test_resume_bad_%d.safetensors", (int)getpid());
    ct_trainer *a, *b, *r;
    float la[4], lr[2];
    CHECK_OK(ct_trainer_create(&c, &o, tr, 100, ev, 50, &a));
    for (int s = 0; s < 4; s++) {
        ct_train_step_info info;
        CHECK_OK(ct_trainer_step(a, &info));
        la[s] = info.loss;
        if (s == 3) CHECK(info.epoch >= 1);
    }
    CHECK_OK(ct_trainer_create(&c, &o, tr, 100, ev, 50, &b));
    CHECK_OK(ct_trainer_step(b, NULL));
    CHECK_OK(ct_trainer_step(b, NULL));
    const char *k[1] = {"note"}, *v[1] = {"test"};
    CHECK_OK(ct_trainer_save(b, path, 1, k, v));
    ct_train_options o2 = o;
    o2.seed = 99; /* a different initialisation: the checkpoint must overwrite all of it */
    CHECK_OK(ct_trainer_create(&c, &o2, tr, 100, ev, 50, &r));
    CHECK_OK(ct_trainer_load(r, path));
    CHECK(ct_trainer_step_count(r) == 2);
    for (int s = 0; s < 2; s++) {
        ct_train_step_info info;
        CHECK_OK(ct_trainer_step(r, &info));
        lr[s] = info.loss;
        CHECK(info.step == s + 3);
    }
    CHECK(lr[0] == la[2] && lr[1] == la[3]);
    int64_t P = ct_gpt_num_params(ct_trainer_model(a));
    CHECK(!memcmp(ct_gpt_params(ct_trainer_model(a)), ct_gpt_params(ct_trainer_model(r)),
                  (size_t)P * 4));
    /* reserved metadata keys are refused */
    const char *rk[1] = {"step"};
    CHECK_STATUS(ct_trainer_save(b, bad, 1, rk, v), CT_EINVAL);
    /* another configuration */
    ct_gpt_config c2 = c;
    c2.d_ff = 16;
    ct_trainer *w;
    CHECK_OK(ct_trainer_create(&c2, &o, tr, 100, ev, 50, &w));
    CHECK_STATUS(ct_trainer_load(w, path), CT_EFORMAT);
    ct_tensor_file *f;
    CHECK_OK(ct_load(path, NULL, &f));
    CHECK_STATUS(ct_gpt_load_params(ct_trainer_model(w), f), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "w_gate_up.weight") && strstr(ct_last_error(), "[32, 16]"));
    ct_tensor_file_close(f);
    ct_trainer_free(w);
    /* a missing file, a truncated file, a file that is not a checkpoint */
    CHECK_STATUS(ct_trainer_load(r, "/nonexistent/ckpt.safetensors"), CT_EIO);
    FILE *in = fopen(path, "rb"), *out = fopen(bad, "wb");
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf, in);
    fwrite(buf, 1, n / 2, out);
    fclose(in);
    fclose(out);
    CHECK_STATUS(ct_trainer_load(r, bad), CT_EFORMAT);
    float x = 1.0f;
    ct_tensor t1;
    int64_t one = 1;
    ct_tensor_wrap(&t1, &x, CT_DTYPE_F32, 1, &one, NULL);
    const char *nm[1] = {"x"};
    CHECK_OK(ct_save_safetensors(bad, &t1, nm, 1, NULL, NULL, 0, NULL));
    CHECK_STATUS(ct_trainer_load(r, bad), CT_EFORMAT);
    /* a bad "config": the message says where and keeps the rule that broke, whole */
    {
        const char *mk[2] = {"format", "config"}, *mv[2] = {"ctorch-gpt", "{\"vocab_size\": 1}"};
        CHECK_OK(ct_save_safetensors(bad, &t1, nm, 1, mk, mv, 2, NULL));
        CHECK_STATUS(ct_trainer_load(r, bad), CT_EFORMAT);
        CHECK(!strcmp(ct_last_error(), "checkpoint: bad \"config\": gpt config: vocab_size "
                                       "must be in [2, 2^31), got 1"));
    }
    remove(path);
    remove(bad);
    ct_trainer_free(a);
    ct_trainer_free(b);
    ct_trainer_free(r);
    free(tr);
    free(ev);
}

static void test_bad_input(void)
{
    ct_gpt_config c = tiny_config();
    ct_gpt *m;
    c.n_head = 3; /* 16 % 3 != 0 */
    CHECK_STATUS(ct_gpt_create(&c, NULL, &m), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "d_model") != NULL);
    c = tiny_config();
    c.n_kv_head = 3;
    CHECK_STATUS(ct_gpt_create(&c, NULL, &m), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "n_kv_head") != NULL);
    c = tiny_config();
    c.d_model = 12, c.n_head = 4; /* head dim 3 is odd */
    CHECK_STATUS(ct_gpt_create(&c, NULL, &m), CT_EINVAL);
    c = tiny_config();
    c.window = -1;
    CHECK_STATUS(ct_gpt_config_check(&c), CT_EINVAL);
    c = tiny_config();
    ct_gpt_options o = ct_gpt_options_default();
    o.seq = 13;
    CHECK_STATUS(ct_gpt_create(&c, &o, &m), CT_EINVAL);
    CHECK_OK(ct_gpt_create(&c, NULL, &m));
    int32_t tok[10] = {1, 2, 3, 40, 5, 6, 7, 8, 9, 10};
    float l;
    CHECK_STATUS(ct_gpt_forward(m, tok, 1, 9, &l), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "40") != NULL);
    CHECK_STATUS(ct_gpt_forward(m, tok, 9, 1, &l), CT_EINVAL);  /* B > batch */
    CHECK_STATUS(ct_gpt_forward(m, tok, 1, 13, &l), CT_EINVAL); /* T > seq */
    ct_gpt_free(m);
    /* configuration JSON: round trip, unknown key, wrong type */
    c = tiny_config();
    char *js, *js2;
    CHECK_OK(ct_gpt_config_to_json(&c, &js));
    ct_gpt_config d = ct_gpt_config_default();
    CHECK_OK(ct_gpt_config_from_json(js, &d));
    CHECK_OK(ct_gpt_config_to_json(&d, &js2));
    CHECK(!strcmp(js, js2) && d.n_layer == c.n_layer && d.window == c.window && d.tied == c.tied);
    ct_free(js);
    ct_free(js2);
    CHECK_STATUS(ct_gpt_config_from_json("{\"layers\": 2}", &d), CT_EFORMAT);
    CHECK_STATUS(ct_gpt_config_from_json("{\"n_layer\": \"2\"}", &d), CT_EFORMAT);
    CHECK_STATUS(ct_gpt_config_from_json("{\"n_layer\": 0}", &d), CT_EINVAL);
    CHECK_STATUS(ct_gpt_config_from_json("not json", &d), CT_EFORMAT);
    /* trainer: too little data, tokens outside the vocabulary */
    ct_trainer *t;
    ct_train_options to = tiny_train();
    int32_t few[5] = {1, 2, 3, 4, 5};
    CHECK_STATUS(ct_trainer_create(&c, &to, few, 5, NULL, 0, &t), CT_EINVAL);
    int32_t *tr = make_tokens(100, 0);
    tr[50] = 1000;
    CHECK_STATUS(ct_trainer_create(&c, &to, tr, 100, NULL, 0, &t), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "1000") != NULL);
    tr[50] = 1;
    CHECK_OK(ct_trainer_create(&c, &to, tr, 100, NULL, 0, &t));
    CHECK_STATUS(ct_trainer_evaluate(t, &l), CT_EINVAL); /* no held-out data */
    ct_trainer_free(t);
    free(tr);
}

/* Generation logits equal the last row of a batch forward (the same model, the same prefix). */
static void test_next_logits(void)
{
    ct_gpt_config c = tiny_config();
    ct_gpt_options o = ct_gpt_options_default();
    o.batch = 1;
    o.fused_head = false;
    ct_gpt *m;
    CHECK_OK(ct_gpt_create(&c, &o, &m));
    CHECK_OK(ct_gpt_init(m, 3));
    int32_t tok[8] = {5, 9, 1, 33, 2, 7, 7, 30};
    float logits[40], l0, l1;
    CHECK_OK(ct_gpt_next_logits(m, tok, 7, logits));
    /* loss of predicting tok[7] after tok[0..6] from the logits, vs the model's own loss
     * difference between the 7- and 6-token sequences */
    double mx = logits[0], s = 0;
    for (int i = 1; i < 40; i++)
        mx = fmax(mx, logits[i]);
    for (int i = 0; i < 40; i++)
        s += exp(logits[i] - mx);
    double nll = mx + log(s) - logits[tok[7]];
    CHECK_OK(ct_gpt_forward(m, tok, 1, 7, &l1));
    CHECK_OK(ct_gpt_forward(m, tok, 1, 6, &l0));
    CHECK(fabs((7.0 * l1 - 6.0 * l0) - nll) < 1e-4 * (1 + nll));
    ct_gpt_free(m);
}

/* The configuration's JSON: a round trip of every new key, older JSON (without them) gives
 * the defaults and keeps its text, bad values are named. */
static void test_config_json(void)
{
    ct_gpt_config c = tiny_config(), d = ct_gpt_config_default();
    char *js;
    CHECK_OK(ct_gpt_config_to_json(&c, &js));
    CHECK(!strstr(js, "head_dim") && !strstr(js, "rope_scaling")); /* older text unchanged */
    ct_gpt_config back = d;
    CHECK_OK(ct_gpt_config_from_json(js, &back));
    CHECK(back.head_dim == 0 && !back.qkv_bias && back.rope_scaling == CT_ROPE_SCALING_NONE);
    ct_free(js);
    c.head_dim = 10;
    c.qkv_bias = true;
    c.o_bias = true;
    c.rope_scaling = CT_ROPE_SCALING_LLAMA3;
    c.rope_factor = 8.0f;
    c.rope_low_freq_factor = 1.5f;
    c.rope_high_freq_factor = 3.25f;
    c.rope_original_context = 64;
    CHECK_OK(ct_gpt_config_to_json(&c, &js));
    back = d;
    CHECK_OK(ct_gpt_config_from_json(js, &back));
    CHECK(back.head_dim == 10 && back.qkv_bias && back.o_bias &&
          back.rope_scaling == CT_ROPE_SCALING_LLAMA3 && back.rope_factor == 8.0f &&
          back.rope_low_freq_factor == 1.5f && back.rope_high_freq_factor == 3.25f &&
          back.rope_original_context == 64);
    char *js2;
    CHECK_OK(ct_gpt_config_to_json(&back, &js2));
    CHECK(!strcmp(js, js2));
    ct_free(js);
    ct_free(js2);
    back = d;
    CHECK(ct_gpt_config_from_json("{\"rope_scaling\": \"yarn\"}", &back) == CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "rope_scaling"));
    CHECK(ct_gpt_config_from_json("{\"head_dim\": 7}", &back) == CT_EINVAL);
    CHECK(strstr(ct_last_error(), "head_dim"));
    back = d;
    CHECK(ct_gpt_config_from_json("{\"qkv_bias\": 1}", &back) == CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "qkv_bias"));
    back = d;
    CHECK(ct_gpt_config_from_json(
              "{\"rope_scaling\": \"llama3\", \"rope_low_freq_factor\": 4}", &back) ==
          CT_EINVAL);
    CHECK(strstr(ct_last_error(), "rope_low_freq_factor"));
    /* head_dim lifts the divisibility rule: 3 heads of 8 on d_model 16 */
    back = tiny_config();
    back.n_head = 3;
    back.n_kv_head = 1;
    CHECK(ct_gpt_config_check(&back) == CT_EINVAL);
    back.head_dim = 8;
    CHECK_OK(ct_gpt_config_check(&back));
}

/* The inverse frequencies against a naive double-precision reading of the rules. */
static void test_rope_freqs(void)
{
    ct_gpt_config c = tiny_config();
    c.head_dim = 16;
    c.rope_base = 10000.0f;
    float f[8];
    CHECK_OK(ct_gpt_rope_inv_freq(&c, f));
    for (int i = 0; i < 8; i++)
        CHECK(fabs(f[i] - 1.0 / pow(10000.0, 2.0 * i / 16)) <= 1e-6 * (1.0 / pow(10000.0, 2.0 * i / 16)));
    c.rope_scaling = CT_ROPE_SCALING_LINEAR;
    c.rope_factor = 2.0f;
    float g[8];
    CHECK_OK(ct_gpt_rope_inv_freq(&c, g));
    for (int i = 0; i < 8; i++)
        CHECK(g[i] == f[i] / 2.0f);
    c.rope_scaling = CT_ROPE_SCALING_LLAMA3;
    c.rope_factor = 8.0f;
    c.rope_low_freq_factor = 1.0f;
    c.rope_high_freq_factor = 4.0f;
    c.rope_original_context = 64;
    CHECK_OK(ct_gpt_rope_inv_freq(&c, g));
    int kept = 0, divided = 0, mixed = 0;
    for (int i = 0; i < 8; i++) {
        double w = 2 * M_PI / f[i], want;
        if (w < 64.0 / 4) want = f[i], kept++;
        else if (w > 64.0 / 1) want = f[i] / 8.0, divided++;
        else {
            double s = (64.0 / w - 1) / (4 - 1);
            want = (1 - s) * f[i] / 8 + s * f[i];
            mixed++;
        }
        CHECK(fabs(g[i] - want) <= 1e-5 * want);
    }
    CHECK(kept && divided && mixed);
}

/* Logits of every position equal the next-token logits of each prefix. */
static void test_logits(void)
{
    ct_gpt_config c = tiny_config();
    c.head_dim = 6;
    c.qkv_bias = true;
    ct_gpt *m;
    ct_gpt_options o = ct_gpt_options_default();
    o.batch = 2;
    CHECK_OK(ct_gpt_create(&c, &o, &m));
    CHECK_OK(ct_gpt_init(m, 3));
    int32_t tok[2 * 7];
    for (int i = 0; i < 14; i++)
        tok[i] = (int32_t)(t_next() % 40);
    float *lg = malloc(14 * 40 * sizeof *lg), nl[40];
    CHECK_OK(ct_gpt_logits(m, tok, 2, 7, lg));
    for (int b = 0; b < 2; b++)
        for (int t = 1; t <= 7; t++) {
            CHECK_OK(ct_gpt_next_logits(m, tok + b * 7, t, nl));
            for (int v = 0; v < 40; v++)
                CHECK(fabsf(nl[v] - lg[(b * 7 + t - 1) * 40 + v]) <= 1e-5f * (1 + fabsf(nl[v])));
        }
    tok[3] = 40;
    CHECK(ct_gpt_logits(m, tok, 2, 7, lg) == CT_EINVAL);
    CHECK(strstr(ct_last_error(), "tokens[0][3]"));
    CHECK(ct_gpt_logits(m, tok, 3, 7, lg) == CT_EINVAL);
    free(lg);
    ct_gpt_free(m);
}

/* Copy checkpoint src to dst with metadata `key` set to `value` (added if absent; NULL key:
 * none), tensor `drop` left out and tensor `as_i32` stored as int32 (NULL: none). */
static void resave(const char *src, const char *dst, const char *key, const char *value,
                   const char *drop, const char *as_i32)
{
    ct_tensor_file *f;
    CHECK_OK(ct_load(src, NULL, &f));
    size_t n = ct_tensor_file_count(f), nm = ct_tensor_file_metadata_count(f), k = 0, km = 0;
    ct_tensor *ts = calloc(n, sizeof *ts);
    const char **names = calloc(n, sizeof *names), **mk = calloc(nm + 1, sizeof *mk),
               **mv = calloc(nm + 1, sizeof *mv);
    for (size_t i = 0; i < n; i++) {
        ct_tensor_info info;
        CHECK_OK(ct_tensor_file_info(f, i, &info));
        if (drop && !strcmp(info.name, drop)) continue;
        names[k] = info.name;
        if (as_i32 && !strcmp(info.name, as_i32))
            CHECK_OK(ct_tensor_file_read(f, i, CT_DTYPE_I32, &ts[k]));
        else
            CHECK_OK(ct_tensor_file_view(f, i, &ts[k]));
        k++;
    }
    bool set = false;
    for (size_t i = 0; i < nm; i++) {
        CHECK_OK(ct_tensor_file_metadata(f, i, &mk[km], &mv[km]));
        if (key && !strcmp(mk[km], key)) mv[km] = value, set = true;
        km++;
    }
    if (key && !set) mk[km] = key, mv[km] = value, km++;
    CHECK_OK(ct_save_safetensors(dst, ts, names, k, mk, mv, km, NULL));
    for (size_t i = 0; i < k; i++)
        if (ts[i].owns) ct_tensor_free(&ts[i]);
    free(ts);
    free(names);
    free(mk);
    free(mv);
    ct_tensor_file_close(f);
}

/* One validation path (ct_gpt_checkpoint_check) for generate and resume: a small file whose
 * configuration describes a 4 GB model fails before any of it is allocated; bad tensors,
 * moments and trainer state are named. */
static void test_checkpoint_validation(void)
{
    ct_gpt_config c = tiny_config();
    ct_train_options o = ct_train_options_default();
    o.batch = 2;
    o.steps = 4;
    int32_t *tr = make_tokens(100, 0);
    char path[64], bad[64];
    snprintf(path, sizeof path, "/tmp/ct_test_ckcheck_%d.safetensors", (int)getpid());
    snprintf(bad, sizeof bad, "/tmp/ct_test_ckcheck_bad_%d.safetensors", (int)getpid());
    ct_trainer *t, *r;
    CHECK_OK(ct_trainer_create(&c, &o, tr, 100, NULL, 0, &t));
    CHECK_OK(ct_trainer_step(t, NULL));
    CHECK_OK(ct_trainer_save(t, path, 0, NULL, NULL));
    CHECK_OK(ct_trainer_create(&c, &o, tr, 100, NULL, 0, &r));
    ct_tensor_file *f;
    ct_gpt_config got;
    CHECK_OK(ct_load(path, NULL, &f));
    CHECK_OK(ct_gpt_checkpoint_check(f, true, &got));
    CHECK(got.vocab_size == c.vocab_size && got.d_ff == c.d_ff && got.window == c.window);
    CHECK_OK(ct_gpt_checkpoint_config(f, &got));
    CHECK_STATUS(ct_gpt_checkpoint_check(NULL, false, &got), CT_EINVAL);
    ct_tensor_file_close(f);

    /* 312 bytes of tensors, a configuration of 2^20 x 1024 embeddings (4 GiB of floats) */
    {
        float x[4] = {1, 2, 3, 4};
        ct_tensor e;
        ct_tensor_wrap(&e, x, CT_DTYPE_F32, 2, (int64_t[]){2, 2}, NULL);
        const char *nm[1] = {"tok_embeddings.weight"};
        const char *mk[2] = {"format", "config"},
                   *mv[2] = {"ctorch-gpt", "{\"vocab_size\": 1048576, \"d_model\": 1024, "
                                           "\"n_head\": 8, \"n_kv_head\": 8, \"n_layer\": 64, "
                                           "\"d_ff\": 65536, \"context\": 65536}"};
        CHECK_OK(ct_save_safetensors(bad, &e, nm, 1, mk, mv, 2, NULL));
        CHECK_OK(ct_load(bad, NULL, &f));
        ct_memory_stats_t before, after;
        ct_memory_reset_peak();
        ct_memory_stats(&before);
        CHECK_STATUS(ct_gpt_checkpoint_config(f, &got), CT_EFORMAT);
        CHECK(strstr(ct_last_error(), "'tok_embeddings.weight' has shape [2, 2], not the "
                                      "configuration's [1048576, 1024]"));
        CHECK_STATUS(ct_gpt_checkpoint_check(f, true, &got), CT_EFORMAT);
        ct_memory_stats(&after);
        CHECK(after.peak_bytes - before.current_bytes < 256 * 1024); /* the name table only */
        ct_tensor_file_close(f);
        CHECK_STATUS(ct_trainer_load(r, bad), CT_EFORMAT);
    }
    /* a missing moment: fine for the model alone, not for resuming */
    resave(path, bad, NULL, NULL, "optimizer.exp_avg_sq.norm.weight", NULL);
    CHECK_OK(ct_load(bad, NULL, &f));
    CHECK_OK(ct_gpt_checkpoint_check(f, false, &got));
    CHECK_STATUS(ct_gpt_checkpoint_check(f, true, &got), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "'optimizer.exp_avg_sq.norm.weight' is missing"));
    ct_tensor_file_close(f);
    CHECK_STATUS(ct_trainer_load(r, bad), CT_EFORMAT);
    /* a parameter stored as integers is not a parameter */
    resave(path, bad, NULL, NULL, NULL, "layers.1.attention.wk.weight");
    CHECK_OK(ct_load(bad, NULL, &f));
    CHECK_STATUS(ct_gpt_checkpoint_config(f, &got), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "'layers.1.attention.wk.weight' has dtype I32"));
    ct_tensor_file_close(f);
    /* trainer state that passed before: a step past int64 (was clamped), an all-zero random
     * state, accum 2^40 (the CLI caps 2^20), a negative step */
    static const char *cases[][2] = {
        {"step", "9223372036854775808"},
        {"step", "-1"},
        {"epoch", "99999999999999999999"},
        {"rng", "0000000000000000000000000000000000000000000000000000000000000000"},
        {"rng", "0000000000000000000000000000000000000000000000000000000000000g01"},
        {"train", "{\"accum\": 1099511627776}"},
        {"train", "{\"batch\": 0}"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        resave(path, bad, cases[i][0], cases[i][1], NULL, NULL);
        CHECK_OK(ct_load(bad, NULL, &f));
        CHECK_OK(ct_gpt_checkpoint_check(f, false, &got));
        CHECK_STATUS(ct_gpt_checkpoint_check(f, true, &got), CT_EFORMAT);
        if (!strstr(ct_last_error(), cases[i][0])) {
            CHECK(!"the message names the field");
            fprintf(stderr, "  %s=%s: %s\n", cases[i][0], cases[i][1], ct_last_error());
        }
        ct_tensor_file_close(f);
        CHECK_STATUS(ct_trainer_load(r, bad), CT_EFORMAT);
    }
    /* the library caps accum as the CLI does */
    ct_train_options o2 = o;
    o2.accum = CT_TRAIN_MAX_ACCUM + 1;
    ct_trainer *w = NULL;
    CHECK_STATUS(ct_trainer_create(&c, &o2, tr, 100, NULL, 0, &w), CT_EINVAL);
    CHECK(strstr(ct_last_error(), "accum"));
    o2.accum = 1;
    o2.batch = CT_TRAIN_MAX_BATCH + 1;
    CHECK_STATUS(ct_trainer_create(&c, &o2, tr, 100, NULL, 0, &w), CT_EINVAL);
    /* the good checkpoint still resumes */
    CHECK_OK(ct_trainer_load(r, path));
    CHECK(ct_trainer_step_count(r) == 1);
    remove(path);
    remove(bad);
    ct_trainer_free(t);
    ct_trainer_free(r);
    free(tr);
}


/* ct_gpt_load_state_dict: a state dict under Hugging Face names with a "model." prefix (gate
 * and up as separate tensors, bf16, an ignored inv_freq buffer, tensors outside the prefix)
 * and under ctorch names load the same weights as the source (bf16: its rounding); a missing,
 * a foreign and a mismatched tensor are refused by name. */
static void test_state_dict(void)
{
    ct_gpt_config c = tiny_config();
    c.window = 0;
    c.tied = false;
    c.qkv_bias = true;
    ct_gpt *a, *b;
    CHECK_OK(ct_gpt_create(&c, NULL, &a));
    CHECK_OK(ct_gpt_create(&c, NULL, &b));
    CHECK_OK(ct_gpt_init(a, 3));
    int nt = ct_gpt_num_tensors(a), n = 0;
    ct_tensor ts[64];
    char names[64][128];
    const char *np[64];
    for (int i = 0; i < nt; i++) { /* HF names, bf16, w_gate_up split in two */
        const char *ct;
        ct_tensor p;
        int parts;
        CHECK_OK(ct_gpt_tensor(a, i, &ct, &p, NULL));
        CHECK_OK(ct_hf_tensor_name(ct, 0, names[n], 100, &parts));
        for (int k = 0; k < parts; k++) {
            char hfn[100];
            CHECK_OK(ct_hf_tensor_name(ct, k, hfn, sizeof hfn, NULL));
            snprintf(names[n], sizeof names[n], "model.%s", hfn);
            ct_tensor half = p;
            if (parts > 1) CHECK_OK(ct_tensor_slice(&p, 0, k * p.shape[0] / 2, (k + 1) * p.shape[0] / 2, 1, &half));
            CHECK_OK(ct_tensor_cast(&half, CT_DTYPE_BF16, &ts[n]));
            np[n] = names[n];
            n++;
        }
    }
    int ncast = n;
    float inv[2] = {1, 2};
    ct_tensor extra[2];
    CHECK_OK(ct_tensor_wrap(&extra[0], inv, CT_DTYPE_F32, 1, (int64_t[]){2}, NULL));
    CHECK_OK(ct_tensor_wrap(&extra[1], inv, CT_DTYPE_F32, 1, (int64_t[]){2}, NULL));
    ts[n] = extra[0];
    np[n++] = "model.model.layers.0.self_attn.rotary_emb.inv_freq";
    ts[n] = extra[1];
    np[n++] = "optim.step"; /* outside the prefix: not looked at */
    char path[64];
    snprintf(path, sizeof path, "/tmp/ct_test_sd_%d.safetensors", (int)getpid());
    CHECK_OK(ct_save_safetensors(path, ts, np, (size_t)n, NULL, NULL, 0, NULL));
    ct_tensor_file *f;
    CHECK_OK(ct_load(path, NULL, &f));
    CHECK_OK(ct_gpt_load_state_dict(b, f));
    ct_tensor_file_close(f);
    const float *pa = ct_gpt_params(a), *pb = ct_gpt_params(b);
    int64_t bad = 0;
    for (int64_t j = 0; j < ct_gpt_num_params(a); j++) /* the naive reference: round each */
        bad += ct_bf16_to_f32(ct_f32_to_bf16(pa[j])) != pb[j];
    CHECK(bad == 0);
    /* a foreign tensor under the prefix, then a missing one */
    ts[n - 1] = extra[1];
    np[n - 1] = "model.model.layers.0.mlp.frob.weight";
    CHECK_OK(ct_save_safetensors(path, ts, np, (size_t)n, NULL, NULL, 0, NULL));
    CHECK_OK(ct_load(path, NULL, &f));
    CHECK_STATUS(ct_gpt_load_state_dict(b, f), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "model.model.layers.0.mlp.frob.weight") != NULL);
    ct_tensor_file_close(f);
    CHECK_OK(ct_save_safetensors(path, ts + 1, np + 1, (size_t)n - 2, NULL, NULL, 0, NULL));
    CHECK_OK(ct_load(path, NULL, &f));
    CHECK_STATUS(ct_gpt_load_state_dict(b, f), CT_EFORMAT);
    CHECK(strstr(ct_last_error(), "model.model.embed_tokens.weight") != NULL ||
          strstr(ct_last_error(), "tok_embeddings") != NULL);
    ct_tensor_file_close(f);
    for (int i = 0; i < ncast; i++)
        ct_tensor_free(&ts[i]);
    /* ctorch names, no prefix, f32: the same bits; a wrong shape is named */
    for (int i = 0; i < nt; i++) {
        const char *ct;
        CHECK_OK(ct_gpt_tensor(a, i, &ct, &ts[i], NULL));
        np[i] = ct;
    }
    CHECK_OK(ct_save_safetensors(path, ts, np, (size_t)nt, NULL, NULL, 0, NULL));
    CHECK_OK(ct_load(path, NULL, &f));
    CHECK_OK(ct_gpt_load_state_dict(b, f));
    CHECK(memcmp(pa, ct_gpt_params(b), (size_t)ct_gpt_num_params(a) * sizeof(float)) == 0);
    ct_tensor_file_close(f);
    ts[nt - 1] = extra[0];
    CHECK_OK(ct_save_safetensors(path, ts, np, (size_t)nt, NULL, NULL, 0, NULL));
    CHECK_OK(ct_load(path, NULL, &f));
    CHECK_STATUS(ct_gpt_load_state_dict(b, f), CT_EFORMAT); /* checked before any weight is read */
    CHECK(strstr(ct_last_error(), np[nt - 1]) != NULL);
    ct_tensor_file_close(f);
    CHECK_STATUS(ct_gpt_load_state_dict(NULL, f), CT_EINVAL);
    unlink(path);
    ct_gpt_free(a);
    ct_gpt_free(b);
}

/* The fused head's budget on the CPU: with lce_scratch_bytes 0 the model takes blocks of 512
 * token rows where 64 MiB holds fewer (V 40000: 64 MiB holds 419 rows; 512 rows' logits are
 * 78 MiB); an explicit budget is kept. The peak above the warm model is the loss's scratch. */
static void test_head_budget(void)
{
    ct_gpt_config c = tiny_config();
    c.vocab_size = 40000;
    c.context = 64;
    c.n_layer = 1;
    c.d_model = 8;
    c.n_head = 2;
    c.n_kv_head = 1;
    c.d_ff = 8;
    c.window = 0;
    int64_t B = 8, T = 64, rows = B * T, V = c.vocab_size;
    int32_t *tok = malloc(sizeof(int32_t) * (size_t)(B * (T + 1)));
    for (int64_t i = 0; i < B * (T + 1); i++) tok[i] = (int32_t)((i * 7919) % V);
    float l[2];
    for (int k = 0; k < 2; k++) {
        ct_gpt_options o = ct_gpt_options_default();
        o.batch = B;
        if (k) o.lce_scratch_bytes = CT_DEFAULT_SCRATCH_BYTES;
        ct_gpt *m;
        CHECK_OK(ct_gpt_create(&c, &o, &m));
        CHECK_OK(ct_gpt_init(m, 3));
        CHECK_OK(ct_gpt_forward_backward(m, tok, B, T, 1.0f, NULL)); /* activations allocated */
        ct_memory_stats_t a, b;
        ct_memory_stats(&a);
        ct_memory_reset_peak();
        CHECK_OK(ct_gpt_forward_backward(m, tok, B, T, 1.0f, &l[k]));
        ct_memory_stats(&b);
        size_t above = b.peak_bytes - a.current_bytes;
        if (k) CHECK(above <= CT_DEFAULT_SCRATCH_BYTES);
        else CHECK(above >= (size_t)(rows * V) * sizeof(float) &&
                   above <= ct_lce_scratch_bytes_for_rows(rows, c.d_model, V, CT_DTYPE_F32));
        ct_gpt_free(m);
    }
    CHECK(fabsf(l[0] - l[1]) <= 1e-5f * fabsf(l[1])); /* the same loss, other blocks */
    free(tok);
}

int main(void)
{
    test_gradients(true, false, true, 0);
    test_gradients(false, true, false, 0);
    test_gradients(true, false, false, 1);
    test_gradients(false, true, true, 2);
    test_config_json();
    test_rope_freqs();
    test_threads();
    test_bf16();
    test_resume();
    test_checkpoint_validation();
    test_bad_input();
    test_next_logits();
    test_logits();
    test_state_dict();
    test_head_budget();
    return t_report("test_model_gpt");
}
