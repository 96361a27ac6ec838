// tessera serve: one loaded pipeline behind an HTTP server (cpp-httplib, decision 0035). Requests
// become jobs in a bounded queue that one worker thread runs in order (decision 0036), each with
// the generate command's defaults, so the same request and seed give the CLI's image and PNG.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "pipelines/diffusion_pipeline.h"

namespace tessera::cli {

struct ServeOptions {
  std::string model;  // "" = the bundled default model
  std::string host = "127.0.0.1", mode, offload = "none", api_key, dtype = "f32";
  int port = 7860;  // 0: any free port (the one bound is printed)
  int max_queue = 8;
};

// One image request, in the CLI's terms; unset values take the generate command's defaults.
struct ImageRequest {
  std::string prompt, negative_prompt;
  std::optional<int64_t> width, height;
  std::optional<int> steps;
  std::optional<double> guidance;
  std::optional<std::string> seed;  // decimal, as ManualSeed::parse reads it
  int n = 1;
};

enum class JobState { queued, running, done, failed, cancelled };
const char* job_state_name(JobState s);

struct Job {
  std::string id;
  ImageRequest request;
  // Guarded by the server's mutex.
  JobState state = JobState::queued;
  int step = 0, total_steps = 0;
  double started = 0, step_time = 0;  // now_seconds() at start and at the last step
  std::string preview_png;            // a low-resolution look at the latents after the last step
  std::vector<std::string> images;    // PNG bytes
  std::string seed, error;            // the seed used (decimal); why it failed
  int width = 0, height = 0, steps_used = 0;
  double guidance_used = 0;
  int version = 0;  // bumped on every change, for progress streams
  std::atomic<bool> cancel{false};
};

// The job queue and its worker; the HTTP layer (server.cpp) only parses and answers.
class ImageService {
 public:
  explicit ImageService(const ServeOptions& options);
  ~ImageService();
  // Queues a request; null when the queue is full.
  std::shared_ptr<Job> submit(const ImageRequest& request);
  std::shared_ptr<Job> find(const std::string& id);
  // Waits until the job's version differs from `seen` or it has finished (or `timeout_s`).
  int wait_change(const Job& job, int seen, double timeout_s);
  void wait_finished(const Job& job);
  bool cancel(const std::string& id);  // false: no such job, or it had already finished
  bool cancel_running();
  void cancel_all();  // the running job and every queued one (the server is stopping)
  // A snapshot for /sdapi/v1/progress: the running job (null if none) and the queue length.
  std::shared_ptr<Job> running(size_t* queued);
  std::mutex& mutex() { return mu_; }
  const std::string& model_path() const { return model_; }
  const std::string& class_name() const { return pipe_->class_name(); }
  std::optional<int64_t> default_size() const;

 private:
  void worker();
  void run(Job& job);
  void touch(Job& job);  // version++ and wake the waiters; mu_ held

  ServeOptions options_;
  std::string model_;
  bool bundled_ = false;
  std::optional<int64_t> bundled_size_, bundled_msl_;
  std::unique_ptr<DiffusionPipeline> pipe_;
  std::mutex mu_;
  std::condition_variable changed_, work_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::shared_ptr<Job> running_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;  // queued, running and the last finished
  std::deque<std::string> finished_;
  uint64_t next_id_ = 1;
  bool stopping_ = false;
  std::thread thread_;
};

// Runs the server until SIGTERM or SIGINT (which cancel every job and stop it cleanly);
// returns the exit code.
int serve(const ServeOptions& options);

}  // namespace tessera::cli
