// A fresh directory removed (recursively) when the object goes away.
#ifndef SLUICE_TESTS_TESTING_TEMP_DIR_H_
#define SLUICE_TESTS_TESTING_TEMP_DIR_H_

#include <string>

namespace sluice::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::string& path() const { return path_; }
  // path() + "/" + name.
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace sluice::testing

#endif  // SLUICE_TESTS_TESTING_TEMP_DIR_H_
