/* A model from a PyTorch state dict (torch.save, read by ct_load's allow-list unpickler) or
 * any tensor file without ctorch's checkpoint "format": its configuration from the file's
 * "config" entry (torch.save({"config": ..., "model": state_dict})) or a config.json beside
 * it, its tensors under ctorch's or Hugging Face's names (one prefix for all, such as "model."
 * of {"model": state_dict}). Shared by `ctorch generate --model FILE.pt` and `ctorch convert`. */
#include "cli.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PT_CONFIG_MAX ((size_t)1 << 20)

/* Parse config text: a Hugging Face config.json (it has "architectures" or "model_type") by
 * ct_hf_config_parse, anything else as a ctorch configuration. */
static ct_status parse_config(const char *text, const char *what, ct_gpt_config *cfg,
                              ct_hf_info *info, bool *hf)
{
    json_error_t je;
    json_t *j = json_loads(text, 0, &je);
    if (!json_is_object(j)) {
        json_decref(j);
        fprintf(stderr, "ctorch: %s: the configuration is not a JSON object\n", what);
        return CT_EFORMAT;
    }
    *hf = json_object_get(j, "architectures") || json_object_get(j, "model_type");
    json_decref(j);
    memset(info, 0, sizeof *info);
    info->bos_token = info->eos_token = -1;
    info->dtype = CT_DTYPE_F32;
    if (*hf) return ct_hf_config_parse(text, strlen(text), cfg, info);
    *cfg = ct_gpt_config_default();
    return ct_gpt_config_from_json(text, cfg);
}

int cli_pt_model_config(const char *path, const ct_tensor_file *f, ct_gpt_config *cfg,
                        ct_hf_info *info, char **config_text)
{
    if (config_text) *config_text = NULL;
    const char *meta = ct_tensor_file_metadata_get(f, "config");
    char *text = NULL, *beside = NULL;
    if (meta) {
        text = strdup(meta);
    } else {
        const char *sl = strrchr(path, '/');
        size_t dl = sl ? (size_t)(sl - path) : 1;
        beside = malloc(dl + sizeof "/config.json");
        if (!beside) return cli_fail("model", CT_ENOMEM);
        snprintf(beside, dl + sizeof "/config.json", "%.*s/config.json", (int)dl, sl ? path : ".");
        FILE *cf = fopen(beside, "rb");
        if (!cf) {
            fprintf(stderr,
                    "ctorch: '%s' carries no model configuration: save it in the file "
                    "(torch.save({\"config\": config, \"model\": state_dict})) or put config.json "
                    "beside it\n",
                    path);
            free(beside);
            return 1;
        }
        text = malloc(PT_CONFIG_MAX + 1);
        size_t n = text ? fread(text, 1, PT_CONFIG_MAX + 1, cf) : 0;
        fclose(cf);
        if (!text || n > PT_CONFIG_MAX) {
            fprintf(stderr, "ctorch: %s: %s\n", beside, text ? "larger than 1 MiB" : "out of memory");
            free(text);
            free(beside);
            return 1;
        }
        text[n] = '\0';
    }
    if (!text) return cli_fail("model", CT_ENOMEM);
    bool hf;
    ct_status s = parse_config(text, beside ? beside : path, cfg, info, &hf);
    if (!s && !hf) s = ct_gpt_config_check(cfg);
    int rc = 0;
    if (s) {
        fprintf(stderr, "ctorch: the configuration of '%s' (%s): %s: %s\n", path,
                beside ? beside : "its \"config\" entry", ct_status_name(s), ct_last_error());
        rc = 1;
    }
    if (!rc && config_text && hf) {
        *config_text = text;
        text = NULL;
    }
    free(text);
    free(beside);
    return rc;
}

/* The prefix and naming of the state dict: the first tensor named [prefix]tok_embeddings.weight
 * (ctorch's names) or [prefix]model.embed_tokens.weight (Hugging Face's). */
