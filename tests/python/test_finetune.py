"""Fine-tuning Hugging Face Llama-family models: `ctorch train --init-from DIR` on directories
save_pretrained wrote (every gradient against transformers' own loss and autograd, the loss
going down, the layout written back and read by from_pretrained, exact resume), LoRA adapters
(their gradients against peft's LoRA layers, the files `ctorch train --lora-rank` writes loaded
by PeftModel.from_pretrained with ctorch's logits, resume) and hostile adapter files."""
import json
import os
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_reference as ref  # noqa: E402
from test_models import read_dir, rel_close  # noqa: E402

from ctorch import models  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import torch_train  # noqa: E402  (read_safetensors)
from conftest import ctorch  # noqa: E402


TEXT = ("The quick brown fox jumps over the lazy dog. A stitch in time saves nine. "
        "All that glitters is not gold; fortune favours the bold.\n") * 40


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    data = d / "text.txt"
    data.write_text(TEXT)
    tok = d / "tokenizer.json"
    ctorch("tokenizer", "train", "--data", data, "--out", tok, "--vocab", 300)
    vocab = json.load(open(tok))["vocab_size"]
    return data, tok, vocab


def make_model(d, corpus, cfg_fn, shards=1, dtype=torch.float32, seed=3, **kw):
    """A HF directory whose tokenizer.json is the ctorch tokenizer of the corpus (vocabulary
    padded by 4 ids, as HF models often are)."""
    _, tok, vocab = corpus
    cfg = cfg_fn(vocab_size=vocab + 4, max_position_embeddings=32, **kw)
    w = ref.random_weights(cfg, seed=seed, std=0.1)
    ref.save_hf(d, cfg, w, dtype=dtype, shards=shards)
    (d / "tokenizer.json").write_bytes(tok.read_bytes())
    return cfg, w


def losses(metrics):
    return [json.loads(line)["loss"] for line in open(metrics) if '"loss"' in line and "step" in line
            and "event" not in line]


RUN = ["--seq", 16, "--batch", 2, "--quiet", "--no-doc-mask", "--eval-every", 0]


@pytest.mark.parametrize("cfg_fn,extra", [(ref.llama_config, {}), (ref.qwen2_config, {}),
                                          (ref.llama_config, {"rope_scaling": {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 16}, "attention_bias": True})])
def test_init_from_gradients_match_reference(tmp_path, corpus, cfg_fn, extra):
    data, _, _ = corpus
    src = tmp_path / "src"
    cfg, w = make_model(src, corpus, cfg_fn, **extra)
    dump = tmp_path / "grads.safetensors"
    ctorch("train", "--init-from", src, "--data", data, *RUN, "--out", tmp_path / "run", "--dump-grads", dump)
    tensors, meta = torch_train.read_safetensors(str(dump))
    tok = torch.from_numpy(tensors["tokens"].astype(np.int64))
    hm = ref.load(src)
    loss = ref.loss(hm, tok)
    loss.backward()
    assert abs(float(meta["loss"]) - loss.item()) <= 1e-5 * loss.item()
    grads = ref.grads_to_hf(cfg, {k[5:]: torch.from_numpy(v) for k, v in tensors.items() if k.startswith("grad.")})
    want = ref.grads(hm)
    assert set(grads) == set(want) == set(w)
    for k, g in want.items():
        ok, err = rel_close(grads[k], g)
        assert ok, f"{k}: relative error {err:.2e}"


@pytest.mark.parametrize("shards,dtype", [(1, torch.float32), (3, torch.bfloat16)])
def test_fine_tuning_lowers_the_loss_and_saves_the_layout(tmp_path, corpus, shards, dtype):
    data, _, _ = corpus
    src, out = tmp_path / "src", tmp_path / "out"
    cfg, w = make_model(src, corpus, ref.llama_config, shards=shards, dtype=dtype)
    ctorch("train", "--init-from", src, "--data", data, *RUN, "--steps", 12, "--lr", 3e-3,
           "--warmup", 2, "--out", out)
    ls = losses(out / "metrics.jsonl")
    assert len(ls) == 12 and np.mean(ls[-3:]) < np.mean(ls[:3]) - 0.1, ls
    a, fa = read_dir(src)
    b, fb = read_dir(out)
    assert set(a) == set(b) and fa == fb            # same names, the same shards
    assert all(a[k][0] == b[k][0] and a[k][1] == b[k][1] for k in a)  # dtypes and shapes kept
    assert any(a[k][2] != b[k][2] for k in a)       # and trained
    assert (out / "tokenizer.json").read_bytes() == (src / "tokenizer.json").read_bytes()
    c = json.load(open(out / "config.json"))
    assert c == json.load(open(src / "config.json"))
    # the saved directory is the trained model: its loss on a batch is what training reached
    m = models.load(out, mmap=False)
    ids = torch.randint(0, cfg["vocab_size"] - 4, (1, 12), generator=torch.Generator().manual_seed(1))
    got = m.forward(ids)
    assert got.shape == (1, 12, cfg["vocab_size"])
    # transformers reads the trained directory, to the same logits
    ok, err = rel_close(got, ref.logits(ref.load(out), ids))
    assert ok, err
    assert not rel_close(got, ref.logits(ref.load(src), ids))[0]  # and it was trained


