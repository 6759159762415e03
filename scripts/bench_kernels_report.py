"""The kernel benchmark's report (scripts/bench_kernels.py): its tables, its targets and the page it writes."""


BEGIN, END = "<!-- kernels:begin -->", "<!-- kernels:end -->"
EAGER_MAX_SEQ = 4096  # eager materialises (B, H, N, N) fp32 scores several times over: slow, near OOM beyond


def fmt(value):
    return "-" if value is None else f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


ATT_HEAD = ("| seq | head dim | causal | batch x heads | ours fwd | ours bwd | ours fwd+bwd | SDPA fwd | SDPA bwd | "
            "SDPA fwd+bwd | eager fwd+bwd | ours / SDPA fwd+bwd | max abs diff out / grad |\n"
            "|---:|---:|:---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
ROT_HEAD = ("| head dim | rotary pct | seq | batch x heads | ours GB/s | eager GB/s | speedup | % of peak | % of copy "
            "| ours as called | eager as called | max abs diff out / grad |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")


def cells(r, *pairs):
    """Each (impl, key) as a number, or the first word of why it is missing; then the diff cell."""
    def one(impl, key):
        status = r["impls"].get(impl, {}).get("status", "not run")
        return fmt(r["impls"][impl].get(key)) if status == "ok" else status.split(":")[0].split(" (")[0]
    diff = "-" if "max_abs_diff_out" not in r else f"{r['max_abs_diff_out']:.2g} / {r['max_abs_diff_grad']:.2g}"
    return [one(impl, key) for impl, key in pairs], diff


def att_line(r):
    nums, diff = cells(r, *[(impl, f"{p}_tflops") for impl in ("ours", "sdpa") for p in ("fwd", "bwd", "fwdbwd")],
                       ("eager", "fwdbwd_tflops"))
    return " | ".join(["", str(r["seq"]), str(r["head_dim"]), "yes" if r["causal"] else "no",
                       f"{r['batch']} x {r['heads']}", *nums, fmt(r.get("ratio_fwdbwd")), diff, ""]).strip()


def rot_line(r):
    (ours, eager, ours_called, eager_called), diff = cells(r, ("ours", "gbps"), ("eager", "gbps"),
                                                           ("ours", "called_gbps"), ("eager", "called_gbps"))
    pct = [("-" if r.get(key) is None else f"{100 * r[key]:.0f} %") for key in ("frac_peak", "frac_copy")]
    return " | ".join(["", str(r["head_dim"]), str(r["rotary_pct"]), str(r["seq"]), f"{r['batch']} x {r['heads']}",
                       ours, eager, fmt(r.get("speedup")), *pct, ours_called, eager_called, diff, ""]).strip()


def target(name, rows, key, expected, threshold=None):
    """PASS only when every expected case was measured and all reach the threshold; INFO when there is none."""
    values = [r[key] for r in rows if key in r]
    status = ("NOT MEASURED" if not values else "INFO" if threshold is None else "FAIL" if min(values) < threshold
              else "PASS" if len(values) == expected else "INCOMPLETE")
    return {"name": name, "status": status, "threshold": threshold, "worst": min(values, default=None),
            "measured": len(values), "expected": expected}


def evaluate_targets(res, grid):
    seqs, dim, rot = grid["target_seqs"], grid["target_dim"], res["rotary"]
    att = [r for r in res["attention"] if r["head_dim"] == dim and r["seq"] in seqs]
    return [target(f"attention fwd+bwd >= 1.0x SDPA, head dim {dim}, seq {min(seqs)}-{max(seqs)}, causal and not",
                   att, "ratio_fwdbwd", 2 * len(seqs), 1.0),
            target("rotary fwd+bwd >= 4x eager", rot, "speedup", len(rot), 4.0),
            target("rotary fwd+bwd >= 70 % of peak memory bandwidth", rot, "frac_peak", len(rot), 0.70),
            target("rotary fwd+bwd, fraction of the measured copy_ bandwidth", rot, "frac_copy", len(rot)),
            target("rotary fwd+bwd as called (host overhead included), speedup over eager", rot, "speedup_called",
                   len(rot))]


def target_line(t):
    worst = "-" if t["worst"] is None else f"{t['worst']:.3g}"
    return f"{t['status']}: {t['name']} (worst {worst}, {t['measured']} of {t['expected']} cases)"


def render(res):
    d, v, s, cpu = res["device"], res["versions"], res["settings"], res["device"]["name"].startswith("CPU")
    timing = ("one `time.perf_counter` run" if cpu else f"median of `triton.testing.do_bench` (warmup "
              f"{s['warmup_ms']} ms, rep {s['rep_ms']} ms, L2 flushed before each run)")
    unhidden = sum(i.get("host_hidden") is False for r in res["rotary"] for i in r["impls"].values())
    tables = max((r["table_bytes_fraction"] for r in res["rotary"]), default=0)
    lines = [("**Smoke run (`--smoke`: tiny shapes, fp32 on CPU under the Triton interpreter): the numbers below "
              "are meaningless.**"), ""] if res["smoke"] else []
    lines += [(f"Measured on {d['name']} ({res['date']}), torch {v['torch']}, triton {v['triton']}, CUDA "
               f"{v['cuda'] or 'n/a'}, with `{res['command']}`. Timing: {timing}."), "",
              f"### Attention ({res['dtype']}, TFLOP/s)", "",
              "Hidden 2048 (heads = 2048 / head dim), batch = 16384 // seq. FLOPs: forward 4·B·H·N²·D, halved when "
              "causal; backward 2.5x and fwd+bwd 3.5x the forward. SDPA: "
              + ("default backend (CPU)" if cpu else "flash backend only (`sdpa_kernel(SDPBackend.FLASH_ATTENTION)`)")
              + f". Eager is skipped above seq {EAGER_MAX_SEQ}. Max abs diff: ours vs SDPA, output / dq, dk, dv.", "",
              ATT_HEAD, *map(att_line, res["attention"]), "", f"### Rotary ({res['dtype']}, fwd+bwd GB/s)", "",
              ("CPU: both columns are plain timings. " if cpu else
               "GB/s: calls queued behind a GPU sleep, so host overhead (Python, autograd, launches) is hidden and the "
               "GPU runs them back to back, L2 flushed before each; these decide the targets. 'As called': do_bench, "
               "host overhead included. " + (f"{unhidden} measurements could not fully hide it (host_hidden false in "
                                             "kernels.json). " if unhidden else ""))
              + "Bytes = 4 · numel · itemsize (read x, write out, read grad, write grad); the fp32 cos/sin tables are "
              f"not counted (at most {100 * tables:.2g} % of those bytes here). Peak: "
              + (f"{d['peak_tbps']:.4g} TB/s ({d['peak_source']})" if d["peak_tbps"] else "unknown for this card")
              + f"; copy: measured `copy_` of a large tensor, {fmt(d['copy_gbps'])} GB/s (read + write).", "",
              ROT_HEAD, *map(rot_line, res["rotary"]), "", "### Targets", "",
              *(f"- {target_line(t)}" for t in res["targets"])]
    return "\n".join(lines + ([""] + [f"- {note}" for note in res["notes"]] if res["notes"] else [])) + "\n"


def write_docs(path, markdown):
    """Replace what lies between the markers (append a Kernels section holding them if they are missing)."""
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    block = f"{BEGIN}\n{markdown.strip()}\n{END}"
    if BEGIN in text and END in text.split(BEGIN, 1)[1]:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip() + ("\n\n" if text.strip() else "") + "## Kernels\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")
