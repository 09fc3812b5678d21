"""A seeded mutation fuzzer of zero-code frame state (run by test_fuzz_frames.py):
``python fuzz_frames.py WORKDIR SEED COUNT SCRIPT``, started with zero-code mode armed
(ferry's start-up hook on PYTHONPATH, FERRY_AUTOTRACK=1) from a folder of library code (a
``site-packages`` folder: its frames are not the user's, as ferry tells them apart).

1. A forked child runs SCRIPT (zc_fuzzed.py) under the real hooks until it stops itself:
   a real zero-code checkpoint. Another runs it plainly, for its printed lines.
2. Forked resumers run SCRIPT again to its restore point, where the session hands the
   checkpoint's frame state to ``LoopKeeper.restore``. There each resumer runs a batch of
   mutations (fuzz_frames_mutations.py) of that section through the real parser and the
   real restore, on the real live frames, each under an alarm; it snapshots the frames,
   checks the verdict (fuzz_frames_live.py) and a canary (no module changed, nothing
   imported from a planted folder, the objects' classes unchanged), and puts the frames
   back for the next one. A resumer that dies or hangs has its batch retried one mutation
   at a time, so that the one that did it is named.
3. Resumers of edited copies of SCRIPT (a renamed local, a changed statement, an added
   line) must write nothing and say why.
4. Crafted checkpoints on disk (the manifest's checksum recomputed) are resumed by real
   `ferry run` processes meanwhile.

The last line of stdout is the summary (JSON).
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import random
import runpy
import shutil
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import fuzz_frames_live as live
import torch  # the zero-code hooks arm here
from fuzz_child import wait_child
from fuzz_frames_mutations import KINDS

from ferry.autotrack import keeper as keeper_module
from ferry.autotrack.keeper import LoopKeeper
from ferry.errors import CorruptCheckpointError
from ferry.format.wire import manifest_checksum
from ferry.state import frameparse, usercode
from ferry.state.framestate import Section

torch.set_num_threads(1)
BATCH = 250
CALL_TIMEOUT = 10.0
RESTORE = LoopKeeper.restore
WATCHED_MODULES = ["os", "sys", "signal", "numpy", "torch", "torch.nn", "builtins"]  # __main__: fields
EDITS = {  # an edited script: what the resumer must say
    "renamed local": (("    scale = 2\n", "    factor = 2\n"), ("lr * scale", "lr * factor")),
    "changed statement": (("    scale = 2\n", "    scale = 3\n"),),
    "added line": (("if __name__", "extra = 1\nif __name__"),),
}


class Hang(BaseException):
    """A call ran past CALL_TIMEOUT."""


def _alarm(signum: int, frame: Any) -> None:
    raise Hang


# ------------------------------------------------------------------------ in a resumer
def _one(index: int, kind: str, pristine: dict[str, Any], seed: int, view: live.Live,
         pre: dict[Any, Any], modules: dict[str, dict[str, int]]) -> dict[str, Any]:  # fmt: skip
    rng = random.Random(seed * 1_000_003 + index)
    tree = copy.deepcopy(pristine)
    what = KINDS[kind][0](tree, rng)
    err = io.StringIO()
    result: dict[str, Any] = {"i": index, "kind": kind, "what": what}
    try:
        parsed = frameparse.parse(tree, "ck/step-000000000008")
    except CorruptCheckpointError as exc:
        message = str(exc)
        ok = "\n" not in message and "ferry.frames" in message
        result.update(outcome="refused" if ok else "multiline", detail=message[:300])
        return result
    except BaseException:
        result.update(outcome="exception", detail=traceback.format_exc()[-600:])
        return result
    section = parsed if isinstance(parsed, Section) else None
    bad = []
    try:
        signal.alarm(int(CALL_TIMEOUT))
        with contextlib.redirect_stderr(err):
            RESTORE(LoopKeeper(), tree)
    except Hang:
        bad.append("hang")
    except BaseException:
        bad.append("exception: " + traceback.format_exc()[-600:])
    finally:
        signal.alarm(0)
    said = [line for line in err.getvalue().splitlines() if line]
    try:
        bad += live.verdict(pre, view.snapshot(), said, section, view)
        bad += [f"module changed: {m}" for m in live.same_modules(modules)]
        bad += _canary()
        view.reset()
        if view.snapshot() != pre:
            bad.append("the fuzzer could not put the frames back (a bug of the fuzzer)")
    except Exception:
        bad.append("the fuzzer failed (a bug of the fuzzer): " + traceback.format_exc()[-600:])
    result["outcome"] = "wrong" if bad else ("warned" if said else "clean")
    result["detail"] = "; ".join(bad)[:600] if bad else (said[0][:300] if said else "")
    return result


def _canary() -> list[str]:
    bad = []
    if os.path.exists(os.environ["FUZZ_CANARY_FILE"]):
        bad.append("code ran: the canary module was imported")
    if any(os.environ["FUZZ_CANARY_DIR"] in str(p) for p in sys.path):
        bad.append("sys.path holds the planted folder")
    main = sys.modules.get("__main__")
    meter = getattr(main, "Meter", None)
    if meter is not None and meter.__init__.__code__.co_name != "__init__":
        bad.append("a class of the script was changed")
    return bad


def _resumer(items: list[tuple[int, str]], seed: int, out: Any) -> Any:
    """LoopKeeper.restore in a resumer: the batch at the real restore point, then exit."""

    def restore(keeper: LoopKeeper, saved: dict[str, Any]) -> dict[int, Any]:
        view = live.Live(usercode.user_frames(sys._getframe(1)))
        pre = view.snapshot()
        modules = live.module_ids(WATCHED_MODULES)
        for index, kind in items:
            out.write(json.dumps(_one(index, kind, saved, seed, view, pre, modules)) + "\n")
        out.flush()
        os._exit(0)

    return restore


def _variant(name: str, out: Any) -> Any:
    def restore(keeper: LoopKeeper, saved: dict[str, Any]) -> dict[int, Any]:
        view = live.Live(usercode.user_frames(sys._getframe(1)))
        pre, err = view.snapshot(), io.StringIO()
        with contextlib.redirect_stderr(err):
            RESTORE(LoopKeeper(), saved)
        said = [line for line in err.getvalue().splitlines() if line]
        written = [f for f, v in view.snapshot().items() if pre.get(f) != v]
        told = any("counters and positions are not restored" in line for line in said)
        outcome = "warned" if told and not written else "wrong"
        detail = f"written: {written[:5]}; said: {said}"[:600]
        out.write(json.dumps({"i": -1, "kind": f"edit: {name}", "what": name, "outcome": outcome,
                              "detail": detail}) + "\n")  # fmt: skip
        out.flush()
        os._exit(0)

    return restore


# ------------------------------------------------------------------------ processes
def _fork(script: str, env: dict[str, str], hook: Any = None) -> tuple[int, int]:
    """A child running ``script`` as its __main__, with ``hook`` as LoopKeeper.restore;
    returns its pid and the read end of its result pipe."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            out = os.fdopen(w, "w")
            os.environ.update(env)
            if hook is not None:
                keeper_module.LoopKeeper.restore = hook(out)  # type: ignore[method-assign]
            signal.signal(signal.SIGALRM, _alarm)
            sys.argv = [script]
            with contextlib.redirect_stdout(io.StringIO() if hook else sys.stdout):
                runpy.run_path(script, run_name="__main__")
            code = 4 if hook is not None else 0  # a resumer that never reached its restore point
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            traceback.print_exc()
            code = 3
        sys.stdout.flush()
        os._exit(code)
    os.close(w)
    return pid, r


