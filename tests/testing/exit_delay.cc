// Loaded with LD_PRELOAD by tests of how a program exits. Its destructor
// runs in exit() after the static destructors of every library loaded later
// (gRPC's among them) and holds the process there for SLUICE_EXIT_DELAY_MS
// milliseconds, so whatever a leftover gRPC thread does in that time, it
// does after gRPC's statics are gone: a race that exit() rarely loses on
// its own is lost every time.
#include <unistd.h>

#include <cstdlib>

namespace {

__attribute__((destructor)) void HoldExit() {
  const char* ms = std::getenv("SLUICE_EXIT_DELAY_MS");
  if (ms != nullptr) usleep(static_cast<useconds_t>(std::atoi(ms)) * 1000);
}

}  // namespace
