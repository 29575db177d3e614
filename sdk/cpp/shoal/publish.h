#pragma once

// Publishing a trained model into a model repository that `shoal serve` watches: the C++ side
// of the Python SDK's `shoal.publish_model` (sdk/python/shoal/publish.py, the reference), with
// the same files, lock and numbering, so that Python and C++ publishers of one model take
// turns and never share a version number (docs/sdk.md, "Publishing models"):
//
// - under `<repository>/<model>/.publish.lock` (flock, held while the number is chosen and the
//   version renamed into place), the files are written into a hidden
//   `<model>/.incoming-<pid>-<8 hex digits>` directory (which the server ignores), each file and
//   the directory fsync'd, then renamed to `<model>/<n>`, n = 1 + the highest version present;
//   a rename refused by an existing version takes the next number;
// - `.incoming-<pid>-*` directories whose process is gone (a publisher killed mid-write) are
//   removed by the next publication of the model;
// - with SHOAL_MODEL_KEEP (the job file's publish.keep) only that many newest versions are
//   left: each older one is renamed to `.removing-<n>-<hex>`, out of the server's view in one
//   step, then deleted;
// - the new version is reported to the agent (`published`, fire-and-forget), which the master
//   journals as model_published; `shoal status` shows the last one. It goes on a connection of
//   its own (AgentClient::ReportAlone), so that an older agent's error answer to the op cannot
//   be taken for the reply to a later ReportResumed.
//
// hdfs:// repositories: publish_hdfs.h. Shared pieces: publish_common.h.

#include <string>

#include "shoal/publish_common.h"
#include "shoal/publish_hdfs.h"

namespace shoal::sdk {

// Publishes a new version of model `name`: `model_path` is a saved TorchScript file (it becomes
// the version's model.pt) or a directory of files (model.pt among them), copied as they are.
// Returns the new version's number and directory, or an error naming what is wrong (nothing is
// published then). The protocol is the Python SDK's (top of this header), so publishers in
// either language may share a model. Then reports the publication to the agent
// (fire-and-forget; nothing without SHOAL_AGENT_SOCKET). Nothing throws.
inline PublishResult PublishModel(const std::string& model_path, const std::string& name,
                                  const PublishOptions& options = {}) {
  PublishResult result;
  std::string repository = options.repository;
  if (repository.empty()) {
    const char* from_env = std::getenv(kModelRepositoryEnv);
    repository = from_env ? from_env : "";
  }
  unsigned keep = 0;
  if ((result.error = internal::CheckPublishArguments(name, options, repository, &keep)).size()) {
    return result;
  }
  std::vector<std::pair<std::string, std::string>> files;
  if ((result.error = internal::ReadModelFiles(model_path, &files)).size()) return result;
  std::string config = options.config;
  if (!config.empty() && config.back() != '\n') config += '\n';
  if (internal::IsHdfs(repository)) {
    internal::HdfsPublish(repository, name, files, config, keep, &result);
    if (!result.ok) return result;
    internal::AgentClient::Get().ReportAlone(
        "published", internal::PublishedFields(name, result.version, repository, options));
    return result;
  }

  const std::string model_dir = repository + "/" + name;
  if (::mkdir(model_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    result.error = internal::ErrnoText("PublishModel: cannot create " + model_dir, errno);
    return result;
  }
  const std::string lock_path = model_dir + "/" + kPublishLockName;
  int lock_fd = ::open(lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd < 0) {
    result.error = internal::ErrnoText("PublishModel: cannot open " + lock_path, errno);
    return result;
  }
  int locked;
  do {
    locked = ::flock(lock_fd, LOCK_EX);
  } while (locked != 0 && errno == EINTR);
  if (locked != 0) {
    result.error = internal::ErrnoText("PublishModel: cannot lock " + lock_path, errno);
    ::close(lock_fd);
    return result;
  }
  // Everything below runs under the lock; `finish` releases it.
  auto finish = [&](std::string error) {
    ::close(lock_fd);
    result.error = std::move(error);
    result.ok = result.error.empty();
    return result;
  };
  internal::RemoveAbandonedIncoming(model_dir);
  if (!config.empty()) {
    if (std::string error = internal::ReplaceFileIfChanged(model_dir, "config.yaml", config);
        !error.empty()) {
      return finish("PublishModel: " + error);
    }
  }
  std::string incoming;
  for (int tries = 0; tries < 100; ++tries) {
    incoming = model_dir + "/" + kIncomingPrefix + std::to_string(::getpid()) + "-" +
               internal::RandomHex8();
    if (::mkdir(incoming.c_str(), 0755) == 0) break;
    if (errno != EEXIST) {
      return finish(internal::ErrnoText("PublishModel: cannot create " + incoming, errno));
    }
    incoming.clear();
  }
  if (incoming.empty()) return finish("PublishModel: no free hidden directory in " + model_dir);
  double delay = 0;
  if (const char* text = std::getenv(kTestPublishWriteDelayEnv); text && *text) {
    delay = std::strtod(text, nullptr);
  }
  for (const auto& [file, bytes] : files) {
    std::string error =
        internal::WriteNewFile(incoming + "/" + file, bytes, file == "model.pt" ? delay : 0);
    if (!error.empty()) {
      internal::RemoveTree(incoming);
      return finish("PublishModel: " + error);
    }
  }
  bool has_marker = false;
  for (const auto& file : files) has_marker = has_marker || file.first == kCompleteMarker;
  if (!has_marker) {
    std::string error = internal::WriteNewFile(incoming + "/" + kCompleteMarker, "", 0);
    if (!error.empty()) {
      internal::RemoveTree(incoming);
      return finish("PublishModel: " + error);
    }
  }
  if (!internal::FsyncDir(incoming)) {
    std::string error = internal::ErrnoText("PublishModel: cannot fsync " + incoming, errno);
    internal::RemoveTree(incoming);
    return finish(error);
  }
  std::vector<uint64_t> existing = internal::ListVersions(model_dir);
  uint64_t version = (existing.empty() ? 0 : existing.back()) + 1;
  while (true) {
    // Refuses an existing non-empty version: a version is never overwritten, even by a
    // publisher that does not take the lock.
    std::string target = model_dir + "/" + std::to_string(version);
    if (::rename(incoming.c_str(), target.c_str()) == 0) break;
    if (errno != EEXIST && errno != ENOTEMPTY && errno != EISDIR) {
      std::string error = internal::ErrnoText(
          "PublishModel: cannot rename " + incoming + " to " + target, errno);
      internal::RemoveTree(incoming);
      return finish(error);
    }
    ++version;
  }
  result.version = version;
  result.path = model_dir + "/" + std::to_string(version);
  if (!internal::FsyncDir(model_dir)) {
    return finish(internal::ErrnoText("PublishModel: cannot fsync " + model_dir, errno));
  }
  if (keep >= 1) {
    std::vector<uint64_t> versions = internal::ListVersions(model_dir);
    for (size_t i = 0; i + keep < versions.size(); ++i) {
      std::string hidden = model_dir + "/" + kRemovingPrefix + std::to_string(versions[i]) + "-" +
                           internal::RandomHex8();
      if (::rename((model_dir + "/" + std::to_string(versions[i])).c_str(), hidden.c_str()) != 0) {
        continue;  // another publisher pruned it
      }
      internal::RemoveTree(hidden);
    }
  }
  finish("");
  internal::AgentClient::Get().ReportAlone(
      "published", internal::PublishedFields(name, version, internal::AbsolutePath(repository),
                                             options));
  return result;
}

}  // namespace shoal::sdk