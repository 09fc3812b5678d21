"""The frame-state fuzzer's mutations (fuzz_frames.py): each changes a copy of a real
checkpoint's frame state (as the session decoded it) the way a damaged or crafted manifest
could, and says what it did. Kinds: none, type (any node made any value), drop (a key
removed), rename (a name made another: a module's, a dunder, not an identifier), position
(a loop's index, slot or count out of range or of another type), target (an object entry
put on a module, a class, a function, the model), entry (another kind of entry, aliases,
devices, fingerprints, deep nesting), swap (a value changed within its kind: a consistent
checkpoint of another state), identity (the frames' code, names, places, order, version),
attack (what running code would take: writes into modules, classes, builtins, sys.path).
"""

from __future__ import annotations

import copy
import math
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

WEIRD: list[Any] = ["abc", "", -5, -1, 0, 7, 2**62, 2**80, 10**6, 3.5, math.nan, math.inf, None, True, [], {},
                    [1, [2, [3]]], {"x": 1}, ("a", 1), "__class__", "a" * 5000, torch.zeros(2), np.zeros(2),
                    {"value": 1}, {"object": {}}, [{"kind": "x"}]]  # fmt: skip
NAMES = ["os", "signal", "np", "torch", "nn", "Meter", "train", "main", "STOP_AT", "model", "opt", "loader",
         "lr_at", "print", "__builtins__", "__class__", "__dict__", "1x", "a-b", "", "planted", "count",
         "epoch", "x" * 300]  # fmt: skip
ATTRS = ["path", "sep", "__class__", "load", "weight", "forward", "environ", "count", "inner", "planted",
         "__init__", "SIGTERM", "best"]  # fmt: skip
POSITIONS: list[Any] = [-7, -5, -1, 0, 1, 2, 3, 5, 6, 7, 10**6, 2**62, 2**62 + 1, 2**80, "3", "abc", 3.0,
                        True, None, [], {}]  # fmt: skip
HOLDERS = {0: ["os", "signal", "np", "torch", "nn", "Meter", "Inner", "train", "main", "STOP_AT"],
           1: ["model", "opt", "loader", "x"], 2: ["model", "opt", "loader", "lr_at", "group"]}  # fmt: skip

# ------------------------------------------------------------------------ mutations
Mutation = Callable[[dict[str, Any], random.Random], str]


