"""The compatibility harness: run real framework code plain and under `ferry run`, and
compare everything the user sees (exit code, printed lines, the files the job wrote).

"Do no harm": an uninterrupted `ferry run` must behave exactly like plain `python`. "Exact":
a run stopped and resumed under ferry must end as the plain run ends. Lines ferry prints
itself (they start with ``ferry``) are set aside; everything else is compared, after a
caller's ``scrub`` has removed what differs between two plain runs too (wall-clock
figures such as HF's ``train_runtime``).

    ref = plain(argv, work / "plain", env)
    got = under_ferry(argv, work / "ferry", env, stop=StopAfter("log.txt", lines=12))
    again = under_ferry(argv, work / "ferry", env)       # the resume, in the same folder
    assert_same(ref, again)
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

FERRY = str(Path(sys.executable).parent / "ferry")
CHECKPOINTS = "ferry-ck"
"""The folder (inside the run's working folder) ferry's checkpoints go to; never compared."""
_FERRY_LINE = re.compile(r"^(ferry|ferry run)(:| \[)")

Scrub = Callable[[str, str], str]
"""(name of the stream or file, its text) -> the text with run-to-run noise removed."""


def no_scrub(name: str, text: str) -> str:
    return text


@dataclass
class Outcome:
    """What a user sees of one run."""

    returncode: int
    stdout: list[str]
    stderr: list[str]
    """Without ferry's own lines."""
    ferry: list[str]
    """ferry's own lines (both streams)."""
    files: dict[str, str]
    """Every file the job wrote under its working folder (relative path -> its text, or
    its sha256 for binary files), ferry's checkpoints aside."""
    exit_lag: float = 0.0
    """Seconds from the job's last line of output to its exit."""
    log: list[str] = field(default_factory=list)


@dataclass
class StopAfter:
    """Send ``signum`` to ``ferry run`` once the file ``name`` (relative to the working
    folder) holds ``lines`` lines, or once stdout has, when ``name`` is "stdout"; with
    ``containing``, only the lines that contain that text are counted."""

    name: str
    lines: int
    signum: int = signal.SIGTERM
    containing: str | None = None

    def count(self, lines: Sequence[str]) -> int:
        return len(lines) if self.containing is None else sum(self.containing in x for x in lines)


def env_for(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    env.update(FERRY_HOME=str(home), PYTHONUNBUFFERED="1", **extra)
    return env


def _files(folder: Path, scrub: Scrub) -> dict[str, str]:
    found: dict[str, str] = {}
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if not path.is_file() or rel.split("/")[0] == CHECKPOINTS:
            continue
        data = path.read_bytes()
        try:
            found[rel] = scrub(rel, data.decode())
        except UnicodeDecodeError:
            found[rel] = "sha256:" + hashlib.sha256(data).hexdigest()
    return found


def _pump(stream: object, into: list[str], stamps: list[float], watch: Callable[[], None]) -> None:
    for line in stream:  # type: ignore[attr-defined]
        into.append(line.rstrip("\n"))
        stamps.append(time.monotonic())
        watch()


def _launch(
    argv: Sequence[str],
    cwd: Path,
    env: dict[str, str],
    scrub: Scrub,
    stop: StopAfter | None,
    timeout: float,
) -> Outcome:
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen(
        list(argv), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    out: list[str] = []
    err: list[str] = []
    stamps: list[float] = []
    sent = threading.Event()

    def watch() -> None:
        if stop is None or sent.is_set():
            return
        if stop.name == "stdout":
            count = stop.count(out)
        else:
            path = cwd / stop.name
            count = stop.count(path.read_text().split("\n")[:-1]) if path.exists() else 0  # whole lines
        if count >= stop.lines:
            sent.set()
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(stop.signum)

    pumps = [
        threading.Thread(target=_pump, args=(proc.stdout, out, stamps, watch), daemon=True),
        threading.Thread(target=_pump, args=(proc.stderr, err, stamps, watch), daemon=True),
    ]
    for t in pumps:
        t.start()
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        watch()  # a file-based stop is checked while the job is silent too
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{argv} did not end within {timeout} s:\n" + "\n".join(err[-40:]))
    ended = time.monotonic()
    for t in pumps:
        t.join(timeout=10)
    if stop is not None and not sent.is_set():
        raise AssertionError("the job ended before the stop was due:\n" + "\n".join(err[-40:]))
    ferry = [line for line in out + err if _FERRY_LINE.match(line)]
    text = lambda name, lines: scrub(name, "\n".join(x for x in lines if not _FERRY_LINE.match(x)))  # noqa: E731
    return Outcome(
        returncode=proc.returncode,
        stdout=text("stdout", out).splitlines(),
        stderr=text("stderr", err).splitlines(),
        ferry=ferry,
        files=_files(cwd, scrub),
        exit_lag=ended - max(stamps, default=ended),
        log=err,
    )


def plain(
    argv: Sequence[str],
    cwd: Path,
    env: dict[str, str],
    *,
    stop: StopAfter | None = None,
    scrub: Scrub = no_scrub,
    timeout: float = 300,
) -> Outcome:
    """``argv`` (``[sys.executable, script, ...]``) run as it is, in ``cwd`` (``stop``: a
    script that uses ferry's explicit API, stopped by a signal)."""
    return _launch(argv, cwd, env, scrub, stop, timeout)


def under_ferry(
    argv: Sequence[str],
    cwd: Path,
    env: dict[str, str],
    *,
    options: Sequence[str] = (),
    stop: StopAfter | None = None,
    scrub: Scrub = no_scrub,
    timeout: float = 300,
) -> Outcome:
    """``ferry run [options] -- argv`` in ``cwd``, its checkpoints in ``cwd/ferry-ck``."""
    cmd = [FERRY, "run", "--dir", str(cwd / CHECKPOINTS), "--job-id", "compat", *options, "--", *argv]
    return _launch(cmd, cwd, env, scrub, stop, timeout)


def _diff(what: str, a: Sequence[str], b: Sequence[str]) -> str:
    lines = list(difflib.unified_diff(list(a), list(b), "plain", "ferry", lineterm="", n=2))
    return f"{what} differ:\n" + "\n".join(lines[:60])


def assert_same(ref: Outcome, got: Outcome, *, streams: Sequence[str] = ("stdout", "stderr")) -> None:
    """Everything the user sees equal: exit code, each stream in ``streams`` line for line
    (ferry's own lines aside), every file byte for byte (after the scrub)."""
    assert got.returncode == ref.returncode, (
        f"exit {got.returncode}, plain exit {ref.returncode}:\n" + "\n".join(got.log[-40:])
    )
    for name in streams:
        a, b = getattr(ref, name), getattr(got, name)
        assert a == b, _diff(name, a, b) + "\n--- ferry said:\n" + "\n".join(got.ferry)
    assert sorted(ref.files) == sorted(got.files), _diff("file lists", sorted(ref.files), sorted(got.files))
    for name, text in ref.files.items():
        assert got.files[name] == text, _diff(name, text.splitlines(), got.files[name].splitlines())