static int find_prefix(const ct_tensor_file *f, const char *path, char *prefix, size_t n, bool *hf)
{
    static const char *sfx[2] = {"tok_embeddings.weight", "model.embed_tokens.weight"};
    size_t nt = ct_tensor_file_count(f);
    for (size_t i = 0; i < nt; i++) {
        ct_tensor_info inf;
        if (ct_tensor_file_info(f, i, &inf) != CT_OK) continue;
        size_t l = strlen(inf.name);
        for (int k = 0; k < 2; k++) {
            size_t m = strlen(sfx[k]);
            if (l >= m && !strcmp(inf.name + l - m, sfx[k]) &&
                (l == m || inf.name[l - m - 1] == '.') && l - m < n) {
                memcpy(prefix, inf.name, l - m);
                prefix[l - m] = '\0';
                *hf = k == 1;
                return 0;
            }
        }
    }
    fprintf(stderr,
            "ctorch: '%s' holds no tok_embeddings.weight or model.embed_tokens.weight: not a "
            "Llama-family state dict\n",
            path);
    return 1;
}

static bool starts_with(const char *s, const char *p)
{
    return strncmp(s, p, strlen(p)) == 0;
}

static bool ends_with(const char *s, const char *p)
{
    size_t n = strlen(s), m = strlen(p);
    return n >= m && !strcmp(s + n - m, p);
}

int cli_pt_model_load(const char *path, const ct_tensor_file *f, ct_gpt *m)
{
    char prefix[512], name[768];
    bool hf;
    if (find_prefix(f, path, prefix, sizeof prefix, &hf)) return 1;
    size_t nt = ct_tensor_file_count(f);
    bool *used = calloc(nt ? nt : 1, sizeof *used);
    if (!used) return cli_fail("model", CT_ENOMEM);
    int rc = 0;
    ct_status s = CT_OK;
    for (int i = 0; i < ct_gpt_num_tensors(m) && !rc; i++) {
        const char *ct;
        ct_tensor p;
        if ((s = ct_gpt_tensor(m, i, &ct, &p, NULL))) break;
        int parts = 1;
        if (hf && (s = ct_hf_tensor_name(ct, 0, name, sizeof name, &parts))) break;
        for (int k = 0; k < parts && !rc; k++) {
            char hfname[256];
            const char *base = ct;
            if (hf) {
                if ((s = ct_hf_tensor_name(ct, k, hfname, sizeof hfname, NULL))) break;
                base = hfname;
            }
            snprintf(name, sizeof name, "%s%s", prefix, base);
            size_t idx;
            if (ct_tensor_file_find(f, name, &idx) != CT_OK) {
                fprintf(stderr, "ctorch: '%s' has no tensor '%s'\n", path, name);
                rc = 1;
                break;
            }
            ct_tensor dst = p;
            if (parts > 1) {
                int64_t rows = p.shape[0] / parts;
                if ((s = ct_tensor_slice(&p, 0, k * rows, (k + 1) * rows, 1, &dst))) break;
            }
            if ((s = ct_tensor_file_read_into(f, idx, &dst))) {
                fprintf(stderr, "ctorch: '%s': tensor '%s': %s\n", path, name, ct_last_error());
                rc = 1;
                break;
            }
            used[idx] = true;
        }
    }
    if (s && !rc) rc = cli_fail("model", s);
    const ct_gpt_config *cfg = ct_gpt_get_config(m);
    for (size_t i = 0; i < nt && !rc; i++) {
        ct_tensor_info inf;
        if (used[i] || ct_tensor_file_info(f, i, &inf) != CT_OK || !starts_with(inf.name, prefix))
            continue;
        const char *rest = inf.name + strlen(prefix);
        if (hf && ends_with(rest, ".self_attn.rotary_emb.inv_freq")) continue; /* derived */
        if (!hf && (starts_with(rest, "optimizer.") || starts_with(rest, "grad."))) continue;
        if (hf && cfg->tied && !strcmp(rest, "lm_head.weight")) { /* must equal the embedding */
            ct_tensor e, h;
            bool same = false;
            if (ct_gpt_tensor(m, 0, NULL, &e, NULL) == CT_OK &&
                ct_tensor_file_read(f, i, CT_DTYPE_F32, &h) == CT_OK) {
                same = ct_tensor_numel(&h) == ct_tensor_numel(&e) &&
                       !memcmp(h.data, e.data, (size_t)ct_tensor_numel(&e) * sizeof(float));
                ct_tensor_free(&h);
            }
            if (same) continue;
            fprintf(stderr, "ctorch: '%s': '%s' of a tied model differs from the embedding\n",
                    path, inf.name);
            rc = 1;
            break;
        }
        fprintf(stderr, "ctorch: '%s': tensor '%s' is not a tensor of this model\n", path,
                inf.name);
        rc = 1;
    }
    free(used);
    return rc;
}