def test_fine_tuning_resume_is_bit_exact(tmp_path, corpus):
    data, _, _ = corpus
    src = tmp_path / "src"
    make_model(src, corpus, ref.qwen2_config)
    run = ["--init-from", src, "--data", data, *RUN, "--steps", 6, "--warmup", 1]
    ctorch("train", *run, "--out", tmp_path / "a")
    ctorch("train", *run, "--out", tmp_path / "b", "--stop-at", 3)
    ctorch("train", "--resume", "--out", tmp_path / "b", "--quiet")
    assert losses(tmp_path / "a" / "metrics.jsonl") == losses(tmp_path / "b" / "metrics.jsonl")[:3] + \
        losses(tmp_path / "b" / "metrics.jsonl")[3:]
    assert read_dir(tmp_path / "a") == read_dir(tmp_path / "b")


def test_init_from_refuses_model_options_and_bad_sources(tmp_path, corpus):
    data, _, _ = corpus
    src = tmp_path / "src"
    make_model(src, corpus, ref.llama_config)
    r = ctorch("train", "--init-from", src, "--data", data, "--layers", 3, "--out", tmp_path / "o", ok=False)
    assert r.returncode == 2 and "--layers" in r.stderr
    r = ctorch("train", "--init-from", src, "--out", tmp_path / "o", ok=False)
    assert r.returncode == 2 and "--data" in r.stderr
    r = ctorch("train", "--lora-rank", 4, "--data", data, "--out", tmp_path / "o", ok=False)
    assert r.returncode == 2 and "--init-from" in r.stderr
    r = ctorch("train", "--init-from", tmp_path / "nothing", "--data", data, "--out", tmp_path / "o", ok=False)
    assert r.returncode == 1 and "nothing" in r.stderr
    os.remove(src / "tokenizer.json")
    r = ctorch("train", "--init-from", src, "--data", data, "--out", tmp_path / "o", ok=False)
    assert r.returncode == 1 and "tokenizer.json" in r.stderr
    r = ctorch("train", "--lora-rank", 4, "--lora-targets", "q,zz", "--init-from", src, "--data", data,
               "--out", tmp_path / "o", ok=False)
    assert r.returncode == 2 and "zz" in r.stderr


# ---- LoRA ------------------------------------------------------------------------------------

@pytest.mark.parametrize("cfg_fn,targets", [(ref.llama_config, "q,k,v,o,gate,up,down"), (ref.qwen2_config, "q,v,up")])
def test_lora_gradients_match_peft(cfg_fn, targets):
    """ctorch's adapters (models.Lora) holding peft's random A and B: the loss, every adapter
    gradient and the logits of peft's LoRA layers on transformers' model."""
    cfg = cfg_fn(vocab_size=64, max_position_embeddings=32)
    w = ref.random_weights(cfg, seed=4)
    m = models.Model(ref.ctorch_config(cfg))
    m.set_weights(ref.to_ctorch(cfg, w))
    pm = ref.peft_model(ref.hf_model(cfg, w), rank=3, alpha=6, targets=targets, seed=9)
    sd = ref.peft_state_dict(pm)  # B nonzero: every gradient carries signal
    assert len(sd) == 2 * len(targets.split(",")) * cfg["num_hidden_layers"]
    lora = models.Lora(m, rank=3, alpha=6.0, targets=targets, batch=2, seq=16)
    assert set(lora.state_dict()) == set(sd)
    lora.set_weights(sd)
    lora.apply()
    tok = torch.randint(0, 64, (2, 17), generator=torch.Generator().manual_seed(9))
    loss_c, _ = m.loss_and_grads(tok)
    grads = lora.grads()
    pm.train()  # dropout 0: the same maths, with gradients
    loss = ref.loss(pm, tok)
    loss.backward()
    assert abs(loss_c - loss.item()) <= 1e-5 * loss.item()
    want = ref.peft_grads(pm)
    assert set(want) == set(sd)
    for k, g in want.items():
        ok, err = rel_close(grads[k], g)
        assert ok, f"{k}: relative error {err:.2e}"
    # the logits of the applied adapters are peft's
    ok, err = rel_close(m.forward(tok[:, :16]), ref.logits(pm.eval(), tok[:, :16]))
    assert ok, err


