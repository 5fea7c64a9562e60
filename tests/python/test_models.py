"""ctorch's model with the Hugging Face Llama-family features (head_dim != d_model / n_head,
Qwen2's q/k/v biases, Llama's attention_bias, llama3 and linear rope_scaling, GQA, tied and
untied heads, Mistral) against transformers 5.25's LlamaForCausalLM / Qwen2ForCausalLM /
MistralForCausalLM holding the same weights (hf_reference.py): logits and every gradient of
transformers' own loss within 1e-4; directories written by save_pretrained load in ctorch, and
the directories ctorch writes load in transformers with the same logits."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_reference as ref  # noqa: E402

from ctorch import models  # noqa: E402

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}

CONFIGS = {
    "llama": ref.llama_config(),
    "llama-llama3-rope": ref.llama_config(rope_scaling=LLAMA3, rope_theta=500000.0, head_dim=16),
    "llama-linear-rope-bias": ref.llama_config(rope_scaling={"type": "linear", "factor": 2.0},
                                               attention_bias=True, tie_word_embeddings=True),
    "llama-mha-headdim": ref.llama_config(num_key_value_heads=4, head_dim=12),
    "qwen2": ref.qwen2_config(),
    "mistral": ref.mistral_config(),
}


def rel_close(ours, want, tol=1e-4):
    scale = want.abs().max().item()
    assert scale > 0
    err = (ours - want).abs().max().item()
    return err <= tol * scale, err / scale


def tokens(cfg, B, T, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg["vocab_size"], (B, T), generator=g)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_gradients_match_reference(name):
    cfg = CONFIGS[name]
    w = ref.random_weights(cfg, seed=3)
    hm = ref.hf_model(cfg, w)
    m = models.Model(ref.ctorch_config(cfg))
    m.set_weights(ref.to_ctorch(cfg, w))
    # logits: [B, T] -> [B, T, V]; the llama3 frequencies fall in all three regions
    ids = tokens(cfg, 3, 24, 1)
    want = ref.logits(hm, ids)
    got = m.forward(ids)
    assert got.shape == want.shape and got.dtype == torch.float32
    ok, err = rel_close(got, want)
    assert ok, f"logits: relative error {err:.2e}"
    # every gradient of the mean next-token loss (transformers' own loss)
    tok = tokens(cfg, 2, 21, 2)
    loss = ref.loss(hm, tok)
    loss.backward()
    ours_loss, grads = m.loss_and_grads(tok)
    assert abs(ours_loss - loss.item()) <= 1e-5 * abs(loss.item())
    hg = ref.grads_to_hf(cfg, grads)
    want_g = ref.grads(hm)
    assert set(hg) == set(want_g) == set(w)
    for k, g in want_g.items():
        ok, err = rel_close(hg[k], g)
        assert ok, f"{k}: relative error {err:.2e}"


def test_scaling_changes_the_logits():
    """The oracle can fail: without the llama3 scaling the logits differ beyond tolerance."""
    cfg = CONFIGS["llama-llama3-rope"]
    w = ref.random_weights(cfg, seed=3)
    plain = dict(cfg, rope_scaling=None)
    m = models.Model(ref.ctorch_config(plain))
    m.set_weights(ref.to_ctorch(plain, w))
    ids = tokens(cfg, 1, 24, 1)
    ok, _ = rel_close(m.forward(ids), ref.logits(ref.hf_model(cfg, w), ids))
    assert not ok


def test_bad_input():
    cfg = CONFIGS["qwen2"]
    m = models.Model(ref.ctorch_config(cfg))
    with pytest.raises(Exception, match="outside the vocabulary"):
        m.forward(torch.tensor([[0, cfg["vocab_size"]]]))
    with pytest.raises(ValueError, match="context"):
        m.forward(torch.zeros(1, cfg["max_position_embeddings"] + 1, dtype=torch.int64))
    with pytest.raises(Exception, match="head_dim"):
        models.Model(dict(ref.ctorch_config(cfg), head_dim=7))
    with pytest.raises(Exception, match="rope_scaling"):
        models.Model(dict(ref.ctorch_config(cfg), rope_scaling="yarn"))


# ---- Hugging Face directories -------------------------------------------------------------

def rounded(w, dtype):
    """The weights as the file holds them (bf16 / f16 rounding), back in f32."""
    return {k: v.detach().to(dtype).to(torch.float32) for k, v in w.items()}


@pytest.mark.parametrize("name,dtype,shards", [
    ("llama", torch.float32, 1), ("llama-llama3-rope", torch.bfloat16, 3),
    ("llama-linear-rope-bias", torch.float16, 1), ("qwen2", torch.float32, 2),
    ("qwen2", torch.bfloat16, 1), ("mistral", torch.float32, 2)])
def test_hf_directory_logits_and_gradients(tmp_path, name, dtype, shards):
    """save_pretrained directories (transformers 5.25's config.json and shards) against
    from_pretrained of the same directory in f32 (the stored weights widened)."""
    cfg = CONFIGS[name]
    w = ref.random_weights(cfg, seed=5)
    ref.save_hf(tmp_path, cfg, w, dtype=dtype, shards=shards)
    hm = ref.load(tmp_path)
    ids = tokens(cfg, 2, 19, 4)
    want = ref.logits(hm, ids)
    mapped = models.load(tmp_path)                # weights read in place, in their dtype
    copied = models.load(tmp_path, mmap=False)    # own f32 buffers, trainable
    # f32: every tensor in place; bf16 / f16: the matrices (norms and biases converted)
    matrices = sum(1 for v in w.values() if v.dim() == 2)
    assert mapped.mapped_tensors == (len(w) if dtype == torch.float32 else matrices)
    a, b = mapped.forward(ids), copied.forward(ids)
    if dtype == torch.float32:
        assert torch.equal(a, b)                  # the same bits either way
    else:                                         # half weights: GEMMs in panels of rows
        assert rel_close(a, b, 1e-5)[0]
    ok, err = rel_close(a, want)
    assert ok, f"logits: relative error {err:.2e}"
    tok = tokens(cfg, 2, 17, 6)
    loss = ref.loss(hm, tok)
    loss.backward()
    ours, grads = copied.loss_and_grads(tok)
    assert abs(ours - loss.item()) <= 1e-5 * loss.item()
    hg = ref.grads_to_hf(cfg, grads)
    for k, g in ref.grads(hm).items():
        ok, err = rel_close(hg[k], g)
        assert ok, f"{k}: relative error {err:.2e}"
    with pytest.raises(Exception, match="mapped"):
        mapped.loss_and_grads(tok)


def read_dir(d, prefix="model"):
    """{tensor name: (dtype, shape, raw bytes)} of the model*.safetensors files, and the files."""
    import json
    import struct
    out, files = {}, {}
    for fn in sorted(os.listdir(d)):
        if not fn.endswith(".safetensors") or not fn.startswith(prefix):
            continue
        data = open(os.path.join(d, fn), "rb").read()
        (n,) = struct.unpack("<Q", data[:8])
        h = json.loads(data[8:8 + n])
        h.pop("__metadata__", None)
        for k, e in h.items():
            b, end = e["data_offsets"]
            out[k] = (e["dtype"], e["shape"], data[8 + n + b:8 + n + end])
            files[k] = fn
    return out, files


@pytest.mark.parametrize("name,dtype,shards", [("llama-llama3-rope", torch.float32, 1),
                                              ("llama-llama3-rope", torch.bfloat16, 3),
                                              ("qwen2", torch.float16, 2), ("mistral", torch.bfloat16, 2)])
def test_hf_save_round_trip_is_bitwise(tmp_path, name, dtype, shards):
    """save_pretrained -> ctorch load -> ctorch save: the same bytes, shards, index and
    config.json; the saved directory loads in transformers with the same logits."""
    import json
    cfg = CONFIGS[name]
    src, dst, again = tmp_path / "src", tmp_path / "dst", tmp_path / "again"
    ref.save_hf(src, cfg, ref.random_weights(cfg, seed=8), dtype=dtype, shards=shards)
    m = models.load(src, mmap=False)
    m.save_hf(dst)
    a, fa = read_dir(src)
    b, fb = read_dir(dst)
    assert a == b and fa == fb                    # names, dtypes, shapes, bytes and shards
    ca, cb = json.load(open(src / "config.json")), json.load(open(dst / "config.json"))
    assert ca == cb
    if shards > 1:
        ia = json.load(open(src / "model.safetensors.index.json"))
        ib = json.load(open(dst / "model.safetensors.index.json"))
        assert ia == ib
    # and the saved directory loads to the same logits, in ctorch and in transformers; a mapped
    # model saves the same too
    ids = tokens(cfg, 1, 9, 1)
    m2 = models.load(dst)
    assert torch.equal(m.forward(ids), m2.forward(ids))
    ok, err = rel_close(m2.forward(ids), ref.logits(ref.load(dst), ids))
    assert ok, err
    m2.save_hf(again)
    assert read_dir(again)[0] == a
    # another dtype on request
    m.save_hf(tmp_path / "f32", dtype="f32")
    c, _ = read_dir(tmp_path / "f32")
    assert {v[0] for v in c.values()} == {"F32"}
    assert json.load(open(tmp_path / "f32" / "config.json"))["dtype"] == "float32"
    assert torch.equal(ref.logits(ref.load(tmp_path / "f32"), ids), ref.logits(ref.load(src), ids))


@pytest.mark.parametrize("name", ["qwen2", "llama-llama3-rope", "llama-linear-rope-bias", "llama-mha-headdim"])
def test_hf_save_from_a_ctorch_model(tmp_path, name):
    """A model made in ctorch (no source directory) saved as Qwen2 or Llama, read back by
    transformers (from_pretrained) with the same logits."""
    cfg = CONFIGS[name]
    m = models.Model(ref.ctorch_config(cfg))
    w = ref.random_weights(cfg, seed=2)
    m.set_weights(ref.to_ctorch(cfg, w))
    m.save_hf(tmp_path)
    import json
    c = json.load(open(tmp_path / "config.json"))
    assert c["architectures"] == cfg["architectures"]
    assert c["num_key_value_heads"] == cfg["num_key_value_heads"]
    t, _ = read_dir(tmp_path)
    assert set(t) == set(w)
    for k, v in w.items():
        assert t[k][2] == v.numpy().tobytes(), k
    ids = tokens(cfg, 2, 13, 3)
    assert torch.equal(models.load(tmp_path).forward(ids), m.forward(ids))
    hm = ref.load(tmp_path)
    assert {k: v for k, v in hm.state_dict().items() if k != "lm_head.weight" or not cfg["tie_word_embeddings"]}.keys() == w.keys()
    ok, err = rel_close(m.forward(ids), ref.logits(hm, ids))
    assert ok, err


def hostile_cases():
    """(mutation of config.json, text the error must contain)."""
    return [
        (lambda c: c.update(architectures=["GPT2LMHeadModel"]), "GPT2LMHeadModel"),
        (lambda c: c.update(architectures="LlamaForCausalLM"), "architectures"),
        (lambda c: c.update(model_type="qwen2"), "model_type"),
        (lambda c: c.update(frobnicate=1), "frobnicate"),
        (lambda c: c.pop("hidden_size"), "hidden_size"),
        (lambda c: c.update(hidden_size=-4), "hidden_size"),
        (lambda c: c.update(hidden_size=2 ** 40), "hidden_size"),
        (lambda c: c.update(num_hidden_layers="2"), "num_hidden_layers"),
        (lambda c: c.update(num_key_value_heads=3), "num_key_value_heads"),
        (lambda c: c.update(head_dim=7), "head_dim"),
        (lambda c: c.update(rms_norm_eps=-1.0), "rms_norm_eps"),
        (lambda c: c.update(rope_theta=0), "rope_theta"),
        (lambda c: c["rope_parameters"].update(rope_theta=-1.0), "rope_parameters.rope_theta"),
        (lambda c: c.update(rope_theta=5.0), "disagree"),
        (lambda c: c.update(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}), "yarn"),
        (lambda c: c.update(rope_parameters={"rope_type": "linear", "rope_theta": 1e4}), "rope_parameters.factor"),
        (lambda c: c.update(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "mscale": 1}), "rope_parameters.mscale"),
        (lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 2.0}), "disagree"),
        (lambda c: c.update(layer_types=["full_attention", "sliding_attention"]), "sliding_attention"),
        (lambda c: c.update(layer_types=["full_attention"]), "layer_types"),
        (lambda c: c.update(hidden_size=10 ** 30), "hidden_size"),
        (lambda c: c.update(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "yarn"),
        (lambda c: c.update(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "low_freq_factor"),
        (lambda c: c.update(rope_scaling={"type": "linear", "factor": 2.0, "mscale": 1}), "rope_scaling.mscale"),
        (lambda c: c.update(rope_scaling={"rope_type": "linear", "factor": 0}), "rope_scaling.factor"),
        (lambda c: c.update(hidden_act="gelu"), "hidden_act"),
        (lambda c: c.update(mlp_bias=True), "mlp_bias"),
        (lambda c: c.update(torch_dtype="int8"), "torch_dtype"),
        (lambda c: c.update(dtype="int8"), "dtype"),
        (lambda c: c.update(vocab_size=95), "embed_tokens"),           # shapes disagree with the file
        (lambda c: c.update(tie_word_embeddings=True), "lm_head.weight"),  # untied file: lm_head differs
        (lambda c: c.update(num_hidden_layers=3), "model.layers.2"),
        (lambda c: c.update(num_hidden_layers=1), "model.layers.1"),   # an unknown tensor
        (lambda c: c.update(eos_token_id=[]), "eos_token_id"),
        (lambda c: c.update(sliding_window=4096), "sliding_window"),
        (lambda c: c.update(quantization_config={"bits": 4}), "quantization_config"),
    ]


@pytest.mark.parametrize("case", range(len(hostile_cases())))
def test_hostile_config_is_refused_by_name(tmp_path, case):
    import json
    mutate, needle = hostile_cases()[case]
    cfg = dict(CONFIGS["llama"])
    ref.save_hf(tmp_path, cfg, ref.random_weights(cfg, seed=1))
    c = json.load(open(tmp_path / "config.json"))
    assert "rope_parameters" in c and "dtype" in c  # what transformers 5.25 writes
    mutate(c)
    json.dump(c, open(tmp_path / "config.json", "w"))
    with pytest.raises(Exception, match=needle.replace(".", r"\.").replace("[", r"\[")):
        models.load(tmp_path).forward(torch.tensor([[1, 2]]))


def test_config_keys_from_the_wild_are_accepted(tmp_path):
    """What real config.json files hold besides the model: keys transformers 4 wrote
    (torch_dtype, rope_theta + rope_scaling), inert keys, integers beyond int64 in them."""
    import json
    cfg = CONFIGS["llama-llama3-rope"]
    w = ref.random_weights(cfg, seed=1)
    ref.save_hf(tmp_path, cfg, w)
    ids = tokens(cfg, 1, 7, 1)
    want = ref.logits(ref.load(tmp_path), ids)
    c = json.load(open(tmp_path / "config.json"))
    rp = c.pop("rope_parameters")
    old = dict(c, torch_dtype=c.pop("dtype"), rope_theta=rp.pop("rope_theta"),
               rope_scaling=dict(rp, type=rp["rope_type"]), pad_token_id=2 ** 70,
               output_hidden_states=False, tokenizer_class="LlamaTokenizer")
    for variant in (old, dict(old, rope_parameters=dict(rp, rope_theta=old["rope_theta"]))):
        (tmp_path / "config.json").write_text(json.dumps(variant))
        assert "1180591620717411303424" in (tmp_path / "config.json").read_text()
        ok, err = rel_close(models.load(tmp_path).forward(ids), want)
        assert ok, err


def test_hostile_config_text(tmp_path):
    cfg = CONFIGS["llama"]
    ref.save_hf(tmp_path, cfg, ref.random_weights(cfg, seed=1))
    for text, needle in [("{", "not JSON"), ("[1]", "object"), ('{"a": 1, "a": 2}', "not JSON"),
                         ("x" * (2 << 20), "allowed")]:
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(Exception, match=needle):
            models.load(tmp_path)
    os.remove(tmp_path / "config.json")
    with pytest.raises(Exception, match="config.json"):
        models.load(tmp_path)


def index_cases():
    """(mutation of the index given its shard names f, text the error must contain)."""
    return [
        (lambda ix, f: ix.update(extra=1), "extra"),
        (lambda ix, f: ix.pop("weight_map"), "weight_map"),
        (lambda ix, f: ix.update(weight_map={}), "weight_map"),
        (lambda ix, f: ix["weight_map"].update({"model.norm.weight": "../" + f[0]}), "model.norm.weight"),
        (lambda ix, f: ix["weight_map"].update({"model.norm.weight": "/etc/passwd"}), "model.norm.weight"),
        (lambda ix, f: ix["weight_map"].update({"model.norm.weight": ".hidden.safetensors"}), "model.norm.weight"),
        (lambda ix, f: ix["weight_map"].update({"model.norm.weight": 3}), "model.norm.weight"),
        (lambda ix, f: ix["weight_map"].update({"model.norm.weight": "missing.safetensors"}), "missing.safetensors"),
        (lambda ix, f: ix["weight_map"].pop("model.norm.weight"), "model.norm.weight"),
        (lambda ix, f: ix["weight_map"].update({"model.extra.weight": f[0]}), "model.extra.weight"),
        (lambda ix, f: ix["weight_map"].update({"model.embed_tokens.weight": f[1] if ix["weight_map"]["model.embed_tokens.weight"] == f[0] else f[0]}), "model.embed_tokens.weight"),
    ]


@pytest.mark.parametrize("case", range(len(index_cases())))
def test_hostile_index_is_refused_by_name(tmp_path, case):
    import json
    mutate, needle = index_cases()[case]
    cfg = CONFIGS["llama"]
    ref.save_hf(tmp_path, cfg, ref.random_weights(cfg, seed=1), shards=2)
    ix = json.load(open(tmp_path / "model.safetensors.index.json"))
    files = sorted(set(ix["weight_map"].values()))
    assert len(files) >= 2
    models.load(tmp_path)  # the index as transformers wrote it loads
    mutate(ix, files)
    json.dump(ix, open(tmp_path / "model.safetensors.index.json", "w"))
    with pytest.raises(Exception, match=needle.replace(".", r"\.")):
        models.load(tmp_path)


def test_tied_lm_head_equal_to_the_embedding_is_accepted(tmp_path):
    """A tied model's file that also holds lm_head.weight (equal to the embedding)."""
    cfg = CONFIGS["qwen2"]
    w = ref.random_weights(cfg, seed=1)
    hm = ref.save_hf(tmp_path, cfg, w)
    import safetensors.torch
    t = safetensors.torch.load_file(str(tmp_path / "model.safetensors"))
    assert "lm_head.weight" not in t  # save_pretrained leaves the tied head out
    t["lm_head.weight"] = t["model.embed_tokens.weight"].clone()
    ref.write_safetensors(tmp_path / "model.safetensors", t, {"format": "pt"})
    ids = tokens(cfg, 1, 5, 1)
    ok, err = rel_close(models.load(tmp_path).forward(ids), ref.logits(hm, ids))
    assert ok, err


@pytest.mark.parametrize("name", ["llama-llama3-rope", "qwen2"])
def test_load_pt_state_dict_with_a_config(tmp_path, name):
    """models.load of torch.save files: HF-named state dicts with the config in the file or a
    config.json (transformers' own) beside, ctorch-named ones with config=, views and bf16 kept
    by the reader; against transformers holding the same weights."""
    import json
    cfg = CONFIGS[name]
    w = ref.random_weights(cfg, seed=11)
    hm = ref.hf_model(cfg, w)
    ids = tokens(cfg, 2, 10, 2)
    want = ref.logits(hm, ids)
    # {"config": config.json, "model": state dict} in one .pt
    p = tmp_path / "ck.pt"
    torch.save({"config": cfg, "model": {k: v.detach() for k, v in w.items()}}, p)
    m = models.load(p)
    ok, err = rel_close(m.forward(ids), want)
    assert ok, err
    assert m.eos_token_id == 2 and m.bos_token_id == 1
    # pytorch_model.bin beside config.json as transformers writes it (a tied model's lm_head
    # equal to the embedding is accepted, as is the derived inv_freq buffer)
    d = tmp_path / "hf"
    hm.config.save_pretrained(d)
    sd = {k: v.detach().to(torch.bfloat16) for k, v in w.items()}
    if cfg["tie_word_embeddings"]:
        sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    torch.save(sd, d / "pytorch_model.bin")
    wr = rounded(w, torch.bfloat16)
    ok, err = rel_close(models.load(d / "pytorch_model.bin").forward(ids), ref.logits(ref.hf_model(cfg, wr), ids))
    assert ok, err
    # ctorch names with a ctorch configuration given; the gate/up halves as views of one storage
    ct = {k: v.detach() for k, v in ref.to_ctorch(cfg, w).items()}
    q = tmp_path / "ct.pt"
    torch.save(ct, q)
    m2 = models.load(q, config=ref.ctorch_config(cfg))
    assert torch.equal(m2.forward(ids), m.forward(ids))
    # refused by name: no configuration, a foreign tensor, a missing one
    with pytest.raises(ValueError, match="config"):
        models.load(q)
    bad = dict(sd, **{"model.layers.0.mlp.frob.weight": torch.ones(2)})
    torch.save(bad, d / "pytorch_model.bin")
    from ctorch._lib import CtorchError
    with pytest.raises(CtorchError, match="frob"):
        models.load(d / "pytorch_model.bin")
    sd.pop("model.norm.weight")
    torch.save(sd, d / "pytorch_model.bin")
    with pytest.raises(CtorchError, match="model.norm.weight"):
        models.load(d / "pytorch_model.bin")
    json.loads((d / "config.json").read_text())
