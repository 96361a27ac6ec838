"""Stable Diffusion 3.5-medium style tiny pipeline and its goldens.

Writes
* tests/fixtures/sd35-medium-tiny/: a StableDiffusion3Pipeline.save_pretrained folder with the
  class names and layout of stabilityai/stable-diffusion-3.5-medium (bf16 weights; transformer
  and text_encoder_3 sharded with index files; CLIP-L/CLIP-G/T5 tokenizer folders).
* tests/fixtures/goldens/sd35-medium-tiny/components/<component>/<f32|bf16>/: inputs, outputs and
  named per-block intermediates of every model (weights loaded from the bf16 files).
* tests/fixtures/goldens/sd35-medium-tiny/pipeline/<case>/<f32|bf16>/: one pipeline run each.

Tiny config, keeping the real model's structure:
* text_encoder: CLIPTextModelWithProjection, CLIP-L style (quick_gelu), hidden 8, 2 heads of 4.
* text_encoder_2: CLIPTextModelWithProjection, CLIP-G style (gelu), hidden 12, 3 heads of 4
  (the same head dim as CLIP-L, more heads, as 64 x 12 vs 64 x 20), 3 layers.
  Both keep the published eos_token_id=2, so pooling takes argmax(input_ids) (the eot token).
* text_encoder_3: T5EncoderModel (gated-gelu), d_model 32 = joint_attention_dim; the CLIP
  states (8 + 12 = 20 wide) are zero-padded to 32 by the pipeline, as 2048 -> 4096 in the real one.
* transformer: SD3Transformer2DModel, 2 heads x 16, 4 blocks, dual attention in blocks 0-1
  (13 of 24 in the real one), qk_norm rms_norm, the last block context_pre_only (diffusers sets it
  on block num_layers-1 itself), pos_embed_max_size 16 (so images up to 256 px).
* vae: AutoencoderKL, 4 blocks (vae_scale_factor 8), 16 latent channels, no quant convs,
  scaling 1.5305, shift 0.0609.
* scheduler: FlowMatchEulerDiscreteScheduler(shift=3.0), the published SD3.5 config.
* tokenizer_2 pads with "!" (id 0) as the published SD3 tokenizer_2 does; tokenizer with
  <|endoftext|>.
"""
import pathlib
import tempfile

import torch
from diffusers import (
    AutoencoderKL,
    FlowMatchEulerDiscreteScheduler,
    SD3Transformer2DModel,
    StableDiffusion3Pipeline,
)
from transformers import (
    CLIPTextConfig,
    CLIPTextModelWithProjection,
    CLIPTokenizer,
    T5Config,
    T5EncoderModel,
    T5TokenizerFast,
)

from goldens import _pipeline_common as pc
from goldens._common import seeded

NAME = "sd35-medium-tiny"
SHARDS = {"transformer": "200KB", "text_encoder_3": "60KB"}
NORM1 = ["", ".gate_msa", ".shift_mlp", ".scale_mlp", ".gate_mlp", ".norm_hidden_states2",
         ".gate_msa2"]  # AdaLayerNormZero / SD35AdaLayerNormZeroX outputs
TUPLES = {"transformer_blocks.*": [".encoder_hidden_states", ".hidden_states"],
          "transformer_blocks.*.attn": [".hidden_states", ".encoder_hidden_states"],
          "transformer_blocks.*.norm1": NORM1,
          "encoder.block.*": ["", ".position_bias"],
          "encoder.block.*.layer.0": ["", ".position_bias"]}
COMPONENTS = ["text_encoder", "text_encoder_2", "text_encoder_3", "transformer", "vae.decode",
              "vae.encode"]

CASES = [
    dict(name="cat_64x64_cfg", prompt="a photo of a cat", seed=0, height=64, width=64,
         num_inference_steps=2, guidance_scale=5.0, max_sequence_length=256),
    dict(name="fox_48x80_cfg", prompt="A red fox in the snow, watercolor painting", seed=42,
         height=48, width=80, num_inference_steps=3, guidance_scale=7.0, max_sequence_length=32),
    dict(name="robot_96x48_nocfg", prompt="a tiny robot reading a book", seed=7, height=96,
         width=48, num_inference_steps=2, guidance_scale=1.0, max_sequence_length=77),
]


