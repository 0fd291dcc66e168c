#!/usr/bin/env python3
"""Collects the device run's stage outputs (tools/gpu-run.sh) into one
results.json, with our numbers beside PyTorch's from the same call.

  gpu_results.py RAW_DIR RESULTS_JSON BUILD_INFO   (after every stage)
  gpu_results.py --summary RESULTS_JSON            (a short table for the log)
  gpu_results.py --best-stages ATTENTION_OUT       (the overlapped kernel's fastest
                                                    K/V stage count and ping-pong setting at
                                                    2640 queries: "STAGES PINGPONG")
  gpu_results.py --best-ws-tma ATTENTION_OUT       (the warp-specialised kernel's TMA build:
                                                    its fastest K/V stages and keys a step at
                                                    2640 queries: "STAGES KEYS")
"""
import csv
import json
import os
import re
import sys
import time


def json_lines(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if line.startswith("{") and line.endswith("}"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def text(path):
    if not os.path.exists(path):
        return ""
    with open(path, errors="replace") as f:
        return f.read()


def gtest_report(path):
    """tests, failures, skipped and the failed tests of one --gtest_output=json file"""
    if not os.path.exists(path):
        return {"error": "%s not written (the stage crashed, hung or did not run)" % os.path.basename(path)}
    try:
        with open(path) as f:
            g = json.load(f)
        res = {"tests": g.get("tests"), "failures": g.get("failures"), "errors": g.get("errors"),
               "disabled": g.get("disabled")}
        failed, failed_tests, skipped = [], [], 0
        for suite in g.get("testsuites", []):
            for t in suite.get("testsuite", []):
                if t.get("result") == "SKIPPED":
                    skipped += 1
                name = suite["name"] + "." + t["name"]
                if t.get("failures"):
                    failed_tests.append(name)
                # a test's first two failures: one test's many (a case per layer and frame)
                # must not hide which others failed
                for fl in t.get("failures", [])[:2]:
                    failed.append({"test": name, "message": fl.get("failure", "")[:900]})
        res["skipped"] = skipped
        res["failed_tests"] = failed_tests
        res["failed"] = failed[:30]
        return res
    except (ValueError, KeyError) as e:
        return {"error": "%s unreadable: %s" % (os.path.basename(path), e)}


def parity(raw, out_dir):
    res = gtest_report(os.path.join(out_dir, "parity.json"))
    # (the kernels' and the end-to-end reports stay with the raw outputs: $OUT takes 8 files)
    res["end_to_end_report"] = gtest_report(os.path.join(raw, "parity_e2e.json"))
    res["wgmma_report"] = gtest_report(os.path.join(raw, "parity_wgmma.json"))
    res["overlap_report"] = gtest_report(os.path.join(raw, "parity_overlap.json"))
    res["ws_report"] = gtest_report(os.path.join(raw, "parity_ws.json"))
    res["ws_tma_report"] = gtest_report(os.path.join(raw, "parity_ws_tma.json"))
    res["span_report"] = gtest_report(os.path.join(out_dir, "parity_span.json"))
    res["attention_kernel"] = text(os.path.join(raw, "attention_kernel.txt")).strip() or None
    log = "\n".join(text(os.path.join(raw, n + ".out")) for n in ("wgmma", "overlap", "ws", "ws_tma", "parity", "span",
                                                                  "e2e"))
    res["end_to_end"] = [l.strip() for l in log.splitlines() if l.startswith("end to end")]
    res["end_to_end_span_host_report"] = gtest_report(os.path.join(raw, "parity_e2e_span_host.json"))
    res["end_to_end_span_host"] = [l.strip() for l in text(os.path.join(raw, "e2e_span_host.out")).splitlines()
                                   if l.startswith("end to end")]
    res["op_errors"] = [l.strip() for l in log.splitlines() if l.startswith("  ") and "max |err|" in l][:80]
    res["device_line"] = next((l.strip() for l in log.splitlines() if l.startswith("CUDA backend:")), None)
    res["summary_lines"] = [l.strip() for l in log.splitlines() if re.match(r"^\[  (PASSED|FAILED|SKIPPED) ", l)][:40]
    return res


def sanitizer(raw, name):
    log = text(os.path.join(raw, name + ".out"))
    if not log:
        return None
    lines = [l.strip() for l in log.splitlines() if "SUMMARY" in l or "Error" in l or "error" in l]
    return {"summary": lines[-12:]}


def compare(results):
    cmp = {"mg2": [], "attention": []}
    torch_runs = {(r["sessions_batched"], r["window_latent_frames"]): r for r in results.get("torch_mg2", [])
                  if "sessions_batched" in r}
    for r in results.get("mg2", []):
        if r.get("bench") != "mg2" or "skipped" in r:
            continue
        t = torch_runs.get((r["sessions_batched"], r["window_latent_frames"]))
        row = {"sessions": r["sessions_batched"], "window": r["window_latent_frames"], "ours_forward_ms": r["forward_ms"],
               "ours_block_ms": r["block_ms"], "ours_fps": r["fps_aggregate"]}
        for k in ("attention_ms_per_forward", "attention_share_of_forward", "attention_TFLOPs", "attention_kernel",
                  "dense_ms_per_forward", "dense_TFLOPs", "other_ms_per_forward",
                  "ffn_fused_per_block", "forward_ms_ffn_unfused", "ffn_fusion_speedup",
                  "attention_fused_inputs_per_block", "forward_ms_inputs_unfused", "inputs_fusion_speedup",
                  "attention_bf16_outputs_per_block", "forward_ms_output_unfused", "output_fusion_speedup",
                  "forward_ms_gemm_autotuned", "gemm_autotune_speedup", "gemm_autotuned_plans",
                  "gemm_autotune_changes"):
            if k in r:
                row[k] = r[k]
        if t:
            row.update({"torch_forward_ms": t["forward_ms"], "torch_fps": t["fps_aggregate"],
                        "fps_ratio": round(r["fps_aggregate"] / max(1e-9, t["fps_aggregate"]), 2)})
        cmp["mg2"].append(row)
    ours = [r for r in results.get("attention", []) if r.get("split") == "auto"]
    for t in results.get("torch_attn", []):
        if "bf16_sdpa_us" not in t:
            continue
        same_q = [r for r in ours if r["query_tokens"] == t["query_tokens"]]
        if not same_q:
            continue
        by_kernel = {}
        for r in same_q:
            by_kernel.setdefault(kernel_label(r), []).append(r)
        for label, rows in by_kernel.items():
            r = min(rows, key=lambda r: abs(r["cached_tokens"] - t["cached_tokens"]))
            cmp["attention"].append({"cached_tokens": t["cached_tokens"], "ours_cached_tokens": r["cached_tokens"],
                                     "query_tokens": t["query_tokens"], "kernel": label,
                                     "torch_us": t["bf16_sdpa_us"], "ours_us": r["us"],
                                     "speedup": round(t["bf16_sdpa_us"] / max(1e-9, r["us"]), 2),
                                     "ours_GBps": r["GBps"], "ours_TFLOPs": r["TFLOPs"],
                                     "torch_GBps": t.get("bf16_GBps"), "torch_TFLOPs": t.get("bf16_TFLOPs")})
    return cmp


def kernel_label(r):
    """the attention kernel of a bench row, with its K/V stages (and keys a step)"""
    k = r.get("kernel")
    if r.get("stages"):
        k = "%s/%d" % (k, r["stages"])
    if r.get("ws_keys"):
        k = "%s/%dkeys" % (k, r["ws_keys"])
    if r.get("ws_tma"):
        k = "%s/tma" % k
    if r.get("ws_ablate"):
        k = "%s/%s" % (k, {1: "loads-only", 2: "compute-only"}.get(r["ws_ablate"], "ablated"))
    return k + "/pingpong" if r.get("pingpong") else k


def collect(raw, out_path, build_info):
    out_dir = os.path.dirname(os.path.abspath(out_path))
    results = {"written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if os.path.exists(build_info):
        results["build"] = dict(l.strip().split("=", 1) for l in open(build_info) if "=" in l)
    stages = []
    p = os.path.join(raw, "stages.csv")
    if os.path.exists(p):
        with open(p) as f:
            stages = list(csv.DictReader(f))
    results["stages"] = stages
    results["info"] = text(os.path.join(raw, "info.out"))[-2000:]
    results["parity"] = parity(raw, out_dir)
    results["memcheck"] = sanitizer(raw, "memcheck")
    results["racecheck"] = sanitizer(raw, "racecheck")
    results["attention"] = (json_lines(os.path.join(raw, "attention.out")) +
                            json_lines(os.path.join(raw, "attention_stages.out")) +
                            json_lines(os.path.join(raw, "attention_ws.out")) +
                            json_lines(os.path.join(raw, "attention_ws_tma.out")))
    # the kernel with half its work taken out (wrong outputs): rows of their own, never compared with PyTorch
    results["attention_ws_ablate"] = json_lines(os.path.join(raw, "attention_ws_ablate.out"))
    results["attention_kivi2"] = json_lines(os.path.join(raw, "attention_kivi2.out"))
    results["attention_quantwm2"] = json_lines(os.path.join(raw, "attention_quantwm2.out"))
    results["audit_probe"] = json_lines(os.path.join(raw, "audit_probe.out"))
    for name in ("ncu_ws64", "ncu_ws128", "ncu_ws_tma", "ncu_sass"):
        results[name] = text(os.path.join(raw, name + ".out"))[-20000:]
    results["ncu_split"] = text(os.path.join(raw, "ncu_split.out"))[-20000:]
    results["torch_attn"] = json_lines(os.path.join(raw, "torch_attn.out"))
    results["mg2"] = json_lines(os.path.join(raw, "mg2.out"))
    results["mg2_stages"] = (json_lines(os.path.join(raw, "mg2_stages.out")) +
                             json_lines(os.path.join(raw, "mg2_overlap.out")) +
                             json_lines(os.path.join(raw, "mg2_ws128.out")) +
                             json_lines(os.path.join(raw, "mg2_ws_tma.out")))
    results["mg2_invariant"] = json_lines(os.path.join(raw, "mg2_invariant.out"))
    results["mg2_quantwm2"] = json_lines(os.path.join(raw, "mg2_quantwm2.out"))
    results["torch_mg2"] = [r for r in json_lines(os.path.join(raw, "torch_mg2.out")) if "runs" not in r]
    results["torch_mg2_summary"] = next((r for r in json_lines(os.path.join(raw, "torch_mg2.out")) if "runs" in r), None)
    for name in ("serving", "serving_graphs"):
        serving = json_lines(os.path.join(raw, name + ".out"))
        results[name] = {"runs": [r for r in serving if r.get("bench") == "serving_run"],
                         "capacity": next((r for r in serving if r.get("bench") == "serving_capacity"), None)}
    results["comparison"] = compare(results)
    tmp = out_path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(results, f, indent=1)
    os.replace(tmp, out_path)


def summary(path):
    with open(path) as f:
        r = json.load(f)
    for s in r.get("stages", []):
        print("stage %-10s rc=%-7s %6ss (limit %s)" % (s["stage"], s["rc"], s["seconds"], s["limit"]))
    p = r.get("parity", {})
    print("attention kernel for the later stages: %s" % p.get("attention_kernel"))
    for name, rep in (("wgmma parity", p.get("wgmma_report", {})), ("overlap parity", p.get("overlap_report", {})),
                      ("warp-specialised parity", p.get("ws_report", {})),
                      ("warp-specialised TMA parity", p.get("ws_tma_report", {})),
                      ("parity", p), ("span formats", p.get("span_report", {})),
                      ("end to end", p.get("end_to_end_report", {})),
                      ("end to end, span formats coded on the host", p.get("end_to_end_span_host_report", {}))):
        if "error" in rep:
            print("%s: %s" % (name, rep["error"]))
            continue
        print("%s: %s tests, %s failures, %s skipped" % (name, rep.get("tests"), rep.get("failures"), rep.get("skipped")))
        if rep.get("failed_tests"):
            print("  failed: " + ", ".join(rep["failed_tests"]))
        for f in rep.get("failed", [])[:8]:
            print("  FAILED %s: %s" % (f["test"], f["message"].replace("\n", " ")[:300]))
    for l in p.get("end_to_end", []):
        print("  " + l)
    for l in p.get("end_to_end_span_host", []):
        print("  (span coder on the host) " + l)
    for name in ("memcheck", "racecheck"):
        s = r.get(name)
        print("%s: %s" % (name, " | ".join(s["summary"][-2:]) if s else "not run"))
    for a in r.get("comparison", {}).get("attention", []):
        print("attention N=%(cached_tokens)s q=%(query_tokens)s %(kernel)s: ours %(ours_us)s us (%(ours_GBps)s GB/s, "
              "%(ours_TFLOPs)s TF/s) vs torch %(torch_us)s us: x%(speedup)s" % a)
    for a in r.get("attention", []):
        if a.get("bench") == "attention" and a.get("query_tokens") == 64:
            print("attention q=64 N=%s split=%s %s: %s us, %s GB/s (%s%% of HBM)" % (
                a["cached_tokens"], a["split"], kernel_label(a), a["us"], a["GBps"], a["pct_hbm_4800"]))
    # each half of the warp-specialised kernel against the whole, at the same keys a step and copies
    whole = {(a.get("ws_keys"), a.get("ws_tma")): a["us"] for a in r.get("attention_ws_ablate", [])
             if a.get("bench") == "attention" and not a.get("ws_ablate")}
    for a in r.get("attention_ws_ablate", []):
        if a.get("bench") == "attention" and a.get("ws_ablate"):
            w = whole.get((a.get("ws_keys"), a.get("ws_tma")))
            print("attention q=%s N=%s %s: %s us%s" % (a["query_tokens"], a["cached_tokens"], kernel_label(a), a["us"],
                                                      " (the whole kernel %s us: %.0f%% of it)" % (w, 100 * a["us"] / w)
                                                      if w else ""))
    # KIVI-2 and QuantWM-2 against fp16 at the same cache length, query block and split, on the kernel each ran
    fp16 = {(a["cached_tokens"], a["query_tokens"], a["split"], a["kernel"]): a for a in r.get("attention", [])
            if a.get("bench") == "attention" and a.get("format", "fp16") == "fp16"}
    for a in r.get("attention_kivi2", []) + r.get("attention_quantwm2", []):
        if a.get("bench") != "attention":
            continue
        ref = fp16.get((a["cached_tokens"], a["query_tokens"], a["split"], a["kernel"]))
        print("attention %s q=%s N=%s split=%s %s: %s us, %s GB/s of its own bytes (%s of them)%s" % (
            a.get("format"), a["query_tokens"], a["cached_tokens"], a["split"], a["kernel"], a["us"], a.get("cache_GBps"),
            a.get("cache_bytes"), " vs fp16 %s us: x%.2f" % (ref["us"], ref["us"] / a["us"]) if ref and a["us"] else ""))
    for a in r.get("audit_probe", []):
        if a.get("bench") == "attention" and "probe_host_ms" in a:
            print("audit probe %s q=%s N=%s: device %s ms, host (reconstruct) %s ms: x%s" % (
                a.get("format"), a["query_tokens"], a["cached_tokens"], a.get("probe_ms"), a["probe_host_ms"],
                a.get("probe_speedup")))
    for m in r.get("comparison", {}).get("mg2", []):
        print("mg2 B=%(sessions)s W=%(window)s: ours %(ours_forward_ms)s ms/forward, %(ours_block_ms)s ms/block, "
              "%(ours_fps)s fps" % m + (" vs torch %(torch_forward_ms)s ms, %(torch_fps)s fps: x%(fps_ratio)s" % m
                                        if "torch_fps" in m else "") +
              (" [attention %(attention_ms_per_forward)s ms/forward, %(attention_TFLOPs)s TF/s, %(attention_kernel)s]" % m
               if "attention_ms_per_forward" in m else "") +
              (" [dense %(dense_ms_per_forward)s ms/forward, %(dense_TFLOPs)s TF/s; the rest %(other_ms_per_forward)s ms]"
               % m if "other_ms_per_forward" in m else "") +
              (" [ffn unfused %(forward_ms_ffn_unfused)s ms/forward: fusion x%(ffn_fusion_speedup)s]" % m
               if "ffn_fusion_speedup" in m else "") +
              (" [q, k, v converted by the attention %(forward_ms_inputs_unfused)s ms/forward: fusion "
               "x%(inputs_fusion_speedup)s]" % m if "inputs_fusion_speedup" in m else "") +
              (" [attention output converted by the projection %(forward_ms_output_unfused)s ms/forward: fusion "
               "x%(output_fusion_speedup)s]" % m if "output_fusion_speedup" in m else "") +
              (" [GEMM algorithms timed (%(gemm_autotuned_plans)s plans, %(gemm_autotune_changes)s changed) "
               "%(forward_ms_gemm_autotuned)s ms/forward: x%(gemm_autotune_speedup)s]" % m
               if "gemm_autotune_speedup" in m else ""))
    for m in r.get("mg2_stages", []):
        if "fps_aggregate" in m:
            print("mg2 B=%s W=%s %s with %s stages, ping-pong %s%s: %s ms/forward, %s fps [attention %s ms/forward, %s TF/s]" % (
                m.get("sessions_batched"), m.get("window_latent_frames"), m.get("attention_kernel"),
                m.get("attention_stages", "?"),
                m.get("attention_pingpong", "?"),
                (", %s keys a step" % m["attention_ws_keys"] if "attention_ws_keys" in m else "") +
                (", TMA" if m.get("attention_ws_tma") else ""),
                m.get("forward_ms"), m.get("fps_aggregate"), m.get("attention_ms_per_forward"),
                m.get("attention_TFLOPs")))
    for m in r.get("mg2_invariant", []):
        if "fps_aggregate" in m:
            print("mg2 B=%s W=%s every session batch-invariant: %s ms/forward, %s ms/block, %s fps" % (
                m.get("sessions_batched"), m.get("window_latent_frames"), m.get("forward_ms"), m.get("block_ms"),
                m.get("fps_aggregate")))
    for m in r.get("mg2_quantwm2", []):
        if "fps_aggregate" in m:
            print("mg2 B=%s W=%s QuantWM-2 caches: %s ms/forward (%s from a graph), %s ms/block (write pass %s ms, "
                  "%s-%s, %s statistics downloads a block; host in the appends %s ms a block, %s of it waiting "
                  "for the device), %s fps, %s KV bytes/session" % (
                      m.get("sessions_batched"), m.get("window_latent_frames"), m.get("forward_ms"),
                      m.get("forward_ms_graph"), m.get("block_ms"), m.get("write_pass_ms"),
                      m.get("write_pass_ms_min"), m.get("write_pass_ms_max"),
                      m.get("statistics_downloads_per_block"), m.get("span_append_host_ms_per_block"),
                      m.get("span_append_wait_ms_per_block"), m.get("fps_aggregate"),
                      m.get("kv_bytes_per_session_device")))
    for name in ("serving", "serving_graphs"):
        sv = r.get(name) or {}
        for run in sv.get("runs", []):
            print(name + " %(sessions)s sessions at %(fps)s fps: holds=%(holds)s, slowest %(session_fps_min)s fps, "
                  "p50 %(p50_ms)s ms, p99 %(p99_ms)s ms, step %(server_model_ms_mean)s ms" % run)
        if sv.get("capacity"):
            print(name + " capacity: %(max_sessions)s sessions hold %(fps)s fps with p99 < %(p99_ms_bound)s ms "
                  "(first failing: %(first_failing)s)" % sv["capacity"])


def fastest(rows, key):
    """key(r) of the rows whose 2640-query times add up to the least (cached lengths timed by every key)"""
    by = {}
    for r in rows:
        if r.get("query_tokens") == 2640 and r.get("stages"):
            by.setdefault(key(r), {})[r["cached_tokens"]] = r["us"]
    common = set.intersection(*(set(v) for v in by.values())) if by else set()
    if not common:
        return None
    return min(by, key=lambda k: sum(by[k][c] for c in common))


def best_stages(path):
    """the overlapped kernel's stage count and ping-pong setting that timed fastest"""
    return fastest(json_lines(path), lambda r: "%d %d" % (r["stages"], r.get("pingpong", 0)))


def best_ws_tma(path):
    """the TMA build's stage count and keys a step that timed fastest"""
    rows = [r for r in json_lines(path) if r.get("kernel") == "ws" and r.get("ws_tma")]
    return fastest(rows, lambda r: "%d %d" % (r["stages"], r.get("ws_keys", 64)))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--summary":
        summary(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] in ("--best-stages", "--best-ws-tma"):
        b = (best_stages if sys.argv[1] == "--best-stages" else best_ws_tma)(sys.argv[2])
        if b is None:
            sys.exit(1)
        print(b)
    elif len(sys.argv) == 4:
        collect(sys.argv[1], sys.argv[2], sys.argv[3])
    else:
        sys.exit(__doc__)
