package shoal.yarn;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.URI;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.yarn.api.ApplicationConstants;
import org.apache.hadoop.yarn.api.records.Container;
import org.apache.hadoop.yarn.api.records.ContainerId;
import org.apache.hadoop.yarn.api.records.ContainerLaunchContext;
import org.apache.hadoop.yarn.api.records.ContainerStatus;
import org.apache.hadoop.yarn.api.records.FinalApplicationStatus;
import org.apache.hadoop.yarn.api.records.LocalResource;
import org.apache.hadoop.yarn.api.records.LocalResourceType;
import org.apache.hadoop.yarn.api.records.LocalResourceVisibility;
import org.apache.hadoop.yarn.api.records.NodeReport;
import org.apache.hadoop.yarn.api.records.Priority;
import org.apache.hadoop.yarn.api.records.Resource;
import org.apache.hadoop.yarn.api.records.URL;
import org.apache.hadoop.yarn.api.records.UpdatedContainer;
import org.apache.hadoop.yarn.client.api.AMRMClient.ContainerRequest;
import org.apache.hadoop.yarn.client.api.async.AMRMClientAsync;
import org.apache.hadoop.yarn.client.api.async.NMClientAsync;
import org.apache.hadoop.yarn.conf.YarnConfiguration;

/**
 * Shoal's application master: obtains one container per Shoal task (a "place"), holds them until
 * the whole gang is allocated, then starts a Shoal agent in each, and tells the Shoal master
 * (YarnBackend, which polls its small HTTP API) what YARN did. It decides nothing about the job;
 * see docs/backends/yarn.md for the protocol.
 *
 * <p>Argument: the base64 of a JSON object {places: [{name, memory_mb, vcores, gpus, node_label,
 * command}], idle_timeout_ms, agent_resources: [{name, url, size, timestamp}], staging_dir}: the
 * files every agent container gets from HDFS (the shoal binary), and the HDFS directory they were
 * staged in, removed when the application ends. Environment: SHOAL_AM_KEY, the bearer key every
 * HTTP request must carry; CLASSPATH, this jar (localized) and the cluster's Hadoop. The agents' token is not among them (the ResourceManager stores both): the backend posts
 * it to /launch and the AM passes it to the NodeManagers only, in each agent's environment.
 *
 * <p>Threads: AMRMClientAsync and NMClientAsync call back on their own threads, the HTTP server
 * on its own; all state is guarded by this object's monitor.
 */
public final class ShoalAppMaster {
  private static final String GPU = "yarn.io/gpu";
  private static final ObjectMapper JSON = new ObjectMapper();

  private static final class Place {
    String name;
    int index;
    Resource resource;
    String nodeLabel;
    String command;
    ContainerRequest request; // outstanding request, or null
    Container container; // the container serving it, or null
    boolean launched;
  }

  private final List<Place> places = new ArrayList<>();
  private final Map<ContainerId, Place> byContainer = new HashMap<>();
  private final List<ObjectNode> events = new ArrayList<>();
  private final byte[] key;
  private final long idleTimeoutMs;
  private final Map<String, LocalResource> agentResources = new HashMap<>();
  private final String stagingDir;
  private String stagedFileSystem = ""; // scheme://authority of the staged files
  private AMRMClientAsync<ContainerRequest> rm;
  private NMClientAsync nm;
  private HttpServer http;
  private String token; // the agents' token, once the backend posted it
  private boolean gangComplete;
  private boolean finishing;
  private long lastPollMs = System.currentTimeMillis();
  private FinalApplicationStatus finalStatus;
  private String finalMessage = "";

