"""FLUX.2-dev style tiny pipeline and its goldens.

Writes
* tests/fixtures/flux2-dev-tiny/: a Flux2Pipeline.save_pretrained folder with the class names and
  layout of black-forest-labs/FLUX.2-dev (bf16 weights; transformer and text_encoder sharded
  with index files; the tokenizer folder as a PixtralProcessor folder).
* tests/fixtures/goldens/flux2-dev-tiny/components/<component>/<f32|bf16>/: inputs, outputs and
  named per-block intermediates of every model (weights loaded from the bf16 files).
* tests/fixtures/goldens/flux2-dev-tiny/pipeline/<case>/<f32|bf16>/: one pipeline run each.

Tiny config, keeping the real model's structure:
* text_encoder: Mistral3ForConditionalGeneration. Language model: hidden 32, 4 heads of 16
  (heads x head_dim != hidden, as 32 x 128 != 5120 in Mistral Small 3), 2 KV heads (GQA),
  rope_theta 1e9, 32 layers, so the pipeline's default text_encoder_out_layers (10, 20, 30) work
  unchanged and, as in the real 40-layer model, none of them is the final (normed) state.
  A one-layer Pixtral vision tower and the patch-merger projector exist only so the class loads.
* tokenizer: the tokenizer engineer's byte-level BPE tokenizer.json with Mistral Small 3's
  special tokens and chat template, plus PixtralProcessor's processor_config.json,
  preprocessor_config.json and chat_template.jinja, as the published folder has them.
  transformers refuses to build PixtralProcessor without torchvision (not installable next to
  torch 2.15), so model_index.json names PixtralProcessor as published, and the goldens load
  the folder's tokenizer and pass it to the pipeline: for text-only prompts the processor's
  apply_chat_template is the tokenizer's (same template, same tokenizer call).
* transformer: Flux2Transformer2DModel, 4 heads x 16, RoPE axes (4, 4, 4, 4), theta 2000,
  2 double + 2 single blocks, in_channels 128 (= 32 latent channels x 2x2 patch),
  joint_attention_dim 96 (= 3 stacked layers x 32), guidance embeds.
* vae: AutoencoderKLFlux2, 4 blocks (vae_scale_factor 8), 32 latent channels, quant convs,
  BatchNorm running statistics set to non-trivial seeded values (mean ~ 0.2 N(0,1),
  var ~ exp(0.5 N(0,1))) so the pipeline's de-normalisation is exercised.
* scheduler: FlowMatchEulerDiscreteScheduler with FLUX.2-dev's published settings (dynamic
  shifting, exponential time shift; the pipeline passes mu = compute_empirical_mu()).
"""
import json
import pathlib
import tempfile

import torch
from diffusers import (
    AutoencoderKLFlux2,
    FlowMatchEulerDiscreteScheduler,
    Flux2Pipeline,
    Flux2Transformer2DModel,
)
from diffusers.pipelines.flux2.pipeline_flux2 import compute_empirical_mu, format_input
from diffusers.pipelines.flux2.system_messages import SYSTEM_MESSAGE
from transformers import AutoTokenizer, Mistral3Config, Mistral3ForConditionalGeneration

from goldens import _pipeline_common as pc
from goldens._common import seeded

NAME = "flux2-dev-tiny"
SHARDS = {"transformer": "300KB", "text_encoder": "300KB"}
OUT_LAYERS = (10, 20, 30)  # the pipeline's default text_encoder_out_layers
COMPONENTS = ["text_encoder", "transformer", "vae.decode", "vae.encode"]
TUPLES = {"transformer_blocks.*": [".encoder_hidden_states", ".hidden_states"],
          "transformer_blocks.*.attn": [".hidden_states", ".encoder_hidden_states"],
          "pos_embed.*": [".cos", ".sin"],
          "model.language_model.layers.*.self_attn": [""]}

SCHEDULER = dict(
    num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
    max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096, invert_sigmas=False,
    shift_terminal=None, use_karras_sigmas=False, use_exponential_sigmas=False,
    use_beta_sigmas=False, time_shift_type="exponential", stochastic_sampling=False)

