// ImageService: the bounded job queue and the one worker that runs the pipeline (decision 0036).
#include <algorithm>
#include <chrono>
#include <cstdio>

#include "io/png.h"
#include "model_defaults.h"
#include "runtime/error.h"
#include "runtime/modes.h"
#include "runtime/random.h"
#include "server.h"

namespace tessera::cli {
namespace {

// Thrown from the step callback to stop a cancelled job between steps.
struct Cancelled {};
constexpr size_t kKeepFinished = 64;  // finished jobs kept for their results and progress

// A cheap look at the latents: each latent pixel's channels averaged in three groups (R, G, B),
// stretched to 0-255, each pixel drawn 4x4. FLUX's packed (B, tokens, C*4) and NCHW latents.
std::string latent_preview(const Tensor& latents, int64_t height, int64_t width) {
  if (!latents.defined() || latents.ndim() < 3) return "";
  int64_t h = 0, w = 0, c = 0;
  bool packed = latents.ndim() == 3;
  if (packed) {
    h = height / 16, w = width / 16, c = latents.dim(2);
    if (h * w != latents.dim(1)) return "";
  } else if (latents.ndim() == 4) {
    c = latents.dim(1), h = latents.dim(2), w = latents.dim(3);
  } else {
    return "";
  }
  if (h <= 0 || w <= 0 || c < 3) return "";
  const std::vector<float> v = latents.to_floats();  // batch item 0 is what is shown
  std::vector<float> rgb(size_t(h * w * 3), 0.f);
  for (int64_t p = 0; p < h * w; ++p)
    for (int64_t k = 0; k < c; ++k) {
      const float x = packed ? v[size_t(p * c + k)] : v[size_t(k * h * w + p)];
      rgb[size_t(p * 3 + (k * 3 / c))] += x / float((c + 2) / 3);
    }
  const auto [lo, hi] = std::minmax_element(rgb.begin(), rgb.end());
  const float scale = *hi > *lo ? 255.f / (*hi - *lo) : 0.f;
  constexpr int kZoom = 4;
  std::vector<uint8_t> out(size_t(h * w * 3 * kZoom * kZoom));
  for (int64_t y = 0; y < h * kZoom; ++y)
    for (int64_t x = 0; x < w * kZoom; ++x)
      for (int ch = 0; ch < 3; ++ch)
        out[size_t((y * w * kZoom + x) * 3 + ch)] =
            uint8_t((rgb[size_t(((y / kZoom) * w + x / kZoom) * 3 + ch)] - *lo) * scale + 0.5f);
  return encode_png(out.data(), int(w * kZoom), int(h * kZoom));
}

}  // namespace

const char* job_state_name(JobState s) {
  switch (s) {
    case JobState::queued: return "queued";
    case JobState::running: return "running";
    case JobState::done: return "done";
    case JobState::failed: return "failed";
    case JobState::cancelled: return "cancelled";
  }
  return "?";
}

ImageService::ImageService(const ServeOptions& options) : options_(options) {
  bool test_pipeline = false;
  model_ = options.model.empty() ? default_model(&test_pipeline) : options.model;
  // As generate: the bundled model's trained size and T5 length only when --model is omitted.
  bundled_ = options.model.empty() && !test_pipeline;
  if (bundled_) {
    const BundledDefaults b = bundled_defaults(model_);
    bundled_size_ = b.size;
    bundled_msl_ = b.max_sequence_length;
  }
  if (options.mode == "eager") set_eager_mode(EagerMode::DeferNever);
  if (options.mode == "defer") set_eager_mode(EagerMode::DeferAndFuse);
  PipelineLoadOptions load;
  load.dtype = dtype_from_name(options.dtype);
  load.offload = offload_mode_from_name(options.offload);
  if (load.offload != OffloadMode::none) load.offload_device = load.device;
  pipe_ = DiffusionPipeline::from_pretrained(model_, load);
  if (options.mode == "compile") {
    TESSERA_CHECK(load.offload == OffloadMode::none,
                  "--mode compile compiles the whole transformer with its weights as constants, "
                  "which offload could not release");
    pipe_->denoiser().reset_compile();
    pipe_->denoiser().compile();
  }
  thread_ = std::thread([this] { worker(); });
}

ImageService::~ImageService() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    if (running_) running_->cancel = true;
  }
  work_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::optional<int64_t> ImageService::default_size() const { return bundled_size_; }

std::shared_ptr<Job> ImageService::submit(const ImageRequest& request) {
  std::lock_guard lock(mu_);
  if (int(queue_.size()) >= options_.max_queue) return nullptr;
  auto job = std::make_shared<Job>();
  job->id = "job-" + std::to_string(next_id_++);
  job->request = request;
  job->total_steps = request.steps.value_or(pipe_->pipeline_defaults().num_inference_steps);
  jobs_[job->id] = job;
  queue_.push_back(job);
  work_.notify_one();
  return job;
}

std::shared_ptr<Job> ImageService::find(const std::string& id) {
  std::lock_guard lock(mu_);
  const auto it = jobs_.find(id);
  return it == jobs_.end() ? nullptr : it->second;
}

