/* A PyTorch state dict (or any tensor file) into a model's own parameters
 * (ct_gpt_load_state_dict, include/ctorch/model.h): ctorch or Hugging Face names under one
 * prefix, converted to f32, anything else under the prefix refused by name. */
#include "model/gpt_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool starts_with(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

static bool ends_with(const char *s, const char *p)
{
    size_t n = strlen(s), m = strlen(p);
    return n >= m && !strcmp(s + n - m, p);
}

#define SD_PREFIX_MAX 512

/* The prefix and naming: the first tensor named [prefix]tok_embeddings.weight (ctorch's
 * names) or [prefix]model.embed_tokens.weight (Hugging Face's), prefix empty or ending in '.'. */
static ct_status find_prefix(const ct_tensor_file *f, char *prefix, bool *hf)
{
    static const char *sfx[2] = {"tok_embeddings.weight", "model.embed_tokens.weight"};
    size_t nt = ct_tensor_file_count(f);
    for (size_t i = 0; i < nt; i++) {
        ct_tensor_info inf;
        CT_TRY(ct_tensor_file_info(f, i, &inf));
        size_t l = strlen(inf.name);
        for (int k = 0; k < 2; k++) {
            size_t m = strlen(sfx[k]);
            if (l >= m && !strcmp(inf.name + l - m, sfx[k]) &&
                (l == m || inf.name[l - m - 1] == '.') && l - m < SD_PREFIX_MAX) {
                memcpy(prefix, inf.name, l - m);
                prefix[l - m] = '\0';
                *hf = k == 1;
                return CT_OK;
            }
        }
    }
    return ct_error(CT_EFORMAT,
                    "ct_gpt_load_state_dict: no tensor is named tok_embeddings.weight or "
                    "model.embed_tokens.weight (under any prefix): not a Llama-family state dict");
}

static bool float_dtype(const ct_tensor_info *inf)
{
    ct_dtype dt = inf->dtype;
    return inf->has_dtype && (dt == CT_DTYPE_F32 || dt == CT_DTYPE_F64 || dt == CT_DTYPE_F16 ||
                              dt == CT_DTYPE_BF16 || dt == CT_DTYPE_F8_E4M3 ||
                              dt == CT_DTYPE_F8_E5M2);
}