CASES = [
    dict(name="cat_64x64", prompt="a photo of a cat", seed=0, height=64, width=64,
         num_inference_steps=2, guidance_scale=4.0, max_sequence_length=512),
    dict(name="fox_48x80", prompt="A red fox in the snow, watercolor painting", seed=42,
         height=48, width=80, num_inference_steps=3, guidance_scale=4.0, max_sequence_length=64),
    dict(name="robot_96x48", prompt="a tiny robot reading a book", seed=7, height=96,
         width=48, num_inference_steps=4, guidance_scale=4.0, max_sequence_length=128),
]

# PixtralProcessor settings for the tiny vision tower (Mistral Small 3 uses patch 14, merge 2).
PATCH_SIZE = 14
SPATIAL_MERGE = 2


def _tokenizer_folder(dst: pathlib.Path) -> None:
    """Tokenizer engineer's Mistral folder + the processor files of a PixtralProcessor folder."""
    from goldens.tokenizers import build_mistral_tokenizer

    build_mistral_tokenizer(dst)
    template = json.loads((dst / "tokenizer_config.json").read_text())["chat_template"]
    (dst / "chat_template.jinja").write_text(template, encoding="utf-8")
    pc.write_json(dst / "processor_config.json", {
        "image_break_token": "[IMG_BREAK]", "image_end_token": "[IMG_END]",
        "image_token": "[IMG]", "patch_size": PATCH_SIZE, "processor_class": "PixtralProcessor",
        "spatial_merge_size": SPATIAL_MERGE})
    pc.write_json(dst / "preprocessor_config.json", {
        "do_convert_rgb": True, "do_normalize": True, "do_rescale": True, "do_resize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_processor_type": "PixtralImageProcessor",
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "patch_size": {"height": PATCH_SIZE, "width": PATCH_SIZE},
        "processor_class": "PixtralProcessor", "resample": 3,
        "rescale_factor": 0.00392156862745098, "size": {"longest_edge": 1540}})


def build_pipeline(tokenizer) -> Flux2Pipeline:
    """Seeded tiny components (f32 in memory; save_pipeline stores them in bf16)."""
    text_encoder = Mistral3ForConditionalGeneration(Mistral3Config(
        text_config=dict(
            model_type="mistral", vocab_size=len(tokenizer), hidden_size=32, head_dim=16,
            num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
            num_hidden_layers=32, rms_norm_eps=1e-5, rope_theta=1e9,
            max_position_embeddings=131072, sliding_window=None, bos_token_id=1,
            eos_token_id=2, pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=False),
        vision_config=dict(
            model_type="pixtral", hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
            head_dim=8, intermediate_size=32, image_size=56, patch_size=PATCH_SIZE,
            num_channels=3, rope_theta=10000.0),
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
        spatial_merge_size=SPATIAL_MERGE, multimodal_projector_bias=False,
        projector_hidden_act="gelu", vision_feature_layer=-1, tie_word_embeddings=False))
    transformer = Flux2Transformer2DModel(
        patch_size=1, in_channels=128, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=4, joint_attention_dim=3 * 32, timestep_guidance_channels=256,
        mlp_ratio=3.0, axes_dims_rope=(4, 4, 4, 4), rope_theta=2000, eps=1e-6,
        guidance_embeds=True)
    vae = AutoencoderKLFlux2(
        in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 16, 16, 16),
        layers_per_block=1, latent_channels=32, norm_num_groups=4, sample_size=64,
        use_quant_conv=True, use_post_quant_conv=True, batch_norm_eps=1e-4,
        batch_norm_momentum=0.1, patch_size=(2, 2))
    for seed, model in enumerate([text_encoder, transformer, vae]):
        pc.init_weights_(model, seed=2000 + seed)
    with torch.no_grad():
        g = seeded(2100)
        bn = vae.bn
        bn.running_mean.copy_((0.2 * torch.randn(bn.running_mean.shape, generator=g))
                              .to(torch.bfloat16).float())
        bn.running_var.copy_(torch.exp(0.5 * torch.randn(bn.running_var.shape, generator=g))
                             .to(torch.bfloat16).float())
    return Flux2Pipeline(scheduler=FlowMatchEulerDiscreteScheduler(**SCHEDULER), vae=vae,
                         text_encoder=text_encoder, tokenizer=tokenizer, transformer=transformer)


