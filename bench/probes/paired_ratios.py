"""Each arm's decode tok/s over the first arm's, repeat by repeat, from bench
JSON files (those written before the bench recorded `paired` itself).

    python bench/probes/paired_ratios.py bench/results/h100-q4-qwen3-8b-drafts-s41-*.json
"""

import json
import sys


def paired(path: str):
    """(case, arm, first arm, [ratio per repeat]) for every arm after the first."""
    results = json.load(open(path))
    for case in results["cases"]:
        arms = list(case["arms"].items())
        if not arms:
            continue
        first, f = arms[0]
        for name, a in arms[1:]:
            ratios = [
                r["decode_tps"] / b["decode_tps"]
                for r, b in zip(a["per_run"], f["per_run"])
            ]
            yield f"{case['suite']}/{case['name']}", name, first, ratios


def main():
    for path in sys.argv[1:]:
        for case, name, first, ratios in paired(path):
            print(json.dumps(dict(
                file=path, case=case, arm=name, against=first,
                ratios=[round(r, 3) for r in ratios],
            ), ensure_ascii=False))


if __name__ == "__main__":
    main()