  private ShoalAppMaster(JsonNode config, byte[] key) {
    this.key = key;
    this.idleTimeoutMs = config.path("idle_timeout_ms").asLong(60000);
    this.stagingDir = config.path("staging_dir").asText("");
    for (JsonNode r : config.path("agent_resources")) {
      URI url = URI.create(r.path("url").asText());
      stagedFileSystem = url.getScheme() + "://" + url.getAuthority();
      // The size and timestamp are the staged file's: the NodeManager checks both.
      agentResources.put(r.path("name").asText(), LocalResource.newInstance(
          URL.fromURI(url), LocalResourceType.FILE,
          LocalResourceVisibility.APPLICATION, r.path("size").asLong(),
          r.path("timestamp").asLong()));
    }
    int i = 0;
    for (JsonNode p : config.path("places")) {
      Place place = new Place();
      place.name = p.path("name").asText();
      place.index = i++;
      place.resource = Resource.newInstance(p.path("memory_mb").asLong(), p.path("vcores").asInt(1));
      long gpus = p.path("gpus").asLong(0);
      if (gpus > 0) place.resource.setResourceValue(GPU, gpus);
      place.nodeLabel = p.path("node_label").asText("");
      place.command = p.path("command").asText();
      places.add(place);
    }
  }

  public static void main(String[] args) throws Exception {
    if (args.length != 1) {
      System.err.println("usage: ShoalAppMaster BASE64_JSON_CONFIG");
      System.exit(2);
    }
    JsonNode config = JSON.readTree(Base64.getDecoder().decode(args[0]));
    String key = System.getenv("SHOAL_AM_KEY");
    if (key == null || key.isEmpty()) {
      System.err.println("SHOAL_AM_KEY is not set");
      System.exit(2);
    }
    new ShoalAppMaster(config, key.getBytes(StandardCharsets.UTF_8)).run();
  }

  private void run() throws Exception {
    YarnConfiguration conf = new YarnConfiguration();
    nm = NMClientAsync.createNMClientAsync(new NodeManagerCallbacks());
    nm.init(conf);
    nm.start();
    // 100 ms: how soon YARN's answers (allocations, completions) reach the AM; the RM only
    // allocates on NodeManager heartbeats anyway, so a faster beat would buy nothing.
    rm = AMRMClientAsync.createAMRMClientAsync(100, new ResourceManagerCallbacks());
    rm.init(conf);
    rm.start();

    String host = System.getenv(ApplicationConstants.Environment.NM_HOST.name());
    if (host == null || host.isEmpty()) host = InetAddress.getLocalHost().getHostName();
    // Bound to the NodeManager's address: the Shoal master polls it from the submitting machine.
    http = HttpServer.create(new InetSocketAddress(host, 0), 16);
    http.createContext("/", this::handle);
    http.setExecutor(Executors.newFixedThreadPool(4));
    http.start();
    int port = http.getAddress().getPort();
    rm.registerApplicationMaster(host, port, "http://" + host + ":" + port + "/status");
    System.err.println("shoal-am: serving on " + host + ":" + port + " for " + places.size()
        + " places");

    synchronized (this) {
      for (Place p : places) request(p);
    }
    // The main thread waits for the end: a finish request, an error, or a master gone silent.
    synchronized (this) {
      while (finalStatus == null) {
        wait(1000);
        if (finalStatus == null && System.currentTimeMillis() - lastPollMs > idleTimeoutMs) {
          beginFinish(FinalApplicationStatus.FAILED, "the Shoal master stopped polling its "
              + "application master for " + idleTimeoutMs / 1000 + "s; it is presumed gone");
        }
      }
    }
    // Stopping the containers first ends them at once; unregistering alone would leave them
    // to the ResourceManager's cleanup, a NodeManager heartbeat or more later.
    stopAll();
    long deadline = System.currentTimeMillis() + 5000;
    synchronized (this) {
      while (!byContainer.isEmpty() && System.currentTimeMillis() < deadline) wait(100);
    }
    removeStagingDir(conf);
    try {
      rm.unregisterApplicationMaster(finalStatus, finalMessage, null);
    } catch (Exception e) {
      System.err.println("shoal-am: unregister failed: " + e);
    }
    rm.stop();
    nm.stop();
    http.stop(0);
    System.exit(0);
  }

  // The staged files are no longer needed once no container will start. Best effort: the Shoal
  // master removes the directory too, after the application ended (and when the AM was killed).
  private void removeStagingDir(YarnConfiguration conf) {
    if (stagingDir.isEmpty() || stagedFileSystem.isEmpty()) return;
    try {
      Path dir = new Path(stagedFileSystem + stagingDir);
      FileSystem.get(dir.toUri(), conf).delete(dir, true);
    } catch (Throwable t) {
      System.err.println("shoal-am: cannot remove the staging directory " + stagingDir + ": " + t);
    }
  }