def _load_pipeline(pipe_dir: pathlib.Path, dtype: torch.dtype) -> Flux2Pipeline:
    """Component by component: from_pretrained would build the (torchvision-only) processor."""
    pipe = Flux2Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(str(pipe_dir / "scheduler")),
        vae=pc.load_component(AutoencoderKLFlux2, pipe_dir / "vae", dtype),
        text_encoder=pc.load_component(Mistral3ForConditionalGeneration,
                                       pipe_dir / "text_encoder", dtype),
        tokenizer=AutoTokenizer.from_pretrained(str(pipe_dir / "tokenizer")),
        transformer=pc.load_component(Flux2Transformer2DModel, pipe_dir / "transformer", dtype))
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---- component goldens ------------------------------------------------------------------------


def _chat_inputs(tok, prompts, max_length):
    """input_ids / attention_mask exactly as Flux2Pipeline._get_mistral_3_small_prompt_embeds."""
    return tok.apply_chat_template(
        format_input(prompts=prompts, system_message=SYSTEM_MESSAGE),
        add_generation_prompt=False, tokenize=True, return_dict=True, return_tensors="pt",
        padding="max_length", truncation=True, max_length=max_length)


def _save_component(dst: pathlib.Path, inputs, outputs, intermediates, info: dict) -> None:
    pc.save_named_component(dst, NAME, TUPLES, inputs, outputs, intermediates, info)


def _component_goldens(pipe: Flux2Pipeline, out: pathlib.Path, dtype_name: str) -> None:
    dtype = pc.DTYPES[dtype_name]

    # Mistral3 text encoder: the pipeline reads hidden_states[10], [20], [30].
    model = pipe.text_encoder
    enc = _chat_inputs(pipe.tokenizer, ["a photo of a cat", ""], 64)
    inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
    lm = "model.language_model"
    n = model.config.text_config.num_hidden_layers
    names = ([f"{lm}.embed_tokens", f"{lm}.norm"]
             + [f"{lm}.layers.{i}" for i in (0, 9, 19, 29, n - 1)])
    # Sub-layers in a second recorder: a layer's hook clears everything under its own name.
    sub_names = [f"{lm}.layers.0.{m}" for m in ("input_layernorm", "self_attn",
                                                "post_attention_layernorm", "mlp")]
    with (torch.no_grad(), pc.ActivationRecorder(model, names) as rec,
          pc.ActivationRecorder(model, sub_names) as sub):
        res = model(**inputs, output_hidden_states=True, use_cache=False)
    rec.tensors.update(sub.tensors)
    outputs = {f"hidden_states.{k}": res.hidden_states[k] for k in (0,) + OUT_LAYERS + (n,)}
    outputs["prompt_embeds"] = torch.stack([res.hidden_states[k] for k in OUT_LAYERS], dim=1) \
        .permute(0, 2, 1, 3).reshape(2, -1, 3 * model.config.text_config.hidden_size)
    inter = rec.tensors
    _save_component(
        out / "text_encoder" / dtype_name, inputs, outputs, inter,
        {"class": "Mistral3ForConditionalGeneration",
         "prompts": ["a photo of a cat", ""], "max_length": 64,
         "call": "model(input_ids, attention_mask, output_hidden_states=True, use_cache=False)",
         "outputs_note": "hidden_states.N as in the output tuple (0 = embeddings, N = layer N "
                         "output; the last one is after the final norm); logits are not stored; "
                         "prompt_embeds = stack(hidden_states[10,20,30], 1) -> (B, L, 3*32)",
         "padding_note": "left padding: position ids are arange(L) whatever the mask, and a "
                         "pad query row (no visible key) gets attention output 0"})

    # Transformer: batch 2, 6x10 latent tokens, 24 text tokens, FLUX.2's 4-axis ids.
    model = pipe.transformer
    g = seeded(21)
    h, w, L = 3, 5, 24
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w),
                                   torch.arange(1)).unsqueeze(0).expand(2, -1, -1)
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1),
                                   torch.arange(L)).unsqueeze(0).expand(2, -1, -1)
    inputs = {
        "hidden_states": torch.randn(2, h * w, 128, generator=g).to(dtype),
        "encoder_hidden_states": torch.randn(2, L, 96, generator=g).to(dtype),
        "timestep": torch.tensor([1.0, 0.4375]).to(dtype),
        "img_ids": img_ids.contiguous(),
        "txt_ids": txt_ids.contiguous(),
        "guidance": torch.tensor([4.0, 4.0]),
    }
    names = (["time_guidance_embed", "double_stream_modulation_img",
              "double_stream_modulation_txt", "single_stream_modulation", "x_embedder",
              "context_embedder", "norm_out", "proj_out"]
             + [f"transformer_blocks.{i}" for i in range(len(model.transformer_blocks))]
             + [f"single_transformer_blocks.{i}"
                for i in range(len(model.single_transformer_blocks))])
    sub_names = ([f"transformer_blocks.{i}.attn" for i in range(len(model.transformer_blocks))]
                 + [f"single_transformer_blocks.{i}.attn"
                    for i in range(len(model.single_transformer_blocks))])
    with (torch.no_grad(), pc.ActivationRecorder(model, names) as rec,
          pc.ActivationRecorder(model, sub_names) as sub,
          pc.ActivationRecorder(model, ["pos_embed"], per_call=True) as rope):
        res = model(**inputs, return_dict=True)
    inter = {**rec.tensors, **sub.tensors}
    # pos_embed runs on img_ids first, then txt_ids: (cos, sin) each.
    for k, v in rope.tensors.items():
        which = "img" if k.startswith("pos_embed@0") else "txt"
        inter[f"pos_embed.{which}.{k.rsplit('.', 1)[1]}"] = v  # renamed .cos / .sin
    _save_component(
        out / "transformer" / dtype_name, inputs, pc.flatten("", res), inter,
        {"class": "Flux2Transformer2DModel",
         "call": "model(hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, "
                 "guidance)",
         "inputs_note": "timestep is already divided by 1000 as the pipeline passes it; guidance "
                        "is float32 as the pipeline makes it",
         "intermediates_note": "single_transformer_blocks.N is the joint [text, image] "
                               "sequence; pos_embed.{img,txt}.{cos,sin} from img_ids / txt_ids"})

    vae = pipe.vae
    z = torch.randn(1, 32, 4, 6, generator=g).to(dtype)
    names = (["post_quant_conv", "decoder.conv_in", "decoder.mid_block",
              "decoder.conv_out"]
             + [f"decoder.up_blocks.{i}" for i in range(len(vae.decoder.up_blocks))])
    with torch.no_grad(), pc.ActivationRecorder(vae, names) as rec:
        res = vae.decode(z, return_dict=True)
    _save_component(out / "vae.decode" / dtype_name, {"z": z}, pc.flatten("", res),
                             rec.tensors, {"class": "AutoencoderKLFlux2",
                                           "call": "vae.decode(z)"})
    sample = (torch.rand(1, 3, 32, 48, generator=g) * 2 - 1).to(dtype)
    names = (["encoder.conv_in", "encoder.mid_block", "encoder.conv_out",
              "quant_conv"]
             + [f"encoder.down_blocks.{i}" for i in range(len(vae.encoder.down_blocks))])
    with torch.no_grad(), pc.ActivationRecorder(vae, names) as rec:
        dist = vae.encode(sample).latent_dist
    outputs = {"latent_dist.mean": dist.mean, "latent_dist.logvar": dist.logvar,
               "latent_dist.std": dist.std, "latent_dist.mode": dist.mode(),
               "bn.running_mean": vae.bn.running_mean.detach().clone(),
               "bn.running_var": vae.bn.running_var.detach().clone()}
    _save_component(out / "vae.encode" / dtype_name, {"sample": sample}, outputs,
                             rec.tensors, {"class": "AutoencoderKLFlux2",
                                           "call": "vae.encode(sample).latent_dist"})


