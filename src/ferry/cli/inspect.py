"""``ferry inspect`` and ``ferry verify``: look into a checkpoint without loading it."""

from __future__ import annotations

import os
import time
from typing import TypedDict

import click

from ferry.cli.output import ago, emit_json, human_bytes, json_option, table
from ferry.cli.places import URL
from ferry.engine.catalog import list_checkpoints, split_url
from ferry.errors import CorruptCheckpointError, NoCheckpointError
from ferry.format.integrity import read_manifest, verify
from ferry.format.manifest import Manifest
from ferry.storage import Storage


def _targets(url: str, newest_only: bool) -> tuple[Storage, list[str]]:
    if "://" not in url and os.path.exists(url) and not os.path.isdir(url):
        raise NoCheckpointError(
            f"{url} is a file, not a checkpoint: give a checkpoint folder (step-...) or a "
            "checkpoint root (the folder ferry run --dir names)"
        )
    storage, name = split_url(url)
    if name is not None:
        return storage, [name]
    names = [r.name for r in list_checkpoints(storage)]
    if not names:
        if not storage.exists(""):
            raise NoCheckpointError(f"{url} does not exist: give a checkpoint or a checkpoint root")
        if storage.exists("bundle.json"):
            raise NoCheckpointError(
                f"{url} is a bundle (ferry export), not a checkpoint: its checkpoint is under "
                f"{url.rstrip('/')}/checkpoints; `ferry resume {url}` starts the job from it"
            )
        raise NoCheckpointError(
            f"{url} is no checkpoint, and no checkpoint root: it holds no committed checkpoint "
            "(step-... with a manifest.json)"
        )
    return storage, names[-1:] if newest_only else names


class TensorRow(TypedDict):
    name: str
    dtype: str
    shape: list[int]
    bytes: int
    device: str


class Tracked(TypedDict):
    name: str
    """As ``ferry export-weights --model`` and ``ferry.state_dict`` take it."""
    type: str | None
    """The object's class, where it was saved through its ``state_dict`` (Sequential, AdamW)."""
    tensors: int


class _Summary(TypedDict):
    url: str
    step: int
    created: str
    bytes: int
    tensors: int
    world_size: int
    torch_version: str
    ferry_version: str
    meta: dict[str, object]
    objects: list[Tracked]


class Summary(_Summary, total=False):
    tensor_list: list[TensorRow]


class Verdict(TypedDict):
    url: str
    step: int | None
    ok: bool
    error: str | None


def _summary(storage: Storage, name: str, manifest: Manifest) -> Summary:
    return {
        "url": storage.child_url(name),
        "step": manifest["step"],
        "created": manifest["created_iso"],
        "bytes": sum(f["size"] for f in manifest["files"].values()),
        "tensors": len(manifest["tensors"]),
        "world_size": manifest["world_size"],
        "torch_version": manifest["torch_version"],
        "ferry_version": manifest["ferry_version"],
        "meta": manifest["meta"],
        "objects": _tracked(manifest),
    }


def _tracked(manifest: Manifest) -> list[Tracked]:
    """The tracked objects of the checkpoint (a session's, or the top level of ``ferry.save``'s
    tree), with their class and how many tensors each holds."""
    tree: object = manifest["tree"]
    session = isinstance(tree, dict) and isinstance(tree.get("objects"), dict) and "ferry" in tree
    objects = tree.get("objects") if session and isinstance(tree, dict) else tree
    if not isinstance(objects, dict):
        return []
    prefix = "objects." if session else ""
    names = [r["name"] for r in _tensor_rows(manifest)]
    out: list[Tracked] = []
    for name, node in objects.items():
        if name.startswith("__"):  # an encoding tag of the tree, not an object
            continue
        kind = node.get("__stateful__") if isinstance(node, dict) else None
        inside = f"{prefix}{name}"
        count = sum(n == inside or n.startswith((f"{inside}.", f"{inside}[")) for n in names)
        out.append({"name": name, "type": kind if isinstance(kind, str) else None, "tensors": count})
    return out


