#pragma once

// `shoal serve --print-manifests`: the Kubernetes objects that run `shoal serve` as N replicas
// behind a Service (docs/serving.md, "Running on Kubernetes"; docs/design/0015-serve-on-
// kubernetes.md says why they look the way they do).

#include <string>
#include <vector>

#include "serve/serve_command.h"

namespace shoal::cli {

struct ServeManifestFlags {
  int replicas = 2;
  std::string image = "localhost/shoal-serve:latest";
  std::string image_pull_policy = "IfNotPresent";
  // hostpath:/DIR (a directory on every node) or pvc:CLAIM (a PersistentVolumeClaim).
  std::string model_repository_volume;
  std::string name = "shoal-serve";  // the Deployment's and the Service's; labels say it too
  std::string ns;                    // empty: no namespace in the objects (kubectl -n decides)
  // An existing Secret whose key `token` the server requires; empty: a Secret NAME-token with
  // a fresh random token is printed with the rest.
  std::string token_secret;
  std::string cpu = "1";       // each replica's request and limit
  std::string memory = "1Gi";  // each replica's request and limit
};

// What of `serve`'s own flags the user gave: those that make no sense in a pod (--host,
// --token-file, --model-repository: the manifests set them) are refused.
struct ServeFlagsGiven {
  bool host = false;
  bool token_file = false;
  bool model_repository = false;
};

// Every problem with the flags, each naming its flag; empty when they are good.
std::vector<std::string> ServeManifestProblems(const ServeManifestFlags& flags,
                                               const serve::ServeOptions& serve,
                                               const ServeFlagsGiven& given);

// A Secret (unless flags.token_secret names one), a Deployment and a Service, as YAML
// documents; the pods run `shoal serve` with `serve`'s ports, threads, limits, repository
// polling, drain and finish times. REQUIRES: ServeManifestProblems(...) is empty.
std::string ServeManifests(const ServeManifestFlags& flags, const serve::ServeOptions& serve);

}  // namespace shoal::cli