def _t5_vocab_size(folder: pathlib.Path) -> int:
    return len(T5TokenizerFast.from_pretrained(str(folder)))


def build_pipeline(tok_dirs: dict[str, pathlib.Path]) -> StableDiffusion3Pipeline:
    """Seeded tiny components (f32 in memory; save_pipeline stores them in bf16)."""
    clip_common = dict(vocab_size=49408, max_position_embeddings=77, bos_token_id=0,
                       eos_token_id=2, pad_token_id=1, layer_norm_eps=1e-5)
    text_encoder = CLIPTextModelWithProjection(CLIPTextConfig(
        hidden_size=8, intermediate_size=32, num_hidden_layers=2, num_attention_heads=2,
        hidden_act="quick_gelu", projection_dim=8, **clip_common))
    text_encoder_2 = CLIPTextModelWithProjection(CLIPTextConfig(
        hidden_size=12, intermediate_size=48, num_hidden_layers=3, num_attention_heads=3,
        hidden_act="gelu", projection_dim=12, **clip_common))
    text_encoder_3 = T5EncoderModel(T5Config(
        vocab_size=_t5_vocab_size(tok_dirs["tokenizer_3"]), d_model=32, d_kv=8, d_ff=64,
        num_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
        tie_word_embeddings=False, layer_norm_epsilon=1e-6, pad_token_id=0, eos_token_id=1,
        decoder_start_token_id=0))
    transformer = SD3Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=16, num_layers=4, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, caption_projection_dim=32,
        pooled_projection_dim=20, out_channels=16, pos_embed_max_size=16,
        dual_attention_layers=(0, 1), qk_norm="rms_norm")
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 16, 16, 16),
        layers_per_block=1, latent_channels=16, norm_num_groups=4, sample_size=64,
        scaling_factor=1.5305, shift_factor=0.0609, use_quant_conv=False,
        use_post_quant_conv=False)
    scheduler = FlowMatchEulerDiscreteScheduler(num_train_timesteps=1000, shift=3.0)
    for seed, model in enumerate([text_encoder, text_encoder_2, text_encoder_3, transformer, vae]):
        pc.init_weights_(model, seed=1000 + seed)
    return StableDiffusion3Pipeline(
        transformer=transformer, scheduler=scheduler, vae=vae,
        text_encoder=text_encoder,
        tokenizer=CLIPTokenizer.from_pretrained(str(tok_dirs["tokenizer"])),
        text_encoder_2=text_encoder_2,
        tokenizer_2=CLIPTokenizer.from_pretrained(str(tok_dirs["tokenizer_2"])),
        text_encoder_3=text_encoder_3,
        tokenizer_3=T5TokenizerFast.from_pretrained(str(tok_dirs["tokenizer_3"])))


# ---- tokenizer folders ------------------------------------------------------------------------


def _clip_folder(dst: pathlib.Path, pad_token: str) -> None:
    from goldens.tokenizers import build_clip_tokenizer

    build_clip_tokenizer(dst, pad_token=pad_token)


def _t5_folder(dst: pathlib.Path) -> None:
    from goldens.tokenizers import build_t5_tokenizer

    build_t5_tokenizer(dst)


TOKENIZER_BUILDERS = {
    "tokenizer": lambda d: _clip_folder(d, "<|endoftext|>"),
    "tokenizer_2": lambda d: _clip_folder(d, "!"),
    "tokenizer_3": _t5_folder,
}


# ---- component goldens ------------------------------------------------------------------------


def _save_component(dst: pathlib.Path, inputs, outputs, intermediates, info: dict) -> None:
    pc.save_named_component(dst, NAME, TUPLES, inputs, outputs, intermediates, info)


