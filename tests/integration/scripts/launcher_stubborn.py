"""A worker that ignores SIGTERM (OUT/ready appears once it does) and never exits by itself."""

from __future__ import annotations

import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(os.path.join(sys.argv[1], "ready"), "w") as f:
    f.write(str(os.getpid()))
time.sleep(120)