def _env(work: str, tag: str, **extra: str) -> dict[str, str]:
    return {"FERRY_DIR": os.path.join(work, "ck"), "FERRY_JOB_ID": f"fuzz-{tag}", "ZC_STOP_AT": "", **extra}


def _batch(items: list[tuple[int, str]], seed: int, script: str, work: str) -> list[dict[str, Any]]:
    pid, r = _fork(script, _env(work, f"r{items[0][0]}"), lambda out: _resumer(items, seed, out))
    got, code = wait_child(pid, r, timeout=60 + CALL_TIMEOUT * len(items))
    done = {g["i"] for g in got}
    missing = [item for item in items if item[0] not in done]
    if code == 0 and not missing:
        return got
    if len(items) == 1:
        outcome = "crash" if code != 4 else "no restore point"
        index, kind = items[0]
        return [{"i": index, "kind": kind, "what": "?", "outcome": outcome, "detail": f"exit {code}"}]
    for item in missing:  # one at a time, to name the culprit
        got += _batch([item], seed, script, work)
    return got


def _rewrite(ck: str, doc: dict[str, Any]) -> None:
    """Write ``doc`` as the manifest with its checksum recomputed, as anyone can."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    with open(os.path.join(ck, "manifest.json"), "w") as f:
        f.write(json.dumps({**body, "checksum": manifest_checksum(body)}))


Full = tuple[str, "subprocess.Popen[str]", tuple[str, ...]]


def _full_runs(work: str, script: str, base: str) -> list[Full]:
    """Crafted checkpoints resumed by real `ferry run` processes: (case, process, expected)."""
    cases = {  # case: (mutation of the loop's frames in the manifest, what must be said)
        "os.path planted, model = 3, a position past the end": (lambda f: (
            f[0]["values"].__setitem__("os", {"object": {"path": {"value": os.environ["FUZZ_CANARY_DIR"]}}}),
            f[1]["values"].__setitem__("model", {"value": 3}),
            f[2]["loops"][0].__setitem__("at", 10**6)),
            ("`os`: holds a module now", "`model`: holds a torch", "next value 1000000 is not ahead")),
        "position abc": (lambda f: f[2]["loops"][0].__setitem__("at", "abc"),
                         ("frames.frames[2].loops[0].at",)),
    }  # fmt: skip
    ferry = os.path.join(os.path.dirname(sys.executable), "ferry")
    runs = []
    for n, (case, (mutate, expect)) in enumerate(cases.items()):
        root = os.path.join(work, f"full{n}")
        shutil.copytree(os.path.dirname(base), root)
        ck = os.path.join(root, os.path.basename(base))
        with open(os.path.join(ck, "manifest.json")) as f:
            doc = json.load(f)
        mutate(doc["tree"]["ferry"]["frames"]["frames"])
        _rewrite(ck, doc)
        env = {k: v for k, v in os.environ.items() if k not in ("FERRY_AUTOTRACK", "PYTHONPATH")}
        cmd = [ferry, "run", "--dir", root, "--job-id", f"full{n}", "--", sys.executable, script]
        runs.append((case, subprocess.Popen(cmd, env=env, text=True, stdout=subprocess.PIPE,
                                            stderr=subprocess.PIPE, cwd=work), expect))  # fmt: skip
    return runs


def _judge(case: str, proc: subprocess.Popen[str], expect: tuple[str, ...]) -> dict[str, Any]:
    """A crafted checkpoint resumed by `ferry run`: each refusal said in one ferry line, the
    job finished (or, for a section ferry never writes, stopped with one ferry error), no
    traceback, no code run."""
    _, err = proc.communicate(timeout=600)
    lines = [ln for ln in err.splitlines() if ln.startswith("ferry: ")]
    errors = [ln for ln in lines if ln.startswith("ferry: error:")]
    bad = []
    if "Traceback" in err or os.path.exists(os.environ["FUZZ_CANARY_FILE"]):
        bad.append("a traceback or the canary")
    if expect[0].startswith("frames.frames"):
        if proc.returncode == 0 or len(errors) != 1 or expect[0] not in errors[0]:
            bad.append(f"exit {proc.returncode}, errors {errors}")
    elif proc.returncode != 0 or errors or not all(any(e in ln for ln in lines) for e in expect):
        bad.append(f"exit {proc.returncode}, expected {expect} said")
    return {"i": -2, "kind": f"full: {case}", "what": case, "outcome": "wrong" if bad else "ok",
            "detail": "; ".join(bad) + " | " + err[-800:] if bad else ""}  # fmt: skip


def main() -> None:
    work, seed, count, source = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    os.makedirs(work, exist_ok=True)
    script = os.path.join(work, "train.py")
    shutil.copy(source, script)
    canary = os.path.join(work, "planted")
    os.makedirs(canary, exist_ok=True)
    os.environ.update(FUZZ_CANARY_DIR=canary, FUZZ_CANARY_FILE=os.path.join(work, "CANARY-RAN"))
    with open(os.path.join(canary, "ferry_canary.py"), "w") as f:
        f.write(f"open({os.environ['FUZZ_CANARY_FILE']!r}, 'w').close()\n")
    t0 = time.perf_counter()
    _stop(script, work)
    base = os.path.join(work, "ck", sorted(os.listdir(os.path.join(work, "ck")))[-1])
    fulls = _full_runs(work, script, base)
    rng = random.Random(seed)
    kinds = list(KINDS)
    plan = kinds + rng.choices(kinds, weights=[KINDS[k][1] for k in kinds], k=max(count - len(kinds), 0))
    items = list(enumerate(plan))
    results: list[dict[str, Any]] = []
    for start in range(0, len(items), BATCH):
        results += _batch(items[start : start + BATCH], seed, script, work)
    in_process = time.perf_counter() - t0
    with open(script) as f:
        original = f.read()
    for name, edits in EDITS.items():
        text = original
        for old, new in edits:
            text = text.replace(old, new)
        with open(script, "w") as f:
            f.write(text)
        pid, r = _fork(script, _env(work, name.replace(" ", "-")), lambda out, n=name: _variant(n, out))
        got, _ = wait_child(pid, r, timeout=120)
        results += got or [{"i": -1, "kind": f"edit: {name}", "what": name, "outcome": "crash", "detail": ""}]
    with open(script, "w") as f:
        f.write(original)
    results += [_judge(case, proc, expect) for case, proc, expect in fulls]
    outcomes = Counter(r["outcome"] for r in results)
    bad = [r for r in results if r["outcome"] not in ("refused", "warned", "clean", "ok")]
    print(json.dumps({
        "seed": seed, "mutations": sum(1 for r in results if r["i"] >= 0),
        "edits": sum(1 for r in results if r["i"] == -1), "full_runs": len(fulls),
        "seconds": round(time.perf_counter() - t0, 1), "in_process_seconds": round(in_process, 1),
        "planned_kinds": kinds, "kinds": dict(sorted(Counter(r["kind"] for r in results if r["i"] >= 0).items())),  # noqa: E501
        "outcomes": dict(sorted(outcomes.items())), "failures": bad,
    }))  # fmt: skip


def _stop(script: str, work: str) -> None:
    """The real checkpoint: ``script`` run in a forked child until it stops itself."""
    pid, r = _fork(script, _env(work, "stop", ZC_STOP_AT="8"))
    _, code = wait_child(pid, r, timeout=300)
    if code != 85:
        raise SystemExit(f"the script did not stop with a checkpoint: exit {code}")


if __name__ == "__main__":
    main()
