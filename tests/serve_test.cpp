// tessera serve as a client sees it: the test starts the CLI on a free loopback port with the
// bundled default model and talks to it with cpp-httplib's client.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/png.h"
#include "io_test_folder.h"

namespace tessera {
namespace {

using nlohmann::json;
using test::quote;
using test::run_cli;
using test::TempDir;

// `tessera serve --port 0 ARGS...` as a child process; the port is read from its first line.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> args) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 1);
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 2);
      close(fds[0]);
      std::vector<std::string> all = {"tessera", "serve", "--port", "0"};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(TESSERA_CLI_PATH, argv.data());
      _exit(127);
    }
    close(fds[1]);
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    while (out.find('\n') == std::string::npos && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fds[0], POLLIN, 0};
      if (poll(&p, 1, 1000) <= 0) continue;
      char buf[256];
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n <= 0) break;
      out.append(buf, size_t(n));
    }
    close(fds[0]);
    const size_t colon = out.rfind(':');
    if (out.find("http://127.0.0.1:") != std::string::npos && colon != std::string::npos)
      port_ = std::atoi(out.c_str() + colon + 1);
  }
  ~ServerProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }
  int port() const { return port_; }
  // Sends `sig` and waits up to `seconds` for the exit; the exit status, or -1 on timeout.
  int signal_and_wait(int sig, int seconds) {
    kill(pid_, sig);
    for (int i = 0; i < seconds * 100; ++i) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }
  bool alive() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(120, 0);
    return c;
  }

 private:
  pid_t pid_ = -1;
  int port_ = 0;
};

std::string unbase64(const std::string& in) {
  static const std::string t =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  uint32_t v = 0;
  int bits = 0;
  for (char c : in) {
    const size_t k = t.find(c);
    if (k == std::string::npos) continue;  // padding
    v = v << 6 | uint32_t(k);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out += char((v >> bits) & 0xff);
    }
  }
  return out;
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

json post(httplib::Client& c, const std::string& path, const std::string& body, int* status,
          const httplib::Headers& headers = {}) {
  const auto r = c.Post(path.c_str(), headers, body, "application/json");
  *status = r ? r->status : -1;
  return r ? json::parse(r->body, nullptr, false) : json();
}

class Serve : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess({}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_GT(server_->port(), 0) << "the server did not start"; }
  static ServerProcess* server_;
};
ServerProcess* Serve::server_ = nullptr;

// The same prompt and seed through the server and through `tessera generate` give the same PNG
// file, text chunks included.
TEST_F(Serve, OpenAiImageIsTheCliImage) {
  auto c = server_->client();
  int status = 0;
  const json r = post(c, "/v1/images/generations",
                      R"({"prompt":"a red circle","seed":7,"response_format":"b64_json"})",
                      &status);
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_EQ(r["data"].size(), 1u);
  EXPECT_EQ(r["seed"], "7");
  TempDir dir;
  const std::string served = dir / "served.png", cli = dir / "cli.png";
  std::ofstream(served, std::ios::binary) << unbase64(r["data"][0]["b64_json"]);
  const auto g = run_cli("generate --prompt " + quote("a red circle") + " --seed 7 -o " + quote(cli));
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(read_file(served), read_file(cli));
  const PngImage img = read_png(served);
  EXPECT_EQ(img.width, 64);
  EXPECT_EQ(img.height, 64);
  EXPECT_EQ(img.text_value("seed"), "7");
  EXPECT_EQ(img.text_value("prompt"), "a red circle");
  EXPECT_EQ(img.text_value("steps"), "28");
}

TEST_F(Serve, A1111Txt2ImgBatchMatchesCli) {
  auto c = server_->client();
  int status = 0;
  const json r = post(c, "/sdapi/v1/txt2img",
                      R"({"prompt":"a blue square","seed":11,"steps":3,"batch_size":2,)"
                      R"("width":64,"height":48,"cfg_scale":3.5})",
                      &status);
  ASSERT_EQ(status, 200) << r.dump();
  ASSERT_EQ(r["images"].size(), 2u);
  const json info = json::parse(r["info"].get<std::string>());
  EXPECT_EQ(info["seed"], "11");
  EXPECT_EQ(info["steps"], 3);
  EXPECT_EQ(info["width"], 64);
  EXPECT_EQ(info["height"], 48);
  TempDir dir;
  const auto g = run_cli("generate --prompt " + quote("a blue square") +
                         " --seed 11 --steps 3 --num-images 2 --width 64 --height 48 -o " +
                         quote(dir / "cli.png"));
  ASSERT_EQ(g.code, 0) << g.err;
  for (int i = 0; i < 2; ++i)
    EXPECT_EQ(unbase64(r["images"][i]), read_file(dir / ("cli-" + std::to_string(i) + ".png")))
        << "image " << i;
}

