"""Helpers shared by the pipeline golden modules (FLUX.1, SD3.5, FLUX.2).

What they give:
* init_weights_(): seeded, well-scaled random weights for every parameter (norm scales near 1,
  small non-zero biases), so no layer is an identity and activations stay in a sane range.
* save_pipeline(): bf16 weights, save_pretrained layout, chosen components re-saved as shards
  with an index file, tokenizer folders rewritten by their builders.
* load_component() / load_pipeline(): reload the saved bf16 files in f32 or bf16.
* ActivationRecorder: forward hooks that record named per-block outputs.
* MethodRecorder: wraps a pipeline method (prepare_latents, encode_prompt) to record what it
  returned, e.g. the initial latents the pipeline drew from its generator.
* StepRecorder: a callback_on_step_end that records the latents after every step.
* flatten(): model outputs -> {name: tensor} named after their output-class fields.
* save_component_golden() / save_case(): write inputs/outputs/intermediates as safetensors plus
  a JSON manifest, with sorted keys so every rerun writes the same bytes.

Safetensors metadata is kept to at most one key: the writer serialises it from a hash map, so
several keys could come out in a different order on each run. Manifests go to JSON files.
"""
import json
import math
import pathlib
import shutil
from typing import Callable, Iterable

import numpy as np
import torch

from ._common import save

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


# ---- weights ------------------------------------------------------------------------------


@torch.no_grad()
def init_weights_(module: torch.nn.Module, seed: int, scale: float = 1.0) -> torch.nn.Module:
    """Overwrites every parameter from one seeded generator, in sorted name order.

    Matrices/convs: N(0, 1/fan_in) * scale; 1-D "weight"/"scale" (norms): 1 + 0.1 N(0,1);
    other 1-D tensors (biases, embeddings of size 1): 0.05 N(0,1). Values are then rounded to
    bf16 so the f32 reference computed from the saved bf16 files sees the same weights.
    """
    g = torch.Generator("cpu").manual_seed(seed)
    for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
        if p.ndim >= 2:
            fan_in = p[0].numel()
            v = torch.randn(p.shape, generator=g) * (scale / math.sqrt(fan_in))
        elif name.endswith("weight") or name.endswith("scale") or name.endswith(".g"):
            v = 1.0 + 0.1 * torch.randn(p.shape, generator=g)
        else:
            v = 0.05 * torch.randn(p.shape, generator=g)
        p.copy_(v.to(torch.bfloat16).to(p.dtype))
    return module


def _rewrite(folder: pathlib.Path) -> None:
    if folder.exists():
        shutil.rmtree(folder)


def save_pipeline(
    pipe,
    dst: pathlib.Path,
    sharded: dict[str, str] | None = None,
    folders: dict[str, Callable[[pathlib.Path], object]] | None = None,
) -> None:
    """Saves `pipe` in bf16 under dst (replacing it), in the published diffusers layout.

    sharded: component name -> max_shard_size (e.g. {"transformer": "300KB"}); those components
    are re-saved so the folder holds numbered shards and a *.safetensors.index.json.
    folders: component name -> builder(dst_folder) that (re)writes that folder after saving,
    e.g. the tokenizer builders, so their files are exactly what the tokenizer goldens test.
    """
    dst = pathlib.Path(dst)
    _rewrite(dst)
    pipe.to(torch.bfloat16)
    pipe.save_pretrained(str(dst), safe_serialization=True)
    for name, size in sorted((sharded or {}).items()):
        comp = getattr(pipe, name)
        _rewrite(dst / name)
        comp.save_pretrained(str(dst / name), max_shard_size=size)
        if not any((dst / name).glob("*.safetensors.index.json")):
            raise RuntimeError(f"{name}: max_shard_size {size} gave a single file; lower it")
    for name, build in sorted((folders or {}).items()):
        _rewrite(dst / name)
        build(dst / name)


def prefix_keys(folder: pathlib.Path, prefix: str) -> None:
    """Prepends `prefix` to every tensor name in a saved component (files and index).

    transformers 5 saves CLIPTextModel(WithProjection) without the `text_model.` prefix that the
    published checkpoints (and transformers 4) use; transformers 5 loads either form.
    """
    from safetensors.torch import load_file

    folder = pathlib.Path(folder)
    for f in sorted(folder.glob("*.safetensors")):
        tensors = load_file(str(f))
        save(f, {(k if k.startswith(prefix) else prefix + k): v for k, v in tensors.items()},
             metadata={"format": "pt"})
    for idx in sorted(folder.glob("*.safetensors.index.json")):
        data = json.loads(idx.read_text())
        data["weight_map"] = {(k if k.startswith(prefix) else prefix + k): v
                              for k, v in data["weight_map"].items()}
        idx.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def patch_model_index(dst: pathlib.Path, entries: dict[str, list]) -> None:
    """Overrides model_index.json entries, e.g. the published class name of a tokenizer."""
    path = pathlib.Path(dst) / "model_index.json"
    data = json.loads(path.read_text())
    data.update(entries)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