  // REQUIRES: holds the monitor.
  private void request(Place p) {
    ContainerRequest.ContainerRequestBuilder b = ContainerRequest.newBuilder()
        .capability(p.resource)
        .priority(Priority.newInstance(0))
        .allocationRequestId(p.index)
        .relaxLocality(true);
    if (!p.nodeLabel.isEmpty()) b.nodeLabelsExpression(p.nodeLabel);
    p.request = b.build();
    rm.addContainerRequest(p.request);
  }

  // REQUIRES: holds the monitor.
  private ObjectNode event(String kind) {
    ObjectNode e = JSON.createObjectNode();
    e.put("seq", events.size() + 1);
    e.put("kind", kind);
    events.add(e);
    notifyAll();
    return e;
  }

  // REQUIRES: holds the monitor.
  private int allocated() {
    int n = 0;
    for (Place p : places) if (p.container != null) n++;
    return n;
  }

  // REQUIRES: holds the monitor.
  private void launchReady() {
    if (token == null || !gangComplete || finishing) return;
    for (Place p : places) {
      if (p.container == null || p.launched) continue;
      p.launched = true;
      Map<String, String> env = new HashMap<>();
      env.put("SHOAL_AGENT_TOKEN", token);
      List<String> commands = new ArrayList<>();
      commands.add("exec " + p.command + " 1>" + ApplicationConstants.LOG_DIR_EXPANSION_VAR
          + "/agent.stdout 2>" + ApplicationConstants.LOG_DIR_EXPANSION_VAR + "/agent.stderr");
      ContainerLaunchContext ctx = ContainerLaunchContext.newInstance(
          new HashMap<>(agentResources), env, commands, null, null, null);
      nm.startContainerAsync(p.container, ctx);
    }
  }

  // REQUIRES: holds the monitor.
  private void beginFinish(FinalApplicationStatus status, String message) {
    if (finalStatus != null) return;
    finishing = true;
    finalMessage = message;
    finalStatus = status;
    event("finishing").put("diagnostics", message);
    notifyAll();
  }

  private void stopAll() {
    List<Container> running = new ArrayList<>();
    synchronized (this) {
      for (Place p : places) {
        if (p.request != null) rm.removeContainerRequest(p.request);
        p.request = null;
        if (p.container != null) running.add(p.container);
      }
    }
    for (Container c : running) nm.stopContainerAsync(c.getId(), c.getNodeId());
  }

  private final class ResourceManagerCallbacks extends AMRMClientAsync.AbstractCallbackHandler {
    @Override
    public void onContainersAllocated(List<Container> containers) {
      List<Container> surplus = new ArrayList<>();
      synchronized (ShoalAppMaster.this) {
        for (Container c : containers) {
          long id = c.getAllocationRequestId();
          Place p = id >= 0 && id < places.size() ? places.get((int) id) : null;
          if (p == null || p.container != null || p.request == null || finishing) {
            surplus.add(c);
            continue;
          }
          rm.removeContainerRequest(p.request);
          p.request = null;
          p.container = c;
          p.launched = false;
          byContainer.put(c.getId(), p);
          ObjectNode e = event("allocated");
          e.put("place", p.name);
          e.put("container", c.getId().toString());
          e.put("node", c.getNodeId().getHost());
          e.put("allocated", allocated());
          e.put("wanted", places.size());
        }
        if (!gangComplete && allocated() == places.size()) {
          gangComplete = true;
          event("gang");
        }
        launchReady();
      }
      for (Container c : surplus) rm.releaseAssignedContainer(c.getId());
    }

