"""FLUX.1 oracle: tiny schnell/dev pipelines in the published layout, component and pipeline goldens.

Writes
  tests/fixtures/flux1-schnell-tiny/, tests/fixtures/flux1-dev-tiny/   (FluxPipeline folders, bf16)
  tests/fixtures/goldens/<pipeline>/index.json                          (what follows, by name)
  tests/fixtures/goldens/<pipeline>/components/<component>/<f32|bf16>/  (inputs, outputs,
      intermediates .safetensors + manifest.json); component in text_encoder, text_encoder_2,
      transformer, vae.decode, vae.encode
  tests/fixtures/goldens/<pipeline>/pipeline/<case>/<f32|bf16>/         (tensors.safetensors +
      manifest.json with prompt, seed, height, width, steps, guidance, max_sequence_length)
f32 goldens load the saved bf16 weights with dtype=torch.float32; bf16 goldens with bfloat16.
"""
import pathlib

import torch

from . import _pipeline_common as pc
from ._common import seeded
from .tokenizers import build_clip_tokenizer, build_t5_tokenizer

# Real FLUX.1 structure at tiny widths: CLIP-L -> 16 wide (its 49408-token embedding dominates the
# size budget), T5-XXL -> 32 wide, transformer 2 heads x
# 16 (RoPE axes 4+6+6 like 16+56+56), VAE with 4 blocks so vae_scale_factor stays 8.
CLIP = dict(hidden_size=16, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-5,
            projection_dim=16, bos_token_id=0, eos_token_id=2, pad_token_id=1)  # FLUX.1's ids
T5 = dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, relative_attention_num_buckets=32,
          relative_attention_max_distance=128, feed_forward_proj="gated-gelu", dropout_rate=0.1,
          layer_norm_epsilon=1e-6, is_encoder_decoder=True, tie_word_embeddings=False,
          decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
TRANSFORMER = dict(patch_size=1, in_channels=64, num_layers=2, num_single_layers=2,
                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                   pooled_projection_dim=16, axes_dims_rope=(4, 6, 6))
VAE = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
           up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 16, 32, 32),
           layers_per_block=2, act_fn="silu", latent_channels=16, norm_num_groups=4,
           sample_size=64, scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False,
           use_post_quant_conv=False, force_upcast=True)
# Published FLUX.1 scheduler_config.json values.
SCHEDULER = {
    "schnell": dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False,
                    base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5, max_shift=1.15),
    "dev": dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True,
                base_image_seq_len=256, max_image_seq_len=4096, base_shift=0.5, max_shift=1.15),
}
SHARDS = {"transformer": "60KB", "text_encoder_2": "40KB"}
SEEDS = dict(text_encoder=1001, text_encoder_2=1002, vae=1003, schnell=1004, dev=1005)

PROMPTS = ["a photo of a cat",
           "A red bicycle leaning against a brick wall, golden hour, 35mm",
           "Café «Zürich» ☕ — watercolor, 2 cups & 3 croissants!!"]
# (name, prompt index, seed, height, width, steps, max_sequence_length or None for the default)
CASES = {
    "schnell": [("cat_s0_64x64", 0, 0, 64, 64, 2, 32),
                ("bicycle_s42_80x48", 1, 42, 80, 48, 4, 64),
                ("cafe_s7_64x112", 2, 7, 64, 112, 3, None)],
    "dev": [("cat_s1_64x64", 0, 1, 64, 64, 3, 32),
            ("cafe_s3_48x80", 2, 3, 48, 80, 2, 64),
            ("bicycle_s1234_112x64", 1, 1234, 112, 64, 4, None)],
}
GUIDANCE = {"schnell": 0.0, "dev": 3.5}


def _build(variant: str, dst: pathlib.Path, tmp: pathlib.Path) -> None:
    from diffusers import (AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline,
                           FluxTransformer2DModel)
    from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config,
                              T5EncoderModel, T5TokenizerFast)

    build_clip_tokenizer(tmp / "tokenizer")
    build_t5_tokenizer(tmp / "tokenizer_2")
    tok = CLIPTokenizer.from_pretrained(str(tmp / "tokenizer"))
    tok2 = T5TokenizerFast.from_pretrained(str(tmp / "tokenizer_2"))

    torch.manual_seed(0)  # construction draws default inits; init_weights_ overwrites them all
    te = CLIPTextModel(CLIPTextConfig(vocab_size=49408, **CLIP))
    te2 = T5EncoderModel(T5Config(vocab_size=len(tok2), **T5))
    tr = FluxTransformer2DModel(guidance_embeds=(variant == "dev"), **TRANSFORMER)
    vae = AutoencoderKL(**VAE)
    pc.init_weights_(te, SEEDS["text_encoder"])
    pc.init_weights_(te2, SEEDS["text_encoder_2"])
    pc.init_weights_(tr, SEEDS[variant])
    pc.init_weights_(vae, SEEDS["vae"])
    pipe = FluxPipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER[variant]), vae=vae,
                        text_encoder=te, tokenizer=tok, text_encoder_2=te2, tokenizer_2=tok2,
                        transformer=tr)
    pc.save_pipeline(pipe, dst, sharded=SHARDS,
                     folders={"tokenizer": build_clip_tokenizer, "tokenizer_2": build_t5_tokenizer})
    # The published checkpoints name CLIP weights text_model.* and list T5TokenizerFast;
    # transformers 5 writes neither but reads both.
    pc.prefix_keys(dst / "text_encoder", "text_model.")
    pc.patch_model_index(dst, {"tokenizer_2": ["transformers", "T5TokenizerFast"]})


