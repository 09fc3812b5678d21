"""What a checkpoint says of the script's files and of a library's loop is untrusted. File
records (autotrack/outputs.py): ferry shortens only the files the resumed script itself opens
for writing, and those it opens after the restore point as it opens them; a record naming any
other file (a crafted checkpoint that knows a file's bytes) leaves it alone (before, it was
truncated at the restore point). A library loop's saved place (autotrack/libloops.py) is said
only when it is plain text, never a forged line or a terminal escape."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import xxhash

SCRIPT = textwrap.dedent(
    """
    import sys
    from ferry.autotrack.outputs import Outputs

    victim, later, before, records = sys.argv[1], sys.argv[2], sys.argv[3], eval(sys.argv[4])
    outputs = Outputs(lambda filename: filename == __file__, lambda: True)
    outputs.watch()
    log = open(before, "a")  # opened by the script before the restore point
    problems = outputs.restore(records)
    log.write("again\\n")
    log.close()
    with open(later, "a") as f:  # opened after the restore point: rolled back as it opens
        f.write("row2b\\n")
    print(problems)
    """
)


def _tail(data: bytes) -> str:
    return xxhash.xxh64_hexdigest(data[-4096:])


def test_only_the_files_the_resumed_script_opens_are_rolled_back(tmp_path: Path) -> None:
    victim, later, before = tmp_path / "victim.txt", tmp_path / "later.csv", tmp_path / "before.log"
    victim.write_bytes(b"A" * 100 + b"B" * 50)
    later.write_bytes(b"row1\nrow2\n")  # row2: written after the checkpoint by the stopped run
    before.write_bytes(b"line1\nline2\n")
    records = {
        str(victim): {"size": 100, "tail": _tail(b"A" * 100)},
        str(later): {"size": 5, "tail": _tail(b"row1\n")},
        str(before): {"size": 6, "tail": _tail(b"line1\n")},
    }
    script = tmp_path / "resumed.py"
    script.write_text(SCRIPT)
    out = subprocess.run(
        [sys.executable, str(script), str(victim), str(later), str(before), repr(records)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert victim.read_bytes() == b"A" * 100 + b"B" * 50  # named by a record only: untouched
    assert later.read_bytes() == b"row1\nrow2b\n"
    assert before.read_bytes() == b"line1\nagain\n"


WARM = textwrap.dedent(
    """
    import sys
    from ferry.autotrack.outputs import Outputs

    path, records = sys.argv[1], eval(sys.argv[2])
    outputs = Outputs(lambda filename: filename == __file__, lambda: True)
    outputs.watch()
    log = open(path, "a")  # a warm worker's script, started before the stopped run's checkpoint
    with open(path, "a") as old:  # the stopped run goes on: its checkpoint, then a line after it
        old.write("line2\\nline3\\n")
    print(outputs.restore(records))
    log.write("again\\n")
    log.close()
    """
)


def test_a_file_set_aside_before_the_checkpoint_is_rolled_back_from_itself(tmp_path: Path) -> None:
    """A warm worker sets a file aside before the stopped run's checkpoint: the copy is too
    old, but the file (opened for appending) still holds the checkpoint's bytes. It is rolled
    back from itself, and nothing is said (before: "could not be put back", the lines kept)."""
    path, script = tmp_path / "losses.txt", tmp_path / "warm.py"
    path.write_bytes(b"line1\n")
    script.write_text(WARM)
    records = {str(path): {"size": 12, "tail": _tail(b"line1\nline2\n")}}
    out = subprocess.run([sys.executable, str(script), str(path), repr(records)],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
    assert path.read_bytes() == b"line1\nline2\nagain\n"


def test_a_library_loops_saved_place_is_said_only_when_plain() -> None:
    from ferry.autotrack.libloops import at_resume

    plain = at_resume([{"file": "lib/loop.py", "line": 12, "qualname": "Trainer.fit"}])
    assert plain is not None and "inside lib/loop.py:12 (in Trainer.fit)" in plain
    for forged in ({"file": "x.py\nferry: resumed exactly", "line": 1, "qualname": "f"},
                   {"file": "\x1b[2Jx.py", "line": 1, "qualname": "f"},
                   {"file": "x.py", "line": "1", "qualname": "f"}):  # fmt: skip
        said = at_resume([forged])
        assert said is not None and "a place the checkpoint does not name plainly" in said
        assert "\n" not in said and "\x1b" not in said
