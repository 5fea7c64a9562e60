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
    ct_status s = CT_OK;
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
            if (ct_tensor_file_find(f, name, &idx) != CT_OK) {
                s = ct_error(CT_EFORMAT, "%s: the state dict has no tensor '%s'", fn, name);
                break;
            }
            ct_tensor dst = p;
            if (parts > 1) {
                int64_t rows = p.shape[0] / parts;
                if ((s = ct_tensor_slice(&p, 0, k * rows, (k + 1) * rows, 1, &dst))) break;
            }
            if ((s = ct_tensor_file_read_into(f, idx, &dst))) {
                s = ct_error_wrap(s, "%s: tensor '%s'", fn, name);
                break;
            }
            used[idx] = true;
        }
    }
    bool tied = m->cfg.tied;
    for (size_t i = 0; i < nt && !s; i++) {
        ct_tensor_info inf;
        if (used[i]) continue;
        if ((s = ct_tensor_file_info(f, i, &inf))) break;
        if (!starts_with(inf.name, prefix)) continue;
        const char *rest = inf.name + strlen(prefix);
        if (hf && ends_with(rest, ".self_attn.rotary_emb.inv_freq")) continue; /* derived */
        if (!hf && (starts_with(rest, "optimizer.") || starts_with(rest, "grad."))) continue;
        if (hf && tied && !strcmp(rest, "lm_head.weight")) { /* must equal the embedding */
            ct_tensor e, h;
            bool same = false;
            if ((s = ct_gpt_tensor(m, 0, NULL, &e, NULL))) break;
            if (ct_tensor_file_read(f, i, CT_DTYPE_F32, &h) == CT_OK) {
                same = ct_tensor_numel(&h) == ct_tensor_numel(&e) &&
                       !memcmp(h.data, e.data, (size_t)ct_tensor_numel(&e) * sizeof(float));
                ct_tensor_free(&h);
            }
            if (same) continue;
            s = ct_error(CT_EFORMAT, "%s: '%s' of a tied model differs from the embedding", fn,
                         inf.name);
            break;
        }
        s = ct_error(CT_EFORMAT, "%s: tensor '%s' is not a tensor of this model", fn, inf.name);
    }
    ct_free(used);
    return s;
}