def _tensor_rows(manifest: Manifest) -> list[TensorRow]:
    """Name each tensor by its path in the state tree (checked when the manifest was read)."""
    names: dict[int, str] = {}

    def walk(node: object, path: str) -> None:
        if isinstance(node, dict):
            for tag in ("__tensor__", "__ndarray__"):
                if tag in node:
                    names[int(node[tag])] = path
                    return
            if "__dict__" in node:
                for k, v in node["__dict__"]:
                    walk(v, f"{path}.{k}" if path else str(k))
                return
            for k, v in node.items():
                walk(v, path if k in ("state", "__tuple__") else (f"{path}.{k}" if path else k))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}[{i}]")

    walk(manifest["tree"], "")
    return [
        {
            "name": names.get(i, f"#{i}"),
            "dtype": e["dtype"],
            "shape": e["shape"],
            "bytes": e["nbytes"],
            "device": e["device"],
        }
        for i, e in enumerate(manifest["tensors"])
    ]


@click.command("inspect")
@click.argument("url", type=URL)
@click.option("--all", "show_all", is_flag=True, help="Every checkpoint under a root.")
@click.option("--tensors", is_flag=True, help="List every tensor.")
@json_option
def inspect_cmd(url: str, show_all: bool, tensors: bool, as_json: bool) -> None:
    """Show a checkpoint's step, time, size, tracked objects and tensors.

    URL is a checkpoint, or a checkpoint root (its newest checkpoint; --all: every one).
    The tracked objects are named as `ferry export-weights --model` and `ferry.state_dict`
    take them.
    """
    storage, names = _targets(url, newest_only=not show_all)
    docs: list[Summary] = []
    created: list[float] = []  # epoch seconds: an age from the ISO text would need its zone
    for name in names:
        manifest = read_manifest(storage, name)
        created.append(manifest["created"])
        doc = _summary(storage, name, manifest)
        if tensors:
            doc["tensor_list"] = _tensor_rows(manifest)
        docs.append(doc)
    if as_json:
        emit_json(docs if show_all else docs[0])
        return
    now = time.time()
    for doc, saved in zip(docs, created, strict=True):
        click.echo(
            f"{doc['url']}\n  step {doc['step']}, {human_bytes(doc['bytes'])} in "
            f"{doc['tensors']} tensors, saved {doc['created']} ({ago(now - saved)}), "
            f"world size {doc['world_size']}, torch {doc['torch_version']}"
        )
        if doc["objects"]:
            click.echo(
                "  tracked: "
                + ", ".join(
                    f"{o['name']} ({o['type'] + ', ' if o['type'] else ''}{o['tensors']} tensors)"
                    for o in doc["objects"]
                )
            )
        if "tensor_list" in doc:
            rows = [
                (
                    r["name"],
                    r["dtype"],
                    "x".join(map(str, r["shape"])) or "()",
                    human_bytes(r["bytes"]),
                    r["device"],
                )
                for r in doc["tensor_list"]
            ]
            click.echo(table(["tensor", "dtype", "shape", "size", "saved on"], rows))


@click.command("verify")
@click.argument("url", type=URL)
@click.option("--all", "check_all", is_flag=True, help="Verify every checkpoint under a root.")
@json_option
def verify_cmd(url: str, check_all: bool, as_json: bool) -> None:
    """Check a checkpoint's manifest and checksums; exits non-zero if it is damaged."""
    storage, names = _targets(url, newest_only=not check_all)
    results: list[Verdict] = []
    for name in names:
        try:
            manifest = verify(storage, name)
            results.append(
                {"url": storage.child_url(name), "step": manifest["step"], "ok": True, "error": None}
            )
        except CorruptCheckpointError as exc:
            results.append({"url": storage.child_url(name), "step": None, "ok": False, "error": str(exc)})
    if as_json:
        emit_json(results if check_all else results[0])
    else:
        for r in results:
            click.echo(
                f"{'ok ' if r['ok'] else 'BAD'} {r['url']}" + (f": {r['error']}" if r["error"] else "")
            )
    bad = [r for r in results if not r["ok"]]
    if bad:
        raise click.exceptions.Exit(CorruptCheckpointError.exit_code)


COMMANDS = [inspect_cmd, verify_cmd]