def test_lora_training_peft_files_merge_and_resume(tmp_path, corpus):
    data, _, _ = corpus
    src = tmp_path / "src"
    cfg, w = make_model(src, corpus, ref.llama_config)
    run = ["--init-from", src, "--data", data, *RUN, "--steps", 10, "--lr", 1e-2, "--warmup", 1,
           "--lora-rank", 4, "--lora-alpha", 16, "--lora-targets", "q,v,gate,down"]
    a, b = tmp_path / "a", tmp_path / "b"
    ctorch("train", *run, "--out", a)
    ls = losses(a / "metrics.jsonl")
    assert np.mean(ls[-3:]) < np.mean(ls[:3]) - 0.05, ls
    # PEFT's layout
    c = json.load(open(a / "adapter_config.json"))
    assert c["r"] == 4 and c["lora_alpha"] == 16 and c["task_type"] == "CAUSAL_LM" and c["bias"] == "none"
    assert c["lora_dropout"] == 0 and c["base_model_name_or_path"] == str(src) and c["peft_type"] == "LORA"
    assert sorted(c["target_modules"]) == ["down_proj", "gate_proj", "q_proj", "v_proj"]
    t, _ = read_dir(a, "adapter")
    names = set(t)
    assert len(names) == 2 * 4 * cfg["num_hidden_layers"]
    assert t["base_model.model.model.layers.1.mlp.down_proj.lora_A.weight"][1] == [4, cfg["intermediate_size"]]
    assert t["base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"][1] == [cfg["hidden_size"], 4]
    assert not (a / "model.safetensors").exists()
    # peft loads the adapters ctorch wrote (PeftModel.from_pretrained on transformers' model of
    # the base) to the logits of ctorch's merged model: base + 16/4 B A
    m = models.load(src, mmap=False)
    assert m.merge_lora(a) == 4 * cfg["num_hidden_layers"]
    ids = torch.randint(0, cfg["vocab_size"], (2, 12), generator=torch.Generator().manual_seed(2))
    pm = ref.load_adapter(ref.load(src), a)
    want = ref.logits(pm, ids)
    ok, err = rel_close(m.forward(ids), want)
    assert ok, err
    assert not rel_close(ref.logits(ref.load(src), ids), want)[0]  # the adapters matter
    ok, err = rel_close(m.forward(ids), ref.logits(pm.merge_and_unload(), ids))
    assert ok, err
    # resume is exact: the same adapters, bit for bit
    ctorch("train", *run, "--out", b, "--stop-at", 4)
    ctorch("train", "--resume", "--out", b, "--quiet")
    assert losses(a / "metrics.jsonl") == losses(b / "metrics.jsonl")
    assert read_dir(a, "adapter")[0] == read_dir(b, "adapter")[0]


def adapter_cases():
    return [
        (lambda c, t: c.update(use_dora=True), "use_dora"),
        (lambda c, t: c.update(target_modules="q_proj|v_proj"), "target_modules"),
        (lambda c, t: c.update(target_modules=["q_proj", "c_attn"]), "c_attn"),
        (lambda c, t: c.update(rank_pattern={"q_proj": 8}), "rank_pattern"),
        (lambda c, t: c.update(bias="all"), "bias"),
        (lambda c, t: c.update(frobnicate=1), "frobnicate"),
        (lambda c, t: c.pop("r"), '"r"'),
        (lambda c, t: c.update(r=5), "r = 5"),
        (lambda c, t: t.update({"base_model.model.model.layers.9.self_attn.q_proj.lora_A.weight": torch.zeros(2, 32)}), "layers.9"),
        (lambda c, t: t.update({"base_model.model.lm_head.lora_A.weight": torch.zeros(2, 32)}), "lm_head"),
        (lambda c, t: t.pop("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"), "lora_B"),
    ]


@pytest.mark.parametrize("case", range(len(adapter_cases())))
def test_hostile_adapter_is_refused_by_name(tmp_path, case):
    mutate, needle = adapter_cases()[case]
    cfg = ref.llama_config()
    w = ref.random_weights(cfg)
    m = models.Model(ref.ctorch_config(cfg))
    m.set_weights(ref.to_ctorch(cfg, w))
    # an adapter as peft writes it (accepted as it is), then broken
    ref.peft_model(ref.hf_model(cfg, w), rank=2, alpha=4, targets="q,v").save_pretrained(str(tmp_path))
    assert m.merge_lora(tmp_path) == 4
    c = json.load(open(tmp_path / "adapter_config.json"))
    t = {k: torch.from_numpy(v) for k, v in torch_train.read_safetensors(str(tmp_path / "adapter_model.safetensors"))[0].items()}
    mutate(c, t)
    json.dump(c, open(tmp_path / "adapter_config.json", "w"))
    ref.write_safetensors(str(tmp_path / "adapter_model.safetensors"), t)
    fresh = models.Model(ref.ctorch_config(cfg))
    with pytest.raises(Exception, match=needle.replace(".", r"\.").replace("|", r"\|")):
        fresh.merge_lora(tmp_path)