# ---- component goldens --------------------------------------------------------------------


def _float_inputs(d: dict, dtype: torch.dtype, keep_f32=()) -> dict:
    return {k: (v.to(dtype) if v.is_floating_point() and k not in keep_f32 else v)
            for k, v in d.items()}


def _component_goldens(variant: str, model_dir: pathlib.Path, out: pathlib.Path) -> list[str]:
    from diffusers import AutoencoderKL, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, CLIPTokenizer, T5EncoderModel, T5TokenizerFast

    tok = CLIPTokenizer.from_pretrained(str(model_dir / "tokenizer"))
    tok2 = T5TokenizerFast.from_pretrained(str(model_dir / "tokenizer_2"))
    # The text encoders and VAE are the same in both pipelines: feed them different inputs.
    prompts = PROMPTS[:2] if variant == "schnell" else PROMPTS[1:]
    clip_ids = tok(prompts, padding="max_length", max_length=77, truncation=True,
                   return_tensors="pt").input_ids
    t5_ids = tok2(prompts, padding="max_length", max_length=32, truncation=True,
                  return_tensors="pt").input_ids

    g = seeded(7 if variant == "schnell" else 8)
    b, h, w, L = 2, 4, 6, 32  # packed latent grid 4x6 (a 64x96 image), 32 text tokens
    tr_inputs = {
        "hidden_states": torch.randn(b, h * w, 64, generator=g),
        "encoder_hidden_states": torch.randn(b, L, TRANSFORMER["joint_attention_dim"], generator=g),
        "pooled_projections": torch.randn(b, TRANSFORMER["pooled_projection_dim"], generator=g),
        "timestep": torch.tensor([0.75, 0.3125]),  # already /1000, as the pipeline passes it
        "img_ids": FluxPipeline._prepare_latent_image_ids(b, h, w, "cpu", torch.float32),
        "txt_ids": torch.zeros(L, 3),
    }
    if variant == "dev":
        tr_inputs["guidance"] = torch.tensor([3.5, 3.5])  # float32 even in bf16 pipelines
    z = torch.randn(1, 16, 4, 6, generator=g)  # decodes to 32x48
    image = torch.rand(1, 3, 32, 48, generator=g) * 2 - 1

    n_layers, n_t5 = CLIP["num_hidden_layers"], T5["num_layers"]
    blocks = ([f"transformer_blocks.{i}" for i in range(TRANSFORMER["num_layers"])] +
              [f"single_transformer_blocks.{i}" for i in range(TRANSFORMER["num_single_layers"])])
    tr_names = ["x_embedder", "context_embedder", "time_text_embed", "pos_embed"] + blocks + [
        "norm_out", "proj_out"]
    vae_up = [f"decoder.up_blocks.{i}" for i in range(4)]
    vae_down = [f"encoder.down_blocks.{i}" for i in range(4)]
    specs = {
        "text_encoder": (CLIPTextModel, "text_encoder", {"input_ids": clip_ids},
                         {n: "text_model." + n for n in
                          ["embeddings"] + [f"encoder.layers.{i}" for i in range(n_layers)] +
                          ["final_layer_norm"]}),
        "text_encoder_2": (T5EncoderModel, "text_encoder_2", {"input_ids": t5_ids},
                           ["shared"] + [f"encoder.block.{i}" for i in range(n_t5)] +
                           ["encoder.final_layer_norm"]),
        "transformer": (FluxTransformer2DModel, "transformer", tr_inputs, tr_names),
        "vae.decode": (AutoencoderKL, "vae", {"z": z},
                       ["decoder.conv_in", "decoder.mid_block"] + vae_up +
                       ["decoder.conv_norm_out", "decoder.conv_out"]),
        "vae.encode": (AutoencoderKL, "vae", {"sample": image},
                       ["encoder.conv_in"] + vae_down + ["encoder.mid_block", "encoder.conv_out"]),
    }
    for name, (cls, folder, inputs, names) in specs.items():
        for dname, dtype in pc.DTYPES.items():
            model = pc.load_component(cls, model_dir / folder, dtype)
            x = _float_inputs(inputs, dtype, keep_f32=("guidance",))
            with torch.no_grad(), pc.ActivationRecorder(model, names) as rec:
                if name == "vae.decode":
                    res = {"sample": model.decode(x["z"]).sample}
                elif name == "vae.encode":
                    dist = model.encode(x["sample"]).latent_dist
                    res = {"latent_dist.parameters": dist.parameters, "latent_dist.mean": dist.mean,
                           "latent_dist.logvar": dist.logvar, "latent_dist.std": dist.std}
                elif name == "transformer":
                    res = model(**x)
                else:
                    res = model(**x, output_hidden_states=True)
            outputs = pc.flatten("", res)
            inter = _rename_pairs(rec.tensors)
            pc.save_component_golden(
                out / "components" / name / dname, x, outputs, inter,
                manifest={"component": name, "dtype": dname, "model": f"{model_dir.name}/{folder}",
                          "class": cls.__name__, "weights": "bf16 files loaded in " + dname})
    return list(specs)