# ---- pipeline goldens -------------------------------------------------------------------------


def _pipeline_case(pipe: Flux2Pipeline, case: dict, dtype_name: str, dst: pathlib.Path) -> None:
    steps = pc.StepRecorder()
    with (pc.MethodRecorder(pipe, "prepare_latents", ["initial_latents", "latent_ids"]) as lat,
          pc.MethodRecorder(pipe, "encode_prompt", ["prompt_embeds", "text_ids"]) as enc,
          pc.InputRecorder(pipe.text_encoder, "text_encoder", ["input_ids"]) as te_in,
          pc.InputRecorder(pipe.transformer, "tr", ["hidden_states"]) as tr_in,
          pc.ActivationRecorder(pipe.transformer, [""], per_call=True) as tr_out,
          pc.InputRecorder(pipe.vae.post_quant_conv, "vae", ["z"]) as dec_in,
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
    tensors["input_ids"] = te_in.tensors["text_encoder.input_ids@0"]
    tensors["attention_mask"] = te_in.tensors["text_encoder.attention_mask@0"]
    for i in range(tr_in.calls):
        tensors[f"timestep.{i}"] = tr_in.tensors[f"tr.timestep@{i}"]
        tensors[f"noise_pred.{i}"] = tr_out.tensors[f"@{i}.0"]
    tensors["guidance"] = tr_in.tensors["tr.guidance@0"]
    tensors["vae_z"] = dec_in.tensors["vae.z@0"]
    tensors["vae_sample"] = dec_out.tensors["decoder"]
    tensors["timesteps"] = pipe.scheduler.timesteps.detach().clone().to(torch.float32)
    tensors["sigmas"] = pipe.scheduler.sigmas.detach().clone().to(torch.float32)
    tensors.update(pc.image_tensors(images))
    # uint8 pixels kept as int32: tessera's safetensors reader has no U8.
    tensors["image_uint8"] = tensors["image_uint8"].to(torch.int32)
    seq = (case["height"] // 16) * (case["width"] // 16)
    manifest = dict(case)
    manifest.update(
        max_sequence_length_is_default=case["max_sequence_length"] == 512,
        model=NAME, pipeline="Flux2Pipeline", dtype=dtype_name, output_type="np",
        text_encoder_out_layers=list(OUT_LAYERS), image_seq_len=seq,
        mu=compute_empirical_mu(seq, case["num_inference_steps"]),
        generator="torch.Generator('cpu').manual_seed(seed)",
        notes={
            "initial_latents": "prepare_latents output: noise drawn as (B, 128, H/16, W/16) in "
                               "the pipeline dtype, packed to (B, H/16*W/16, 128); latent_ids "
                               "(B, N, 4) rows (0, h, w, 0)",
            "latents.i": "packed latents after step i (callback_on_step_end)",
            "noise_pred.i/timestep.i": "transformer output / its timestep argument at step i: "
                                       "t cast to the latents' dtype (bf16 in bf16 runs), then "
                                       "/ 1000; guidance: its guidance argument (float32)",
            "input_ids/attention_mask": "chat-template ids the text encoder got (left padded)",
            "prompt_embeds/text_ids": "stacked hidden_states[10, 20, 30] (B, L, 96) and text ids "
                                      "(B, L, 4) rows (0, 0, 0, l)",
            "timesteps/sigmas": "scheduler state after set_timesteps (sigmas end in 0)",
            "vae_z": "tokens scattered back by latent_ids, de-normalised with the VAE BatchNorm "
                     "statistics (x * sqrt(var + eps) + mean), un-patchified: the input of "
                     "vae.decode (post_quant_conv)",
            "vae_sample": "VAE decoder output (before postprocess)",
            "image": "output_type=np, (B, H, W, 3) float32 in [0, 1]",
            "image_uint8": "the PIL image's uint8 pixels (B, H, W, 3), stored as int32",
        })
    pc.save_case(dst, tensors, manifest)


def make(fixtures: pathlib.Path) -> None:
    torch.manual_seed(0)
    pipe_dir = fixtures / NAME
    with tempfile.TemporaryDirectory() as tmp:
        _tokenizer_folder(pathlib.Path(tmp))
        pipe = build_pipeline(AutoTokenizer.from_pretrained(tmp))
    pc.save_pipeline(pipe, pipe_dir, sharded=SHARDS, folders={"tokenizer": _tokenizer_folder})
    pc.patch_model_index(pipe_dir, {"tokenizer": ["transformers", "PixtralProcessor"]})
    del pipe

    out = fixtures / "goldens" / NAME
    for sub in ("components", "pipeline"):
        pc._rewrite(out / sub)
    for dtype_name in ("f32", "bf16"):
        pipe = _load_pipeline(pipe_dir, pc.DTYPES[dtype_name])
        _component_goldens(pipe, out / "components", dtype_name)
        for case in CASES:
            _pipeline_case(pipe, case, dtype_name, out / "pipeline" / case["name"] / dtype_name)
    pc.write_json(out / "index.json", {
        "model": NAME, "pipeline": "Flux2Pipeline", "components": COMPONENTS,
        "dtypes": list(pc.DTYPES), "cases": [c["name"] for c in CASES],
        "guidance_scale": 4.0, "scheduler": SCHEDULER})
    print(f"[{NAME}] pipeline {pc.dir_size(pipe_dir) / 1e6:.2f} MB, goldens "
          f"{pc.dir_size(out) / 1e6:.2f} MB")
