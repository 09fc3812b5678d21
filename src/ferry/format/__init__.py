"""The on-disk format, torch-free: what a checkpoint's bytes are and how they are checked.

- wire.py: names, the dtype table, the manifest's checksum and bytes, the state tree's
  closed set of tags (decoding it, or only checking it);
- manifest.py: the manifest's schema, checked whole before any field is used;
- integrity.py: reading a manifest and verifying a checkpoint's files against it;
- dcpdesc.py: the JSON description of sharded state (DCP's metadata, never a pickle).

Nothing here imports torch (an import contract in pyproject.toml holds it to that):
``ferry inspect`` and ``ferry verify`` read checkpoints through this package alone. The
save/load machinery that turns live torch values into this format and back is ferry.engine.
"""
