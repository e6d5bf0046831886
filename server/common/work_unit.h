#ifndef SLUICE_SERVER_COMMON_WORK_UNIT_H_
#define SLUICE_SERVER_COMMON_WORK_UNIT_H_

#include <cstdint>
#include <string>

#include "google/protobuf/repeated_ptr_field.h"
#include "sluice/v1/common.pb.h"

namespace sluice {

// Questions every holder of a WorkUnit asks, answered for each of its kinds
// (ShardRange, WindowUnit, MixedUnit) so that no caller infers the kind from
// which fields are set.

// The unit's number within its kind: the shard's index in the manifest, the
// window's number in the epoch or the mixed block. With (epoch, sequence) it
// names a planned unit; -1 when no kind is set.
int32_t UnitIndex(const v1::WorkUnit& unit);

// The shards a window or mixed unit interleaves; empty for a ShardRange.
const google::protobuf::RepeatedPtrField<v1::WindowPiece>& UnitPieces(
    const v1::WorkUnit& unit);

// The URL a message about the unit names: the shard's, or the first piece's;
// empty when there is none.
const std::string& UnitFirstUrl(const v1::WorkUnit& unit);

// "shard", "window", "mixed" or "unset", for messages.
const char* UnitKindName(const v1::WorkUnit& unit);

}  // namespace sluice

#endif  // SLUICE_SERVER_COMMON_WORK_UNIT_H_
