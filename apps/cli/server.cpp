// The HTTP layer of tessera serve: OpenAI's images API, AUTOMATIC1111's txt2img, a job API with
// a server-sent-events progress stream and interrupt (decision 0037). Every bad request is a
// 4xx JSON error naming the field; nothing is written to disk.
#include <arpa/inet.h>
#include <dirent.h>
#include <httplib.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/png.h"
#include "runtime/error.h"
#include "runtime/random.h"
#include "server.h"
#include "server_page.h"

namespace tessera::cli {
namespace {

using nlohmann::json;

constexpr int kMaxImages = 8;         // n / batch_size
constexpr int kMaxSteps = 200;        // more is a mistake, not a request
constexpr int64_t kMaxSide = 2048;    // pixels per side
constexpr size_t kMaxBody = 1 << 20;  // request bytes

// A 4xx answer: thrown while parsing, caught by the route.
struct BadRequest {
  int status;
  std::string message, param;
};

std::string base64(const std::string& in) {
  static const char* t = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((in.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < in.size(); i += 3) {
    const uint32_t v = uint8_t(in[i]) << 16 | uint8_t(in[i + 1]) << 8 | uint8_t(in[i + 2]);
    for (int s : {18, 12, 6, 0}) out += t[(v >> s) & 63];
  }
  if (i < in.size()) {
    uint32_t v = uint8_t(in[i]) << 16;
    if (i + 1 < in.size()) v |= uint8_t(in[i + 1]) << 8;
    out += t[(v >> 18) & 63];
    out += t[(v >> 12) & 63];
    out += i + 1 < in.size() ? t[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(body.dump(), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message,
                const std::string& param = "") {
  json e = {{"message", message},
            {"type", status < 500 ? "invalid_request_error" : "server_error"}};
  e["param"] = param.empty() ? json() : json(param);
  send_json(res, status, {{"error", e}});
}

json parse_body(const httplib::Request& req) {
  json body = json::parse(req.body, nullptr, false);
  if (body.is_discarded()) throw BadRequest{400, "the body is not valid JSON", "body"};
  if (!body.is_object()) throw BadRequest{400, "the body must be a JSON object", "body"};
  return body;
}

// Field readers: a wrong type or range names the field.
std::string get_string(const json& v, const std::string& name) {
  if (!v.is_string()) throw BadRequest{400, "'" + name + "' must be a string", name};
  std::string s = v.get<std::string>();
  try {
    check_png_text({{"prompt", s}});
  } catch (const Error&) {
    throw BadRequest{400, "'" + name + "' must be UTF-8 text without NUL characters", name};
  }
  return s;
}
int64_t get_int(const json& v, const std::string& name, int64_t lo, int64_t hi) {
  if (!v.is_number_integer())
    throw BadRequest{400, "'" + name + "' must be an integer", name};
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi))
    throw BadRequest{400, "'" + name + "' must be from " + std::to_string(lo) + " to " +
                              std::to_string(hi), name};
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw BadRequest{400, "'" + name + "' must be from " + std::to_string(lo) + " to " +
                              std::to_string(hi) + ", got " + std::to_string(x), name};
  return x;
}
double get_number(const json& v, const std::string& name) {
  if (!v.is_number()) throw BadRequest{400, "'" + name + "' must be a number", name};
  const double x = v.get<double>();
  if (!(x >= 0 && x <= 100)) throw BadRequest{400, "'" + name + "' must be from 0 to 100", name};
  return x;
}
std::string get_seed(const json& v, const std::string& name) {
  if (!v.is_number_integer())
    throw BadRequest{400, "'" + name + "' must be an integer in " +
                              std::string(ManualSeed::kRange), name};
  return v.is_number_unsigned() ? std::to_string(v.get<uint64_t>())
                                : std::to_string(v.get<int64_t>());
}
int64_t get_side(const json& v, const std::string& name) {
  const int64_t x = get_int(v, name, 16, kMaxSide);
  if (x % 16) throw BadRequest{400, "'" + name + "' must be a multiple of 16", name};
  return x;
}

// OpenAI's POST /v1/images/generations body (tessera extras: seed, steps, guidance,
// negative_prompt).
ImageRequest parse_openai(const json& b) {
  ImageRequest r;
  bool has_prompt = false;
  for (const auto& [k, v] : b.items()) {
    if (k == "prompt") r.prompt = get_string(v, k), has_prompt = true;
    else if (k == "negative_prompt") r.negative_prompt = get_string(v, k);
    else if (k == "n") r.n = int(get_int(v, k, 1, kMaxImages));
    else if (k == "steps") r.steps = int(get_int(v, k, 1, kMaxSteps));
    else if (k == "guidance") r.guidance = get_number(v, k);
    else if (k == "seed") r.seed = get_seed(v, k);
    else if (k == "model" || k == "user") get_string(v, k);  // one model is served: ignored
    else if (k == "response_format") {
      if (get_string(v, k) != "b64_json")
        throw BadRequest{400, "'response_format' must be \"b64_json\" (no image is stored "
                              "for a URL)", k};
    } else if (k == "size") {
      const std::string s = get_string(v, k);
      const size_t x = s.find('x');
      const auto side = [&](const std::string& t) {
        if (t.empty() || t.size() > 5 || t.find_first_not_of("0123456789") != std::string::npos)
          throw BadRequest{400, "'size' must be \"WIDTHxHEIGHT\", got \"" + s + "\"", k};
        return get_side(json(std::stoll(t)), k);
      };
      if (x == std::string::npos)
        throw BadRequest{400, "'size' must be \"WIDTHxHEIGHT\", got \"" + s + "\"", k};
      r.width = side(s.substr(0, x));
      r.height = side(s.substr(x + 1));
    } else {
      throw BadRequest{400, "unknown field '" + k + "'", k};
    }
  }
  if (!has_prompt) throw BadRequest{400, "'prompt' is required", "prompt"};
  return r;
}

// AUTOMATIC1111's POST /sdapi/v1/txt2img body; seed -1 means a random seed there.
ImageRequest parse_a1111(const json& b) {
  ImageRequest r;
  for (const auto& [k, v] : b.items()) {
    if (k == "prompt") r.prompt = get_string(v, k);
    else if (k == "negative_prompt") r.negative_prompt = get_string(v, k);
    else if (k == "batch_size") r.n = int(get_int(v, k, 1, kMaxImages));
    else if (k == "steps") r.steps = int(get_int(v, k, 1, kMaxSteps));
    else if (k == "cfg_scale") r.guidance = get_number(v, k);
    else if (k == "width") r.width = get_side(v, k);
    else if (k == "height") r.height = get_side(v, k);
    else if (k == "seed") {
      r.seed = get_seed(v, k);
      if (*r.seed == "-1") r.seed.reset();
    } else {
      throw BadRequest{400, "unknown field '" + k + "'", k};
    }
  }
  return r;
}

void check_seed(const ImageRequest& r) {
  if (r.seed && !ManualSeed::parse(*r.seed))
    throw BadRequest{400, "'seed' must be an integer in " + std::string(ManualSeed::kRange),
                     "seed"};
}

// One progress event (also GET /v1/jobs/ID without the images); mu held.
json job_json(const Job& j, bool with_images) {
  json o = {{"id", j.id}, {"state", job_state_name(j.state)}, {"step", j.step},
            {"steps", j.total_steps}};
  const double elapsed = j.step_time - j.started;
  o["eta_seconds"] = j.step > 0 ? json(elapsed / j.step * (j.total_steps - j.step)) : json();
  if (!j.preview_png.empty() && j.state == JobState::running)
    o["preview"] = "data:image/png;base64," + base64(j.preview_png);
  if (!j.error.empty()) o["error"] = j.error;
  if (j.state == JobState::done) {
    o["seed"] = j.seed;
    if (with_images) {
      json data = json::array();
      for (const auto& png : j.images) data.push_back({{"b64_json", base64(png)}});
      o["data"] = data;
    }
  }
  return o;
}

// An endpoint of a socket as cpp-httplib writes it in Request (address text, port).
bool endpoint_is(const sockaddr_storage& a, const std::string& addr, int port) {
  char text[INET6_ADDRSTRLEN] = {};
  int p = -1;
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text);
    p = ntohs(v4.sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text);
    p = ntohs(v6.sin6_port);
  }
  return p == port && addr == text;
}

// The descriptor of the connection that carried `req`, or -1. cpp-httplib 0.11 does not hand
// handlers their socket, so it is found among this process's descriptors by its two endpoints.
int connection_socket(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (const dirent* e = readdir(dir)) {
    const int fd = std::atoi(e->d_name);
    struct stat st {};
    if (fd <= 2 || fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t n1 = sizeof peer, n2 = sizeof local;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &n1) == 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&local), &n2) == 0 &&
        endpoint_is(peer, req.remote_addr, req.remote_port) &&
        endpoint_is(local, req.local_addr, req.local_port)) {
      found = fd;
      break;
    }
  }
  closedir(dir);
  return found;
}

