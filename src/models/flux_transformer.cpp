#include "models/flux_transformer.h"

#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "io/model_folder.h"
#include "nn/checkpoint_source.h"
#include "ops/copy.h"
#include "ops/elementwise.h"
#include "ops/shape_ops.h"
#include "runtime/error.h"

namespace tessera {

namespace {

constexpr const char* kWhere = "[FluxTransformer2DModel]";

void require_positive(const JsonConfig& c, const std::string& key, int64_t v) {
  TESSERA_CHECK(v > 0, kWhere, " unsupported value ", key, "=", v, " in ", c.source(),
                "; expected a positive integer");
}

// ids (L, n) or the deprecated batched (B, L, n), of which diffusers keeps the first row.
Tensor unbatched_ids(const Tensor& ids, const char* name) {
  TESSERA_CHECK(ids.defined(), kWhere, " ", name, " is required");
  TESSERA_CHECK(ids.ndim() == 2 || ids.ndim() == 3, kWhere, " ", name, " must be (L, 3), got ",
                ids.describe());
  return ids.ndim() == 3 ? ids.select(0, 0) : ids;
}

}  // namespace

FluxTransformerConfig FluxTransformerConfig::from_json(const JsonConfig& c) {
  const std::string class_name = c.get_string("_class_name", "FluxTransformer2DModel");
  TESSERA_CHECK(class_name == "FluxTransformer2DModel", kWhere, " unsupported _class_name '",
                class_name, "' in ", c.source(), "; expected FluxTransformer2DModel");
  FluxTransformerConfig cfg;
  cfg.patch_size = c.get_int("patch_size", 1);
  cfg.in_channels = c.get_int("in_channels");
  cfg.out_channels = c.get_int("out_channels", cfg.in_channels);
  cfg.num_layers = c.get_int("num_layers");
  cfg.num_single_layers = c.get_int("num_single_layers");
  cfg.attention_head_dim = c.get_int("attention_head_dim");
  cfg.num_attention_heads = c.get_int("num_attention_heads");
  cfg.joint_attention_dim = c.get_int("joint_attention_dim");
  cfg.pooled_projection_dim = c.get_int("pooled_projection_dim");
  cfg.guidance_embeds = c.get_bool("guidance_embeds", false);
  cfg.axes_dims_rope = c.get_int_list("axes_dims_rope");

  require_positive(c, "patch_size", cfg.patch_size);
  require_positive(c, "in_channels", cfg.in_channels);
  require_positive(c, "out_channels", cfg.out_channels);
  TESSERA_CHECK(cfg.num_layers >= 0, kWhere, " unsupported value num_layers=", cfg.num_layers,
                " in ", c.source());
  TESSERA_CHECK(cfg.num_single_layers >= 0, kWhere,
                " unsupported value num_single_layers=", cfg.num_single_layers, " in ", c.source());
  require_positive(c, "attention_head_dim", cfg.attention_head_dim);
  require_positive(c, "num_attention_heads", cfg.num_attention_heads);
  require_positive(c, "joint_attention_dim", cfg.joint_attention_dim);
  require_positive(c, "pooled_projection_dim", cfg.pooled_projection_dim);
  // The rotary tables cover each head exactly, one even slice per position axis.
  int64_t rope_dim = 0;
  for (int64_t d : cfg.axes_dims_rope) {
    TESSERA_CHECK(d > 0 && d % 2 == 0, kWhere, " unsupported value axes_dims_rope containing ", d,
                  " in ", c.source(), "; every axis needs a positive even size");
    rope_dim += d;
  }
  TESSERA_CHECK(!cfg.axes_dims_rope.empty() && rope_dim == cfg.attention_head_dim, kWhere,
                " unsupported value axes_dims_rope (sum ", rope_dim, ") in ", c.source(),
                "; the axes must add up to attention_head_dim=", cfg.attention_head_dim);
  return cfg;
}

FluxTransformer2DModel::FluxTransformer2DModel(const FluxTransformerConfig& cfg)
    : config(cfg),
      pos_embed(10000.0, cfg.axes_dims_rope),
      time_text_embed(cfg.inner_dim(), cfg.pooled_projection_dim, cfg.guidance_embeds),
      context_embedder(cfg.joint_attention_dim, cfg.inner_dim()),
      x_embedder(cfg.in_channels, cfg.inner_dim()),
      norm_out(cfg.inner_dim(), cfg.inner_dim(), 1e-6),
      proj_out(cfg.inner_dim(), cfg.patch_size * cfg.patch_size * cfg.out_channels) {
  const int64_t dim = cfg.inner_dim();
  for (int64_t i = 0; i < cfg.num_layers; ++i)
    transformer_blocks.push_back(std::make_unique<flux::FluxTransformerBlock>(
        dim, cfg.num_attention_heads, cfg.attention_head_dim));
  for (int64_t i = 0; i < cfg.num_single_layers; ++i)
    single_transformer_blocks.push_back(std::make_unique<flux::FluxSingleTransformerBlock>(
        dim, cfg.num_attention_heads, cfg.attention_head_dim));
  register_module("time_text_embed", &time_text_embed);
  register_module("context_embedder", &context_embedder);
  register_module("x_embedder", &x_embedder);
  register_modules("transformer_blocks", transformer_blocks);
  register_modules("single_transformer_blocks", single_transformer_blocks);
  register_module("norm_out", &norm_out);
  register_module("proj_out", &proj_out);
}

std::unique_ptr<FluxTransformer2DModel> FluxTransformer2DModel::from_pretrained(
    const std::string& folder, DType dtype) {
  TESSERA_CHECK(dtype == DType::f32 || dtype == DType::bf16, kWhere, " dtype ", dtype_name(dtype),
                " is not supported; use f32 or bf16");
  TESSERA_CHECK(std::filesystem::is_directory(folder), kWhere, " component folder '", folder,
                "' does not exist");
  const std::string config_path = (std::filesystem::path(folder) / "config.json").string();
  TESSERA_CHECK(std::filesystem::exists(config_path), kWhere, " no config.json in '", folder, "'");
  auto model = std::make_unique<FluxTransformer2DModel>(
      FluxTransformerConfig::from_json(JsonConfig::load(config_path)));
  const auto source = CheckpointWeightSource::open(folder);
  LoadOptions options;
  options.dtype = dtype;
  const auto unused = model->load_weights(source, options);
  // Tensors the config has no place for mean the config does not describe these weights.
  if (!unused.empty()) {
    std::string names;
    for (size_t i = 0; i < unused.size() && i < 5; ++i) names += (i ? ", " : "") + unused[i];
    TESSERA_FAIL(kWhere, " ", source.describe(), " has ", unused.size(), " tensor(s) that ",
                 config_path, " has no place for: ", names, unused.size() > 5 ? ", ..." : "");
  }
  model->dtype_ = dtype;
  // TESSERA_COMPILE=full|regional: the test suites run every model test in compiled mode.
  if (const char* mode = std::getenv("TESSERA_COMPILE"); mode && *mode) {
    if (std::strcmp(mode, "full") == 0)
      model->compile();
    else if (std::strcmp(mode, "regional") == 0)
      model->compile_repeated_blocks();
    else
      TESSERA_FAIL(kWhere, " TESSERA_COMPILE='", mode, "' is not a mode; use full or regional");
  }
  return model;
}

std::vector<std::string> FluxTransformer2DModel::capture_names() const {
  std::vector<std::string> names = {"x_embedder", "time_text_embed", "context_embedder",
                                    "pos_embed.cos", "pos_embed.sin"};
  for (size_t i = 0; i < transformer_blocks.size(); ++i)
    for (const char* k : {".encoder_hidden_states", ".hidden_states"})
      names.push_back("transformer_blocks." + std::to_string(i) + k);
  for (size_t i = 0; i < single_transformer_blocks.size(); ++i)
    for (const char* k : {".encoder_hidden_states", ".hidden_states"})
      names.push_back("single_transformer_blocks." + std::to_string(i) + k);
  names.push_back("norm_out");
  names.push_back("proj_out");
  return names;
}

Tensor FluxTransformer2DModel::forward(const FluxTransformerInputs& in,
                                       std::map<std::string, Tensor>* capture) const {
  if (!compiled_whole()) return forward_eager(in, capture);
  // Compiled: the inputs are the program's inputs; captured activations are extra outputs.
  const std::vector<std::string> names = capture ? capture_names() : std::vector<std::string>{};
  const auto outs = call_compiled(
      {in.hidden_states, in.encoder_hidden_states, in.pooled_projections, in.timestep, in.img_ids,
       in.txt_ids, in.guidance},
      [&](const std::vector<Tensor>& x) {
        std::map<std::string, Tensor> cap;
        const Tensor sample =
            forward_eager({x[0], x[1], x[2], x[3], x[4], x[5], x[6]}, capture ? &cap : nullptr);
        std::vector<Tensor> r{sample};
        for (const auto& n : names) r.push_back(cap.at(n));
        return r;
      },
      capture ? 1 : 0);
  for (size_t i = 0; i < names.size(); ++i) (*capture)[names[i]] = outs[i + 1];
  return outs[0];
}

Tensor FluxTransformer2DModel::forward_eager(const FluxTransformerInputs& in,
                                             std::map<std::string, Tensor>* capture) const {
  auto record = [&](const std::string& name, const Tensor& t) {
    if (capture) (*capture)[name] = t;
  };
  const FluxTransformerConfig& c = config;
  TESSERA_CHECK(in.hidden_states.defined() && in.hidden_states.ndim() == 3 &&
                    in.hidden_states.dim(2) == c.in_channels,
                kWhere, " hidden_states must be (B, L_img, ", c.in_channels, "), got ",
                in.hidden_states.defined() ? in.hidden_states.describe() : "nothing");
  const int64_t B = in.hidden_states.dim(0);
  TESSERA_CHECK(
      in.encoder_hidden_states.defined() && in.encoder_hidden_states.ndim() == 3 &&
          in.encoder_hidden_states.dim(0) == B &&
          in.encoder_hidden_states.dim(2) == c.joint_attention_dim,
      kWhere, " encoder_hidden_states must be (", B, ", L_txt, ", c.joint_attention_dim, "), got ",
      in.encoder_hidden_states.defined() ? in.encoder_hidden_states.describe() : "nothing");
  TESSERA_CHECK(in.pooled_projections.defined() && in.pooled_projections.ndim() == 2 &&
                    in.pooled_projections.dim(0) == B &&
                    in.pooled_projections.dim(1) == c.pooled_projection_dim,
                kWhere, " pooled_projections must be (", B, ", ", c.pooled_projection_dim,
                "), got ",
                in.pooled_projections.defined() ? in.pooled_projections.describe() : "nothing");
  TESSERA_CHECK(in.timestep.defined() && in.timestep.ndim() == 1 && in.timestep.dim(0) == B, kWhere,
                " timestep must be (", B, ",), got ",
                in.timestep.defined() ? in.timestep.describe() : "nothing");
  if (c.guidance_embeds) {
    TESSERA_CHECK(in.guidance.defined() && in.guidance.ndim() == 1 && in.guidance.dim(0) == B,
                  kWhere, " this model has guidance_embeds=true (FLUX.1-dev): guidance must be (",
                  B, ",), got ", in.guidance.defined() ? in.guidance.describe() : "nothing");
  } else {
    TESSERA_CHECK(!in.guidance.defined(), kWhere,
                  " guidance was given but this model has guidance_embeds=false");
  }
  const Tensor txt_ids = unbatched_ids(in.txt_ids, "txt_ids");
  const Tensor img_ids = unbatched_ids(in.img_ids, "img_ids");
  TESSERA_CHECK(txt_ids.dim(0) == in.encoder_hidden_states.dim(1) &&
                    img_ids.dim(0) == in.hidden_states.dim(1),
                kWhere, " txt_ids ", txt_ids.describe(), " and img_ids ", img_ids.describe(),
                " must have one row per text and image token (", in.encoder_hidden_states.dim(1),
                " and ", in.hidden_states.dim(1), ")");

  // Activations run in the model dtype (torch would refuse a mismatch; we convert).
  const DType dt = dtype_;
  Tensor hidden_states = x_embedder(astype(in.hidden_states, dt));
  record("x_embedder", hidden_states);

  // diffusers scales in the activation dtype: bf16 timesteps round after the * 1000.
  const Tensor timestep = astype(in.timestep, dt) * 1000.0;
  const Tensor guidance = in.guidance.defined() ? astype(in.guidance, dt) * 1000.0 : Tensor();
  const Tensor temb = time_text_embed(timestep, guidance, astype(in.pooled_projections, dt));
  record("time_text_embed", temb);

  Tensor encoder_hidden_states = context_embedder(astype(in.encoder_hidden_states, dt));
  record("context_embedder", encoder_hidden_states);

  const flux::RotaryEmbedding rotary = pos_embed(concat({txt_ids, img_ids}, 0));
  record("pos_embed.cos", rotary.cos);
  record("pos_embed.sin", rotary.sin);

  for (size_t i = 0; i < transformer_blocks.size(); ++i) {
    const auto& block = *transformer_blocks[i];  // hooks: sequential offload streams weights
    auto out = with_forward_hook(
        block, [&] { return block(hidden_states, encoder_hidden_states, temb, rotary); });
    encoder_hidden_states = out.encoder_hidden_states;
    hidden_states = out.hidden_states;
    if (capture) {
      const std::string p = "transformer_blocks." + std::to_string(i);
      record(p + ".encoder_hidden_states", encoder_hidden_states);
      record(p + ".hidden_states", hidden_states);
    }
  }
  if (!single_transformer_blocks.empty()) {
    // Single blocks run on the joint [text, image] sequence; their per-block outputs are views.
    const int64_t text_len = encoder_hidden_states.dim(1);
    Tensor joint = concat({encoder_hidden_states, hidden_states}, 1);
    for (size_t i = 0; i < single_transformer_blocks.size(); ++i) {
      const auto& block = *single_transformer_blocks[i];
      joint = with_forward_hook(block, [&] { return block.forward_joint(joint, temb, rotary); });
      if (capture) {
        const std::string p = "single_transformer_blocks." + std::to_string(i);
        record(p + ".encoder_hidden_states", joint.slice(1, 0, text_len));
        record(p + ".hidden_states", joint.slice(1, text_len, joint.dim(1)));
      }
    }
    hidden_states = joint.slice(1, text_len, joint.dim(1));
  }

  hidden_states = norm_out(hidden_states, temb);
  record("norm_out", hidden_states);
  Tensor sample = proj_out(hidden_states);
  record("proj_out", sample);
  return sample;
}

}  // namespace tessera
