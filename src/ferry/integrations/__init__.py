"""Callbacks that bring ferry into high-level trainers; each module imports its library,
so ``import ferry`` imports none of them. See docs/integrations.md.

- ``ferry.integrations.lightning.FerryCallback``: Lightning (``pip install 'gpuferry[lightning]'``)
- ``ferry.integrations.transformers.FerryCallback``: Hugging Face Trainer (``[transformers]``)
- ``ferry.integrations.keras.FerryCallback``: Keras 3 (``[keras]``)
"""
