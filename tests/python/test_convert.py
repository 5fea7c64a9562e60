"""`ctorch convert` of models: a Hugging Face Llama-family directory (save_pretrained of
transformers 5.25) <-> a ctorch checkpoint (dtypes kept or --dtype, shards, config.json and the
tokenizer carried), a checkpoint `ctorch train` made from scratch -> a directory, and
--merge-lora (an adapter peft 0.21 saved, folded into its base), each output written
atomically; the converted models against transformers (from_pretrained of the source, and of
every directory ctorch writes) and peft's merge_and_unload."""
import json
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_reference as ref  # noqa: E402
from conftest import ctorch  # noqa: E402
from test_models import CONFIGS, read_dir, rel_close, tokens  # noqa: E402

from ctorch import io, models  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(HERE))


def run(*args, rc=0):
    r = ctorch(*args, ok=False)
    assert r.returncode == rc, f"ctorch {' '.join(map(str, args))}: rc {r.returncode}\n{r.stderr}"
    return r


ST = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}


@pytest.mark.parametrize("name,dtype,shards", [
    ("llama", torch.float32, 1), ("llama-llama3-rope", torch.bfloat16, 3),
    ("llama-linear-rope-bias", torch.float16, 2), ("qwen2", torch.bfloat16, 1),
    ("mistral", torch.float32, 2)])
def test_hf_directory_to_checkpoint_and_back(tmp_path, name, dtype, shards):
    cfg = CONFIGS[name]
    w = ref.random_weights(cfg, seed=7)
    src = tmp_path / "src"
    ref.save_hf(src, cfg, w, dtype=dtype, shards=shards)
    (src / "generation_config.json").write_text('{"do_sample": false}\n')
    ck = tmp_path / "model.safetensors"
    r = run("convert", src, ck)
    assert "ctorch checkpoint" in r.stdout
    # a ctorch checkpoint: ctorch names, the source's dtype, the config, config.json kept
    with io.SafetensorsFile(ck) as f:
        meta = f.metadata
        assert meta["format"] == "ctorch-gpt" and json.loads(meta["hf_config"]) == json.load(open(src / "config.json"))
        want = ref.to_ctorch(cfg, {k: v.detach().to(dtype) for k, v in w.items()})
        assert set(f.keys()) == set(want)
        for k, v in want.items():
            assert f.info(k)["dtype"].upper() == ST[dtype], (k, f.info(k)["dtype"])
            got = torch.from_numpy(f.to(k, "f32").copy())
            assert torch.equal(got, v.to(torch.float32)), k
    # it computes what transformers computes on the stored weights
    ids = tokens(cfg, 2, 11, 3)
    hm = ref.load(src)
    want = ref.logits(hm, ids)
    ok, err = rel_close(models.load(ck).forward(ids), want)
    assert ok, err
    # generation from the checkpoint is the directory's (EOS from its config.json, ids in/out),
    # and transformers' generate(do_sample=False)
    g = [json.loads(run("generate", "--model", m, "--prompt-ids", "3 5 7", "--greedy",
                        "--max-new-tokens", 6, "--json", "--ignore-eos").stdout) for m in (src, ck)]
    assert g[0]["new_ids"] == g[1]["new_ids"] and g[0]["prompt_ids"] == [3, 5, 7]
    assert g[0]["new_ids"] == ref.greedy(hm, torch.tensor([[3, 5, 7]]), 6)[0, 3:].tolist()
    assert models.load(ck).eos_token_id == 2 and models.load(ck).bos_token_id == 1
    # and back: the same layout, names, dtypes, shards, bytes and config.json
    back = tmp_path / "back"
    run("convert", ck, back)
    a, fa = read_dir(src)
    b, fb = read_dir(back)
    assert a == b
    assert set(fb.values()) == {"model.safetensors"}  # a checkpoint holds no shard layout
    assert json.load(open(back / "config.json")) == json.load(open(src / "config.json"))
    ok, err = rel_close(ref.logits(ref.load(back), ids), want)  # transformers reads it back
    assert ok, err
    # a directory to a directory keeps the shards and the side files
    again = tmp_path / "again"
    run("convert", src, again)
    assert read_dir(again) == read_dir(src)
    assert (again / "generation_config.json").read_text() == '{"do_sample": false}\n'
    assert sorted(os.listdir(tmp_path)) == ["again", "back", "model.safetensors", "src"]