    @Override
    public void onContainersCompleted(List<ContainerStatus> statuses) {
      synchronized (ShoalAppMaster.this) {
        for (ContainerStatus s : statuses) {
          Place p = byContainer.remove(s.getContainerId());
          if (p == null) continue;
          if (p.container != null && p.container.getId().equals(s.getContainerId())) {
            p.container = null;
            p.launched = false;
          }
          ObjectNode e = event("completed");
          e.put("place", p.name);
          e.put("container", s.getContainerId().toString());
          e.put("exit_status", s.getExitStatus());
          e.put("diagnostics", s.getDiagnostics().trim());
        }
        ShoalAppMaster.this.notifyAll();
      }
    }

    @Override
    public void onContainersUpdated(List<UpdatedContainer> containers) {}

    @Override
    public void onShutdownRequest() {
      synchronized (ShoalAppMaster.this) {
        beginFinish(FinalApplicationStatus.FAILED, "the ResourceManager asked the AM to shut down");
      }
    }

    @Override
    public void onNodesUpdated(List<NodeReport> updated) {}

    @Override
    public float getProgress() {
      return 0;
    }

    @Override
    public void onError(Throwable error) {
      // An invalid request (more than any NodeManager offers, an unknown label) lands here:
      // YARN's own words are the reason the job is refused.
      String message = String.valueOf(error.getMessage()).trim();
      System.err.println("shoal-am: ResourceManager error: " + error);
      synchronized (ShoalAppMaster.this) {
        event("refused").put("diagnostics", message);
        beginFinish(FinalApplicationStatus.FAILED, message);
      }
    }
  }

  private final class NodeManagerCallbacks extends NMClientAsync.AbstractCallbackHandler {
    @Override
    public void onContainerStarted(ContainerId id, Map<String, ByteBuffer> serviceResponse) {
      synchronized (ShoalAppMaster.this) {
        Place p = byContainer.get(id);
        if (p == null) return;
        ObjectNode e = event("launched");
        e.put("place", p.name);
        e.put("container", id.toString());
        e.put("node", p.container != null ? p.container.getNodeId().getHost() : "");
      }
    }

    @Override
    public void onStartContainerError(ContainerId id, Throwable t) {
      Container c = null;
      synchronized (ShoalAppMaster.this) {
        Place p = byContainer.remove(id);
        if (p == null) return;
        c = p.container;
        p.container = null;
        p.launched = false;
        ObjectNode e = event("completed");
        e.put("place", p.name);
        e.put("container", id.toString());
        e.put("exit_status", -1);
        e.put("diagnostics", "the NodeManager could not start the agent's container: " + t);
      }
      if (c != null) rm.releaseAssignedContainer(id);
    }

    @Override
    public void onContainerStatusReceived(ContainerId id, ContainerStatus status) {}

    @Override
    public void onContainerStopped(ContainerId id) {}

    @Override
    public void onGetContainerStatusError(ContainerId id, Throwable t) {}

    @Override
    public void onContainerResourceIncreased(ContainerId id, Resource resource) {}

    @Override
    public void onContainerResourceUpdated(ContainerId id, Resource resource) {}

    @Override
    public void onIncreaseContainerResourceError(ContainerId id, Throwable t) {}

    @Override
    public void onUpdateContainerResourceError(ContainerId id, Throwable t) {}

    @Override
    public void onStopContainerError(ContainerId id, Throwable t) {
      System.err.println("shoal-am: stopping " + id + " failed: " + t);
    }
  }

  // ------------------------------------------------------------------ the HTTP API

