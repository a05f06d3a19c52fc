#include "cupcake/tools/subprocess.h"

#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace cupcake::tools {

StatusOr<int> RunChild(const std::vector<std::string>& argv,
                       const std::vector<std::pair<std::string, std::string>>& env, const std::string& who,
                       const std::string& cannot_run) {
  if (argv.empty()) return InvalidArgumentError(who + ": no command; expected a program and its arguments");
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid < 0) return InternalError(who + ": fork: " + std::strerror(errno));
  if (pid == 0) {
    for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
    ::execvp(args[0], args.data());
    // Only async-signal-safe calls between fork and _exit.
    const char* why = std::strerror(errno);
    [[maybe_unused]] auto n = ::write(2, cannot_run.data(), cannot_run.size());
    n = ::write(2, args[0], std::strlen(args[0]));
    n = ::write(2, ": ", 2);
    n = ::write(2, why, std::strlen(why));
    n = ::write(2, "\n", 1);
    ::_exit(127);
  }
  int wstatus = 0;
  while (::waitpid(pid, &wstatus, 0) < 0) {
    if (errno != EINTR) return InternalError(who + ": waitpid: " + std::strerror(errno));
  }
  return wstatus;
}

}  // namespace cupcake::tools
