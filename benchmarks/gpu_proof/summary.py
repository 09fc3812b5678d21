"""gpu_proof.sh, the last step: ``OUT/summary.md`` from ``env.json``, ``results.jsonl`` (the
parts' rows, and each part's plan: the checks it means to make) and ``parts.tsv`` (each
part's command, exit code and seconds). A planned check that has no row is listed as FAIL
(its part ended before it: a timeout, a crash) or SKIPPED (its part never started), so that
nothing is left out in silence.

    python summary.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GOALS_HEADER = "| part | check | figure | goal | result |\n| --- | --- | --- | --- | --- |"


def _cell(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _disk(doc: Any) -> str:
    return f"{doc['total']} GiB, {doc['free']} free" if isinstance(doc, dict) else "?"


def _load(out: Path) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, list[str]], list[list[str]]]:
    env = json.loads((out / "env.json").read_text()) if (out / "env.json").exists() else {}
    rows: list[dict[str, Any]] = []
    plans: dict[str, list[str]] = {}
    results = out / "results.jsonl"
    for line in results.read_text().splitlines() if results.exists() else []:
        try:
            doc = json.loads(line)
        except json.JSONDecodeError:
            continue
        if "plan" in doc:
            plans[doc["part"]] = list(doc["plan"])
        else:
            rows.append(doc)
    parts = (
        [line.split("\t") for line in (out / "parts.tsv").read_text().splitlines()]
        if (out / "parts.tsv").exists()
        else []
    )
    return env, rows, plans, parts


def _missing(
    rows: list[dict[str, Any]], plans: dict[str, list[str]], parts: list[list[str]]
) -> list[dict[str, Any]]:
    """A row for each planned check that has none."""
    started = {p[0]: p for p in parts}
    out = []
    for part, checks in plans.items():
        have = {r["check"] for r in rows if r["part"] == part}
        for check in checks:
            if check in have:
                continue
            run = started.get(part)
            note = (
                f"no result: the part ended ({run[1]}) before this check"
                if run
                else "the part did not run (no time left)"
            )
            out.append(
                {
                    "part": part,
                    "check": check,
                    "figure": "-",
                    "goal": "-",
                    "status": "FAIL" if run else "SKIPPED",
                    "note": note,
                }
            )
    return out


def render(out: Path) -> str:
    env, rows, plans, parts = _load(out)
    rows += _missing(rows, plans, parts)
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("PASS", "FAIL", "UNAVAILABLE", "SKIPPED")}
    gpu = env.get("name", "no GPU")
    lines = [
        f"# gpu_proof: {gpu}",
        "",
        f"- GPU: {env.get('nvidia_smi', '?')} (torch sees {env.get('gpus', '?')}: {gpu}, "
        f"{env.get('gpu_memory_gib', '?')} GiB, compute capability {env.get('capability', '?')})",
        f"- driver's CUDA: {env.get('driver_cuda', '?')} (nvidia-smi: {env.get('nvidia_smi_cuda', '?')}); "
        f"torch's CUDA: {env.get('torch_cuda', '?')}",
        f"- runtime: {env.get('runtime', '?')}; {env.get('cpus', '?')} CPUs, "
        f"{env.get('host_memory_gib', '?')} GiB of host memory; /tmp: {_disk(env.get('tmp_disk_gib'))}",
        f"- Python {env.get('python', '?')}; "
        + ", ".join(f"{k} {v}" for k, v in (env.get("packages") or {}).items()),
        f"- results: {', '.join(f'{n} {s}' for s, n in counts.items())}",
        "",
        GOALS_HEADER,
    ]
    for r in rows:
        result = r["status"] + (f" ({_cell(r['note'])})" if r.get("note") else "")
        cells = [_cell(r[k]) for k in ("part", "check", "figure", "goal")]
        lines.append(f"| {' | '.join(cells)} | {result} |")
    lines += ["", "Each part, as it ran (exit code: 124 timed out; seconds; its timeout):", "", "```"]
    lines += [f"[{p[0]}] exit {p[1]}, {p[2]} s of {p[3]} s: {p[4]}" for p in parts if len(p) >= 5]
    lines += ["```", ""]
    return "\n".join(lines)


def main() -> None:
    out = Path(sys.argv[1])
    (out / "summary.md").write_text(render(out))


if __name__ == "__main__":
    main()
