"""ctorch train --score-mod / --mask-mod (compiled mods in the GPT's attention): the mask
ANDed with causal gives the same bits as the built-in window it spells, the expressions are
stored in the checkpoint's config so --resume (bit-exact) and generate reuse them, and the
flags' rules (exclusive with --window, refused on --resume)."""
import json

from safetensors import safe_open
from test_train import TINY, ctorch, losses


def test_mask_mod_equals_builtin_window(tmp_path):
    run = [*TINY, "--steps", 4, "--eval-every", 2, "--quiet"]
    ctorch("train", *run, "--window", 5, "--out", tmp_path / "w")
    ctorch("train", *run, "--mask-mod", "q - kv <= 5", "--out", tmp_path / "m")
    lw, lm = losses(tmp_path / "w" / "metrics.jsonl"), losses(tmp_path / "m" / "metrics.jsonl")
    assert len(lw) == 6 and lw == lm


def test_mask_mod_anded_with_doc_mask_unless_no_doc_mask(tmp_path):
    """With --no-doc-mask the compiled mask still equals the built-in window (ANDed with causal
    only); with the document mask (the default) it is ANDed in too, so the runs differ."""
    run = [*TINY, "--steps", 4, "--eval-every", 2, "--quiet"]
    ctorch("train", *run, "--window", 5, "--no-doc-mask", "--out", tmp_path / "w")
    ctorch("train", *run, "--mask-mod", "q - kv <= 5", "--no-doc-mask", "--out", tmp_path / "m")
    ctorch("train", *run, "--mask-mod", "q - kv <= 5", "--out", tmp_path / "d")
    lw, lm = losses(tmp_path / "w" / "metrics.jsonl"), losses(tmp_path / "m" / "metrics.jsonl")
    assert len(lw) == 6 and lw == lm
    assert losses(tmp_path / "d" / "metrics.jsonl") != lm


def test_mods_stored_resumed_and_generated(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    mods = ["--score-mod", "score + 0.05 * (kv - q) / (h + 1)", "--mask-mod", "q - kv <= 7 || kv < 2"]
    run = [*TINY, "--steps", 6, "--eval-every", 2, "--quiet", *mods]
    ctorch("train", *run, "--out", a)
    ctorch("train", *run, "--out", b, "--stop-at", 3)
    ctorch("train", "--resume", "--out", b, "--quiet", "--eval-every", 2)
    la, lb = losses(a / "metrics.jsonl"), losses(b / "metrics.jsonl")
    lb.pop(("eval", 3), None)
    assert la == lb and len([k for k in la if isinstance(k, int)]) == 6
    with safe_open(str(b / "checkpoint.safetensors"), framework="pt") as f:  # the safetensors library reads it
        cfg = json.loads(f.metadata()["config"])
    assert cfg["score_mod"] == mods[1] and cfg["mask_mod"] == mods[3]
    # a different mod changes training: the mods are really applied
    ctorch("train", *TINY, "--steps", 6, "--eval-every", 2, "--quiet", "--out", tmp_path / "c",
           "--score-mod", "score + 0.05 * (kv - q) / (h + 2)", "--mask-mod", mods[3])
    assert losses(tmp_path / "c" / "metrics.jsonl") != la
    g = ctorch("generate", "--model", a / "checkpoint.safetensors", "--prompt-ids", "1 2 3",
               "--max-new-tokens", 4, "--greedy", "--json")
    n = ctorch("generate", "--model", a / "checkpoint.safetensors", "--prompt-ids", "1 2 3",
               "--max-new-tokens", 4, "--greedy", "--json", "--no-cache")
    gj, nj = json.loads(g.stdout.strip().splitlines()[-1]), json.loads(n.stdout.strip().splitlines()[-1])
    assert len(gj["new_ids"]) == 4 and gj["new_ids"] == nj["new_ids"]


def test_flag_rules(tmp_path):
    r = ctorch("train", *TINY, "--window", 4, "--mask-mod", "q - kv <= 3", "--out", tmp_path, ok=False)
    assert r.returncode == 2 and "exclusive with --window" in r.stderr
    r = ctorch("train", *TINY, "--steps", 1, "--mask-mod", "q >= kv )", "--out", tmp_path / "e", ok=False)
    assert r.returncode != 0 and "position 8" in r.stderr
    ctorch("train", *TINY, "--steps", 1, "--quiet", "--out", tmp_path / "ok", "--score-mod", "score")
    r = ctorch("train", "--resume", "--out", tmp_path / "ok", "--score-mod", "score * 2", ok=False)
    assert r.returncode == 2 and "--score-mod" in r.stderr


def test_bench_compile_smoke():
    """ctorch bench compile --json at a small size: every figure present, the compiled mods give
    the built-ins' results, and the warm loads ran no process (figures are not checked)."""
    r = ctorch("bench", "compile", "--seq", 192, "--torch-seq", 64, "--no-torch-compile", "--json")
    j = json.loads(r.stdout)
    for k in ("alibi_causal_fwd_bwd", "softcap_causal_fwd_bwd"):
        for phase in (j[k], j[k]["forward"], j[k]["backward"]):
            assert phase["builtin"]["median_s"] > 0 and phase["compiled"]["median_s"] > 0
        assert j[k]["max_abs_diff"] < 1e-5
    t = j["vs_torch_dense_alibi_causal"]["torch"]  # PyTorch 2.13, flex_attention eager here
    assert t["status"] == "ok" and t["torch_version"].startswith("2.13") and t["threads"] == j["machine"]["threads"]
    assert t["dense_fwd_bwd"]["median_s"] > 0 and t["flex_fwd"]["median_s"] > 0 and t["flex_fwd"]["mode"] == "eager"
    assert t["flex_backward"]["status"].startswith("not supported: ") or t["flex_backward"]["status"] == "ok"
    assert j["cold_compile_per_kernel_s"]["median"] > 0
    assert j["warm_cache_load_ms"]["warm_load_processes"] == 0
    assert j["warm_cache_load_ms"]["warm_load_cache_hits"] == 7
    assert j["pool_8_mods"]["serial_s"] > 0 and j["pool_8_mods"]["pool_s"] > 0