static bool finished(JobState s) {
  return s == JobState::done || s == JobState::failed || s == JobState::cancelled;
}

int ImageService::wait_change(const Job& job, int seen, double timeout_s) {
  std::unique_lock lock(mu_);
  changed_.wait_for(lock, std::chrono::duration<double>(timeout_s),
                    [&] { return job.version != seen || finished(job.state); });
  return job.version;
}

void ImageService::wait_finished(const Job& job) {
  std::unique_lock lock(mu_);
  changed_.wait(lock, [&] { return finished(job.state); });
}

bool ImageService::cancel(const std::string& id) {
  std::lock_guard lock(mu_);
  const auto it = jobs_.find(id);
  if (it == jobs_.end() || finished(it->second->state)) return false;
  Job& job = *it->second;
  job.cancel = true;
  if (job.state == JobState::queued) {  // never started: drop it from the queue now
    queue_.erase(std::find(queue_.begin(), queue_.end(), it->second));
    job.state = JobState::cancelled;
    job.error = "cancelled";
    finished_.push_back(job.id);
    touch(job);
  }
  return true;
}

void ImageService::cancel_all() {
  std::vector<std::string> ids;
  {
    std::lock_guard lock(mu_);
    for (const auto& job : queue_) ids.push_back(job->id);
    if (running_) ids.push_back(running_->id);
  }
  for (const auto& id : ids) cancel(id);
}

bool ImageService::cancel_running() {
  std::lock_guard lock(mu_);
  if (!running_) return false;
  running_->cancel = true;
  return true;
}

std::shared_ptr<Job> ImageService::running(size_t* queued) {
  std::lock_guard lock(mu_);
  *queued = queue_.size();
  return running_;
}

void ImageService::touch(Job& job) {
  ++job.version;
  changed_.notify_all();
}

void ImageService::worker() {
  for (;;) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock lock(mu_);
      work_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = queue_.front();
      queue_.pop_front();
      running_ = job;
      job->state = JobState::running;
      job->started = job->step_time = now_seconds();
      touch(*job);
    }
    JobState end = JobState::done;
    std::string error;
    try {
      run(*job);
    } catch (const Cancelled&) {
      end = JobState::cancelled;
      error = "cancelled";
    } catch (const std::exception& e) {
      end = JobState::failed;
      error = e.what();
    }
    std::lock_guard lock(mu_);
    job->state = end;
    job->error = error;
    running_.reset();
    finished_.push_back(job->id);
    while (finished_.size() > kKeepFinished) {
      jobs_.erase(finished_.front());
      finished_.pop_front();
    }
    touch(*job);
  }
}

// generate's call, field for field (apps/cli/generate.cpp), with the images kept in memory.
void ImageService::run(Job& job) {
  const ImageRequest& r = job.request;
  std::optional<ManualSeed> seed;
  if (r.seed) seed = ManualSeed::parse(*r.seed);  // validated by the HTTP layer
  TextToImageOptions call;
  call.prompt = {r.prompt};
  if (!r.negative_prompt.empty()) call.negative_prompt = std::vector<std::string>{r.negative_prompt};
  call.height = r.height ? r.height : bundled_size_;
  call.width = r.width ? r.width : bundled_size_;
  call.num_inference_steps = r.steps;
  call.guidance_scale = r.guidance;
  call.num_images_per_prompt = r.n;
  if (seed) call.seed = seed->bits;
  const PipelineDefaults d = pipe_->pipeline_defaults();
  call.max_sequence_length = bundled_msl_.value_or(d.max_sequence_length);
  const int64_t h = call.height.value_or(0), w = call.width.value_or(0);
  call.on_step_end = [&](int i, int n, const Tensor& latents) {
    if (job.cancel) throw Cancelled{};
    std::string preview;
    try {
      preview = latent_preview(latents, h, w);
    } catch (const std::exception&) {
      // A preview is optional: a latent layout it does not know just has none.
    }
    std::lock_guard lock(mu_);
    job.step = i + 1;
    job.total_steps = n;
    job.step_time = now_seconds();
    job.preview_png = std::move(preview);
    touch(job);
  };
  if (job.cancel) throw Cancelled{};
  const PipelineOutput out = pipe_->generate(call);

  GenerationInfo info{r.prompt, "", "0", 0, 0.0, 0, 0, model_};
  info.seed = seed ? seed->str() : std::to_string(out.seed);
  info.steps = r.steps.value_or(d.num_inference_steps);
  info.guidance = r.guidance.value_or(d.guidance_scale);
  info.width = int(out.images[0].width);
  info.height = int(out.images[0].height);
  std::vector<std::string> pngs;
  for (const RgbImage& im : out.images)
    pngs.push_back(encode_png(im.pixels.data(), int(im.width), int(im.height),
                              generation_text(info), "image"));
  std::lock_guard lock(mu_);
  job.images = std::move(pngs);
  job.seed = info.seed;
  job.width = info.width;
  job.height = info.height;
  job.steps_used = info.steps;
  job.guidance_used = info.guidance;
}

}  // namespace tessera::cli