def test_dtype_option_and_tokenizer(tmp_path):
    cfg = ref.llama_config(vocab_size=300)
    w = ref.random_weights(cfg, seed=3)
    src = tmp_path / "src"
    ref.save_hf(src, cfg, w, dtype=torch.float32)
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog " * 30)
    run("tokenizer", "train", "--data", text, "--out", src / "tokenizer.json", "--vocab", 280)
    ck = tmp_path / "half.safetensors"
    run("convert", src, ck, "--dtype", "bf16")
    with io.SafetensorsFile(ck) as f:
        assert {f.info(k)["dtype"].upper() for k in f.keys()} == {"BF16"}
        tj = json.loads(f.metadata["tokenizer"])
        assert tj == json.load(open(src / "tokenizer.json"))
        emb = torch.from_numpy(f.to("tok_embeddings.weight", "f32").copy())
    assert torch.equal(emb, w["model.embed_tokens.weight"].to(torch.bfloat16).float())
    out = tmp_path / "f16dir"
    run("convert", ck, out, "--dtype", "f16")
    t, _ = read_dir(out)
    assert {v[0] for v in t.values()} == {"F16"}
    c = json.load(open(out / "config.json"))
    assert c["dtype"] == "float16" and c["bos_token_id"] == 1 and c["eos_token_id"] == 2
    assert "torch_dtype" not in c  # the key transformers 5.25 wrote in the source
    assert json.load(open(out / "tokenizer.json")) == json.load(open(src / "tokenizer.json"))
    # the converted model generates through its tokenizer as the source does
    g1 = run("generate", "--model", src, "--prompt", "the quick", "--greedy", "--max-new-tokens", 5, "--json", "--ignore-eos")
    g2 = run("generate", "--model", ck, "--prompt", "the quick", "--greedy", "--max-new-tokens", 5, "--json", "--ignore-eos")
    assert json.loads(g1.stdout)["prompt_ids"] == json.loads(g2.stdout)["prompt_ids"]


def test_merge_lora(tmp_path):
    """An adapter peft saved (get_peft_model + save_pretrained, random nonzero lora_B) folded
    into its base by `ctorch convert --merge-lora`: peft's merge_and_unload logits."""
    cfg = CONFIGS["llama-llama3-rope"]
    w = ref.random_weights(cfg, seed=4)
    base = tmp_path / "base"
    ref.save_hf(base, cfg, w, dtype=torch.float32, shards=2)
    pm = ref.peft_model(ref.hf_model(cfg, w), rank=2, alpha=6, targets="q,v,gate,up,down", seed=9, std=0.1)
    pm.peft_config["default"].base_model_name_or_path = str(base)
    ad = tmp_path / "adapter"
    pm.save_pretrained(str(ad))
    assert json.load(open(ad / "adapter_config.json"))["peft_version"] == "0.21.2"
    ids = tokens(cfg, 2, 9, 5)
    unmerged = ref.logits(pm, ids)
    merged_model = pm.merge_and_unload()
    want = ref.logits(merged_model, ids)
    assert rel_close(unmerged, want, 1e-5)[0]
    out = tmp_path / "merged"
    r = run("convert", base, out, "--merge-lora", ad)
    assert "10 LoRA adapters" in r.stdout
    ok, err = rel_close(models.load(out).forward(ids), want)
    assert ok, err
    ok, err = rel_close(ref.logits(ref.load(out), ids), want)  # and in transformers
    assert ok, err
    t, files = read_dir(out)
    assert set(files.values()) == set(read_dir(base)[1].values())  # the base's shards
    # the base named by the adapter, into a ctorch checkpoint
    ck = tmp_path / "merged.safetensors"
    run("convert", ad, ck, "--merge-lora")
    ok, err = rel_close(models.load(ck).forward(ids), want)
    assert ok, err
    # a checkpoint base, --merge-lora first: merged twice, W + 2 s B A
    ck2 = tmp_path / "merged2.safetensors"
    run("convert", "--merge-lora", ad, ck, ck2)
    msd = merged_model.state_dict()
    twice = {k: msd[k] + (msd[k] - v) for k, v in w.items()}
    ok, err = rel_close(models.load(ck2).forward(ids), ref.logits(ref.hf_model(cfg, twice), ids))
    assert ok, err


