"""scripts/bench.py end to end in its --smoke mode: every section's code path (HF baselines, pretrain.py, eval.py,
the data-pipeline workers, the GPU section's end-to-end step on CPU) with tiny shapes, into a temporary folder."""

import json
import os
import subprocess
import sys

from conftest import REPO, needs_shared

BEFORE, AFTER = "# Benchmarks\n\nIntro.\n\n<!-- kernels:begin -->\nkept\n<!-- kernels:end -->\n\n## Suite\n\n", "\n\nAfter.\n"


def bench(*args, timeout=300):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(REPO / "scripts" / "bench.py"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_smoke_run_measures_every_section_and_rewrites_only_its_docs_block(tmp_path):
    shared = needs_shared("glue/SST-2").parents[1]
    docs = tmp_path / "benchmarks.md"
    docs.write_text(f"{BEFORE}<!-- bench:begin -->\nstale\n<!-- bench:end -->{AFTER}", encoding="utf-8")
    real_docs = (REPO / "docs" / "benchmarks.md").read_bytes()

    result = bench("--smoke", "--out", str(tmp_path / "out"), "--shared", str(shared), "--write-docs", str(docs))

    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (REPO / "docs" / "benchmarks.md").read_bytes() == real_docs
    data = json.loads((tmp_path / "out" / "bench.json").read_text(encoding="utf-8"))
    assert data["smoke"] is True and {"cpu", "torch", "transformers", "date"} <= data["machine"].keys()
    sections = data["sections"]
    assert list(sections) == ["train", "data", "quality", "finetune", "gpu", "generate", "token-dropping", "documents"]
    assert all(s["status"] in ("ok", "smoke-cpu") for s in sections.values()), {k: s.get("error") for k, s in sections.items()}
    assert {t["section"] for t in data["targets"]} == {"train", "data", "quality", "finetune", "gpu", "generate",
                                                        "token-dropping", "documents"}
    for t in data["targets"]:
        assert isinstance(t["value"], float) and t["value"] > 0, t
        assert t["status"] in {"PASS", "FAIL", "INFO"}, t
    train = sections["train"]
    # every pair in each precision timed (fp32 on a CPU, and bf16 where auto pretrains in it), with its peaks
    assert [(c["arch"], c["precision"]) for c in train["cases"]] == \
        [(arch, p) for arch in ("crammed-bert-tiny", "gpt-tiny") for p in train["precisions"]]
    assert train["precisions"][0] == "fp32" and train["peak_flops"] > 0 and train["peaks"]["fp32"] > 0
    assert list(dict.fromkeys(c["hf_model"] for c in train["cases"])) == ["BertForMaskedLM", "GPT2LMHeadModel"]
    assert all(set(c["models"]["ours"]["mfu_of"]) == set(train["peaks"]) for c in train["cases"])
    assert sections["quality"]["ours"]["val_loss"] == sections["quality"]["ours"]["val_loss_pretrain_py"]
    assert set(sections["data"]["runs"]) == {"ours 1x", "HF 1x", "ours 2x", "HF 2x"}
    assert sections["finetune"]["results"]["ours"]["examples"] == 64
    generate = sections["generate"]  # the cache and the recomputed prefix gave the same tokens, or it failed
    assert generate["new_tokens"] == 4 and set(generate["results"]) >= {"1"}
    assert all(r["cached_s"] > 0 and r["uncached_s"] > 0 for r in generate["results"].values())

    text = docs.read_text(encoding="utf-8")
    block = (tmp_path / "out" / "bench.md").read_text(encoding="utf-8").strip()
    assert text == f"{BEFORE}<!-- bench:begin -->\n{block}\n<!-- bench:end -->{AFTER}"
    assert block.startswith("**Smoke run") and "### Targets" in block and "### 5. GPU" in block
    assert "### 6. Generation with the KV cache" in block
    dropping = sections["token-dropping"]  # both sides trained, timed in turn
    assert dropping["keep"] == 0.5 and dropping["predicted"] > 1
    assert all(r["speedup"] > 0 for r in dropping["results"].values())
    assert "### 7. Token dropping" in block
    documents = sections["documents"]  # both objectives, with and without masking, timed in turn on packed rows
    assert documents["documents_per_row"] > 1 and set(documents["cases"]) == {"crammed-bert-tiny", "gpt-tiny"}
    assert [c["objective"] for c in documents["cases"].values()] == ["mlm", "clm"]
    assert all(r["ratio"] > 0 for c in documents["cases"].values() for r in c["results"].values())
    assert "### 8. Document masking" in block
    assert "wrote the bench block" in result.stdout


def test_bad_input_is_one_error_line(tmp_path):
    docs = tmp_path / "no-block.md"
    docs.write_text("# nothing to replace\n", encoding="utf-8")
    for args, fragment in ((["--sections", "train,nope"], "--sections has nope"),
                           (["--train-rounds", "0"], "--train-rounds=0: must be positive"),
                           (["--generate-tokens", "0"], "--generate-tokens=0: must be positive"),
                           (["--write-docs", str(docs), "--sections", "train"], "has no <!-- bench:begin -->"),
                           (["--shared", str(tmp_path / "missing")], "shared data not found")):
        result = bench(*args, "--out", str(tmp_path / "out"), timeout=60)
        assert result.returncode == 2, result.stderr
        assert result.stderr.strip().splitlines()[-1].startswith("error: ") and fragment in result.stderr


def test_the_generation_bench_times_ours_against_llama_and_gpt2():
    """scripts/bench_generate.py at a tiny size, one round: each model's row, our cache giving our uncached tokens."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_generate.py"), "--rounds", "1", "--new",
                             "3", "--prompt", "4", "--vocab", "128", "arch.num_layers=1", "arch.hidden_size=32",
                             "arch.num_heads=2", "arch.ffn_size=64"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [line.split()[0] for line in result.stdout.splitlines()[2:]]
    assert rows == ["ours", "Llama", "GPT-2"], result.stdout
