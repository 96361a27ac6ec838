// tessera run: one component of a diffusers pipeline folder on tensors from a safetensors file,
// for debugging and parity checks. Inputs are named after the forward() arguments of the
// diffusers / transformers class, outputs after the fields of its output class, so the component
// goldens (inputs.safetensors / outputs.safetensors) can be fed and compared as they are.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "commands.h"
#include "io/model_folder.h"
#include "io/safetensors.h"
#include "ops/copy.h"
#include "pipelines/registry.h"
#include "runtime/error.h"

namespace tessera::cli {
namespace {

struct RunOptions {
  std::string model, component, inputs, output, dtype = "f32";
  bool capture = false;
  bool hidden_states = false;
};

std::string join_names(const std::vector<InputSpec>& specs) {
  std::string s;
  for (const auto& sp : specs)
    s += (s.empty() ? "" : ", ") + std::string(sp.name) + (sp.required ? "" : " (optional)");
  return s;
}

// Component names as the user types them: a VAE is run as <name>.decode / <name>.encode.
std::string component_names(const PipelineFolder& p) {
  std::string s;
  for (const auto& c : p.components) {
    if (c.library.empty()) continue;
    const ComponentClass* cls = find_component_class(c.class_name);
    if (!cls || cls->methods.empty()) {
      s += (s.empty() ? "" : ", ") + c.name;
      continue;
    }
    for (const auto& m : cls->methods) s += (s.empty() ? "" : ", ") + c.name + "." + m;
  }
  return s;
}

// Checks names, ranks and dtypes; converts the VAE input to the model dtype, ids to i64.
std::map<std::string, Tensor> check_inputs(const std::map<std::string, Tensor>& given,
                                           const std::vector<InputSpec>& specs,
                                           const std::string& class_name, const std::string& file,
                                           DType dtype) {
  for (const auto& [name, t] : given) {
    const bool known =
        std::any_of(specs.begin(), specs.end(), [&](const InputSpec& s) { return name == s.name; });
    TESSERA_CHECK(known, "unexpected input tensor '", printable_name(name), "' in ", file, " for ",
                  class_name, " (expected: ", join_names(specs), ")");
  }
  std::map<std::string, Tensor> out;
  for (const auto& s : specs) {
    auto it = given.find(s.name);
    if (it == given.end()) {
      TESSERA_CHECK(!s.required, "missing input tensor '", s.name, "' in ", file, " for ",
                    class_name, " (expected: ", join_names(specs), ")");
      continue;
    }
    const Tensor& t = it->second;
    const bool rank_ok = std::find(s.ranks.begin(), s.ranks.end(), t.ndim()) != s.ranks.end();
    TESSERA_CHECK(rank_ok, "input '", s.name, "' must be ", s.layout, ", got ", t.describe());
    const std::string n = s.name;
    if (n == "attention_mask") {
      out[n] = t;  // the models accept any dtype (nonzero = attend)
    } else if (n == "input_ids") {
      TESSERA_CHECK(!is_floating(t.dtype()), "input 'input_ids' must hold integers, got ",
                    t.describe());
      out[n] = astype(t, DType::i64);
    } else if ((n == "img_ids" || n == "txt_ids") && !is_floating(t.dtype())) {
      out[n] = astype(t, DType::i64);  // FLUX.2's pipeline passes integer position ids
    } else {
      TESSERA_CHECK(is_floating(t.dtype()), "input '", n, "' must be floating point, got ",
                    t.describe());
      // The VAE wants its own dtype; the transformer converts (ids stay exact in f32).
      out[n] = n == "z" || n == "sample" ? astype(t, dtype) : t;
    }
  }
  return out;
}

int run_run(const RunOptions& o) {
  const PipelineFolder p = open_pipeline_folder(o.model);
  // "vae.decode" -> component "vae", method "decode".
  std::string name = o.component, method;
  const size_t dot = name.rfind('.');
  if (dot != std::string::npos) {
    method = name.substr(dot + 1);
    name = name.substr(0, dot);
  }
  TESSERA_CHECK(
      p.has_component(name) && (method.empty() || method == "decode" || method == "encode"),
      "unknown component '", printable_name(o.component), "' in ", p.path,
      " (components: ", component_names(p), ")");
  const auto it = std::find_if(p.components.begin(), p.components.end(),
                               [&](const ComponentInfo& c) { return c.name == name; });
  const ComponentInfo& c = *it;
  TESSERA_CHECK(c.present, "component folder '", c.path, "' is missing (model_index.json lists ",
                name, " as ", c.class_name, ")");

  const ComponentClass* cls = find_component_class(c.class_name);
  TESSERA_CHECK(cls, "component '", name, "' is a ", c.class_name,
                ", which tessera run does not support (supported: ",
                supported_component_classes(), ")");
  const auto& methods = cls->methods;
  if (method.empty()) {
    std::string as;
    for (size_t i = 0; i < methods.size(); ++i)
      as += (i ? (i + 1 == methods.size() ? " or " : ", ") : "") + name + "." + methods[i];
    TESSERA_CHECK(methods.empty(), "component '", name, "' is a ", c.class_name, ": run it as ",
                  as);
  } else {
    TESSERA_CHECK(std::find(methods.begin(), methods.end(), method) != methods.end(),
                  "component '", name, "' is a ", c.class_name, ", which has no .", method,
                  " (components: ", component_names(p), ")");
  }

  // Fail before loading a large model, not after running it.
  const std::filesystem::path out_dir = std::filesystem::absolute(o.output).parent_path();
  TESSERA_CHECK(std::filesystem::is_directory(out_dir), o.output, ": cannot write (no folder ",
                out_dir.string(), ")");

  const DType dtype = dtype_from_name(o.dtype);
  const std::vector<InputSpec> specs = cls->inputs(method);
  const std::map<std::string, Tensor> in =
      check_inputs(load_safetensors(o.inputs), specs, c.class_name, o.inputs, dtype);

  std::map<std::string, Tensor> capture;
  std::map<std::string, Tensor> out = cls->run(
      c.path, dtype, in, {method, o.hidden_states, o.capture ? &capture : nullptr});
  for (const auto& [k, v] : capture) {
    // Output fields and module paths never coincide in these classes; keep the output if so.
    out.emplace(k, v);
  }
  save_safetensors(o.output, out,
                   {{"component", o.component}, {"class", c.class_name}, {"dtype", o.dtype}});
  std::printf("%s (%s, %s): wrote %zu tensors to %s\n", o.component.c_str(), c.class_name.c_str(),
              o.dtype.c_str(), out.size(), o.output.c_str());
  return 0;
}

}  // namespace

void register_run(CLI::App& app, Runner& run) {
  auto o = std::make_shared<RunOptions>();
  CLI::App* sub = app.add_subcommand(
      "run", "Run one pipeline component on tensors from a safetensors file (parity checks)");
  sub->add_option("--model", o->model, "diffusers pipeline folder (with model_index.json)")
      ->required();
  sub->add_option("--component", o->component,
                  "text_encoder, text_encoder_2, transformer, vae.decode, vae.encode, ...")
      ->required();
  sub->add_option("--inputs", o->inputs,
                  "safetensors file of the forward() arguments (input_ids; hidden_states, "
                  "encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids, "
                  "guidance; z; sample)")
      ->required();
  sub->add_option("--output,-o", o->output,
                  "safetensors file for the outputs (last_hidden_state, pooler_output, "
                  "text_embeds, sample, latent_dist.*)")
      ->required();
  sub->add_option("--dtype", o->dtype, "f32 or bf16")->check(CLI::IsMember({"f32", "bf16"}));
  sub->add_flag("--capture", o->capture, "also write the recorded intermediate activations");
  sub->add_flag("--hidden-states", o->hidden_states,
                "text encoders: also write hidden_states.N (output_hidden_states=True)");
  sub->callback([o, &run] { run = [o] { return run_run(*o); }; });
}

}  // namespace tessera::cli