def _rename_pairs(t: dict) -> dict:
    """Names tuple outputs by meaning instead of position.

    Flux blocks return (encoder_hidden_states, hidden_states); pos_embed (cos, sin); a T5 block
    (hidden_states, position_bias), where the hidden states keep the block's own name.
    """
    fields = {"transformer_blocks": (2, (".encoder_hidden_states", ".hidden_states")),
              "single_transformer_blocks": (2, (".encoder_hidden_states", ".hidden_states")),
              "pos_embed": (1, (".cos", ".sin")),
              "encoder.block": (3, ("", ".position_bias"))}
    out = {}
    for k, v in t.items():
        for head, (depth, names) in fields.items():
            parts = k.split(".")
            if k.startswith(head + ".") or k.startswith(head + "@"):
                if len(parts) == depth + 1 and parts[-1] in ("0", "1"):
                    k = ".".join(parts[:-1]) + names[int(parts[-1])]
                break
        out[k] = v
    return out


# ---- pipeline goldens ---------------------------------------------------------------------


def _run_case(model_dir: pathlib.Path, dtype: torch.dtype, prompt: str, seed: int, height: int,
              width: int, steps: int, guidance: float, max_seq: int | None) -> dict:
    from diffusers import FluxPipeline

    pipe = pc.load_pipeline(FluxPipeline, model_dir, dtype)
    kwargs = {} if max_seq is None else {"max_sequence_length": max_seq}
    rec_steps = pc.StepRecorder()
    noise = {}

    def on_transformer(_m, _args, kwargs_in, output):
        i = len(noise) // 2
        noise[f"noise_pred.{i}"] = output[0].detach().clone()
        noise[f"timestep.{i}"] = kwargs_in["timestep"].detach().clone()

    handle = pipe.transformer.register_forward_hook(on_transformer, with_kwargs=True)
    try:
        with pc.MethodRecorder(pipe, "prepare_latents", ["initial_latents", "img_ids"]) as lat, \
             pc.MethodRecorder(pipe, "encode_prompt",
                               ["prompt_embeds", "pooled_prompt_embeds", "txt_ids"]) as enc, \
             pc.InputRecorder(pipe.text_encoder, "clip", ["input_ids"]) as ids1, \
             pc.InputRecorder(pipe.text_encoder_2, "t5", ["input_ids"]) as ids2, \
             pc.InputRecorder(pipe.vae.decoder, "vae", ["z"]) as vin, \
             pc.ActivationRecorder(pipe.vae, ["decoder"]) as vout:
            images = pipe(prompt, height=height, width=width, num_inference_steps=steps,
                          guidance_scale=guidance, generator=torch.Generator("cpu").manual_seed(seed),
                          output_type="np", callback_on_step_end=rec_steps, **kwargs).images
    finally:
        handle.remove()
    t = {}
    t.update(lat.tensors)
    t.update(enc.tensors)
    t["clip_input_ids"] = ids1.tensors["clip.input_ids@0"]
    t["t5_input_ids"] = ids2.tensors["t5.input_ids@0"]
    t["vae_z"] = vin.tensors["vae.z@0"]  # (latents / scaling_factor) + shift_factor, unpacked
    t["vae_sample"] = vout.tensors["decoder"]
    t.update(rec_steps.tensors)
    t.update(noise)
    t["timesteps"] = pipe.scheduler.timesteps.clone()
    t["sigmas"] = pipe.scheduler.sigmas.clone()
    t.update(pc.image_tensors(images))
    return t


