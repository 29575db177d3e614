// The model manager's decisions (version policy, swaps, refusals, load/unload) on a real
// repository directory, with a backend whose "model files" are text: "ok <value>" loads a model
// that returns <value>, anything else fails to load.
#include "serve/repository/model_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "serve/runtime/model_backend.h"

namespace shoal::serve {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class ConstantModel final : public BackendModel {
 public:
  explicit ConstantModel(float value) : value_(value) {}
  const std::vector<std::string>& ArgumentNames() const override { return arguments_; }
  bool Run(std::vector<Tensor>&, std::vector<Tensor>* outputs, std::string*) override {
    Tensor out;
    out.datatype = DataType::kFp32;
    out.shape = {1};
    out.data.resize(sizeof(float));
    std::memcpy(out.data.data(), &value_, sizeof(float));
    outputs->assign(1, std::move(out));
    return true;
  }

 private:
  const float value_;
  const std::vector<std::string> arguments_{"x"};
};

// "fail": loads, then fails every request it runs; "wide <value>": answers with shape [2].
class FailingModel final : public BackendModel {
 public:
  const std::vector<std::string>& ArgumentNames() const override { return arguments_; }
  bool Run(std::vector<Tensor>&, std::vector<Tensor>*, std::string* error) override {
    *error = "RuntimeError: deliberately broken";
    return false;
  }

 private:
  const std::vector<std::string> arguments_{"x"};
};

class WideModel final : public BackendModel {
 public:
  explicit WideModel(float value) : value_(value) {}
  const std::vector<std::string>& ArgumentNames() const override { return arguments_; }
  bool Run(std::vector<Tensor>&, std::vector<Tensor>* outputs, std::string*) override {
    Tensor out;
    out.datatype = DataType::kFp32;
    out.shape = {2};
    out.data.resize(2 * sizeof(float));
    std::memcpy(out.data.data(), &value_, sizeof(float));
    std::memcpy(out.data.data() + sizeof(float), &value_, sizeof(float));
    outputs->assign(1, std::move(out));
    return true;
  }

 private:
  const float value_;
  const std::vector<std::string> arguments_{"x"};
};

class TextBackend final : public ModelBackend {
 public:
  std::unique_ptr<BackendModel> Load(const std::string& path, std::string* error) override {
    loads_[path] += 1;
    std::ifstream file(path);
    std::string word;
    float value = 0;
    if (file >> word && word == "fail") return std::make_unique<FailingModel>();
    file.clear();
    file.seekg(0);
    if (file >> word >> value && word == "ok") return std::make_unique<ConstantModel>(value);
    if (word == "wide") return std::make_unique<WideModel>(value);
    *error = path + ": not a model";
    return nullptr;
  }
  void PrepareThread(int) override {}
  std::string Description() const override { return "text"; }
  int LoadsOf(const std::string& path) const {
    auto it = loads_.find(path);
    return it == loads_.end() ? 0 : it->second;
  }

 private:
  std::map<std::string, int> loads_;  // only the manager's update thread loads
};

class ModelManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/shoal-manager-test-XXXXXX";
    ASSERT_NE(mkdtemp(pattern), nullptr);
    root_ = pattern;
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(root_, ec);
  }
  void Write(const std::string& relative, const std::string& text) {
    fs::path path = root_ / relative;
    fs::create_directories(path.parent_path());
    std::ofstream(path) << text;
  }
  RepositoryScan Scan() {
    auto scan = ScanModelRepository(root_.string());
    EXPECT_TRUE(scan.ok()) << scan.status();
    return scan.ok() ? *scan : RepositoryScan{};
  }
  std::string Path(const std::string& relative) { return (root_ / relative).string(); }

  // The value the model's unversioned requests get, or -1 with the error printed.
  float Answer(const std::string& model) {
    auto version = manager_.FindVersion(model, std::nullopt);
    if (!version.ok()) {
      ADD_FAILURE() << version.status();
      return -1;
    }
    return Run(**version);
  }
  static float Run(ServedVersion& version) {
    InferRequest request;
    Tensor x;
    x.name = "x";
    x.shape = {1};
    x.data.resize(sizeof(float));
    request.inputs.push_back(x);
    auto outputs = version.Infer(std::move(request));
    if (!outputs.ok() || outputs->size() != 1) return -1;
    float value;
    std::memcpy(&value, outputs->front().data.data(), sizeof(float));
    return value;
  }

  fs::path root_;
  TextBackend backend_;
  FakeClock clock_;
  ModelManager manager_{&backend_, &clock_, 2, ""};
};

