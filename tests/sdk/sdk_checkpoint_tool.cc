// A command-line face of sdk/cpp/shoal/sdk.h's checkpoint functions, for tests that drive the
// C++ SDK from Python against real storage (tests/sdk/hdfs_cpp_test.py: HDFS).
//
//   sdk_checkpoint_tool save DIR STEP KEEP FILE   writes FILE's bytes; prints the path
//   sdk_checkpoint_tool load DIR OUT [END]        writes the newest loadable checkpoint (one
//                                                 ending in END, when given: others are
//                                                 rejected as corrupt) to OUT; prints its step
//                                                 (exit 3 when there is none)
//   sdk_checkpoint_tool list DIR                  prints the steps, one a line
//
// Errors go to stderr with exit status 1.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "shoal/sdk.h"

int main(int argc, char** argv) {
  std::string command = argc > 1 ? argv[1] : "";
  if (command == "save" && argc == 6) {
    std::ifstream in(argv[5], std::ios::binary);
    std::ostringstream bytes;
    bytes << in.rdbuf();
    shoal::sdk::SaveResult saved = shoal::sdk::SaveCheckpoint(
        argv[2], std::strtoull(argv[3], nullptr, 10), bytes.str(),
        static_cast<unsigned>(std::strtoul(argv[4], nullptr, 10)));
    if (!saved) {
      std::cerr << "error: " << saved.error << "\n";
      return 1;
    }
    std::cout << saved.path << "\n";
    return 0;
  }
  if (command == "load" && (argc == 4 || argc == 5)) {
    std::string end = argc == 5 ? argv[4] : "";
    auto loaded = shoal::sdk::LoadLatestCheckpoint(argv[2], [&](uint64_t, std::string_view bytes) {
      return bytes.size() >= end.size() && bytes.substr(bytes.size() - end.size()) == end;
    });
    if (!loaded) return 3;
    std::ofstream out(argv[3], std::ios::binary | std::ios::trunc);
    out << loaded->second;
    std::cout << loaded->first << "\n";
    return out ? 0 : 1;
  }
  if (command == "list" && argc == 3) {
    for (uint64_t step : shoal::sdk::ListCheckpoints(argv[2])) std::cout << step << "\n";
    return 0;
  }
  std::cerr << "usage: sdk_checkpoint_tool save DIR STEP KEEP FILE | load DIR OUT [END] | list DIR\n";
  return 2;
}
