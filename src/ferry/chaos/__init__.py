"""``ferry chaos``: a soak test of the whole product (docs/chaos.md).

- ``soak``: the options, the fault kinds and the loop that injects them;
- ``faults``: killing process trees, a checkpoint filesystem that can be filled;
- ``remote``: an S3 server behind a relay that can be cut (``remote-down``);
- ``outputs``: comparing a round's outputs with the reference's;
- ``summary``: the report.
"""

from ferry.chaos.soak import KINDS, ChaosError, ChaosOptions, Soak
from ferry.chaos.summary import Summary, summary_json

__all__ = ["KINDS", "ChaosError", "ChaosOptions", "Soak", "Summary", "summary_json"]