// True once the client has closed its end (it gave up waiting): the job it asked for is dropped.
bool client_left(int fd) {
  if (fd < 0) return false;
  pollfd p{fd, POLLRDHUP, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

}  // namespace

int serve(const ServeOptions& options) {
  std::signal(SIGPIPE, SIG_IGN);
  // SIGTERM and SIGINT are taken by one thread (below), so they are blocked before any other
  // thread starts and inherits the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  TESSERA_CHECK(options.max_queue >= 1, "--max-queue must be at least 1");
  std::fprintf(stderr, "tessera: loading %s\n",
               options.model.empty() ? "the bundled default model" : options.model.c_str());
  ImageService svc(options);
  httplib::Server http;
  // Waiting requests and progress streams each hold a thread: more than the queue can hold.
  const size_t threads = size_t(options.max_queue) + 16;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(kMaxBody);
  http.set_read_timeout(30, 0);

  if (!options.api_key.empty()) {
    http.set_pre_routing_handler([&](const httplib::Request& req, httplib::Response& res) {
      if (req.path == "/health" || req.path == "/") return httplib::Server::HandlerResponse::Unhandled;
      const std::string bearer = "Bearer " + options.api_key;
      if (req.get_header_value("Authorization") == bearer ||
          req.get_header_value("X-API-Key") == options.api_key)
        return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("WWW-Authenticate", "Bearer");
      send_error(res, 401, "a valid API key is required (Authorization: Bearer KEY)", "api_key");
      return httplib::Server::HandlerResponse::Handled;
    });
  }
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [](const httplib::Request&, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    const std::string msg = res.status == 413 ? "the body is larger than 1 MiB"
                            : res.status == 404 ? "no such endpoint"
                                                : "HTTP error " + std::to_string(res.status);
    send_error(res, res.status, msg, res.status == 413 ? "body" : "");
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                                std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, 500, what);
  });

  // Parses, queues and waits for one request; answers through `reply` or with an error.
  const auto generate = [&](const httplib::Request& req, httplib::Response& res,
                            ImageRequest (*parse)(const json&),
                            const std::function<void(const Job&)>& reply) {
    try {
      ImageRequest r = parse(parse_body(req));
      check_seed(r);
      const auto job = svc.submit(r);
      if (!job) {
        res.set_header("Retry-After", "5");
        return send_error(res, 503, "the queue is full; retry later");
      }
      // Waits for the job, and cancels it if the client goes away before it is done.
      const int fd = connection_socket(req);
      for (int seen = -1;;) {
        seen = svc.wait_change(*job, seen, 0.25);
        {
          std::lock_guard lock(svc.mutex());
          if (job->state != JobState::queued && job->state != JobState::running) break;
        }
        if (client_left(fd)) {
          svc.cancel(job->id);
          svc.wait_finished(*job);
          return;  // nobody to answer
        }
      }
      std::lock_guard lock(svc.mutex());
      if (job->state == JobState::done) return reply(*job);
      if (job->state == JobState::cancelled) return send_error(res, 409, "the job was cancelled");
      return send_error(res, 500, job->error);
    } catch (const BadRequest& e) {
      send_error(res, e.status, e.message, e.param);
    }
  };

  http.Post("/v1/images/generations", [&](const httplib::Request& req, httplib::Response& res) {
    generate(req, res, parse_openai, [&](const Job& j) {
      json data = json::array();
      for (const auto& png : j.images) data.push_back({{"b64_json", base64(png)}});
      send_json(res, 200, {{"created", int64_t(std::time(nullptr))}, {"data", data},
                           {"seed", j.seed}});
    });
  });
  http.Post("/sdapi/v1/txt2img", [&](const httplib::Request& req, httplib::Response& res) {
    generate(req, res, parse_a1111, [&](const Job& j) {
      json images = json::array();
      for (const auto& png : j.images) images.push_back(base64(png));
      const ImageRequest& r = j.request;
      json info = {{"prompt", r.prompt}, {"negative_prompt", r.negative_prompt},
                   {"seed", j.seed}, {"all_seeds", json::array({j.seed})},
                   {"steps", j.steps_used}, {"cfg_scale", j.guidance_used},
                   {"width", j.width}, {"height", j.height}, {"batch_size", r.n},
                   {"sd_model_name", svc.model_path()}};
      send_json(res, 200, {{"images", images}, {"parameters", json::parse(req.body)},
                           {"info", info.dump()}});
    });
  });
  http.Get("/sdapi/v1/progress", [&](const httplib::Request&, httplib::Response& res) {
    size_t queued = 0;
    const auto job = svc.running(&queued);
    std::lock_guard lock(svc.mutex());
    json state = {{"job_count", queued + (job ? 1 : 0)},
                  {"sampling_step", job ? job->step : 0},
                  {"sampling_steps", job ? job->total_steps : 0},
                  {"interrupted", job && job->cancel.load()},
                  {"job", job ? job->id : ""}};
    const double progress = job && job->total_steps ? double(job->step) / job->total_steps : 0;
    const json j = job ? job_json(*job, false) : json();
    send_json(res, 200, {{"progress", progress},
                         {"eta_relative", job ? j["eta_seconds"] : json(0)},
                         {"state", state},
                         {"current_image", j.is_object() && j.contains("preview")
                                               ? json(j["preview"].get<std::string>().substr(22))
                                               : json()}});
  });
  http.Post("/sdapi/v1/interrupt", [&](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"interrupted", svc.cancel_running()}});
  });
  http.Get("/health", [&](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"status", "ok"}});
  });
  http.Get("/v1/models", [&](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"},
                         {"data", json::array({{{"id", svc.model_path()},
                                                {"object", "model"},
                                                {"owned_by", "tessera"},
                                                {"pipeline", svc.class_name()}}})}});
  });

  // The job API: queue without waiting, then poll, stream progress or interrupt.
  http.Post("/v1/jobs", [&](const httplib::Request& req, httplib::Response& res) {
    try {
      ImageRequest r = parse_openai(parse_body(req));
      check_seed(r);
      const auto job = svc.submit(r);
      if (!job) {
        res.set_header("Retry-After", "5");
        return send_error(res, 503, "the queue is full; retry later");
      }
      send_json(res, 202, {{"id", job->id}});
    } catch (const BadRequest& e) {
      send_error(res, e.status, e.message, e.param);
    }
  });
  http.Get(R"(/v1/jobs/([A-Za-z0-9-]+))", [&](const httplib::Request& req, httplib::Response& res) {
    const auto job = svc.find(req.matches[1]);
    if (!job) return send_error(res, 404, "no job '" + std::string(req.matches[1]) + "'", "id");
    std::lock_guard lock(svc.mutex());
    send_json(res, 200, job_json(*job, true));
  });
  http.Post(R"(/v1/jobs/([A-Za-z0-9-]+)/interrupt)",
            [&](const httplib::Request& req, httplib::Response& res) {
              const std::string id = req.matches[1];
              if (!svc.find(id)) return send_error(res, 404, "no job '" + id + "'", "id");
              send_json(res, 200, {{"interrupted", svc.cancel(id)}});
            });
  http.Get(R"(/v1/jobs/([A-Za-z0-9-]+)/events)",
           [&](const httplib::Request& req, httplib::Response& res) {
             const auto job = svc.find(req.matches[1]);
             if (!job)
               return send_error(res, 404, "no job '" + std::string(req.matches[1]) + "'", "id");
             auto seen = std::make_shared<int>(-1);
             res.set_header("Cache-Control", "no-cache");
             res.set_chunked_content_provider(
                 "text/event-stream", [&svc, job, seen](size_t, httplib::DataSink& sink) {
                   if (*seen >= 0) *seen = svc.wait_change(*job, *seen, 15.0);
                   std::string event;
                   bool end = false;
                   {
                     std::lock_guard lock(svc.mutex());
                     if (*seen < 0) *seen = job->version;
                     end = job->state != JobState::queued && job->state != JobState::running;
                     event = "data: " + job_json(*job, false).dump() + "\n\n";
                   }
                   if (!sink.write(event.data(), event.size())) return false;
                   if (end) sink.done();
                   return true;
                 });
           });

  register_web_page(http);

  const int port = options.port == 0 ? http.bind_to_any_port(options.host)
                                     : (http.bind_to_port(options.host, options.port)
                                            ? options.port
                                            : -1);
  TESSERA_CHECK(port > 0, "cannot listen on ", options.host, ":", options.port);
  if (options.host != "127.0.0.1" && options.host != "localhost" && options.host != "::1" &&
      options.api_key.empty())
    std::fprintf(stderr, "tessera: warning: listening on %s without --api-key: anyone who can "
                 "reach this address can use the server\n", options.host.c_str());
  std::printf("tessera: serving %s on http://%s:%d\n", svc.model_path().c_str(),
              options.host.c_str(), port);
  std::fflush(stdout);
  std::atomic<bool> listening_ended{false};
  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    if (listening_ended) return;  // woken by the main thread below
    std::fprintf(stderr, "tessera: %s: cancelling jobs and stopping\n", strsignal(sig));
    svc.cancel_all();
    // stop() before the accept loop has started would be lost: wait until it runs.
    while (!http.is_running() && !listening_ended)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    http.stop();
  });
  http.listen_after_bind();
  listening_ended = true;
  pthread_kill(stopper.native_handle(), SIGTERM);  // blocked: only wakes sigwait, if still there
  stopper.join();
  return 0;
}

}  // namespace tessera::cli