TEST_F(Serve, HealthModelsAndIdleProgress) {
  auto c = server_->client();
  auto r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  const json m = json::parse(r->body);
  EXPECT_EQ(m["data"][0]["pipeline"], "FluxPipeline");
  EXPECT_NE(m["data"][0]["id"].get<std::string>().find("tessera-shapes"), std::string::npos);
  r = c.Get("/sdapi/v1/progress");
  ASSERT_TRUE(r);
  const json p = json::parse(r->body);
  EXPECT_EQ(p["state"]["job_count"], 0);
  EXPECT_EQ(p["progress"], 0.0);
}

// Every bad request is a 4xx JSON error naming the field, and the server keeps serving.
TEST_F(Serve, BadRequestsNameTheField) {
  auto c = server_->client();
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* param;
  };
  const std::vector<Case> cases = {
      {"/v1/images/generations", R"({"prompt":)", 400, "body"},
      {"/v1/images/generations", R"([1,2])", 400, "body"},
      {"/v1/images/generations", R"({"n":1})", 400, "prompt"},
      {"/v1/images/generations", R"({"prompt":"x","colour":"red"})", 400, "colour"},
      {"/v1/images/generations", R"({"prompt":7})", 400, "prompt"},
      {"/v1/images/generations", R"({"prompt":"x","size":"65x64"})", 400, "size"},
      {"/v1/images/generations", R"({"prompt":"x","size":"big"})", 400, "size"},
      {"/v1/images/generations", R"({"prompt":"x","size":"4096x4096"})", 400, "size"},
      {"/v1/images/generations", R"({"prompt":"x","steps":0})", 400, "steps"},
      {"/v1/images/generations", R"({"prompt":"x","steps":100000})", 400, "steps"},
      {"/v1/images/generations", R"({"prompt":"x","steps":"4"})", 400, "steps"},
      {"/v1/images/generations", R"({"prompt":"x","n":9})", 400, "n"},
      {"/v1/images/generations", R"({"prompt":"x","n":1.5})", 400, "n"},
      {"/v1/images/generations", R"({"prompt":"x","seed":1e30})", 400, "seed"},
      {"/v1/images/generations", R"({"prompt":"x","guidance":"high"})", 400, "guidance"},
      {"/v1/images/generations", R"({"prompt":"x","response_format":"url"})", 400,
       "response_format"},
      {"/sdapi/v1/txt2img", R"({"prompt":"x","width":50})", 400, "width"},
      {"/sdapi/v1/txt2img", R"({"prompt":"x","batch_size":0})", 400, "batch_size"},
      {"/sdapi/v1/txt2img", R"({"prompt":"x","sampler_name":"Euler"})", 400, "sampler_name"},
      {"/sdapi/v1/txt2img", R"({"prompt":"x","cfg_scale":-1})", 400, "cfg_scale"},
      {"/v1/jobs", R"({"prompt":"x","steps":-3})", 400, "steps"},
      {"/v1/images/generations", std::string(2 << 20, ' '), 413, "body"},
  };
  for (const Case& k : cases) {
    int status = 0;
    const json r = post(c, k.path, k.body, &status);
    EXPECT_EQ(status, k.status) << k.path << " " << k.body.substr(0, 60);
    ASSERT_TRUE(r.is_object() && r.contains("error")) << k.body.substr(0, 60);
    EXPECT_EQ(r["error"]["param"], k.param) << k.body.substr(0, 60) << " " << r.dump();
  }
  auto g = c.Get("/v1/jobs/job-999999");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 404);
  g = c.Get("/no/such/endpoint");
  ASSERT_TRUE(g);
  EXPECT_EQ(g->status, 404);
  int status = 0;
  post(c, "/v1/images/generations", R"({"prompt":"still here","steps":1})", &status);
  EXPECT_EQ(status, 200);
  EXPECT_TRUE(server_->alive());
}

