// sluice._core.LocalCluster, ServerProcess and start_server: the
// local-cluster library (client/cli/local_cluster.h) for Python, which the
// Python tests' fixtures (tests/python/conftest.py) start their servers
// with. Calls that wait (start, restart, stop, wait) let the GIL go; as the
// library itself, a cluster and its handles are driven by one thread at a
// time.
//
//   c = _core.LocalCluster(dir="/tmp/c", bin_dir="build/bin",
//                          shards_dir="/tmp/c/shards")
//   c.start_coordinator()
//   c.start_data_servers(2)
//   os.kill(c.data_servers[0].pid, signal.SIGSTOP)
//   c.stop()
//
// Errors raise RuntimeError carrying the status; a wait that times out
// raises TimeoutError, a data server index past the end IndexError.
#ifndef SLUICE_CLIENT_PYTHON_CORE_LOCAL_CLUSTER_BINDINGS_H_
#define SLUICE_CLIENT_PYTHON_CORE_LOCAL_CLUSTER_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace sluice {

// `note_grpc_use` is called before each call that opens gRPC channels (the
// cluster's readiness and live-server checks).
void BindLocalCluster(pybind11::module_& m, void (*note_grpc_use)());

}  // namespace sluice

#endif  // SLUICE_CLIENT_PYTHON_CORE_LOCAL_CLUSTER_BINDINGS_H_
