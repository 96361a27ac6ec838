"""Helpers shared by golden modules: deterministic safetensors output."""
import pathlib

import torch
from safetensors.torch import save_file


def save(path: pathlib.Path, tensors: dict, metadata: dict | None = None) -> None:
    """Writes contiguous tensors with sorted keys so reruns give identical bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    out = {k: tensors[k].detach().contiguous().clone() for k in sorted(tensors)}
    save_file(out, str(path), metadata=metadata or {})


def seeded(seed: int) -> torch.Generator:
    return torch.Generator("cpu").manual_seed(seed)