// The progress stream: one event per step with an ETA and a preview, then the finished state;
// the finished job holds its image.
TEST_F(Serve, ProgressStreamThenResult) {
  auto c = server_->client();
  int status = 0;
  const json j = post(c, "/v1/jobs", R"({"prompt":"a green triangle","seed":3,"steps":6})", &status);
  ASSERT_EQ(status, 202) << j.dump();
  const std::string id = j["id"];
  std::string stream;
  const auto r = c.Get(("/v1/jobs/" + id + "/events").c_str(),
                       [&](const char* data, size_t n) {
                         stream.append(data, n);
                         return true;
                       });
  ASSERT_TRUE(r);
  EXPECT_EQ(r->get_header_value("Content-Type"), "text/event-stream");
  std::vector<json> events;
  for (size_t p = 0; (p = stream.find("data: ", p)) != std::string::npos;) {
    const size_t end = stream.find("\n\n", p);
    events.push_back(json::parse(stream.substr(p + 6, end - p - 6)));
    p = end;
  }
  ASSERT_GE(events.size(), 2u) << stream;
  EXPECT_EQ(events.back()["state"], "done");
  EXPECT_EQ(events.back()["step"], 6);
  int last = -1;
  bool preview = false, eta = false;
  for (const json& e : events) {
    EXPECT_GE(e["step"].get<int>(), last);
    last = e["step"];
    EXPECT_EQ(e["steps"], 6);
    if (e.contains("preview"))
      preview = e["preview"].get<std::string>().rfind("data:image/png;base64,", 0) == 0;
    eta = eta || e["eta_seconds"].is_number();
  }
  EXPECT_TRUE(eta);
  // A step shorter than the stream's wake-up may be skipped; any running event shows a preview.
  if (events.size() > 2) EXPECT_TRUE(preview);
  const auto done = c.Get(("/v1/jobs/" + id).c_str());
  ASSERT_TRUE(done);
  const json d = json::parse(done->body);
  ASSERT_EQ(d["data"].size(), 1u);
  TempDir dir;
  std::ofstream(dir / "job.png", std::ios::binary) << unbase64(d["data"][0]["b64_json"]);
  EXPECT_EQ(read_png(dir / "job.png").text_value("steps"), "6");
}