def _nodes(node: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(node, dict):
        for k, v in node.items():
            found += _nodes(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            found += _nodes(v, (*path, i))
    return found


def _at(tree: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        tree = tree[part]
    return tree


def _dicts(tree: dict[str, Any], under: str) -> list[tuple[Any, ...]]:
    return [p for p in _nodes(tree) if p and isinstance(_at(tree, p), dict) and (under in map(str, p))]


def m_none(tree: dict[str, Any], rng: random.Random) -> str:
    return "none"


def m_type(tree: dict[str, Any], rng: random.Random) -> str:
    path = rng.choice(_nodes(tree)[1:])
    value = copy.deepcopy(rng.choice(WEIRD))
    _at(tree, path[:-1])[path[-1]] = value
    return f"{path} := {str(value)[:40]}"


def m_drop(tree: dict[str, Any], rng: random.Random) -> str:
    path = rng.choice([p for p in _nodes(tree) if isinstance(_at(tree, p), dict) and _at(tree, p)])
    key = rng.choice(list(_at(tree, path)))
    del _at(tree, path)[key]
    return f"del {path}[{key!r}]"


def m_rename(tree: dict[str, Any], rng: random.Random) -> str:
    path = rng.choice(_dicts(tree, "values") or [("frames",)])
    node = _at(tree, path)
    if not isinstance(node, dict) or not node:
        return "rename: nothing"
    old, new = rng.choice(list(node)), rng.choice(NAMES)
    node[new] = node.pop(old)
    return f"{path}: {old} -> {new}"


def m_position(tree: dict[str, Any], rng: random.Random) -> str:
    frame = rng.choice([f for f in tree["frames"] if isinstance(f, dict) and f.get("loops")] or [None])
    if frame is None:
        return "position: no loop"
    loop = rng.choice(frame["loops"])
    at = loop.get("at")
    field = rng.choice(["at", "slot", "count", "inner"] if isinstance(at, dict) else ["at", "slot"])
    value = copy.deepcopy(rng.choice(POSITIONS))
    if field in ("count", "inner") and isinstance(at, dict):
        if field == "inner" and isinstance(at.get("inner"), dict):
            at["inner"]["at"] = value
        else:
            at["count"] = value
    else:
        loop[field] = value
    return f"{frame['qualname']} loop {field} := {str(value)[:30]}"


def m_target(tree: dict[str, Any], rng: random.Random) -> str:
    fi = rng.randrange(len(tree["frames"]))
    name = rng.choice(HOLDERS.get(fi, ["x"]))
    attrs = {a: {"value": copy.deepcopy(rng.choice(WEIRD[:14]))} for a in rng.sample(ATTRS, 2)}
    tree["frames"][fi]["values"][name] = {"object": attrs}
    return f"frame {fi}: {name}.{'/'.join(attrs)}"


def m_entry(tree: dict[str, Any], rng: random.Random) -> str:
    paths = [p for p in _dicts(tree, "values") if p[-1] != "values" and isinstance(_at(tree, p), dict)
             and p[-2] in ("values", "object")]  # fmt: skip
    path = rng.choice(paths)
    node = _at(tree, path)
    choice = rng.randrange(6)
    if choice == 0:
        node.clear()
        node["set"] = [1, "a", (1, 2)] if rng.random() < 0.8 else [[1]]
    elif choice == 1:
        node.clear()
        node["object"] = {"count": {"value": 1}}
    elif choice == 2:
        node.clear()
        node["fingerprint"] = {"kind": rng.choice(["torch", "numpy", "x"]), "dtype": "float32",
                               "shape": rng.choice([[3], [-1], ["a"]]),
                               "xxh3": rng.choice(["0" * 16, "zz"])}  # fmt: skip
    elif choice == 3:
        node["alias"] = rng.choice([0, 1, 2, -1, "a", 10**9])
    elif choice == 4:
        node["device"] = rng.choice(["cuda:99", "meta", "xla", "cuda:abc", "cpu", 5])
    else:
        node["value"] = _deep(rng.choice([7, 9, 12]))
    return f"{path} entry {choice}"


def m_swap(tree: dict[str, Any], rng: random.Random) -> str:
    kinds = (int, float, str, list)
    leaves = [p for p in _nodes(tree) if p and p[-1] == "value" and type(_at(tree, p)) in kinds]
    path = rng.choice(leaves)
    old = _at(tree, path)
    changes = {
        int: lambda: old + rng.choice([-1, 1, 100]),
        float: lambda: old * 2 + 1,
        str: lambda: old + "x",
        list: lambda: [*old, 1] if rng.random() < 0.5 else old[:1],
    }
    new: Any = changes[type(old)]()
    _at(tree, path[:-1])[path[-1]] = new
    return f"{path}: {str(old)[:20]} -> {str(new)[:20]}"


def m_identity(tree: dict[str, Any], rng: random.Random) -> str:
    frames = tree["frames"]
    frame = rng.choice(frames)
    choice = rng.randrange(9)
    if choice == 0:
        frame["code"] = f"{rng.getrandbits(64):016x}"
    elif choice == 1 and frame["names"]:
        frame["names"][rng.randrange(len(frame["names"]))] = "renamed"
        frame["code"] = f"{rng.getrandbits(64):016x}"
    elif choice == 2:
        frame["file"] = "/elsewhere/train.py"
    elif choice == 3:
        frame["line"] += 1
    elif choice == 4:
        frame["qualname"] = "other"
    elif choice == 5:
        frames.insert(0, copy.deepcopy(frame))
    elif choice == 6:
        frames.reverse()
    elif choice == 7:
        tree["version"] = rng.choice([1, 3, "2", None])
    else:
        tree["python"] = rng.choice(["3.12", "2.7", 3.11])
    return f"identity {choice}"


def m_attack(tree: dict[str, Any], rng: random.Random) -> str:
    """What code execution would take: writes into modules, classes, functions, builtins."""
    planted = os.environ["FUZZ_CANARY_DIR"]
    attacks = [
        (0, "os", {"object": {"path": {"value": planted}, "sep": {"value": planted}}}),
        (0, "torch", {"object": {"load": {"value": 1}, "planted": {"value": 1}}}),
        (0, "np", {"object": {"__path__": {"value": [planted]}}}),
        (0, "Meter", {"object": {"__init__": {"value": 1}, "count": {"value": 9}}}),
        (0, "train", {"object": {"__code__": {"value": "x"}, "planted": {"value": 1}}}),
        (0, "__builtins__", {"value": {"print": 1}}),
        (0, "print", {"value": "x"}),
        (0, "STOP_AT", {"value": [1, 2]}),
        (0, "sys", {"object": {"path": {"value": [planted]}}}),
        (1, "model", {"object": {"forward": {"value": 1}, "training": {"value": "x"}}}),
        (2, "meter", {"object": {"__class__": {"value": 1}}}),
        (2, "meter", {"object": {"__dict__": {"value": {}}}}),
        (2, "meter", {"object": {"inner": {"value": planted}}}),
        (1, "attrs", {"value": 1}),
    ]
    fi, name, entry = rng.choice(attacks)
    if rng.random() < 0.2:
        tree["frames"][fi]["attrs"] = {"sys": {"path": [planted]}}  # the old layout's attack
        return "attack: old attrs"
    tree["frames"][fi]["values"][name] = copy.deepcopy(entry)
    return f"attack: {name}"


def _deep(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


KINDS: dict[str, tuple[Mutation, int]] = {
    "none": (m_none, 3), "type": (m_type, 20), "drop": (m_drop, 8), "rename": (m_rename, 10),
    "position": (m_position, 15), "target": (m_target, 10), "entry": (m_entry, 10), "swap": (m_swap, 10),
    "identity": (m_identity, 8), "attack": (m_attack, 10),
}  # fmt: skip
