"""Where a launch of the Hopper schedule waits, from Nsight Compute's per-instruction stall samples
(``ncu --section SourceCounters ... -o REP``, then ``ncu -i REP --page source --csv --print-source sass >
FILE.csv``; ``gpu.sh s10-probe`` writes them). For each file: the share of samples in the consumers' loop body
(instructions run once per key block), in code run once per program (prologue, last block, epilogue: what a
program pays whatever its list length) and in the load partition, each with its main stall reasons; then the
loop body of the first consumer by opcode.

    python benchmarks/experiments/ncu_stalls.py FILE.csv [...]
"""

from __future__ import annotations

import collections
import csv
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def read(path: str) -> tuple[list[str], list[dict[str, str]]]:
    rows = list(csv.reader(open(path)))
    header = rows[1]
    return header, [dict(zip(header, row)) for row in rows[2:] if len(row) == len(header)]


def regions(data: list[dict[str, str]]) -> dict[str, list[int]]:
    """Instruction indices by region. The load partition is the code around the first bulk tensor copy
    (UTMALDG) to the end; the loop body is what runs most often; code run under a tenth as often is per
    program."""
    count = [int(d[EXECUTED] or 0) for d in data]
    first_copy = next(i for i, d in enumerate(data) if "UTMALDG" in d["Source"])
    tally = collections.Counter(count)
    loop = max(c for c, n in tally.items() if n > 300)
    out: dict[str, list[int]] = collections.defaultdict(list)
    for i, c in enumerate(count):
        if i >= first_copy - 150:
            out["load partition"].append(i)
        elif c == loop:
            out["loop body"].append(i)
        elif 0 < c < loop // 10:
            out["once per program"].append(i)
    return out


def has_loop(data: list[dict[str, str]]) -> bool:
    """Whether some instruction ran more than three times as often as the kernel's first one (once per warp of
    every program): a loop over key blocks ran. With empty lists none does (the most, 1.5 times, is the partitions'
    dispatch), and ``regions`` would call the consumers' epilogue a loop."""
    counts = [int(d[EXECUTED] or 0) for d in data]
    return max(counts) > 3 * counts[0]


def top(data: list[dict[str, str]], reasons: list[str], total: int, n: int = 14) -> None:
    """The ``n`` instructions with the most samples, with their main stall reasons: where a launch waits, whatever
    its shape (with empty lists there is no loop, only what every program pays)."""
    ranked = sorted(range(len(data)), key=lambda i: -int(data[i][SAMPLES] or 0))[:n]
    print(f"  the {n} instructions with the most samples:")
    for i in ranked:
        samples = int(data[i][SAMPLES] or 0)
        why = collections.Counter({r[6:]: int(data[i][r] or 0) for r in reasons})
        print(f"    {i:5} {100 * samples / max(total, 1):5.1f} % x{data[i][EXECUTED]:>8} {data[i]['Source'][:60]:60} "
              + ", ".join(f"{r} {m}" for r, m in why.most_common(2)))


def main() -> None:
    for path in sys.argv[1:]:
        header, data = read(path)
        reasons = [h for h in header if h.startswith("stall_") and "Not Issued" not in h]
        total = sum(int(d[SAMPLES] or 0) for d in data)
        print(f"== {path}: {total} samples")
        top(data, reasons, total)
        if not has_loop(data):
            continue  # no key-block loop ran (empty lists): the instructions above are all there is
        parts = regions(data)
        for name, idx in parts.items():
            samples = sum(int(data[i][SAMPLES] or 0) for i in idx)
            why = collections.Counter({r[6:]: sum(int(data[i][r] or 0) for i in idx) for r in reasons})
            print(f"  {name:17} {len(idx):5} instructions {100 * samples / total:5.1f} % of samples: "
                  + ", ".join(f"{r} {100 * n / max(samples, 1):.0f} %" for r, n in why.most_common(5)))
        body = parts["loop body"]
        gaps = [n for n, (a, b) in enumerate(zip(body, body[1:]), 1) if b - a > 50]  # one copy per consumer
        first = body[:gaps[0]] if gaps else body
        by_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        ops = collections.Counter()
        for i in first:
            words = data[i]["Source"].split()
            op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
            ops[op] += 1
            for r in reasons:
                by_op[op][r[6:]] += int(data[i][r] or 0)
        body_samples = sum(sum(c.values()) for c in by_op.values())
        print(f"  first consumer's loop body, {len(first)} instructions, by opcode:")
        for op, why in sorted(by_op.items(), key=lambda kv: -sum(kv[1].values()))[:8]:
            print(f"    {op:10} x{ops[op]:3} {100 * sum(why.values()) / body_samples:5.1f} %: "
                  + ", ".join(f"{r} {n}" for r, n in why.most_common(3)))


if __name__ == "__main__":
    main()