json wait_state(httplib::Client& c, const std::string& id,
                const std::function<bool(const json&)>& until) {
  for (int i = 0; i < 3000; ++i) {
    const auto r = c.Get(("/v1/jobs/" + id).c_str());
    if (r && r->status == 200) {
      json j = json::parse(r->body);
      if (until(j)) return j;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return json();
}

TEST_F(Serve, InterruptCancelsBetweenSteps) {
  auto c = server_->client();
  int status = 0;
  const json j = post(c, "/v1/jobs", R"({"prompt":"x","steps":200})", &status);
  ASSERT_EQ(status, 202);
  const std::string id = j["id"];
  ASSERT_TRUE(wait_state(c, id, [](const json& s) { return s["step"].get<int>() >= 1; })
                  .is_object());
  const json i = post(c, "/v1/jobs/" + id + "/interrupt", "", &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(i["interrupted"], true);
  const json s = wait_state(c, id, [](const json& s) { return s["state"] != "running"; });
  EXPECT_EQ(s["state"], "cancelled");
  EXPECT_LT(s["step"].get<int>(), 200);
  EXPECT_FALSE(s.contains("data"));
  // The next job runs normally.
  post(c, "/v1/images/generations", R"({"prompt":"after","steps":1})", &status);
  EXPECT_EQ(status, 200);
}

// --max-queue 1: one job runs, one waits, the next is 503 with Retry-After.
TEST(ServeLimits, QueueFullIs503) {
  ServerProcess server({"--max-queue", "1"});
  ASSERT_GT(server.port(), 0);
  auto c = server.client();
  std::vector<std::string> ids;
  bool full = false;
  for (int k = 0; k < 4 && !full; ++k) {
    const auto r = c.Post("/v1/jobs", R"({"prompt":"x","steps":200})", "application/json");
    ASSERT_TRUE(r);
    if (r->status == 503) {
      full = true;
      EXPECT_EQ(r->get_header_value("Retry-After"), "5");
      EXPECT_TRUE(json::parse(r->body).contains("error"));
    } else {
      ASSERT_EQ(r->status, 202);
      ids.push_back(json::parse(r->body)["id"]);
    }
  }
  EXPECT_TRUE(full);
  EXPECT_LE(ids.size(), 2u);
  for (const auto& id : ids) c.Post(("/v1/jobs/" + id + "/interrupt").c_str(), "", "text/plain");
}

// A client that gives up on a synchronous request cancels its job: the worker is free again
// long before 8 images x 200 steps would have finished.
TEST(ServeLimits, ClientThatLeavesCancelsItsJob) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0);
  httplib::Client impatient("127.0.0.1", server.port());
  impatient.set_read_timeout(1, 0);
  const auto r = impatient.Post("/v1/images/generations", R"({"prompt":"x","steps":200,"n":8})",
                                "application/json");
  EXPECT_FALSE(r);  // timed out and closed its connection
  impatient.stop();
  auto c = server.client();
  json s;
  for (int i = 0; i < 1000; ++i) {  // 10 s
    const auto g = c.Get("/v1/jobs/job-1");
    ASSERT_TRUE(g);
    s = json::parse(g->body);
    if (s["state"] != "queued" && s["state"] != "running") break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(s["state"], "cancelled") << s.dump();
  EXPECT_LT(s["step"].get<int>(), 200);
  int status = 0;
  post(c, "/v1/images/generations", R"({"prompt":"after","steps":1})", &status);
  EXPECT_EQ(status, 200);
}

// SIGTERM cancels the running and queued jobs, answers their waiters and exits 0.
TEST(ServeLimits, SigtermStopsCleanly) {
  ServerProcess server({});
  ASSERT_GT(server.port(), 0);
  auto c = server.client();
  int status = 0;
  const json j = post(c, "/v1/jobs", R"({"prompt":"x","steps":200,"n":8})", &status);
  ASSERT_EQ(status, 202);
  ASSERT_TRUE(wait_state(c, j["id"], [](const json& s) { return s["step"].get<int>() >= 1; })
                  .is_object());
  post(c, "/v1/jobs", R"({"prompt":"queued","steps":200})", &status);
  ASSERT_EQ(status, 202);
  EXPECT_EQ(server.signal_and_wait(SIGTERM, 30), 0);
}

TEST(ServeLimits, ApiKeyRequired) {
  ServerProcess server({"--api-key", "s3cret"});
  ASSERT_GT(server.port(), 0);
  auto c = server.client();
  auto r = c.Get("/v1/models");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  EXPECT_EQ(json::parse(r->body)["error"]["param"], "api_key");
  r = c.Get("/v1/models", {{"Authorization", "Bearer wrong"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401);
  r = c.Get("/v1/models", {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  int status = 0;
  post(c, "/sdapi/v1/txt2img", R"({"prompt":"x","steps":1})", &status);
  EXPECT_EQ(status, 401);
  post(c, "/sdapi/v1/txt2img", R"({"prompt":"x","steps":1})", &status,
       {{"X-API-Key", "s3cret"}});
  EXPECT_EQ(status, 200);
  r = c.Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

// --dtype reaches the pipeline as generate's does: bf16 images are the CLI's bf16 images.
TEST(ServeLimits, Bf16IsTheCliBf16Image) {
  ServerProcess server({"--dtype", "bf16"});
  ASSERT_GT(server.port(), 0);
  auto c = server.client();
  int status = 0;
  const json r = post(c, "/v1/images/generations", R"({"prompt":"a star","seed":4,"steps":2})",
                      &status);
  ASSERT_EQ(status, 200) << r.dump();
  TempDir dir;
  const auto g = run_cli("generate --dtype bf16 --prompt " + quote("a star") +
                         " --seed 4 --steps 2 -o " + quote(dir / "cli.png"));
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(unbase64(r["data"][0]["b64_json"]), read_file(dir / "cli.png"));
}

TEST(ServeLimits, BadFlagsFail) {
  auto r = run_cli("serve --port 70000");
  EXPECT_NE(r.code, 0);
  r = run_cli("serve --model /no/such/folder --port 0");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("tessera: error:"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace tessera