def test_model_conversions_are_atomic_and_refuse_bad_input(tmp_path):
    cfg = CONFIGS["llama"]
    src = tmp_path / "src"
    ref.save_hf(src, cfg, ref.random_weights(cfg), dtype=torch.float32)
    # a non-empty OUT directory is refused and left alone
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep").write_text("x")
    r = run("convert", src, full, rc=1)
    assert "not an empty directory" in r.stderr and os.listdir(full) == ["keep"]
    # a failing conversion leaves no OUT and no temporary directory
    ad = tmp_path / "ad"
    ad.mkdir()
    (ad / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"],
                                                        "use_dora": True}))
    r = run("convert", src, tmp_path / "out", "--merge-lora", ad, rc=1)
    assert "use_dora" in r.stderr
    r = run("convert", src, tmp_path / "out.safetensors", "--merge-lora", ad, rc=1)
    assert sorted(os.listdir(tmp_path)) == ["ad", "full", "src"]
    # an adapter without a base, a file that is no model, hostile configs by name
    (ad / "adapter_config.json").write_text(json.dumps({"r": 2, "lora_alpha": 4, "target_modules": ["q_proj"]}))
    r = run("convert", ad, tmp_path / "o", "--merge-lora", rc=1)
    assert "base_model_name_or_path" in r.stderr
    plain = tmp_path / "plain.safetensors"
    ref.write_safetensors(str(plain), {"w": torch.ones(2)})
    r = run("convert", plain, tmp_path / "o", rc=1)
    assert "carries no model configuration" in r.stderr
    c = json.load(open(src / "config.json"))
    c["frobnicate"] = 1
    json.dump(c, open(src / "config.json", "w"))
    r = run("convert", src, tmp_path / "o.safetensors", rc=1)
    assert "frobnicate" in r.stderr
    r = run("convert", src, tmp_path / "o.pt", rc=2)
    assert "ctorch checkpoint" in r.stderr
    r = run("convert", tmp_path / "ad", tmp_path / "o", rc=1)
    assert "config.json" in r.stderr
    r = run("convert", plain, tmp_path / "o", "--dtype", "i8", "--to", "hf", rc=2)
    assert sorted(os.listdir(tmp_path)) == ["ad", "full", "plain.safetensors", "src"]


def test_pt_state_dict_generates_and_converts(tmp_path):
    """`ctorch generate --model FILE.pt` and `ctorch convert FILE.pt DIR`: a torch.save state
    dict with its config inside, or pytorch_model.bin beside config.json (HF names, bf16)."""
    cfg = CONFIGS["llama-llama3-rope"]
    w = ref.random_weights(cfg, seed=12)
    p = tmp_path / "ck.pt"
    torch.save({"config": cfg, "model": {k: v.detach() for k, v in w.items()}}, p)
    want = ref.greedy(ref.hf_model(cfg, w), torch.tensor([[3, 5, 7]]), 6)[0].tolist()
    g = json.loads(run("generate", "--model", p, "--prompt-ids", "3 5 7", "--greedy",
                       "--max-new-tokens", 6, "--json", "--ignore-eos").stdout)
    assert g["prompt_ids"] + g["new_ids"] == want
    # ctorch names with a ctorch configuration inside
    q = tmp_path / "ct.pt"
    torch.save({"config": ref.ctorch_config(cfg), **{k: v.detach() for k, v in ref.to_ctorch(cfg, w).items()}}, q)
    g2 = json.loads(run("generate", "--checkpoint", q, "--prompt-ids", "3 5 7", "--greedy",
                        "--max-new-tokens", 6, "--json", "--ignore-eos").stdout)
    assert g2["new_ids"] == g["new_ids"]
    # an HF directory of pytorch_model.bin (bf16) -> its safetensors layout
    hcfg = dict(cfg, torch_dtype="bfloat16")
    d = tmp_path / "bin"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(hcfg))
    torch.save({k: v.detach().to(torch.bfloat16) for k, v in w.items()}, d / "pytorch_model.bin")
    out = tmp_path / "st"
    run("convert", d / "pytorch_model.bin", out)
    want_dir = tmp_path / "want"
    ref.save_hf(want_dir, cfg, w, dtype=torch.bfloat16)
    assert read_dir(out)[0] == read_dir(want_dir)[0]
    assert json.load(open(out / "config.json")) == hcfg
    ids = tokens(cfg, 1, 8, 2)
    ok, err = rel_close(ref.logits(ref.load(out), ids), ref.logits(ref.load(want_dir), ids))
    assert ok, err
    # refused by name: a foreign tensor, a missing one, no configuration
    torch.save({"config": cfg, "model": dict({k: v.detach() for k, v in w.items()},
                                             **{"model.layers.0.mlp.frob.weight": torch.ones(2)})}, p)
    assert "frob" in run("generate", "--model", p, "--prompt-ids", "1", rc=1).stderr
    sd = {k: v.detach() for k, v in w.items() if k != "model.norm.weight"}
    torch.save({"config": cfg, "model": sd}, p)
    assert "model.model.norm.weight" in run("generate", "--model", p, "--prompt-ids", "1", rc=1).stderr
    torch.save(sd, tmp_path / "bare.pt")
    r = run("generate", "--model", tmp_path / "bare.pt", "--prompt-ids", "1", rc=1)
    assert "carries no model configuration" in r.stderr