def _component_goldens(pipe_dir: pathlib.Path, out: pathlib.Path, dtype_name: str) -> None:
    dtype = pc.DTYPES[dtype_name]
    tok = CLIPTokenizer.from_pretrained(str(pipe_dir / "tokenizer"))
    tok2 = CLIPTokenizer.from_pretrained(str(pipe_dir / "tokenizer_2"))
    tok3 = T5TokenizerFast.from_pretrained(str(pipe_dir / "tokenizer_3"))
    prompts = ["a photo of a cat", ""]

    # CLIP-L / CLIP-G with projection: what the pipeline reads is text_embeds and hidden_states[-2].
    for comp, tk in (("text_encoder", tok), ("text_encoder_2", tok2)):
        model = pc.load_component(CLIPTextModelWithProjection, pipe_dir / comp, dtype)
        ids = tk(prompts, padding="max_length", max_length=77, truncation=True,
                 return_tensors="pt").input_ids
        n = model.config.num_hidden_layers
        names = (["text_model.embeddings"] + [f"text_model.encoder.layers.{i}" for i in range(n)]
                 + ["text_model.final_layer_norm", "text_projection"])
        with torch.no_grad(), pc.ActivationRecorder(model, names) as rec:
            res = model(input_ids=ids, output_hidden_states=True)
        _save_component(out / comp / dtype_name, {"input_ids": ids},
                                 pc.flatten("", res), rec.tensors,
                                 {"class": type(model).__name__, "prompts": prompts,
                                  "call": "model(input_ids, output_hidden_states=True)"})

    model = pc.load_component(T5EncoderModel, pipe_dir / "text_encoder_3", dtype)
    ids = tok3(prompts, padding="max_length", max_length=32, truncation=True,
               add_special_tokens=True, return_tensors="pt").input_ids
    n = model.config.num_layers
    names = (["encoder.embed_tokens"] + [f"encoder.block.{i}" for i in range(n)]
             + ["encoder.final_layer_norm"])
    sub_names = [f"encoder.block.{i}.layer.0" for i in range(n)]  # self-attention sub-layer
    with (torch.no_grad(), pc.ActivationRecorder(model, names) as rec,
          pc.ActivationRecorder(model, sub_names) as sub):
        res = model(input_ids=ids, output_hidden_states=True)
    _save_component(out / "text_encoder_3" / dtype_name, {"input_ids": ids},
                             pc.flatten("", res), {**rec.tensors, **sub.tensors},
                             {"class": "T5EncoderModel", "prompts": prompts,
                              "call": "model(input_ids, output_hidden_states=True)"})

    # Transformer: CFG-sized batch of 2, non-square latent grid 6x10 (48x80 px), 77+32 tokens.
    model = pc.load_component(SD3Transformer2DModel, pipe_dir / "transformer", dtype)
    g = seeded(11)
    inputs = {
        "hidden_states": torch.randn(2, 16, 6, 10, generator=g).to(dtype),
        "timestep": torch.tensor([1000.0, 437.5]).to(dtype),
        "encoder_hidden_states": torch.randn(2, 77 + 32, 32, generator=g).to(dtype),
        "pooled_projections": torch.randn(2, 20, generator=g).to(dtype),
    }
    n = model.config.num_layers
    names = (["pos_embed", "time_text_embed", "context_embedder", "norm_out", "proj_out"]
             + [f"transformer_blocks.{i}" for i in range(n)])
    # Sub-block outputs go to a second recorder: a block's hook clears its own name's prefix.
    sub_names = ([f"transformer_blocks.{i}.norm1" for i in range(n)]
                 + [f"transformer_blocks.{i}.attn" for i in range(n)]
                 + [f"transformer_blocks.{i}.attn2" for i in model.config.dual_attention_layers])
    with (torch.no_grad(), pc.ActivationRecorder(model, names) as rec,
          pc.ActivationRecorder(model, sub_names) as sub):
        res = model(**inputs, return_dict=True)
    _save_component(out / "transformer" / dtype_name, inputs, pc.flatten("", res),
                             {**rec.tensors, **sub.tensors},
                             {"class": "SD3Transformer2DModel",
                              "call": "model(hidden_states, timestep, encoder_hidden_states, "
                                      "pooled_projections)",
                              "intermediates_note": "the last block (context_pre_only) has no "
                                                    ".encoder_hidden_states output; norm1.* are "
                                                    "its AdaLN outputs (x, gates, shift/scale)"})

    vae = pc.load_component(AutoencoderKL, pipe_dir / "vae", dtype)
    z = torch.randn(1, 16, 4, 6, generator=g).to(dtype)
    names = (["decoder.conv_in", "decoder.mid_block", "decoder.conv_out"]
             + [f"decoder.up_blocks.{i}" for i in range(len(vae.decoder.up_blocks))])
    with torch.no_grad(), pc.ActivationRecorder(vae, names) as rec:
        res = vae.decode(z, return_dict=True)
    _save_component(out / "vae.decode" / dtype_name, {"z": z}, pc.flatten("", res),
                             rec.tensors, {"class": "AutoencoderKL",
                                           "call": "vae.decode(z)"})
    sample = (torch.rand(1, 3, 32, 48, generator=g) * 2 - 1).to(dtype)
    names = (["encoder.conv_in", "encoder.mid_block", "encoder.conv_out"]
             + [f"encoder.down_blocks.{i}" for i in range(len(vae.encoder.down_blocks))])
    with torch.no_grad(), pc.ActivationRecorder(vae, names) as rec:
        dist = vae.encode(sample).latent_dist
    outputs = {"latent_dist.mean": dist.mean, "latent_dist.logvar": dist.logvar,
               "latent_dist.std": dist.std, "latent_dist.mode": dist.mode()}
    _save_component(out / "vae.encode" / dtype_name, {"sample": sample}, outputs,
                             rec.tensors, {"class": "AutoencoderKL",
                                           "call": "vae.encode(sample).latent_dist"})


