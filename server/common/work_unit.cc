#include "server/common/work_unit.h"

namespace sluice {

int32_t UnitIndex(const v1::WorkUnit& unit) {
  switch (unit.kind_case()) {
    case v1::WorkUnit::kShard:
      return unit.shard().shard_index();
    case v1::WorkUnit::kWindow:
      return unit.window().window_index();
    case v1::WorkUnit::kMixed:
      return unit.mixed().block_index();
    case v1::WorkUnit::KIND_NOT_SET:
      break;
  }
  return -1;
}

const google::protobuf::RepeatedPtrField<v1::WindowPiece>& UnitPieces(
    const v1::WorkUnit& unit) {
  switch (unit.kind_case()) {
    case v1::WorkUnit::kWindow:
      return unit.window().pieces();
    case v1::WorkUnit::kMixed:
      return unit.mixed().pieces();
    default:
      break;
  }
  static const auto* const kNone =
      new google::protobuf::RepeatedPtrField<v1::WindowPiece>();
  return *kNone;
}

const std::string& UnitFirstUrl(const v1::WorkUnit& unit) {
  if (unit.has_shard()) return unit.shard().url();
  const auto& pieces = UnitPieces(unit);
  if (!pieces.empty()) return pieces.Get(0).url();
  static const auto* const kEmpty = new std::string();
  return *kEmpty;
}

const char* UnitKindName(const v1::WorkUnit& unit) {
  switch (unit.kind_case()) {
    case v1::WorkUnit::kShard:
      return "shard";
    case v1::WorkUnit::kWindow:
      return "window";
    case v1::WorkUnit::kMixed:
      return "mixed";
    case v1::WorkUnit::KIND_NOT_SET:
      break;
  }
  return "unset";
}

}  // namespace sluice
