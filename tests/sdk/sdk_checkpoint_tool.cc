// A command-line face of sdk/cpp/shoal/sdk.h's checkpoint functions and PublishModel, for tests
// that drive the C++ SDK from Python against real storage (tests/sdk/hdfs_cpp_test.py: HDFS).
//
//   sdk_checkpoint_tool save DIR STEP KEEP FILE   writes FILE's bytes; prints the path
//   sdk_checkpoint_tool load DIR OUT [END]        writes the newest loadable checkpoint (one
//                                                 ending in END, when given: others are
//                                                 rejected as corrupt) to OUT; prints its step
//                                                 (exit 3 when there is none)
//   sdk_checkpoint_tool list DIR                  prints the steps, one a line
//   sdk_checkpoint_tool publish REPO NAME MODEL COUNT [CONFIG]
//                                                 publishes MODEL (a file or directory) COUNT
//                                                 times as NAME, with CONFIG's text as its
//                                                 config.yaml when given; prints each version
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
  if (command == "publish" && (argc == 6 || argc == 7)) {
    shoal::sdk::PublishOptions options;
    options.repository = argv[2];
    if (argc == 7) {
      std::ifstream in(argv[6], std::ios::binary);
      std::ostringstream text;
      text << in.rdbuf();
      options.config = text.str();
    }
    for (unsigned long i = 0, count = std::strtoul(argv[5], nullptr, 10); i < count; ++i) {
      shoal::sdk::PublishResult published = shoal::sdk::PublishModel(argv[4], argv[3], options);
      if (!published) {
        std::cerr << "error: " << published.error << "\n";
        return 1;
      }
      std::cout << published.version << std::endl;
    }
    return 0;
  }
  std::cerr << "usage: sdk_checkpoint_tool save DIR STEP KEEP FILE | load DIR OUT [END] | list DIR"
               " | publish REPO NAME MODEL COUNT [CONFIG]\n";
  return 2;
}