# ---- pipeline goldens -------------------------------------------------------------------------


def _pipeline_case(pipe, case: dict, dtype_name: str, dst: pathlib.Path) -> None:
    steps = pc.StepRecorder()
    enc_names = ["prompt_embeds", "negative_prompt_embeds", "pooled_prompt_embeds",
                 "negative_pooled_prompt_embeds"]
    with (pc.MethodRecorder(pipe, "prepare_latents", "initial_latents") as lat,
          pc.MethodRecorder(pipe, "encode_prompt", enc_names) as enc,
          pc.InputRecorder(pipe.text_encoder, "clip_l", ["input_ids"]) as ids_l,
          pc.InputRecorder(pipe.text_encoder_2, "clip_g", ["input_ids"]) as ids_g,
          pc.InputRecorder(pipe.text_encoder_3, "t5", ["input_ids"]) as ids_t5,
          pc.InputRecorder(pipe.transformer, "tr", ["hidden_states"]) as tr_in,
          pc.ActivationRecorder(pipe.transformer, [""], per_call=True) as tr_out,
          pc.InputRecorder(pipe.vae.decoder, "vae", ["z"]) as dec_in,
          pc.ActivationRecorder(pipe.vae, ["decoder"]) as dec_out):
        images = pipe(
            prompt=case["prompt"], height=case["height"], width=case["width"],
            num_inference_steps=case["num_inference_steps"],
            guidance_scale=case["guidance_scale"],
            max_sequence_length=case["max_sequence_length"],
            generator=seeded(case["seed"]), output_type="np",
            callback_on_step_end=steps, callback_on_step_end_tensor_inputs=["latents"],
        ).images
    tensors = {}
    tensors.update(lat.tensors)
    tensors.update(enc.tensors)
    tensors.update(steps.tensors)
    # encode_prompt runs the prompt first, then the negative prompt.
    for rec, name in ((ids_l, "clip_l"), (ids_g, "clip_g"), (ids_t5, "t5")):
        tensors[f"{name}_input_ids"] = rec.tensors[f"{name}.input_ids@0"]
        if f"{name}.input_ids@1" in rec.tensors:
            tensors[f"negative_{name}_input_ids"] = rec.tensors[f"{name}.input_ids@1"]
    for i in range(tr_in.calls):
        tensors[f"timestep.{i}"] = tr_in.tensors[f"tr.timestep@{i}"]
        tensors[f"noise_pred.{i}"] = tr_out.tensors[f"@{i}.0"]
    tensors["vae_z"] = dec_in.tensors["vae.z@0"]
    tensors["vae_sample"] = dec_out.tensors["decoder"]
    tensors["timesteps"] = pipe.scheduler.timesteps.detach().clone().to(torch.float32)
    tensors["sigmas"] = pipe.scheduler.sigmas.detach().clone().to(torch.float32)
    tensors.update(pc.image_tensors(images))
    # uint8 pixels kept as int32: tessera's safetensors reader has no U8.
    tensors["image_uint8"] = tensors["image_uint8"].to(torch.int32)
    manifest = dict(case)
    manifest.update(
        max_sequence_length_is_default=case["max_sequence_length"] == 256,
        model=NAME, pipeline="StableDiffusion3Pipeline", dtype=dtype_name, negative_prompt="",
        output_type="np", do_classifier_free_guidance=case["guidance_scale"] > 1,
        generator="torch.Generator('cpu').manual_seed(seed)",
        notes={
            "initial_latents": "prepare_latents output (B, 16, H/8, W/8), drawn in the pipeline "
                               "dtype",
            "latents.i": "latents after step i (callback_on_step_end)",
            "noise_pred.i/timestep.i": "transformer output (before CFG; batch [uncond, cond] "
                                       "with CFG) / its timestep argument (0..1000, float32 "
                                       "even in bf16 runs) at step i",
            "clip_l/clip_g/t5_input_ids": "token ids each text encoder got for the prompt "
                                          "(negative_*: for the empty negative prompt)",
            "prompt_embeds": "(B, 77 + max_sequence_length, 32): [CLIP-L | CLIP-G | zero pad] "
                             "penultimate states, then T5",
            "timesteps/sigmas": "scheduler state after set_timesteps (sigmas end in 0)",
            "vae_z/vae_sample": "VAE decoder input (latents / scaling_factor + shift_factor) and "
                                "output (before postprocess)",
            "image": "output_type=np, (B, H, W, 3) float32 in [0, 1]",
            "image_uint8": "the PIL image's uint8 pixels (B, H, W, 3), stored as int32",
        })
    pc.save_case(dst, tensors, manifest)


