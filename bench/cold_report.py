#!/usr/bin/env python3
"""The cold-storage benchmark's report: ``bench/cold_report.py RESULTS.jsonl REPORT.md``.

Reads the JSON lines bench/cold.py wrote and writes a Markdown report: one table of every
run (samples/s, storage bytes and reads per epoch, peak memory, the strategy meshfeed
chose) and the targets of issue 21 checked one by one; a missed target names the phase
that took the time and the measurement. Prints the targets' lines on stdout.
"""

import collections
import json
import sys

MiB = 1 << 20


def rate(e):
    return e["samples"] / max(e["seconds"], 1e-9)


def median(xs):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def fmt_rate(r):
    return f"{r:,.0f}" if r is not None else "—"


def main(results, report):
    limits, runs = {}, collections.defaultdict(dict)
    for line in open(results):
        r = json.loads(line)
        key = (r["size"], r["format"])
        if r["kind"] == "limit":
            limits[key] = r
        else:
            runs[key][(r["scenario"], r["loader"])] = r
    out = ["# meshfeed on cold storage", ""]
    lim = next(iter(limits.values()), None)
    if lim:
        out += [f"Storage throttled to {lim['bps'] / 1e6:.0f} MB/s and {lim['iops']} reads/s "
                "(a loop device of its own,",
                "cgroup block-I/O throttling), page cache of the dataset dropped before each run, every loader of a",
                "scenario under the same cgroup memory limit (page cache included). 4 ranks. Rates in samples/s;",
                "storage bytes as a multiple of the dataset; peak: the cgroup's peak memory (page cache included).",
                f"Measured {lim['date']} at git {lim['git_rev']}.", ""]
    out += ["| sample | format | scenario | loader | strategy | epoch 0 | epoch 1 | epoch 2 "
            "| storage read (× data) per epoch | reads per epoch | limit MiB | peak MiB | OOM |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    targets = []
    for key in sorted(runs, key=lambda k: (k[0], k[1])):
        size, fmt = key
        L = limits.get(key)
        data = L["data_bytes"] if L else 1
        for (scenario, loader), r in sorted(runs[key].items()):
            es = r["epochs"]
            rates = [fmt_rate(rate(e)) + ("*" if r["stopped"] and i == len(es) - 1 else "") for i, e in enumerate(es)]
            rates = rates[:3] + ["—"] * (3 - len(rates))
            strategy = es[0].get("read_strategy", "") if es else ""
            if strategy == "passes":
                strategy += f" ({es[0].get('passes')})"
            if es and es[0].get("spill"):
                strategy += ", spill"
            storage = " / ".join(f"{e['storage_bytes'] / data:.2f}" for e in es) or "—"
            reads = " / ".join(f"{e['storage_reads']}" for e in es) or "—"
            status = "" if r["ok"] else f" (failed: exit {r['exit']})"
            out.append(f"| {size} | {fmt} | {scenario} | {loader}{status} | {strategy} | {rates[0]} | {rates[1]} | "
                       f"{rates[2]} | {storage} | {reads} | {r.get('memory_limit', 0) / MiB:.0f} | "
                       f"{r['cgroup_peak_bytes'] / MiB:.0f} | {r['oom_kills']} |")
        targets += check(key, L, runs[key])
    out += ["", "`*` an epoch stopped at the time limit (its rate is that of the samples so far).", "",
            "## Targets", ""]
    out += [f"- {t}" for t in targets]
    with open(report, "w") as f:
        f.write("\n".join(out) + "\n")
    print("\n".join(f"- {t}" for t in targets))


def slowest_phase(e):
    phases = e.get("phase_s") or {}
    if not phases:
        return ""
    p, s = max(phases.items(), key=lambda kv: kv[1])
    return f"; slowest phase {p} {s:.2f} s of {e['seconds']:.2f} s"


def check(key, L, runs):
    size, fmt = key
    name = f"{size} {fmt}"
    res = []
    if not L:
        return res
    samples, data = L["samples"], L["data_bytes"]
    seq_sps = samples / (data / L["sequential"]["bytes_per_s"])
    # One read per sample: at the device's reads/s, or its bandwidth where samples are
    # large enough for that to bind first (1 MiB at 250 MB/s: 238/s, not 3 000/s).
    floor = min(L["iops_floor_samples_per_s"], seq_sps)

    def mark(ok, text):
        res.append(f"{'met' if ok else 'MISSED'}: {name}: {text}")

    warm = runs.get(("warm", "meshfeed:warm"))
    warm_rate = median([rate(e) for e in warm["epochs"][1:]]) if warm and warm["ok"] else None

    def torch_best(scenario, i):
        best = None
        for v in ("pytorch:memmap", "pytorch:pread"):
            r = runs.get((scenario, v))
            if r and r["ok"] and len(r["epochs"]) > i:
                best = max(best or 0, rate(r["epochs"][i]))
        return best

    for scenario in ("fits", "over", "spill"):
        r = runs.get((scenario, "meshfeed"))
        if not r:
            continue
        es = r["epochs"]
        if not r["ok"] or r["oom_kills"]:
            mark(False, f"{scenario}: meshfeed failed (exit {r['exit']}, OOM kills {r['oom_kills']}): {r.get('error')}")
            continue
        mark(r["oom_kills"] == 0, f"{scenario}: no OOM kill under a {r['memory_limit'] / MiB:.0f} MiB limit")
        if scenario == "fits" and es:
            e0 = es[0]
            mark(rate(e0) >= 0.8 * seq_sps,
                 f"fits: epoch 0 {rate(e0):,.0f}/s ≥ 0.8 × the sequential limit {seq_sps:,.0f}/s"
                 f" ({rate(e0) / seq_sps:.2f}×){slowest_phase(e0)}")
            later = es[1:]
            read = sum(e["storage_bytes"] for e in later)
            mark(read <= data / 100, f"fits: epochs 1-{len(later)} read {read / MiB:.1f} MiB from storage (0 expected)")
            if warm_rate and later:
                r = median([rate(e) for e in later])
                mark(r >= warm_rate / 1.25,
                     f"fits: epochs 1-{len(later)} (median) {r:,.0f}/s within 1.25× of warm-cache speed (median) "
                     f"{warm_rate:,.0f}/s ({warm_rate / r:.2f}×){slowest_phase(later[-1])}")
        if scenario == "over" and len(es) >= 1:
            today = runs.get(("over", "meshfeed:today"))
            passes = runs.get(("over", "meshfeed:passes"))
            k = passes["epochs"][0].get("passes") if passes and passes["ok"] and passes["epochs"] else None
            # Without a forced run (--loaders), the passes meshfeed chose itself.
            k = k or (es[0].get("passes") if es[0].get("read_strategy") == "passes" else None)
            best_limit = max(seq_sps / k if k else 0, floor)
            e = es[-1]
            mark(rate(e) >= 0.8 * best_limit,
                 f"over: epoch {len(es) - 1} {rate(e):,.0f}/s ≥ 0.8 × max(sequential / {k} passes, IOPS floor) = "
                 f"{best_limit:,.0f}/s ({rate(e) / best_limit:.2f}×){slowest_phase(e)}; chose "
                 f"{e.get('read_strategy')}; storage {e['storage_bytes'] / data:.2f}× data, {e['storage_reads']} reads")
            if size == "medium" and today and today["ok"] and today["epochs"]:
                t = rate(today["epochs"][-1])
                mark(rate(e) >= 1.2 * t, f"over: epoch {len(es) - 1} {rate(e):,.0f}/s ≥ 1.2 × today's defaults' "
                                         f"{t:,.0f}/s ({rate(e) / t:.2f}×)")
        local = runs.get(("spill", "meshfeed:local"))
        if scenario == "spill" and len(es) >= 2 and local and local["ok"] and len(local["epochs"]) >= 2:
            e = es[-1]
            ref = median([rate(x) for x in local["epochs"][1:]])
            mark(rate(e) >= 0.8 * ref,
                 f"spill: epoch {len(es) - 1} {rate(e):,.0f}/s ≥ 0.8 × the node-local device's rate {ref:,.0f}/s "
                 f"(the data on it, same memory limit; {rate(e) / ref:.2f}×); shared storage "
                 f"{e['storage_bytes'] / data:.2f}× data{slowest_phase(e)}")
        if scenario in ("fits", "over"):
            for i, e in enumerate(es[:2]):
                t = torch_best(scenario, i)
                if t:
                    mark(rate(e) >= 5 * t, f"{scenario}: epoch {i} {rate(e):,.0f}/s ≥ 5 × PyTorch's better variant "
                                           f"{t:,.0f}/s ({rate(e) / t:.1f}×)")
    return res


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