class RepositoryModelManagerTest : public ModelManagerTest {
 protected:
  // The load endpoint scans the repository: a manager that knows where it is.
  void SetUp() override {
    ModelManagerTest::SetUp();
    manager_with_dir_ = std::make_unique<ModelManager>(&backend_, &clock_, 2, root_.string());
  }
  std::unique_ptr<ModelManager> manager_with_dir_;
};

TEST_F(ModelManagerTest, LatestServesTheHighestVersionThatLoads) {
  Write("m/1/model.pt", "ok 1");
  Write("m/2/model.pt", "ok 2");
  Write("m/3/model.pt", "broken");
  manager_.LoadRepository(Scan());
  EXPECT_EQ(Answer("m"), 2);
  auto view = manager_.FindModel("m");
  ASSERT_TRUE(view.ok());
  ASSERT_EQ(view->versions.size(), 1u);  // 1 is not loaded at all
  EXPECT_EQ(backend_.LoadsOf(Path("m/1/model.pt")), 0);
  auto three = manager_.FindVersion("m", "3");
  EXPECT_EQ(three.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(three.status().message(), HasSubstr("version 3 is not available: "));
}

// Issue 23, defect 8: a version that failed to load answered /ready with 404, as if it did
// not exist. What exists answers ready or not, with why; only what does not is NotFound.
TEST_F(ModelManagerTest, ReadinessTellsAVersionThatDoesNotServeFromOneThatDoesNotExist) {
  Write("m/1/model.pt", "ok 1");
  Write("m/2/model.pt", "ok 2");
  Write("m/3/model.pt", "broken");
  Write("bad/config.yaml", "instances: 0\n");
  Write("bad/1/model.pt", "ok 1");
  manager_.LoadRepository(Scan());

  auto ready = [&](const std::string& model, std::optional<std::string> version) {
    absl::StatusOr<Readiness> readiness = manager_.CheckReadiness(model, version);
    EXPECT_TRUE(readiness.ok()) << model << " " << version.value_or("") << ": "
                                << readiness.status();
    return readiness.ok() ? *readiness : Readiness{};
  };
  EXPECT_TRUE(ready("m", std::nullopt).ready);
  EXPECT_TRUE(ready("m", "2").ready);
  Readiness refused = ready("m", "3");
  EXPECT_FALSE(refused.ready);
  EXPECT_EQ(refused.why_not,
            "model 'm' version 3 is not available: " + Path("m/3/model.pt") + ": not a model");
  Readiness not_served = ready("m", "1");  // on disk; `latest` serves 2 only
  EXPECT_FALSE(not_served.ready);
  EXPECT_EQ(not_served.why_not,
            "model 'm' version 1 is not served: its version_policy serves version(s) 2");
  Readiness bad = ready("bad", "1");
  EXPECT_FALSE(bad.ready);
  EXPECT_THAT(bad.why_not, HasSubstr("model 'bad' is not available: invalid config:"));
  EXPECT_FALSE(ready("bad", std::nullopt).ready);

  for (const char* version : {"4", "0", "01", "x"}) {
    absl::StatusOr<Readiness> unknown = manager_.CheckReadiness("m", version);
    EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << version;
    EXPECT_EQ(unknown.status().message(),
              absl::StrCat("model 'm' has no version '", version, "'; ready versions: 2"));
  }
  absl::StatusOr<Readiness> unknown_of_refused = manager_.CheckReadiness("bad", "2");
  EXPECT_EQ(unknown_of_refused.status().message(),
            "model 'bad' has no version '2'; ready versions: none");
  absl::StatusOr<Readiness> unknown_model = manager_.CheckReadiness("nope", std::nullopt);
  EXPECT_EQ(unknown_model.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unknown_model.status().message(), "unknown model 'nope'; the repository has: bad, m");
}

TEST_F(ModelManagerTest, AllServesEveryVersionThatLoads) {
  Write("m/config.yaml", "version_policy: all\n");
  Write("m/1/model.pt", "ok 1");
  Write("m/2/model.pt", "ok 2");
  manager_.LoadRepository(Scan());
  EXPECT_EQ(Answer("m"), 2);
  auto one = manager_.FindVersion("m", "1");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(Run(**one), 1);
}

TEST_F(ModelManagerTest, ANewVersionTakesOverWhileRequestsHoldingTheOldOneFinishOnIt) {
  Write("m/1/model.pt", "ok 1");
  manager_.LoadRepository(Scan());
  auto held = manager_.FindVersion("m", std::nullopt);  // a request in flight
  ASSERT_TRUE(held.ok());
  Write("m/2/model.pt", "ok 2");
  manager_.ApplyScan(Scan());
  EXPECT_EQ(Answer("m"), 2);
  EXPECT_EQ(Run(**held), 1);  // the old version still answers the request holding it
  EXPECT_EQ(manager_.FindVersion("m", "1").status().message(),
            "model 'm' has no version '1'; ready versions: 2");
}

TEST_F(ModelManagerTest, ABrokenNewVersionLeavesTheOldOneServingAndIsNotRetriedUntilItChanges) {
  Write("m/1/model.pt", "ok 1");
  manager_.LoadRepository(Scan());
  Write("m/2/model.pt", "half");
  manager_.ApplyScan(Scan());
  manager_.ApplyScan(Scan());
  EXPECT_EQ(Answer("m"), 1);
  EXPECT_EQ(backend_.LoadsOf(Path("m/2/model.pt")), 1);
  Write("m/2/model.pt", "ok 2.0");  // the copy completes: other size and time
  manager_.ApplyScan(Scan());
  EXPECT_EQ(Answer("m"), 2);
}

TEST_F(ModelManagerTest, RemovingTheServingVersionFallsBackToTheNextOneThatLoads) {
  Write("m/1/model.pt", "ok 1");
  Write("m/2/model.pt", "ok 2");
  manager_.LoadRepository(Scan());
  fs::remove_all(root_ / "m/2");
  manager_.ApplyScan(Scan());
  EXPECT_EQ(Answer("m"), 1);
  fs::remove_all(root_ / "m/1");  // nothing left on disk: keeps serving what it has
  manager_.ApplyScan(Scan());
  EXPECT_EQ(Answer("m"), 1);
}

TEST_F(ModelManagerTest, AModelAddedLaterIsLoadedByTheNextScan) {
  Write("m/1/model.pt", "ok 1");
  manager_.LoadRepository(Scan());
  EXPECT_EQ(manager_.FindVersion("late", std::nullopt).status().code(),
            absl::StatusCode::kNotFound);
  Write("late/4/model.pt", "ok 4");
  manager_.ApplyScan(Scan());
  EXPECT_EQ(Answer("late"), 4);
}

TEST_F(RepositoryModelManagerTest, UnloadIsStickyUntilALoad) {
  Write("m/1/model.pt", "ok 1");
  ModelManager& manager = *manager_with_dir_;
  manager.LoadRepository(Scan());
  ASSERT_TRUE(manager.UnloadModel("m").ok());
  auto gone = manager.FindVersion("m", std::nullopt);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(gone.status().message(),
            "model 'm' is not available: unloaded (POST /v2/repository/models/m/load serves it "
            "again)");
  absl::StatusOr<Readiness> unloaded = manager.CheckReadiness("m", "1");
  ASSERT_TRUE(unloaded.ok()) << unloaded.status();
  EXPECT_FALSE(unloaded->ready);
  EXPECT_EQ(unloaded->why_not, gone.status().message());
  Write("m/2/model.pt", "ok 2");
  manager.ApplyScan(Scan());
  EXPECT_EQ(manager.FindVersion("m", std::nullopt).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(manager.LoadModel("m").ok());
  auto back = manager.FindVersion("m", std::nullopt);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(Run(**back), 2);
}

TEST_F(RepositoryModelManagerTest, LoadAndUnloadOfUnknownModelsAreNotFoundWithTheReason) {
  Write("m/1/model.pt", "ok 1");
  ModelManager& manager = *manager_with_dir_;
  manager.LoadRepository(Scan());
  absl::Status load = manager.LoadModel("nope");
  EXPECT_EQ(load.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(load.message(), "no model 'nope' in the repository " + root_.string() +
                                ": expected a directory " + root_.string() + "/nope");
  absl::Status unload = manager.UnloadModel("nope");
  EXPECT_EQ(unload.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(unload.message(), "unknown model 'nope'; the repository has: m");
}

TEST_F(RepositoryModelManagerTest, ALoadRetriesARefusedVersionAndSaysWhatKeepsServing) {
  Write("m/1/model.pt", "ok 1");
  Write("m/2/model.pt", "broken");
  ModelManager& manager = *manager_with_dir_;
  manager.LoadRepository(Scan());
  absl::Status load = manager.LoadModel("m");
  EXPECT_EQ(load.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(load.message(), "model 'm': version 2: " + Path("m/2/model.pt") +
                                ": not a model (refused; serving version(s) 1)");
  EXPECT_EQ(backend_.LoadsOf(Path("m/2/model.pt")), 2);
}

TEST_F(ModelManagerTest, AnEnsembleOfUnknownMembersOrACycleIsRefusedWithTheReason) {
  Write("a/1/model.pt", "ok 1");
  Write("e/config.yaml", "ensemble: {models: [a, zz], combine: mean}\n");
  Write("c1/config.yaml", "ensemble: {models: [a, c2], combine: mean}\n");
  Write("c2/config.yaml", "ensemble: {models: [c1, a], combine: mean}\n");
  manager_.LoadRepository(Scan());
  EXPECT_THAT(manager_.FindVersion("e", std::nullopt).status().message(),
              HasSubstr("model 'e' is not available: ensemble refused: unknown member 'zz'"));
  EXPECT_EQ(manager_.FindVersion("c1", std::nullopt).status().message(),
            "model 'c1' is not available: ensemble refused: its members form a cycle: c1 -> c2 "
            "-> c1");
}

constexpr char kMemberConfig[] =
    "inputs: [{name: x, datatype: FP32, dims: [1]}]\n"
    "outputs: [{name: y, datatype: FP32, dims: [1]}]\n";

TEST_F(ModelManagerTest, AnEnsembleUsesItsMembersNewVersionsAndANewConfigOnTheNextScan) {
  Write("a/config.yaml", kMemberConfig);
  Write("a/1/model.pt", "ok 1");
  Write("b/config.yaml", kMemberConfig);
  Write("b/1/model.pt", "ok 4");
  Write("c/config.yaml", kMemberConfig);
  Write("c/1/model.pt", "ok 16");
  Write("e/config.yaml", "ensemble: {models: [a, b], combine: mean}\n");
  manager_.LoadRepository(Scan());
  EXPECT_EQ(Answer("e"), 2.5f);  // (1 + 4) / 2
  Write("a/2/model.pt", "ok 3");
  manager_.ApplyScan(Scan());
  EXPECT_EQ(Answer("e"), 3.5f);  // (3 + 4) / 2: a's new version, the same ensemble
  Write("e/config.yaml", "ensemble: {models: [a, b, c], combine: geometric_mean}\n");
  manager_.ApplyScan(Scan());
  EXPECT_FLOAT_EQ(Answer("e"), std::cbrt(3.0f * 4.0f * 16.0f));  // a new combiner and member
  // A new config that is refused leaves the ensemble serving as it was.
  Write("e/config.yaml", "ensemble: {models: [a, zz], combine: mean}\n");
  manager_.ApplyScan(Scan());
  EXPECT_FLOAT_EQ(Answer("e"), std::cbrt(3.0f * 4.0f * 16.0f));
}

}  // namespace
}  // namespace shoal::serve

namespace shoal::serve {
namespace {

// A config whose canary decides quickly: every other request, 10 s, 6 requests, no latency rule.
constexpr char kCanaryConfig[] =
    "outputs: [{name: y, datatype: FP32, dims: [1]}]\n"
    "rollout: {canary: {share: 0.5, duration_s: 10, min_requests: 6, max_error_rate: 0.2,\n"
    "                   max_p99_ratio: 0}}\n";

class CanaryModelManagerTest : public RepositoryModelManagerTest {
 protected:
  // Runs `count` unversioned requests through the model's route; the values answered, in order
  // (-1 for an error).
  std::vector<float> Serve(ModelManager& manager, const std::string& model, int count) {
    std::vector<float> answers;
    for (int i = 0; i < count; ++i) {
      auto route = manager.RouteInference(model, std::nullopt);
      if (!route.ok()) {
        ADD_FAILURE() << route.status();
        answers.push_back(-1);
        continue;
      }
      if (!route->rollout) {
        answers.push_back(Run(*route->version));
        continue;
      }
      InferRequest request;
      Tensor x;
      x.name = "x";
      x.shape = {1};
      x.data.resize(sizeof(float));
      request.inputs.push_back(x);
      auto [answered, outputs] = route->rollout->Infer(std::move(request));
      float value = -1;
      if (outputs.ok() && outputs->size() == 1 && outputs->front().shape == std::vector<int64_t>{1}) {
        std::memcpy(&value, outputs->front().data.data(), sizeof(float));
      }
      answers.push_back(value);
    }
    return answers;
  }
  using ModelManagerTest::Answer;
  float Answer(ModelManager& manager, const std::string& model) {
    auto version = manager.FindVersion(model, std::nullopt);
    if (!version.ok()) {
      ADD_FAILURE() << version.status();
      return -1;
    }
    return Run(**version);
  }
  std::string StateFile() {
    std::ifstream in(root_ / "m" / ".shoal-serve-rollout.json");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
};

TEST_F(CanaryModelManagerTest, AGoodNewVersionServesItsShareThenIsPromoted) {
  ModelManager& manager = *manager_with_dir_;
  Write("m/config.yaml", kCanaryConfig);
  Write("m/1/model.pt", "ok 1");
  manager.LoadRepository(Scan());
  Write("m/2/model.pt", "ok 2");
  manager.ApplyScan(Scan());
  EXPECT_EQ(Serve(manager, "m", 6), (std::vector<float>{1, 2, 1, 2, 1, 2}));
  auto view = manager.FindModel("m");
  ASSERT_TRUE(view.ok() && view->rollout && view->rollout->canary);
  EXPECT_EQ(*view->rollout->canary, 2);
  EXPECT_EQ(view->rollout->serving, 1);
  manager.ApplyScan(Scan());  // the watcher's next pass changes nothing
  manager.DecideCanaries();
  EXPECT_EQ(manager.FindModel("m")->rollout->canary, 2) << "10 s have not passed";
  EXPECT_EQ(Serve(manager, "m", 6), (std::vector<float>{1, 2, 1, 2, 1, 2}));
  clock_.Advance(std::chrono::seconds(11));
  manager.DecideCanaries();
  view = manager.FindModel("m");
  ASSERT_TRUE(view.ok() && view->rollout);
  EXPECT_FALSE(view->rollout->canary.has_value());
  EXPECT_EQ(view->rollout->serving, 2);
  ASSERT_TRUE(view->rollout->last.has_value());
  EXPECT_EQ(view->rollout->last->decision, "promoted");
  EXPECT_THAT(view->rollout->last->reason, HasSubstr("6 canary requests in 11 s: error rate 0%"));
  EXPECT_EQ(Serve(manager, "m", 3), (std::vector<float>{2, 2, 2}));
  auto metrics = manager.RolloutMetricsNow();
  ASSERT_EQ(metrics.size(), 1u);
  EXPECT_EQ(metrics[0].promoted, 1u);
  EXPECT_EQ(metrics[0].routed_canary, 6u);
  EXPECT_EQ(metrics[0].routed_current, 6u);
  EXPECT_EQ(metrics[0].canary_share, 0);
}

// A canary that fails (or answers with the wrong shape) is rolled back after a few requests,
// none of which fails for the caller, and stays out: across scans and a restart.
void ExpectRolledBack(CanaryModelManagerTest& test, ModelManager& manager,
                      const std::vector<float>& answers) {
  EXPECT_EQ(answers, std::vector<float>(answers.size(), 1)) << "every caller got version 1";
  manager.DecideCanaries();
  auto view = manager.FindModel("m");
  ASSERT_TRUE(view.ok() && view->rollout);
  EXPECT_FALSE(view->rollout->canary.has_value());
  EXPECT_EQ(view->rollout->serving, 1);
  ASSERT_TRUE(view->rollout->last.has_value());
  EXPECT_EQ(view->rollout->last->decision, "rolled_back");
  EXPECT_THAT(view->rollout->last->reason,
              HasSubstr("2 of 2 canary requests failed, more than max_error_rate 0.2 allows over "
                        "min_requests 6 (1)"));
  EXPECT_EQ(view->rollout->rolled_back.count(2), 1u);
  EXPECT_EQ(manager.RolloutMetricsNow()[0].rolled_back, 1u);
  EXPECT_EQ(manager.RolloutMetricsNow()[0].fallbacks, 2u);
}

TEST_F(CanaryModelManagerTest, AFailingCanaryIsRolledBackWithoutAFailedRequestAndStaysOut) {
  ModelManager& manager = *manager_with_dir_;
  Write("m/config.yaml", kCanaryConfig);
  Write("m/1/model.pt", "ok 1");
  manager.LoadRepository(Scan());
  Write("m/2/model.pt", "fail");
  manager.ApplyScan(Scan());
  std::vector<float> answers = Serve(manager, "m", 4);
  // The second failure is past the budget: no request goes to the canary after it, even
  // before the decision is applied.
  for (float answer : Serve(manager, "m", 4)) answers.push_back(answer);
  ExpectRolledBack(*this, manager, answers);
  EXPECT_THAT(StateFile(), HasSubstr("\"2\": \"2 of 2 canary requests failed"));
  manager.ApplyScan(Scan());
  EXPECT_EQ(backend_.LoadsOf(Path("m/2/model.pt")), 1) << "not loaded again";
  EXPECT_EQ(Serve(manager, "m", 2), (std::vector<float>{1, 1}));
  auto index = manager.Index();
  ASSERT_EQ(index.size(), 2u);
  EXPECT_EQ(index[1].version, "2");
  EXPECT_EQ(index[1].state, "UNAVAILABLE");
  EXPECT_EQ(index[1].rollout_state, "rolled_back");
  EXPECT_EQ(index[1].decision, "rolled_back");
  EXPECT_EQ(index[0].rollout_state, "serving");
  auto readiness = manager.CheckReadiness("m", "2");
  ASSERT_TRUE(readiness.ok());
  EXPECT_FALSE(readiness->ready);
  EXPECT_THAT(readiness->why_not, HasSubstr("was rolled back"));

  // A restarted server reads the decision back.
  ModelManager restarted(&backend_, &clock_, 2, root_.string());
  restarted.LoadRepository(Scan());
  EXPECT_EQ(Serve(restarted, "m", 2), (std::vector<float>{1, 1}));
  EXPECT_EQ(backend_.LoadsOf(Path("m/2/model.pt")), 1);
  // A newer good version still gets its canary.
  Write("m/3/model.pt", "ok 3");
  restarted.ApplyScan(Scan());
  EXPECT_EQ(restarted.FindModel("m")->rollout->canary, 3);
}

TEST_F(CanaryModelManagerTest, ACanaryAnsweringTheWrongShapeIsRolledBack) {
  ModelManager& manager = *manager_with_dir_;
  Write("m/config.yaml", kCanaryConfig);
  Write("m/1/model.pt", "ok 1");
  manager.LoadRepository(Scan());
  Write("m/2/model.pt", "wide 2");
  manager.ApplyScan(Scan());
  ExpectRolledBack(*this, manager, Serve(manager, "m", 4));
}

TEST_F(CanaryModelManagerTest, PinUnpinAndRollBackByRequest) {
  ModelManager& manager = *manager_with_dir_;
  Write("m/1/model.pt", "ok 1");
  Write("m/2/model.pt", "ok 2");
  manager.LoadRepository(Scan());
  EXPECT_EQ(Answer(manager, "m"), 2);
  ASSERT_TRUE(manager.Pin("m", 1).ok());
  EXPECT_EQ(Answer(manager, "m"), 1);
  Write("m/3/model.pt", "ok 3");
  manager.ApplyScan(Scan());
  EXPECT_EQ(Answer(manager, "m"), 1) << "pinned: newer versions are ignored";
  EXPECT_THAT(StateFile(), HasSubstr("\"pinned\": 1"));
  {
    ModelManager restarted(&backend_, &clock_, 2, root_.string());
    restarted.LoadRepository(Scan());
    EXPECT_EQ(Answer(restarted, "m"), 1) << "the pin outlives a restart";
  }
  ASSERT_TRUE(manager.Unpin("m").ok());
  EXPECT_EQ(Answer(manager, "m"), 3);
  ASSERT_TRUE(manager.RollBack("m").ok());
  EXPECT_EQ(Answer(manager, "m"), 2);
  manager.ApplyScan(Scan());
  EXPECT_EQ(Answer(manager, "m"), 2) << "3 is not loaded again";
  EXPECT_EQ(manager.FindModel("m")->rollout->last->decision, "rolled_back");
  // Pinning a rolled-back version forgives it.
  ASSERT_TRUE(manager.Pin("m", 3).ok());
  EXPECT_EQ(Answer(manager, "m"), 3);

  // Bad requests change nothing.
  EXPECT_EQ(manager.Pin("m", 9).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager.Pin("nope", 1).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager.RollBack("nope").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(manager.Unpin("nope").code(), absl::StatusCode::kNotFound);
  Write("m/4/model.pt", "broken");
  EXPECT_EQ(manager.Pin("m", 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Answer(manager, "m"), 3);
  EXPECT_EQ(manager.FindModel("m")->rollout->pinned, 3);
  ASSERT_TRUE(manager.Unpin("m").ok());
  EXPECT_EQ(manager.Unpin("m").code(), absl::StatusCode::kFailedPrecondition);
  // 4 does not load: 3 serves; rolling 3 back goes to 2, then 2 to 1; 1 has nothing before it.
  manager.ApplyScan(Scan());
  EXPECT_EQ(Answer(manager, "m"), 3);
  ASSERT_TRUE(manager.RollBack("m").ok());
  EXPECT_EQ(Answer(manager, "m"), 2);
  ASSERT_TRUE(manager.RollBack("m").ok());
  EXPECT_EQ(Answer(manager, "m"), 1);
  absl::Status last = manager.RollBack("m");
  EXPECT_EQ(last.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(last.message(), HasSubstr("no other version that loads"));
  EXPECT_EQ(Answer(manager, "m"), 1);
}

// Waits (real time: the copies run on the versions' threads) until the canary of `model` has
// counted `requests` requests and compared `pairs` pairs.
void WaitForCanaryFigures(ModelManager& manager, const std::string& model, uint64_t requests,
                          uint64_t pairs) {
  for (int i = 0; i < 500; ++i) {
    auto view = manager.FindModel(model);
    const auto& figures = view->rollout->canary_figures;
    if (figures && figures->canary_requests == requests && figures->drift_pairs == pairs) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ADD_FAILURE() << "the canary of " << model << " never counted " << requests << " requests and "
                << pairs << " compared pairs";
}

TEST_F(CanaryModelManagerTest, OutputDriftDecidesMirroredAndSampledCanaries) {
  ModelManager& manager = *manager_with_dir_;
  constexpr char kDrift[] =
      "outputs: [{name: y, datatype: FP32, dims: [1]}]\n"
      "rollout: {canary: {share: 0.5, duration_s: 10, min_requests: 4, max_p99_ratio: 0,\n"
      "                   max_output_drift: 0.5, mirror: MIRROR}}\n";
  std::string mirrored = kDrift, sampled = kDrift;
  mirrored.replace(mirrored.find("MIRROR"), 6, "true");
  sampled.replace(sampled.find("MIRROR"), 6, "false");
  Write("mirrored/config.yaml", mirrored);
  Write("mirrored/1/model.pt", "ok 1");
  Write("sampled/config.yaml", sampled);
  Write("sampled/1/model.pt", "ok 1");
  manager.LoadRepository(Scan());
  Write("mirrored/2/model.pt", "ok 1.2");  // drift 0.2: within 0.5
  Write("sampled/2/model.pt", "ok 5");     // drift 4
  manager.ApplyScan(Scan());
  // Mirrored: every caller gets version 1, copies of every other request run on 2.
  EXPECT_EQ(Serve(manager, "mirrored", 8), std::vector<float>(8, 1));
  WaitForCanaryFigures(manager, "mirrored", 4, 4);
  // Sampled: callers of the canary's share get its answers, which are compared after.
  EXPECT_EQ(Serve(manager, "sampled", 8), (std::vector<float>{1, 5, 1, 5, 1, 5, 1, 5}));
  WaitForCanaryFigures(manager, "sampled", 4, 4);
  clock_.Advance(std::chrono::seconds(11));
  manager.DecideCanaries();
  auto mirrored_view = manager.FindModel("mirrored");
  EXPECT_EQ(mirrored_view->rollout->serving, 2);
  EXPECT_EQ(mirrored_view->rollout->last->decision, "promoted");
  EXPECT_THAT(mirrored_view->rollout->last->reason,
              HasSubstr("mean output drift 0.2 over 4 compared requests (max 0.5)"));
  auto sampled_view = manager.FindModel("sampled");
  EXPECT_EQ(sampled_view->rollout->serving, 1);
  EXPECT_EQ(sampled_view->rollout->last->decision, "rolled_back");
  EXPECT_EQ(sampled_view->rollout->last->reason,
            "mean output drift 4 over 4 compared requests (max 0.5)");
}

TEST_F(CanaryModelManagerTest, PinAndRollBackNeedVersionPolicyLatest) {
  ModelManager& manager = *manager_with_dir_;
  Write("a/config.yaml", "version_policy: all\n");
  Write("a/1/model.pt", "ok 1");
  Write("a/2/model.pt", "ok 2");
  manager.LoadRepository(Scan());
  absl::Status pin = manager.Pin("a", 1);
  EXPECT_EQ(pin.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(pin.message(), HasSubstr("version_policy all"));
  EXPECT_EQ(manager.RollBack("a").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_FALSE(fs::exists(root_ / "a" / ".shoal-serve-rollout.json"));
  EXPECT_EQ(manager.FindModel("a")->versions.size(), 2u);
}

TEST_F(CanaryModelManagerTest, RollingBackACanaryByRequestKeepsTheCurrentVersion) {
  ModelManager& manager = *manager_with_dir_;
  Write("m/config.yaml", kCanaryConfig);
  Write("m/1/model.pt", "ok 1");
  manager.LoadRepository(Scan());
  Write("m/2/model.pt", "ok 2");
  manager.ApplyScan(Scan());
  ASSERT_TRUE(manager.FindModel("m")->rollout->canary.has_value());
  ASSERT_TRUE(manager.RollBack("m").ok());
  EXPECT_FALSE(manager.FindModel("m")->rollout->canary.has_value());
  EXPECT_EQ(Serve(manager, "m", 4), (std::vector<float>{1, 1, 1, 1}));
  manager.ApplyScan(Scan());
  EXPECT_FALSE(manager.FindModel("m")->rollout->canary.has_value());
}

}  // namespace
}  // namespace shoal::serve