def make(fixtures: pathlib.Path) -> None:
    torch.manual_seed(0)
    pipe_dir = fixtures / NAME
    with tempfile.TemporaryDirectory() as tmp:
        tok_dirs = {k: pathlib.Path(tmp) / k for k in TOKENIZER_BUILDERS}
        for name, build in TOKENIZER_BUILDERS.items():
            build(tok_dirs[name])
        pipe = build_pipeline(tok_dirs)
    pc.save_pipeline(pipe, pipe_dir, sharded=SHARDS, folders=TOKENIZER_BUILDERS)
    # transformers 5 names every T5 tokenizer T5Tokenizer; the published folder says Fast.
    pc.patch_model_index(pipe_dir, {"tokenizer_3": ["transformers", "T5TokenizerFast"]})
    del pipe

    out = fixtures / "goldens" / NAME
    for sub in ("components", "pipeline"):
        pc._rewrite(out / sub)
    for dtype_name in ("f32", "bf16"):
        _component_goldens(pipe_dir, out / "components", dtype_name)
        pipe = pc.load_pipeline(StableDiffusion3Pipeline, pipe_dir, pc.DTYPES[dtype_name])
        for case in CASES:
            _pipeline_case(pipe, case, dtype_name, out / "pipeline" / case["name"] / dtype_name)
    pc.write_json(out / "index.json", {
        "model": NAME, "pipeline": "StableDiffusion3Pipeline", "components": COMPONENTS,
        "dtypes": list(pc.DTYPES), "cases": [c["name"] for c in CASES],
        "scheduler": {"num_train_timesteps": 1000, "shift": 3.0}})
    print(f"[{NAME}] pipeline {pc.dir_size(pipe_dir) / 1e6:.2f} MB, goldens "
          f"{pc.dir_size(out) / 1e6:.2f} MB")
