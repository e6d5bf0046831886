// Prints which malloc is in use and whether Sluice's tuning applies to it,
// as "provider=NAME tuned=0|1". Run by malloc_tuning_test.cc with another
// malloc preloaded (LD_PRELOAD), where the tuning must be declined.
#include <cstdio>

#include "server/common/malloc_tuning.h"

int main() {
  std::printf("provider=%s tuned=%d\n", sluice::MallocProvider().c_str(),
              sluice::TuneMallocForStreaming() ? 1 : 0);
  return 0;
}