def test_checkpoint_trained_from_scratch_converts(tmp_path):
    """`ctorch train` with its default model (a few steps) -> `ctorch convert` -> a directory
    transformers loads with ctorch's logits and greedy tokens; a sliding window converts to
    MistralForCausalLM (sliding_window = window + 1: test_hf_window) with the same logits; what
    the Llama family cannot express (a compiled score_mod) is refused by name, leaving nothing."""
    run_dir = tmp_path / "run"
    run("train", "--steps", 2, "--batch", 1, "--eval-every", 0, "--quiet", "--out", run_dir)
    ck = run_dir / "checkpoint.safetensors"
    out = tmp_path / "hf"
    r = run("convert", ck, out)
    assert "Hugging Face directory" in r.stdout
    c = json.load(open(out / "config.json"))
    assert c["architectures"] == ["LlamaForCausalLM"] and c["vocab_size"] == 32768
    assert c["num_hidden_layers"] == 4 and c["tie_word_embeddings"] is True
    assert c["eos_token_id"] == 0  # the EOS the run trained with
    hm = ref.load(out)
    assert hm.config.rope_parameters["rope_theta"] == 10000.0
    ids = torch.randint(1, 32768, (2, 40), generator=torch.Generator().manual_seed(3))
    m = models.load(ck)
    ok, err = rel_close(m.forward(ids), ref.logits(hm, ids))
    assert ok, err
    m.eos_token_id = None
    assert torch.equal(m.generate(ids[:, :5], 8), ref.greedy(hm, ids[:, :5], 8))
    assert torch.equal(models.load(out).forward(ids), m.forward(ids))
    # the settings Hugging Face's Llama has no place for, named
    win = tmp_path / "win"
    tiny = ["--vocab", 64, "--classes", 4, "--sentence", 3, "--layers", 1, "--d-model", 16, "--heads", 2,
            "--kv-heads", 1, "--ffn", 16, "--context", 16, "--batch", 1, "--steps", 1, "--eval-every", 0, "--quiet"]
    run("train", *tiny, "--window", 4, "--out", win)
    run("convert", win / "checkpoint.safetensors", tmp_path / "o1")
    c = json.load(open(tmp_path / "o1" / "config.json"))
    assert c["architectures"] == ["MistralForCausalLM"] and c["sliding_window"] == 5
    ids = torch.randint(1, 64, (2, 16), generator=torch.Generator().manual_seed(4))
    ok, err = rel_close(models.load(win / "checkpoint.safetensors").forward(ids),
                        ref.logits(ref.load(tmp_path / "o1"), ids))
    assert ok, err
    sm = tmp_path / "sm"
    run("train", *tiny, "--score-mod", "score + 0.05 * (kv - q)", "--out", sm)
    r = run("convert", sm / "checkpoint.safetensors", tmp_path / "o2", rc=1)
    assert '"score_mod"' in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["hf", "o1", "run", "sm", "win"]


def test_bench_hf_runs_and_cleans_up(tmp_path):
    """`ctorch bench hf` on a small directory (timing decides nothing here)."""
    r = run("bench", "hf", "--layers", 3, "--vocab", 512, "--hidden", 512, "--intermediate", 256,
            "--shard-mib", 1, "--dir", tmp_path, "--json", "--repeats", 3)
    j = json.loads(r.stdout)
    d = j["directory"]
    C, F_, V, L = 512, 256, 512, 3
    per_layer = 2 * C + C * C + 2 * C * 64 + C * C + 3 * C * F_  # norms, q, k, v (1 kv head), o, mlp
    assert d["data_bytes"] == 2 * (2 * V * C + C + L * per_layer) and d["tensors"] == 3 + 9 * L
    assert d["shards"] > 1 and j["open"]["median_s"] > 0 and j["shards_ct_load"]["repeats"] == 3
    # loading for inference: the bf16 weights stay mapped (no copy), converted they are f32
    f32_bytes = 2 * d["data_bytes"]
    assert j["load_mapped"]["tracked_bytes"] < f32_bytes / 10
    assert j["load_converted"]["tracked_bytes"] >= f32_bytes
    assert j["load_converted"]["rss_anon_bytes"] > j["load_mapped"]["rss_anon_bytes"]
    assert os.listdir(tmp_path) == []
    assert run("bench", "hf", "--help").stdout.startswith("usage: ctorch bench hf")
    assert "--hidden" in run("bench", "hf", "--hidden", 100, rc=2).stderr
