"""Activation checkpointing (model.gradient_checkpointing): recompute each block's activations in
the backward pass instead of keeping them, for every family that asks for it."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedModel


def enable_activation_checkpointing(model: PreTrainedModel) -> None:
    kwargs = {"use_reentrant": False}  # the reentrant variant is deprecated in torch
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5 renamed it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