def _self_check(t: dict, dtype: torch.dtype, seed: int, height: int, width: int, steps: int):
    """Fails the run if diffusers stops doing what the README documents for these tensors."""
    h, w = 2 * (height // 16), 2 * (width // 16)
    noise = torch.randn((1, 16, h, w), generator=seeded(seed), dtype=dtype)
    packed = noise.view(1, 16, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5)
    assert torch.equal(packed.reshape(1, h * w // 4, 64), t["initial_latents"]), "noise packing"
    s = t["sigmas"]
    assert torch.equal(t["timesteps"], s[:-1] * 1000) and s[-1] == 0, "timesteps = sigmas * 1000"
    prev = t["initial_latents"]
    for i in range(steps):
        # Euler: dt is a 0-dim f32 tensor, so dt * v stays in v's dtype (bf16 rounds here).
        step = (prev.float() + (s[i + 1] - s[i]) * t[f"noise_pred.{i}"]).to(dtype)
        assert torch.equal(step, t[f"latents.{i}"]), f"Euler step {i}"
        prev = step
    unpacked = prev.view(1, h // 2, w // 2, 16, 2, 2).permute(0, 3, 1, 4, 2, 5).reshape(1, 16, h, w)
    assert torch.equal(unpacked / VAE["scaling_factor"] + VAE["shift_factor"], t["vae_z"]), "vae_z"
    image = (t["vae_sample"] * 0.5 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).float()
    assert torch.equal(image, t["image"]), "postprocess"


def _pipeline_goldens(variant: str, model_dir: pathlib.Path, out: pathlib.Path) -> list[str]:
    names = []
    for name, p, seed, height, width, steps, max_seq in CASES[variant]:
        for dname, dtype in pc.DTYPES.items():
            t = _run_case(model_dir, dtype, PROMPTS[p], seed, height, width, steps,
                          GUIDANCE[variant], max_seq)
            _self_check(t, dtype, seed, height, width, steps)
            manifest = {
                "model": model_dir.name, "pipeline": "FluxPipeline", "dtype": dname,
                "prompt": PROMPTS[p], "prompt_2": None, "seed": seed, "height": height,
                "width": width, "num_inference_steps": steps, "guidance_scale": GUIDANCE[variant],
                "max_sequence_length": 512 if max_seq is None else max_seq,
                "max_sequence_length_is_default": max_seq is None,
                "generator": "torch.Generator('cpu').manual_seed(seed)", "output_type": "np",
                "notes": {
                    "initial_latents": "packed (B, hw/4, 64), drawn in the pipeline dtype",
                    "latents.i": "packed latents after step i (callback_on_step_end): "
                                 "(latents.f32 + (dt * noise_pred.i in the model dtype)).to(dtype)",
                    "noise_pred.i/timestep.i": "transformer output / timestep argument at step i",
                    "timesteps/sigmas": "scheduler state after set_timesteps (sigmas end in 0)",
                    "vae_z/vae_sample": "VAE decoder input and output (before postprocess)",
                    "image": "output_type=np, (B, H, W, 3) float32 in [0, 1]",
                    "image_uint8": "the PIL image's uint8 pixels (B, H, W, 3), stored as int32",
                },
            }
            pc.save_case(out / "pipeline" / name / dname, t, manifest)
        names.append(name)
    return names


def _quiet() -> None:
    import diffusers
    import huggingface_hub
    import transformers

    diffusers.utils.logging.set_verbosity_error()
    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    huggingface_hub.utils.disable_progress_bars()


def make(fixtures_dir: pathlib.Path) -> None:
    import tempfile

    _quiet()
    for variant in ("schnell", "dev"):
        model_dir = fixtures_dir / f"flux1-{variant}-tiny"
        out = fixtures_dir / "goldens" / f"flux1-{variant}-tiny"
        with tempfile.TemporaryDirectory() as tmp:
            _build(variant, model_dir, pathlib.Path(tmp))
        if out.exists():
            import shutil
            shutil.rmtree(out)
        components = _component_goldens(variant, model_dir, out)
        cases = _pipeline_goldens(variant, model_dir, out)
        pc.write_json(out / "index.json", {
            "model": model_dir.name, "components": components, "dtypes": list(pc.DTYPES),
            "cases": cases, "guidance_scale": GUIDANCE[variant],
            "scheduler": SCHEDULER[variant]})
        print(f"  {model_dir.name}: {pc.dir_size(model_dir) / 1e6:.2f} MB, goldens "
              f"{pc.dir_size(out) / 1e6:.2f} MB", flush=True)