  private void handle(HttpExchange x) throws IOException {
    try {
      String auth = x.getRequestHeaders().getFirst("Authorization");
      byte[] given = auth == null ? new byte[0]
          : auth.replaceFirst("^Bearer ", "").getBytes(StandardCharsets.UTF_8);
      if (!MessageDigest.isEqual(given, key)) {
        reply(x, 401, error("a bearer key is required"));
        return;
      }
      String path = x.getRequestURI().getPath();
      Map<String, String> query = query(x.getRequestURI().getRawQuery());
      String method = x.getRequestMethod();
      if (method.equals("GET") && path.equals("/events")) {
        reply(x, 200, events(Long.parseLong(query.getOrDefault("after", "0")),
            Long.parseLong(query.getOrDefault("wait_ms", "0"))));
      } else if (method.equals("GET") && path.equals("/status")) {
        reply(x, 200, status());
      } else if (method.equals("POST") && path.equals("/launch")) {
        JsonNode body = JSON.readTree(readBody(x));
        synchronized (this) {
          token = body.path("token").asText();
          launchReady();
        }
        reply(x, 200, ok());
      } else if (method.equals("POST") && path.equals("/stop")) {
        Container c = null;
        synchronized (this) {
          Place p = find(query.get("place"));
          if (p != null) c = p.container;
        }
        if (c != null) nm.stopContainerAsync(c.getId(), c.getNodeId());
        reply(x, 200, ok());
      } else if (method.equals("POST") && path.equals("/replace")) {
        synchronized (this) {
          Place p = find(query.get("place"));
          if (p == null) {
            reply(x, 404, error("no place " + query.get("place")));
            return;
          }
          if (p.container == null && p.request == null && !finishing) request(p);
        }
        reply(x, 200, ok());
      } else if (method.equals("POST") && path.equals("/finish")) {
        JsonNode body = JSON.readTree(readBody(x));
        FinalApplicationStatus status;
        try {
          status = FinalApplicationStatus.valueOf(body.path("status").asText("SUCCEEDED"));
        } catch (IllegalArgumentException e) {
          status = FinalApplicationStatus.UNDEFINED;
        }
        synchronized (this) {
          beginFinish(status, body.path("diagnostics").asText(""));
        }
        reply(x, 200, ok());
      } else {
        reply(x, 404, error("no " + method + " " + path));
      }
    } catch (Exception e) {
      reply(x, 400, error(e.toString()));
    }
  }

  // REQUIRES: holds the monitor.
  private Place find(String name) {
    for (Place p : places) if (p.name.equals(name)) return p;
    return null;
  }

  private ObjectNode events(long after, long waitMs) throws InterruptedException {
    long deadline = System.currentTimeMillis() + Math.min(waitMs, 5000);
    synchronized (this) {
      lastPollMs = System.currentTimeMillis();
      // A long poll: the backend hears of an event the moment it happens.
      while (events.size() <= after && finalStatus == null) {
        long left = deadline - System.currentTimeMillis();
        if (left <= 0) break;
        wait(left);
      }
      ObjectNode out = JSON.createObjectNode();
      ArrayNode list = out.putArray("events");
      for (int i = (int) Math.max(0, after); i < events.size(); i++) list.add(events.get(i));
      out.put("next", events.size());
      return out;
    }
  }

  private synchronized ObjectNode status() {
    ObjectNode out = JSON.createObjectNode();
    out.put("allocated", allocated());
    out.put("wanted", places.size());
    out.put("gang_complete", gangComplete);
    ArrayNode list = out.putArray("places");
    for (Place p : places) {
      ObjectNode o = list.addObject();
      o.put("name", p.name);
      o.put("container", p.container != null ? p.container.getId().toString() : "");
      o.put("launched", p.launched);
    }
    return out;
  }

  private static ObjectNode ok() {
    return JSON.createObjectNode().put("ok", true);
  }

  private static ObjectNode error(String message) {
    return JSON.createObjectNode().put("error", message);
  }

  private static byte[] readBody(HttpExchange x) throws IOException {
    try (InputStream in = x.getRequestBody()) {
      return in.readAllBytes();
    }
  }

  private static Map<String, String> query(String raw) {
    Map<String, String> out = new HashMap<>();
    if (raw == null) return out;
    for (String kv : raw.split("&")) {
      int eq = kv.indexOf('=');
      if (eq <= 0) continue;
      out.put(java.net.URLDecoder.decode(kv.substring(0, eq), StandardCharsets.UTF_8),
          java.net.URLDecoder.decode(kv.substring(eq + 1), StandardCharsets.UTF_8));
    }
    return out;
  }

  private static void reply(HttpExchange x, int code, JsonNode body) throws IOException {
    byte[] bytes = JSON.writeValueAsBytes(body);
    x.getResponseHeaders().set("Content-Type", "application/json");
    x.sendResponseHeaders(code, bytes.length);
    try (OutputStream out = x.getResponseBody()) {
      out.write(bytes);
    }
  }
}
