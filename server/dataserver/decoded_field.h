// DecodedField: one decoded sample field, as a decoder or an image
// transform hands it on (raw bytes, a tensor, an integer or text).
#ifndef SLUICE_SERVER_DATASERVER_DECODED_FIELD_H_
#define SLUICE_SERVER_DATASERVER_DECODED_FIELD_H_

#include <cstdint>
#include <vector>

#include "server/format/tar_shard_reader.h"
#include "sluice/v1/dataserver.pb.h"

namespace sluice::dataserver {

struct DecodedField {
  enum class Kind { kRaw, kTensor, kInt, kText };
  Kind kind = Kind::kRaw;
  // kRaw / kText: the bytes; kTensor: the tensor data (little-endian,
  // C order). May share the input's owner (no copy) or own new memory.
  Payload bytes;
  int64_t int_value = 0;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> shape;
};

}  // namespace sluice::dataserver

#endif  // SLUICE_SERVER_DATASERVER_DECODED_FIELD_H_
