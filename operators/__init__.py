"""Operators: one plain class per module (see ``base.py`` for the contract)."""

from operators.support.deferred_imports import defer_unused as _defer_unused

_defer_unused()  # before any operator imports timm / img2dataset, which import wandb at module level
