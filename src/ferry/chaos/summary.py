"""What a soak reports: the faults injected, what the job did about them, the verdict."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Summary:
    seed: int
    rounds: int = 0
    injected: Counter[str] = field(default_factory=Counter)
    skipped_kinds: dict[str, str] = field(default_factory=dict)
    checkpoints: int = 0
    checkpoint_failures: int = 0
    supervisor_runs: int = 0
    failed_runs: int = 0
    worker_starts: int = 0
    steps: int = 0
    steps_recomputed: int = 0
    remote: bool = False
    """Checkpoints were copied to a remote (the ``remote-down`` fault is drawn)."""
    remote_outage_seconds: float = 0.0
    remote_copies: int = 0
    remote_copy_failures: int = 0
    remote_copies_skipped: int = 0
    """Copies that had not started when a newer checkpoint's copy was asked for."""
    remote_retries: int = 0
    """Tries of copies that failed and were retried (also of copies a kill cut short)."""
    remote_verified: int = 0
    """Checkpoints the remote listed as committed at the end of each round, all read back
    and checked against their manifests (one that fails is a difference)."""
    differences: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def equal(self) -> bool:
        return not self.differences

    def as_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["injected"] = dict(sorted(self.injected.items()))
        doc["events"] = sum(self.injected.values())
        doc["equal"] = self.equal
        return doc

    def table(self) -> str:
        rows = [("seed", str(self.seed)), ("rounds (full runs under chaos)", str(self.rounds))]
        rows.append(("events injected", str(sum(self.injected.values()))))
        rows += [(f"  {k}", str(v)) for k, v in sorted(self.injected.items())]
        rows += [(f"  {k} (skipped)", why) for k, why in self.skipped_kinds.items()]
        rows += [
            ("checkpoints committed", str(self.checkpoints)),
            ("checkpoint saves failed", str(self.checkpoint_failures)),
        ]
        if self.remote:
            rows += [
                ("remote down in all (seconds)", f"{self.remote_outage_seconds:.1f}"),
                ("copies to the remote committed", str(self.remote_copies)),
                ("copies to the remote failed", str(self.remote_copy_failures)),
                ("copies skipped for a newer checkpoint", str(self.remote_copies_skipped)),
                ("  tries retried during copies", str(self.remote_retries)),
                ("remote checkpoints verified", str(self.remote_verified)),
            ]
        rows += [
            ("`ferry run` invocations", str(self.supervisor_runs)),
            ("  of which failed after a late fault", str(self.failed_runs)),
            ("worker starts", str(self.worker_starts)),
            ("steps per run", str(self.steps)),
            ("steps lost and recomputed", str(self.steps_recomputed)),
            ("seconds", f"{self.seconds:.1f}"),
            ("result", "EQUAL to the uninterrupted run" if self.equal else "DIFFERENT"),
        ]
        rows += [("  difference", d) for d in self.differences[:20]]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def summary_json(summary: Summary) -> str:
    return json.dumps(summary.as_dict(), indent=1, sort_keys=True)
