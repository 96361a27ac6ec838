// tessera launch: starts one tessera process per rank through OpenMPI's mpirun (torchrun's
// role): `tessera launch --nproc-per-node N [--hosts FILE] -- generate ... --tp N`. Ranks on
// several hosts come from MPI's own host file. Each rank gets cores / N kernel threads unless
// TESSERA_NUM_THREADS is set. The exit code is mpirun's: non-zero when any rank failed.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "distributed/process_group.h"
#include "runtime/env.h"
#include "runtime/error.h"

namespace tessera::cli {
namespace {

struct LaunchOptions {
  int nproc_per_node = 1;
  std::string hosts;
  std::vector<std::string> command;  // after --: the tessera subcommand and its flags
};

int run_launch(const LaunchOptions& o) {
  TESSERA_CHECK(mpi_available(), "[launch] this build of tessera has no MPI backend (OpenMPI was "
                "not found when it was configured; scripts/setup.sh installs it)");
  TESSERA_CHECK(!o.command.empty(), "[launch] nothing to run: give the tessera command after --, "
                "e.g. tessera launch --nproc-per-node 2 -- generate --prompt ... --tp 2");
  TESSERA_CHECK(o.command[0] == "generate", "[launch] runs tessera generate on every rank; got '",
                o.command[0], "'");
#ifdef TESSERA_MPIRUN
  const std::string mpirun = TESSERA_MPIRUN;
#else
  const std::string mpirun = "mpirun";
#endif
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::string> args = {mpirun, "--quiet"};
  if (geteuid() == 0) args.push_back("--allow-run-as-root");  // containers often run as root
  if (o.hosts.empty()) {
    args.insert(args.end(), {"-n", std::to_string(o.nproc_per_node)});
  } else {
    args.insert(args.end(), {"--hostfile", o.hosts, "--npernode", std::to_string(o.nproc_per_node)});
  }
  // More ranks than cores (tests on small machines): allowed, and not pinned to one core each.
  if (unsigned(o.nproc_per_node) > cores) args.insert(args.end(), {"--oversubscribe", "--bind-to", "none"});
  // A failed rank must not take the others down silently: they detect it themselves (heartbeat
  // watchdog) and exit naming it (decision 0040).
  args.push_back("--enable-recovery");
  if (!env::is_set(EnvVar::num_threads))
    setenv("TESSERA_NUM_THREADS", std::to_string(std::max(1u, cores / unsigned(o.nproc_per_node))).c_str(), 1);
  // Remote hosts get the TESSERA_* and OMP_* settings of this one.
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    const std::string name = kv.substr(0, kv.find('='));
    if (name.rfind("TESSERA_", 0) == 0 || name.rfind("OMP_", 0) == 0)
      args.insert(args.end(), {"-x", name});
  }
  // Where rank 0 marks that every rank finished (mpirun's own exit code says nothing under
  // --enable-recovery).
  char dir_template[] = "/tmp/tessera-launch-XXXXXX";
  TESSERA_CHECK(mkdtemp(dir_template), "[launch] cannot create a folder in /tmp");
  const std::string dir = dir_template;
  setenv("TESSERA_LAUNCH_DIR", dir.c_str(), 1);
  args.insert(args.end(), {"-x", "TESSERA_LAUNCH_DIR"});
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  TESSERA_CHECK(n > 0, "[launch] cannot find the tessera executable (/proc/self/exe)");
  args.push_back(std::string(self, size_t(n)));
  args.insert(args.end(), o.command.begin(), o.command.end());

  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = fork();
  TESSERA_CHECK(pid >= 0, "[launch] fork failed");
  if (pid == 0) {
    execvp(argv[0], argv.data());
    std::fprintf(stderr, "tessera: error: [launch] cannot run %s\n", argv[0]);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
  }
  const std::string done = dir + "/done";
  const bool finished = access(done.c_str(), F_OK) == 0;
  unlink(done.c_str());
  rmdir(dir.c_str());
  if (WIFSIGNALED(status)) {
    std::fprintf(stderr, "tessera: error: [launch] mpirun was killed by signal %d\n",
                 WTERMSIG(status));
    return 128 + WTERMSIG(status);
  }
  const int code = WEXITSTATUS(status);
  if (code == 0 && finished) return 0;
  // The failing rank has said why on its own line (an error, or the watchdog naming a dead rank).
  std::fprintf(stderr, "tessera: error: [launch] the run failed: not every rank finished%s\n",
               code ? (" (mpirun exit code " + std::to_string(code) + ")").c_str() : "");
  return code ? code : 1;
}

}  // namespace

void register_launch(CLI::App& app, Runner& run) {
  auto o = std::make_shared<LaunchOptions>();
  CLI::App* sub = app.add_subcommand(
      "launch", "Run a tessera command on N ranks over MPI: launch --nproc-per-node N -- generate "
                "... --tp N");
  sub->add_option("--nproc-per-node", o->nproc_per_node, "processes (ranks) per host")
      ->required()
      ->check(CLI::PositiveNumber);
  sub->add_option("--hosts", o->hosts, "MPI host file (several hosts; default: this one)")
      ->check(CLI::ExistingFile);
  sub->add_option("command", o->command, "the tessera command to run on every rank, after --");
  sub->callback([o, &run] { run = [o] { return run_launch(*o); }; });
}

}  // namespace tessera::cli