def load_component(cls, folder: pathlib.Path, dtype: torch.dtype):
    """cls.from_pretrained(folder) in `dtype` (both libraries now take dtype=, not torch_dtype=)."""
    model = cls.from_pretrained(str(folder), dtype=dtype)
    return model.eval()


def load_pipeline(cls, folder: pathlib.Path, dtype: torch.dtype):
    pipe = cls.from_pretrained(str(folder), dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---- capture ------------------------------------------------------------------------------


def flatten(prefix: str, obj) -> dict[str, torch.Tensor]:
    """Tensors inside obj, named like the output classes' fields: prefix.field, prefix.N."""
    out: dict[str, torch.Tensor] = {}
    join = (lambda k: f"{prefix}.{k}") if prefix else (lambda k: str(k))
    if obj is None:
        return out
    if isinstance(obj, torch.Tensor):
        out[prefix] = obj.detach().clone()
    elif hasattr(obj, "keys") and hasattr(obj, "__getitem__"):  # dict, ModelOutput, BaseOutput
        for k in obj.keys():
            out.update(flatten(join(k), obj[k]))
    elif isinstance(obj, (tuple, list)):
        for i, v in enumerate(obj):
            out.update(flatten(join(i), v))
    return out


class ActivationRecorder:
    """Records the outputs of named submodules during forward passes.

    names: module paths, or {module path: recorded name} when the checkpoint's parameter paths
    differ from the Python module tree (transformers 5 CLIPTextModel has no `text_model.`).
    A module called more than once (e.g. per denoising step) keeps its last call unless
    per_call=True, which names them name@0, name@1, ...
    """

    def __init__(self, model: torch.nn.Module, names: Iterable[str] | dict[str, str],
                 per_call: bool = False):
        self.model, self.per_call = model, per_call
        self.names = dict(names) if isinstance(names, dict) else {n: n for n in names}
        self.tensors: dict[str, torch.Tensor] = {}
        self._calls: dict[str, int] = {}
        self._handles = []

    def _hook(self, name):
        def fn(_module, _args, output):
            key = name
            if self.per_call:
                n = self._calls.get(name, 0)
                self._calls[name] = n + 1
                key = f"{name}@{n}"
            for k in [k for k in self.tensors if k == key or k.startswith(key + ".")]:
                del self.tensors[k]
            self.tensors.update(flatten(key, output))

        return fn

    def __enter__(self):
        for path, name in self.names.items():
            self._handles.append(self.model.get_submodule(path).register_forward_hook(self._hook(name)))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()


class InputRecorder:
    """Records the keyword/positional inputs of every call of a module: prefix.<arg>@<call>."""

    def __init__(self, module: torch.nn.Module, prefix: str, arg_names: list[str] | None = None):
        self.module, self.prefix, self.arg_names = module, prefix, arg_names or []
        self.tensors: dict[str, torch.Tensor] = {}
        self.calls = 0
        self._handle = None

    def _hook(self, _module, args, kwargs):
        named = dict(zip(self.arg_names, args))
        named.update(kwargs)
        for k, v in named.items():
            if isinstance(v, torch.Tensor):
                self.tensors[f"{self.prefix}.{k}@{self.calls}"] = v.detach().clone()
        self.calls += 1

    def __enter__(self):
        self._handle = self.module.register_forward_pre_hook(self._hook, with_kwargs=True)
        return self

    def __exit__(self, *exc):
        self._handle.remove()


class MethodRecorder:
    """Wraps pipe.<method> for the duration of a with-block and records what it returned.

    names: one name per element of the returned tuple (None to skip one), or a single name.
    """

    def __init__(self, obj, method: str, names: list[str | None] | str):
        self.obj, self.method, self.names = obj, method, names
        self.tensors: dict[str, torch.Tensor] = {}

    def __enter__(self):
        original = getattr(self.obj, self.method)

        def wrapper(*args, **kwargs):
            result = original(*args, **kwargs)
            values = result if isinstance(result, tuple) else (result,)
            names = [self.names] if isinstance(self.names, str) else self.names
            for name, v in zip(names, values):
                if name is not None and isinstance(v, torch.Tensor):
                    self.tensors[name] = v.detach().clone()
            return result

        setattr(self.obj, self.method, wrapper)
        return self

    def __exit__(self, *exc):
        delattr(self.obj, self.method)  # back to the class's method


class StepRecorder:
    """callback_on_step_end that records the latents after step i as latents.<i>."""

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self.steps: list[float] = []

    def __call__(self, pipe, i, t, callback_kwargs):
        self.tensors[f"latents.{i}"] = callback_kwargs["latents"].detach().clone()
        self.steps.append(float(t))
        return {}


def image_tensors(images: np.ndarray) -> dict[str, torch.Tensor]:
    """output_type="np" images (B,H,W,3 float32 in [0,1]) plus the pixels PIL would hold.

    The pixels are uint8 values stored as int32: tessera's safetensors reader has no U8 dtype.
    numpy_to_pil computes (image * 255).round() in float32, rounding halves to even.
    """
    from diffusers.image_processor import VaeImageProcessor

    pil = VaeImageProcessor.numpy_to_pil(images)
    uint8 = np.stack([np.asarray(p, dtype=np.uint8) for p in pil])
    return {"image": torch.from_numpy(np.ascontiguousarray(images, dtype=np.float32)),
            "image_uint8": torch.from_numpy(uint8.astype(np.int32))}


# ---- writing ------------------------------------------------------------------------------


def write_json(path: pathlib.Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_component_golden(
    dst: pathlib.Path,
    inputs: dict[str, torch.Tensor],
    outputs: dict[str, torch.Tensor],
    intermediates: dict[str, torch.Tensor] | None = None,
    manifest: dict | None = None,
) -> None:
    """dst/inputs.safetensors (forward() argument names), dst/outputs.safetensors (output fields),
    dst/intermediates.safetensors (submodule paths), dst/manifest.json (names, shapes, notes)."""
    dst = pathlib.Path(dst)
    files = {"inputs": inputs, "outputs": outputs}
    if intermediates:
        files["intermediates"] = intermediates
    info = dict(manifest or {})
    for stem, tensors in files.items():
        save(dst / f"{stem}.safetensors", tensors)
        info[stem] = {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                      for k, v in sorted(tensors.items())}
    write_json(dst / "manifest.json", info)


def rename_tuple_outputs(tensors: dict, fields: dict) -> dict:
    """Names tuple outputs by meaning instead of position (as the FLUX.1 goldens do).

    fields: module-path pattern ("*" = one index) -> names of the tuple elements in order; ""
    keeps the module's own name.
    """
    out = {}
    for k, v in tensors.items():
        head, _, idx = k.rpartition(".")
        for pattern, names in fields.items():
            p = pattern.split(".")
            h = head.split(".")
            if idx.isdigit() and len(p) == len(h) and all(a in ("*", b) for a, b in zip(p, h)):
                if int(idx) < len(names):
                    k = head + names[int(idx)]
                break
        out[k] = v
    return out


def save_named_component(dst: pathlib.Path, pipeline: str, tuples: dict, inputs, outputs,
                         intermediates, info: dict) -> None:
    """save_component_golden with the manifest keys every pipeline's component goldens carry;
    dst is .../<component>/<dtype>, tuples as in rename_tuple_outputs."""
    info = dict(info, component=dst.parent.name, dtype=dst.name,
                model=f"{pipeline}/{dst.parent.name.split('.')[0]}",
                weights=f"bf16 files loaded in {dst.name}")
    save_component_golden(dst, inputs, outputs, rename_tuple_outputs(intermediates or {}, tuples),
                          info)


def save_case(dst: pathlib.Path, tensors: dict[str, torch.Tensor], manifest: dict) -> None:
    """One pipeline run: dst/tensors.safetensors + dst/manifest.json (inputs and tensor index)."""
    dst = pathlib.Path(dst)
    save(dst / "tensors.safetensors", tensors)
    info = dict(manifest)
    info["tensors"] = {k: {"dtype": str(v.dtype).replace("torch.", ""), "shape": list(v.shape)}
                       for k, v in sorted(tensors.items())}
    write_json(dst / "manifest.json", info)


def dir_size(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in pathlib.Path(path).rglob("*") if p.is_file())
