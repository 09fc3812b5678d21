"""``ferry process suspend / wake / state / dump / restore``: errors and exit codes, for real.

In-process through click's runner on ``ferry.cli.main``, and as the installed ``ferry``
script in a subprocess, on real PIDs (a dead one, a live process that uses no GPU). The
commands' old names (``ferry suspend``, ``ferry process-state``, ...) still work, hidden,
with a note on stderr.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from ferry.cli import RENAMED, main

A = "GPU-eea0d83f-ebcd-ac27-6b3e-bec2a19724e6"
B = "GPU-8f4022ba-e0cb-1298-286e-225c953a7feb"
FERRY = Path(sys.executable).parent / "ferry"
no_driver_here = pytest.mark.skipif(
    ctypes.util.find_library("cuda") is not None,
    reason="asserts the answer of a machine without a GPU driver",
)


@pytest.fixture(autouse=True)
def _home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FERRY_HOME", str(tmp_path / "home"))


@pytest.fixture
def sleeper() -> Iterator[int]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def gone(pid: int) -> str:
    return f"no process with pid {pid} on this machine (it exited, or lives in another PID namespace)"


def run(*args: str) -> tuple[int, str, str]:
    """``ferry process ARGS``."""
    return invoke("process", *args)


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args), prog_name="ferry")
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, result.stderr


def test_commands_are_registered_with_json() -> None:
    code, out, _ = invoke("--help")
    assert code == 0
    listed = re.findall(r"^  (\S+)  ", out, re.MULTILINE)
    assert "process" in listed and not set(RENAMED) & set(listed), listed
    code, out, _ = run("--help")
    assert code == 0
    listed = re.findall(r"^  (\S+)  ", out, re.MULTILINE)
    assert listed[-5:] == ["suspend", "wake", "state", "dump", "restore"], out
    for name in listed[-5:]:
        code, help_text, _ = run(name, "--help")
        assert code == 0 and "--json" in help_text and f"Usage: ferry process {name} " in help_text
    assert "--map OLD=NEW" in run("wake", "--help")[1]


OLD_CALLS = {
    "suspend": ["{pid}"],
    "wake": ["{pid}", "--json"],
    "process-state": ["{pid}", "--json"],
    "dump": ["{pid}", "/nonexistent/ferry-dump", "--json"],
    "restore": ["/nonexistent/ferry-dump"],
}


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_each_old_name_works_as_before_and_names_the_new_form(old: str, dead_pid: int) -> None:
    """Hidden aliases for one release: the new form's exit status and stdout (for the scripts
    that read it), and one more line on stderr that names the new form."""
    args = [a.format(pid=dead_pid) for a in OLD_CALLS[old]]
    new = RENAMED[old]
    code, out, err = invoke(old, *args)
    new_code, new_out, new_err = invoke(*new.split(), *args)
    assert (code, out) == (new_code, new_out) and code == (2 if old == "restore" else 9)
    assert (out if "--json" in args else new_err).count("\n") == 1, (out, new_err)
    note = f"ferry: note: `ferry {old}` is now `ferry {new}` (the old name goes in the next release)\n"
    assert err == note + new_err
    help_text = invoke(old, "--help")[1]
    assert f"Usage: ferry {old} " in help_text and f"Now `ferry {new}`" in help_text


@pytest.mark.parametrize("command", ["suspend", "wake", "state"])
def test_dead_pid_exits_9_with_one_line(command: str, dead_pid: int) -> None:
    code, out, err = run(command, str(dead_pid))
    assert (code, out) == (9, "")
    assert err == f"ferry: error: {gone(dead_pid)}\n"


@no_driver_here
@pytest.mark.parametrize(
    "args", [["suspend"], ["suspend", "--timeout", "0"], ["wake"], ["state"], ["suspend", "--json"]]
)
def test_live_non_gpu_process_gets_the_capability_error(args: list[str], sleeper: int) -> None:
    code, out, err = run(*args, str(sleeper))
    if "--json" in args:  # the error as JSON on stdout, with its exit status (issue 16)
        doc = json.loads(out)
        assert (code, doc["exit"], err) == (9, 9, "")
        err = f"ferry: error: {doc['error']}\n"
    assert (code, out if "--json" not in args else "") == (9, "")
    assert err.startswith("ferry: error: ") and err.count("\n") == 1
    assert "libcuda.so.1 could not be loaded" in err or "gpuferry[process]" in err


@pytest.mark.parametrize(
    ("args", "option", "says"),
    [
        (["suspend", "0"], "PID", "0: must be a whole number, from 1 to 4,194,304"),
        (["suspend", "--", "-4"], "PID", "-4: must be a whole number"),
        (["wake", "1", "--map", "nonsense"], "--map", "expected OLD=NEW"),
        (["wake", "1", "--map", f"{A}=0"], "--map", "'0' is not a GPU UUID"),
        (["wake", "1", "--map", f"{A}={B}", "--map", f"{B}={B}"], "--map", "are both mapped to"),
        (["wake", "1", "--map", f"MIG-{A[4:]}={B}"], "--map", "is a MIG instance"),
        (["suspend", "1", "--timeout", "-1"], "--timeout", "a number of seconds, 0 or more"),
        (["restore", "/nonexistent/ferry-dump"], None, "holds no CRIU dump (no inventory.img)"),
    ],
)
def test_bad_arguments_exit_2_before_anything_runs(args: list[str], option: str | None, says: str) -> None:
    """Values click parses are its usage errors, naming the option (issue 30); what needs a
    look at the machine (a dump's folder) is ferry's one-line error."""
    code, out, err = run(*args)
    assert (code, out) == (2, "")
    if option is None:
        assert err.startswith("ferry: error: ") and says in err
    else:
        assert f"Error: Invalid value for '{option}': " in err and says in err, err


def test_wake_with_a_map_but_no_record_says_how_to_get_one(sleeper: int) -> None:
    code, _, err = run("wake", str(sleeper), "--map", f"{A}={B}")
    assert code == 2 and "suspend it with `ferry process suspend` (which records them)" in err


def test_non_integer_pid_is_a_usage_error() -> None:
    code, _, err = run("suspend", "abc")
    assert code == 2 and "Invalid value for 'PID': 'abc' is not a whole number" in err


@no_driver_here
def test_installed_script_in_a_subprocess(dead_pid: int, tmp_path: Path) -> None:
    env = {**os.environ, "FERRY_HOME": str(tmp_path)}
    out = subprocess.run(
        [str(FERRY), "process", "suspend", "999999"], capture_output=True, text=True, env=env, timeout=120
    )
    assert (out.returncode, out.stdout) == (9, "")
    assert out.stderr.strip().splitlines()[-1] == f"ferry: error: {gone(999999)}"
    out = subprocess.run(
        [str(FERRY), "process", "state", str(os.getpid()), "--json"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    doc = json.loads(out.stdout)  # with --json, the error is JSON on stdout (issue 16)
    assert out.returncode == 9 and doc["exit"] == 9 and out.stderr == ""
    assert "libcuda.so.1 could not be loaded" in doc["error"] or "gpuferry[process]" in doc["error"]


def test_dump_reports_what_criu_lacks(sleeper: int, tmp_path: Path) -> None:
    code, out, err = run("dump", str(sleeper), str(tmp_path / "img"), "--json")
    if code == 0:  # CRIU works here: the dump is real (test_process_criu covers it)
        assert json.loads(out)["pid"] == sleeper
        return
    doc = json.loads(out)  # with --json, the error is JSON on stdout (issue 16)
    assert (code, doc["exit"], err) == (9, 9, "")
    assert any(s in doc["error"] for s in ("criu is not installed", "`criu check` failed", "need root")), doc


def test_outcome_is_printed_for_people_and_for_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    from ferry.cli.process import _print_outcome
    from ferry.process import GpuUsage, GpuUuid, Outcome, ProcessState

    a, b = GpuUuid.parse(A), GpuUuid.parse(B)
    out = Outcome(
        7,
        "suspend",
        ProcessState.CHECKPOINTED,
        [("lock", 0.001), ("checkpoint", 1.5)],
        gpus=[GpuUsage(a, "NVIDIA L4", 3 << 30)],
        warnings=["NCCL is loaded"],
    )
    _print_outcome(out, as_json=False)
    text = capsys.readouterr()
    assert text.out.splitlines() == [
        "pid 7 suspended in 1.501 s (lock 0.001 s, checkpoint 1.500 s); now checkpointed",
        f"released {A} (NVIDIA L4, 3.00 GiB)",
    ]
    assert text.err == "ferry: warning: NCCL is loaded\n"
    woke = Outcome(7, "wake", ProcessState.RUNNING, [("restore", 2.0), ("unlock", 0.0)], mapping={a: b})
    _print_outcome(woke, as_json=True)
    doc = json.loads(capsys.readouterr().out)
    assert doc["mapping"] == {A: B} and doc["state"] == "running" and doc["seconds"] == 2.0
    _print_outcome(Outcome(7, "wake", ProcessState.RUNNING), as_json=False)
    assert capsys.readouterr().out == "pid 7 is already running: nothing to do\n"