static void shape_text(char *buf, size_t cap, int ndim, const int64_t *shape)
{
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", d ? ", " : "", (long long)shape[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* Tensor idx of the file (named name) has shape `want` (ndim 1 or 2) and a float dtype. */
static ct_status check_one(const char *fn, const ct_tensor_file *f, size_t idx, const char *name,
                           int ndim, const int64_t *want)
{
    ct_tensor_info inf;
    CT_TRY(ct_tensor_file_info(f, idx, &inf));
    if (!float_dtype(&inf))
        return ct_error(CT_EFORMAT,
                        "%s: tensor '%s' has dtype %s; parameters need a floating-point one "
                        "(F32, F64, F16, BF16, F8)",
                        fn, name, ct_st_dtype_name(inf.st_dtype));
    bool same = inf.ndim == ndim;
    for (int d = 0; same && d < ndim; d++)
        same = inf.shape[d] == want[d];
    if (same) return CT_OK;
    char w[64], got[160];
    shape_text(w, sizeof w, ndim, want);
    shape_text(got, sizeof got, inf.ndim > 8 ? 8 : inf.ndim, inf.shape);
    return ct_error(CT_EFORMAT, "%s: tensor '%s' has shape %s%s, not the configuration's %s", fn,
                    name, got, inf.ndim > 8 ? " (first 8 dims)" : "", w);
}

/* Every check of the load that needs no weights, before anything the model's size exists:
 * each of the configuration's tensors present (under the prefix, ctorch's or HF's names) with
 * its shape and a float dtype, nothing foreign under the prefix, a tied model's lm_head of the
 * embedding's shape and dtype class. used (nt entries) receives which tensors the model takes. */
static ct_status check_all(const char *fn, const ct_tensor_file *f, const ct_gpt_config *cfg,
                           const char *prefix, bool hf, bool *used)
{
    char name[SD_PREFIX_MAX + 256], part[256];
    gpt_tensor *tab;
    int n;
    CT_TRY(gpt_tensor_table(cfg, &tab, &n));
    ct_status s = CT_OK;
    for (int i = 0; i < n && !s; i++) {
        const gpt_tensor *t = &tab[i];
        int parts = 1;
        if (hf && (s = ct_hf_tensor_name(t->name, 0, part, sizeof part, &parts))) break;
        for (int k = 0; k < parts && !s; k++) {
            if (hf && (s = ct_hf_tensor_name(t->name, k, part, sizeof part, NULL))) break;
            snprintf(name, sizeof name, "%s%s", prefix, hf ? part : t->name);
            size_t idx;
            if (ct_tensor_file_find(f, name, &idx) != CT_OK) {
                s = ct_error(CT_EFORMAT, "%s: the state dict has no tensor '%s'", fn, name);
                break;
            }
            int64_t want[2] = {t->shape[0] / parts, t->ndim > 1 ? t->shape[1] : 0};
            s = check_one(fn, f, idx, name, t->ndim, want);
            used[idx] = true;
        }
    }
    size_t nt = ct_tensor_file_count(f);
    for (size_t i = 0; i < nt && !s; i++) {
        ct_tensor_info inf;
        if (used[i]) continue;
        if ((s = ct_tensor_file_info(f, i, &inf))) break;
        if (!starts_with(inf.name, prefix)) continue;
        const char *rest = inf.name + strlen(prefix);
        if (hf && ends_with(rest, ".self_attn.rotary_emb.inv_freq")) continue; /* derived */
        if (!hf && (starts_with(rest, "optimizer.") || starts_with(rest, "grad."))) continue;
        if (hf && cfg->tied && !strcmp(rest, "lm_head.weight")) { /* must equal the embedding */
            s = check_one(fn, f, i, inf.name, tab[0].ndim, tab[0].shape);
            continue;
        }
        s = ct_error(CT_EFORMAT, "%s: tensor '%s' is not a tensor of this model", fn, inf.name);
    }
    ct_free(tab);
    return s;
}

ct_status ct_gpt_state_dict_check(const ct_tensor_file *f, const ct_gpt_config *cfg)
{
    const char *fn = "ct_gpt_state_dict_check";
    if (!f || !cfg) return ct_error(CT_EINVAL, "%s: f and cfg must not be NULL", fn);
    char prefix[SD_PREFIX_MAX];
    bool hf = false;
    CT_TRY(find_prefix(f, prefix, &hf));
    size_t nt = ct_tensor_file_count(f);
    bool *used = NULL;
    CT_TRY(ct_calloc((void **)&used, (nt ? nt : 1) * sizeof *used));
    ct_status s = check_all(fn, f, cfg, prefix, hf, used);
    ct_free(used);
    return s;
}

ct_status ct_gpt_load_state_dict(ct_gpt *m, const ct_tensor_file *f)
{
    const char *fn = "ct_gpt_load_state_dict";
    if (!m || !f) return ct_error(CT_EINVAL, "%s: m and f must not be NULL", fn);
    char prefix[SD_PREFIX_MAX], name[SD_PREFIX_MAX + 256], part[256];
    bool hf = false;
    CT_TRY(find_prefix(f, prefix, &hf));
    size_t nt = ct_tensor_file_count(f);
    bool *used = NULL;
    CT_TRY(ct_calloc((void **)&used, (nt ? nt : 1) * sizeof *used));
    /* names, shapes and dtypes first: a file that does not fit leaves the weights untouched */
    ct_status s = check_all(fn, f, &m->cfg, prefix, hf, used);
    for (int i = 0; i < ct_gpt_num_tensors(m) && !s; i++) {
        const char *ct;
        ct_tensor p;
        if ((s = ct_gpt_tensor(m, i, &ct, &p, NULL))) break;
        int parts = 1;
        if (hf && (s = ct_hf_tensor_name(ct, 0, part, sizeof part, &parts))) break;
        for (int k = 0; k < parts && !s; k++) {
            if (hf && (s = ct_hf_tensor_name(ct, k, part, sizeof part, NULL))) break;
            snprintf(name, sizeof name, "%s%s", prefix, hf ? part : ct);
            size_t idx;
            if ((s = ct_tensor_file_find(f, name, &idx))) break; /* found by check_all */
            ct_tensor dst = p;
            if (parts > 1) {
                int64_t rows = p.shape[0] / parts;
                if ((s = ct_tensor_slice(&p, 0, k * rows, (k + 1) * rows, 1, &dst))) break;
            }
            if ((s = ct_tensor_file_read_into(f, idx, &dst))) {
                s = ct_error_wrap(s, "%s: tensor '%s'", fn, name);
                break;
            }
        }
    }
    /* the one check that needs the weights: a tied model's lm_head equals the embedding */
    for (size_t i = 0; i < nt && !s && hf && m->cfg.tied; i++) {
        ct_tensor_info inf;
        if (used[i]) continue;
        if ((s = ct_tensor_file_info(f, i, &inf))) break;
        if (!starts_with(inf.name, prefix) || strcmp(inf.name + strlen(prefix), "lm_head.weight"))
            continue;
        ct_tensor e, h;
        bool same = false;
        if ((s = ct_gpt_tensor(m, 0, NULL, &e, NULL))) break;
        if (ct_tensor_file_read(f, i, CT_DTYPE_F32, &h) == CT_OK) {
            same = ct_tensor_numel(&h) == ct_tensor_numel(&e) &&
                   !memcmp(h.data, e.data, (size_t)ct_tensor_numel(&e) * sizeof(float));
            ct_tensor_free(&h);
        }
        if (!same)
            s = ct_error(CT_EFORMAT, "%s: '%s' of a tied model differs from the embedding", fn,
                         inf.name);
    }
    ct_free(used);
    return s;
}
