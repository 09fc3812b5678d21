"""A seeded mutation fuzzer for checkpoints read as untrusted input (run by
test_fuzz_checkpoints.py): ``python fuzz_checkpoints.py WORKDIR SEED COUNT``.

This process imports torch and ferry once, saves a rich state with ``ferry.save``, and
forks workers; each worker takes a batch of mutations, and for each one copies the
checkpoint, damages or crafts it, and reads it the four ways a user can: ``ferry.load`` of
the checkpoint, ``ferry.load`` of the root into live objects (the fallback path),
``ferry verify`` and ``ferry inspect --tensors`` (in-process CLI calls). Each outcome is
one JSON line on a pipe. A worker runs under an address-space limit (RLIMIT_AS) and each
call under an alarm; a worker that dies or hangs has its batch retried one mutation at a
time, so the one that did it is named. The last line of stdout is the summary (JSON).

Outcomes: ``equal`` (the state, bitwise), ``error`` (a FerryError, one line), ``other``
(a consistent checkpoint of another state: only a manifest edited *with* its checksum
recomputed can be one), ``ok`` (verify/inspect exited 0), ``refused`` (verify/inspect
exited with a ferry error code, one line); failures: ``exception`` (anything else),
``multiline``, ``hang``, ``crash``, ``wrong`` (damage that loaded as other data),
``followed`` (a symlink or special file that was read).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import random
import resource
import shutil
import signal
import struct
import sys
import time
from collections import Counter
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np
import torch
from fuzz_child import wait_child
from fuzz_tables import DEVICES, DTYPES, FILES, HOSTILE, NBYTES, SHAPES
from torch import nn

import ferry
from ferry.cli import main as cli_main
from ferry.engine.codec import TORCH_DTYPES
from ferry.errors import FerryError
from ferry.format.wire import manifest_checksum

torch.set_num_threads(1)
logging.getLogger("ferry").setLevel(logging.CRITICAL)

STEP = "step-000000000001"
BATCH = 100
CALL_TIMEOUT = 10.0
AS_HEADROOM = 3 << 30


class Hang(BaseException):
    """A call ran past CALL_TIMEOUT (raised from the alarm)."""


# ------------------------------------------------------------------------ the state


def rich_state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    tensors: dict[str, Any] = {}
    for name, dt in TORCH_DTYPES.items():
        base = torch.randn(7, 3, generator=g) * 50
        if dt.is_complex:
            t = torch.complex(base, base.flip(0)).to(dt)
        elif dt == torch.bool:
            t = base > 0
        elif dt.is_floating_point:
            t = base.to(dt)
        else:
            t = base.abs().to(torch.int64).to(dt)
        tensors[name] = t
    model = nn.Linear(4, 3)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    return {
        "tensors": tensors,
        "big": torch.randn(80_000, generator=g),  # 320 KB: read straight into a live tensor
        "empty": torch.empty(0, 3),
        "zero_dim": torch.tensor(3.5 + seed),
        "non_contiguous": (torch.arange(24.0) + seed).reshape(4, 6).t(),
        "model": model,
        "arrays": [
            np.arange(10, dtype=">i4") + seed,
            np.zeros((2, 0)),
            rng.standard_normal((3, 3)).astype(np.float32),
            np.array(seed % 2 == 0),
            np.array([1 + 2j, seed], np.complex128),
            np.arange(6, dtype=np.uint16).reshape(2, 3)[:, ::2],
        ],
        "scalars": (
            np.float64(2.5 + seed),
            np.float32(1.25),
            np.int8(-7),
            np.uint64(2**64 - 1 - seed),
            np.bool_(True),
            np.float16(0.5),
            np.int64(-(2**63)),
        ),
        "plain": {
            "none": None,
            "text": f"str ünï {seed}",
            "float": 1.5 + seed,
            "nan": math.nan,
            "inf": math.inf,
            "ninf": -math.inf,
            "big": 2**62 + seed,
            "flag": True,
            "bytes": b"\x00\xffbytes",
            "tuple": (1, "a", None),
            "odd_keys": {1: "int key", "__x": 2, (1, 2): 3},
            "dtype": torch.float16,
            "device": torch.device("cpu"),
            "nested": [[{"a": [1, {"b": torch.ones(2) * seed}]}]],
        },
    }


def plain(v: Any) -> Any:
    """``v`` with Stateful objects replaced by their state dicts, as loading without
    ``into`` returns them."""
    if isinstance(v, nn.Module):
        return dict(v.state_dict())
    if isinstance(v, dict):
        return {k: plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [plain(x) for x in v]
    if isinstance(v, tuple):
        return tuple(plain(x) for x in v)
    return v


def same(a: Any, b: Any) -> bool:
    """Bitwise equality of two decoded states (types, dtypes, shapes, bytes, key order)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape or a.device != b.device:
            return False
        return bool(a.resolve_conj().contiguous().view(-1).view(torch.uint8).equal(
            b.resolve_conj().contiguous().view(-1).view(torch.uint8)))  # fmt: skip
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()
    if isinstance(a, np.generic):
        return a.dtype == b.dtype and a.tobytes() == b.tobytes()
    if isinstance(a, float):
        return struct.pack("<d", a) == struct.pack("<d", b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


# ------------------------------------------------------------------------ mutations

DAMAGE = ["flip_data", "flip_manifest", "truncate", "append", "delete"]
CRAFTED = ["field_edit", "tensor_edit", "tree_edit", "numpy_scalar", "deep_nesting"]
SPECIAL = ["special_file", "symlink"]
KINDS = {"none": 10, "flip_data": 400, "flip_manifest": 250, "truncate": 150, "append": 100, "delete": 40,
         "field_edit": 350, "tensor_edit": 400, "tree_edit": 300, "numpy_scalar": 80, "deep_nesting": 20,
         "special_file": 30, "symlink": 40}  # fmt: skip
"""Relative weights; every kind appears at least once per run."""

TAGS: list[Any] = [
    {"__npscalar__": "|i1", "value": 1000}, {"__npscalar__": "<u8", "value": -1},
    {"__npscalar__": "<f2", "value": 1e300}, {"__npscalar__": "|O", "value": 1},
    {"__npscalar__": "<c16", "value": 1}, {"__npscalar__": "<f8", "value": "x"},
    {"__npscalar__": "<i8", "value": True}, {"__npscalar__": "<f8"}, {"__npscalar__": ["<f8"], "value": 1},
    {"__float__": "1e999"}, {"__float__": []}, {"__bytes__": "!!"}, {"__bytes__": 5},
    {"__dict__": [[[1], 2]]}, {"__dict__": "ab"}, {"__dict__": [[{"a": 1}, 2]]}, {"__dict__": [[1]]},
    {"__dict__": {"a": 1}}, {"__tuple__": 5}, {"__tuple__": "abc"}, {"__tensor__": True},
    {"__tensor__": 10**20}, {"__tensor__": -1}, {"__tensor__": 1.0}, {"__ndarray__": "0"},
    {"__device__": "cuda:99999999999"}, {"__device__": 5}, {"__device__": "nonsense"},
    {"__device__": "cpu\n"}, {"__dtype__": []}, {"__dtype__": "object"}, {"__stateful__": "x"},
    {"__reduce__": ["os.system", "echo pwned"]}, {"__class__": "x"}, {"__tensor__": 0, "__reduce__": 1},
    {"__stateful__": "M", "state": {"__tensor__": 5}}, {"__tensor__": 0}, {"__ndarray__": 0},
]  # fmt: skip


def _rewrite(ck: str, doc: dict[str, Any], raw_tree: str | None = None) -> None:
    """Write ``doc`` as the manifest with its checksum recomputed (so it gets past it);
    ``raw_tree`` replaces the tree with JSON text too deep for ``json.dumps``."""
    body = {k: v for k, v in doc.items() if k != "checksum"}
    if raw_tree is None:
        checksum = manifest_checksum(body)
        text = json.dumps({**body, "checksum": checksum})
    else:
        import xxhash

        body["tree"] = "@@TREE@@"
        canon = json.dumps(body, separators=(",", ":")).replace('"@@TREE@@"', raw_tree)
        checksum = xxhash.xxh3_64_hexdigest(canon.encode())
        text = canon[:-1] + f',"checksum":"{checksum}"}}'
    with open(os.path.join(ck, "manifest.json"), "w") as f:
        f.write(text)


def _doc(ck: str) -> dict[str, Any]:
    with open(os.path.join(ck, "manifest.json")) as f:
        doc: dict[str, Any] = json.load(f)
    return doc


def _flip(path: str, rng: random.Random, n: int) -> None:
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        for _ in range(n):
            at = rng.randrange(size)
            f.seek(at)
            byte = f.read(1)[0]
            f.seek(at)
            f.write(bytes([byte ^ rng.randrange(1, 256)]))


def _walk_to(node: Any, rng: random.Random) -> tuple[Any, Any]:
    """A random (container, key) inside ``node``."""
    parent, key = None, None
    while isinstance(node, (dict, list)) and node and (parent is None or rng.random() < 0.7):
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        parent, node = node, node[key]
    return parent, key


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth if depth % 2 else '{"a":' * depth + "1" + "}" * depth


def mutate(kind: str, ck: str, root: str, outside: str, rng: random.Random) -> str:
    """Apply mutation ``kind`` to the checkpoint folder ``ck``; returns a label of what."""
    data, manifest = os.path.join(ck, "data-0.bin"), os.path.join(ck, "manifest.json")
    if kind == "none":
        return "none"
    if kind == "flip_data":
        _flip(data, rng, rng.randint(1, 4))
        return "flip data"
    if kind == "flip_manifest":
        _flip(manifest, rng, rng.randint(1, 3))
        return "flip manifest"
    if kind == "truncate":
        path = rng.choice([data, manifest])
        os.truncate(path, rng.randrange(os.path.getsize(path)))
        return f"truncate {os.path.basename(path)}"
    if kind == "append":
        path = rng.choice([data, manifest])
        with open(path, "ab") as f:
            f.write(rng.randbytes(rng.randint(1, 100)))
        return f"append {os.path.basename(path)}"
    if kind == "delete":
        path = rng.choice([data, manifest])
        os.unlink(path)
        return f"delete {os.path.basename(path)}"
    doc = _doc(ck)
    if kind == "field_edit":
        parent, key = _walk_to(doc, rng)
        value = rng.choice(HOSTILE)
        if parent is None:
            doc = {"format": "ferry-checkpoint", "version": 1, "x": value}
        else:
            parent[key] = value
        _rewrite(ck, doc)
        return f"field {key!r} = {value!r}"[:80]
    if kind == "tensor_edit":
        i = rng.randrange(len(doc["tensors"]))
        e = doc["tensors"][i]
        field = rng.choice(["dtype", "shape", "nbytes", "offset", "kind", "device", "file", "huge", "swap"])
        if field == "dtype":
            e["dtype"] = rng.choice(DTYPES)
        elif field == "shape":
            shape = rng.choice(SHAPES)
            e["shape"] = [e["nbytes"]] if shape == NBYTES else shape
        elif field == "nbytes":
            e["nbytes"] = rng.choice([0, 2**63 - 1, -1, e["nbytes"] + 1, e["nbytes"] * 2])
        elif field == "offset":
            size = doc["files"]["data-0.bin"]["size"]
            e["offset"] = rng.choice([2**63 - 1, -64, size, e["offset"] + 1, e["offset"] + 64, size - 64])
        elif field == "kind":
            e["kind"] = rng.choice(["numpy", "torch", "pickle", None])
        elif field == "device":
            e["device"] = rng.choice(DEVICES)
        elif field == "file":
            e["file"] = rng.choice(FILES)
        elif field == "huge":  # consistent with itself: a tensor, and a file, of 2**40 bytes
            e["shape"], e["nbytes"], e["dtype"], e["kind"] = [2**37], 2**40, "float64", "torch"
            doc["files"][e["file"]]["size"] = e["offset"] + 2**40
        else:  # two tensors trade places: a different, consistent state
            j = rng.randrange(len(doc["tensors"]))
            doc["tensors"][i], doc["tensors"][j] = doc["tensors"][j], doc["tensors"][i]
        _rewrite(ck, doc)
        return f"tensor {field}"
    if kind == "tree_edit":
        parent, key = _walk_to(doc["tree"], rng)
        tag = json.loads(json.dumps(rng.choice(TAGS)))
        if parent is None:
            doc["tree"] = tag
        else:
            parent[key] = tag
        _rewrite(ck, doc)
        return f"tree {next(iter(tag))}"
    if kind == "numpy_scalar":
        dt = rng.choice(["|i1", "<i2", "<i4", "<i8", "|u1", "<u2", "<u4", "<u8", "<f2", "<f4", "<f8", "|b1"])
        value = rng.choice([-1, 0, 1, 127, 128, 255, 256, -129, 2**31, 2**63, 2**64, -(2**63) - 1, 1e300,
                            -1e300, 65504.0, 65520.0, True, False, 0.5, "1", None])  # fmt: skip
        doc["tree"]["scalars"]["__tuple__"][rng.randrange(7)] = {"__npscalar__": dt, "value": value}
        _rewrite(ck, doc)
        return f"npscalar {dt} {value!r}"
    if kind == "deep_nesting":
        depth = rng.choice([150, 201, 300, 990, 5000, 100_000])
        _rewrite(ck, doc, raw_tree=_deep(depth))
        return f"nesting {depth}"
    if kind == "special_file":
        what = rng.choice(["fifo data", "fifo manifest", "dir data", "dir manifest", "sparse gap",
                           "huge manifest", "pickle manifest", "extra fifo"])  # fmt: skip
        if what.startswith("fifo"):
            path = data if what == "fifo data" else manifest
            os.unlink(path)
            os.mkfifo(path)
        elif what.startswith("dir"):
            path = data if what == "dir data" else manifest
            os.unlink(path)
            os.mkdir(path)
        elif what == "sparse gap":  # a file that "holds" 256 MiB of nothing past its tensors
            doc["files"]["data-0.bin"]["size"] = 256 << 20
            os.truncate(data, 256 << 20)
            _rewrite(ck, doc)
        elif what == "huge manifest":
            os.truncate(manifest, 2 << 30)
        elif what == "pickle manifest":
            import pickle

            with open(manifest, "wb") as f:
                pickle.dump({"format": "ferry-checkpoint"}, f)
        else:
            os.mkfifo(os.path.join(ck, "extra"))
            doc["files"]["extra"] = {"size": 0, "xxh3_64": "2d06800538d394c2"}
            _rewrite(ck, doc)
        return what
    # symlinks: each one refused, even where what it points at has the right bytes
    what = rng.choice(["data to copy", "data to passwd", "data to dev zero", "manifest to copy", "folder",
                       "sub to root", "loop", "dangling", "extra to passwd"])  # fmt: skip
    if what == "data to copy":
        shutil.copy(data, os.path.join(outside, "data-0.bin"))
        os.unlink(data)
        os.symlink(os.path.join(outside, "data-0.bin"), data)
    elif what == "data to passwd":
        os.unlink(data)
        os.symlink("/etc/passwd", data)
    elif what == "data to dev zero":
        os.unlink(data)
        os.symlink("/dev/zero", data)
    elif what == "manifest to copy":
        shutil.copy(manifest, os.path.join(outside, "manifest.json"))
        os.unlink(manifest)
        os.symlink(os.path.join(outside, "manifest.json"), manifest)
    elif what == "folder":
        target = os.path.join(outside, STEP)
        shutil.copytree(ck, target)
        shutil.rmtree(ck)
        os.symlink(target, ck)
    elif what in ("sub to root", "extra to passwd"):
        import xxhash

        real = "/etc/passwd"
        with open(real, "rb") as f:
            content = f.read()
        if what == "sub to root":
            os.symlink("/", os.path.join(ck, "sub"))
            name = "sub/etc/passwd"
        else:
            os.symlink(real, os.path.join(ck, "extra"))
            name = "extra"
        doc["files"][name] = {"size": len(content), "xxh3_64": xxhash.xxh3_64_hexdigest(content)}
        _rewrite(ck, doc)
    elif what == "loop":
        os.unlink(data)
        os.symlink("data-0.bin", data)
    else:
        os.unlink(data)
        os.symlink(os.path.join(outside, "nothing-here"), data)
    return f"symlink {what}"


# ------------------------------------------------------------------------ one mutation


def _alarm(signum: int, frame: Any) -> None:
    raise Hang()


def _api(fn: Any, expected: Any, kind: str) -> tuple[str, str]:
    signal.setitimer(signal.ITIMER_REAL, CALL_TIMEOUT)
    try:
        got = fn()
    except Hang:
        return "hang", ""
    except FerryError as exc:
        text = str(exc)
        return ("multiline" if "\n" in text else "error"), f"{type(exc).__name__}: {text}"[:300]
    except BaseException as exc:  # what the fuzzer is looking for
        return "exception", f"{type(exc).__name__}: {exc}"[:300]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if same(got, expected):
        return ("followed" if kind in SPECIAL else "equal"), ""
    return ("other" if kind in CRAFTED else "wrong"), ""


def _cli(args: list[str], kind: str) -> tuple[str, str]:
    out, err = io.StringIO(), io.StringIO()
    signal.setitimer(signal.ITIMER_REAL, CALL_TIMEOUT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli_main.main(args, prog_name="ferry", standalone_mode=False)
    except Hang:
        return "hang", ""
    except BaseException as exc:  # a traceback is what the fuzzer is looking for
        return "exception", f"{type(exc).__name__}: {exc}"[:300]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    rc = rc or 0
    text = err.getvalue().strip()
    if "Traceback" in text or "Traceback" in out.getvalue():
        return "exception", text[-300:]
    if rc == 0:
        return ("followed" if kind in SPECIAL and args[0] == "verify" else "ok"), ""
    lines = [line for line in text.splitlines() if line] or out.getvalue().strip().splitlines()
    bad = [line for line in out.getvalue().splitlines() if line.startswith("BAD")]
    if rc in (4, 5, 6) and (len(lines) == 1 or (text == "" and len(bad) == 1)):
        return "refused", (text or bad[0])[:300]
    return "multiline", f"exit {rc}: {text or out.getvalue()}"[:300]


def run_one(index: int, kind: str, seed: int, base: str, scratch: str, expected: Any) -> dict[str, Any]:
    rng = random.Random(seed * 1_000_003 + index)
    root = os.path.join(scratch, f"m{index}")
    outside = os.path.join(scratch, f"o{index}")
    os.makedirs(root)
    os.makedirs(outside)
    ck = os.path.join(root, STEP)
    shutil.copytree(base, ck)
    try:
        what = mutate(kind, ck, root, outside, rng)
        live = rich_state(1)
        result = {"i": index, "kind": kind, "what": what}
        for check, outcome in (
            ("load", _api(lambda: ferry.load(ck).state, expected, kind)),
            ("into", _api(lambda: (ferry.load(root, into=live), plain(live))[1], expected, kind)),
            ("verify", _cli(["verify", root], kind)),
            ("inspect", _cli(["inspect", "--tensors", root], kind)),
        ):
            result[check] = outcome
        return result
    finally:
        for path in (root, outside):
            for dirpath, dirnames, _ in os.walk(path):  # a test chmod must not stop the cleanup
                for d in dirnames:
                    if os.path.islink(os.path.join(dirpath, d)):  # chmod follows links: `sub -> /`!
                        continue
                    with contextlib.suppress(OSError):
                        os.chmod(os.path.join(dirpath, d), 0o700)
            shutil.rmtree(path, ignore_errors=True)


# ------------------------------------------------------------------------ driver


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    return 0


def run_batch(items: list[tuple[int, str]], seed: int, base: str, scratch: str, expected: Any,
              timeout: float) -> tuple[list[dict[str, Any]], bool]:  # fmt: skip
    """Run ``items`` in a forked worker; returns the results it reported and whether it
    ended cleanly (exit 0 within ``timeout``)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 0
        try:
            signal.signal(signal.SIGALRM, _alarm)
            limit = _vm_size() + AS_HEADROOM
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
            with os.fdopen(w, "w", buffering=1) as out:
                for index, kind in items:
                    out.write(json.dumps(run_one(index, kind, seed, base, scratch, expected)) + "\n")
        except BaseException:  # the parent sees the missing lines
            code = 3
        os._exit(code)
    os.close(w)
    results, code = wait_child(pid, r, timeout)
    return results, code == 0


def main() -> None:
    work, seed, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    base_root = os.path.join(work, "base")
    scratch = os.path.join(work, "scratch")
    os.makedirs(scratch, exist_ok=True)
    saved = rich_state(0)
    ferry.save(saved, base_root, step=1)
    base = os.path.join(base_root, STEP)
    expected = plain(saved)
    rng = random.Random(seed)
    kinds = list(KINDS)
    plan = kinds + rng.choices(kinds, weights=[KINDS[k] for k in kinds], k=max(count - len(kinds), 0))
    items = list(enumerate(plan))
    t0 = time.perf_counter()
    results: list[dict[str, Any]] = []
    for start in range(0, len(items), BATCH):
        batch = items[start : start + BATCH]
        got, clean = run_batch(batch, seed, base, scratch, expected, timeout=60 + CALL_TIMEOUT * len(batch))
        done = {r["i"] for r in got}
        results.extend(got)
        missing = [item for item in batch if item[0] not in done]
        if clean and not missing:
            continue
        for item in missing:  # one at a time, to name the culprit
            one, _ = run_batch([item], seed, base, scratch, expected, timeout=4 * CALL_TIMEOUT + 30)
            if one:
                results.extend(one)
            else:
                crash = {check: ("crash", "") for check in ("load", "into", "verify", "inspect")}
                results.append({"i": item[0], "kind": item[1], "what": "?", **crash})
    seconds = time.perf_counter() - t0
    outcomes: Counter[str] = Counter()
    failures = []
    for r in results:
        for check in ("load", "into", "verify", "inspect"):
            outcome, detail = r[check]
            outcomes[f"{check}:{outcome}"] += 1
            if outcome in ("exception", "multiline", "hang", "crash", "wrong", "followed"):
                failures.append({"i": r["i"], "kind": r["kind"], "what": r["what"], "check": check,
                                 "outcome": outcome, "detail": detail})  # fmt: skip
    summary = {
        "seed": seed,
        "mutations": len(results),
        "seconds": round(seconds, 1),
        "per_second": round(len(results) / seconds, 1),
        "planned_kinds": kinds,
        "kinds": dict(sorted(Counter(r["kind"] for r in results).items())),
        "outcomes": dict(sorted(outcomes.items())),
        "failures": failures,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
