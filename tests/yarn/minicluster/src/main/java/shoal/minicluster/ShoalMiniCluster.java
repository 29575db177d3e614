package shoal.minicluster;

import java.io.File;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.hdfs.MiniDFSCluster;
import org.apache.hadoop.yarn.conf.YarnConfiguration;
import org.apache.hadoop.yarn.server.MiniYARNCluster;
import org.apache.hadoop.yarn.server.nodemanager.NodeManager;

/**
 * Shoal's YARN + HDFS test cluster in one JVM: a MiniDFSCluster (one NameNode, WebHDFS on) and
 * a MiniYARNCluster (one ResourceManager, several NodeManagers), every daemon on a free port.
 *
 * <p>Once everything is up it writes, under {@code --dir}: {@code conf/} (core-site.xml,
 * hdfs-site.xml, yarn-site.xml for a client), {@code env} (KEY=value lines with the addresses),
 * and prints one line {@code ready} on stdout. It runs until the JVM is asked to exit (SIGTERM,
 * SIGINT), when a shutdown hook stops YARN, then HDFS. Started by tests/yarn/cluster.sh; see
 * docs/backends/yarn-test-cluster.md.
 */
public final class ShoalMiniCluster {
  /** Command-line options; every field has a default that fits a small shared machine. */
  static final class Options {
    /** State directory: conf/, env, and the daemons' data under work/. Required. */
    File dir;
    /** NodeManagers. Default: 2. */
    int nodeManagers = 2;
    /** Memory each NodeManager offers to containers (MB). Default: 4096. */
    int nmMemoryMb = 4096;
    /** Virtual cores each NodeManager offers (not enforced). Default: 4. */
    int nmVcores = 4;
    /** Fake GPUs (resource yarn.io/gpu) each NodeManager offers; 0 declares none. Default: 2. */
    int nmGpus = 2;
    /** DataNodes. Default: 1. */
    int dataNodes = 1;

    static Options parse(String[] args) {
      Options o = new Options();
      for (int i = 0; i < args.length; i++) {
        String flag = args[i];
        if (flag.equals("-h") || flag.equals("--help")) usage(null);
        if (i + 1 >= args.length) usage("missing value for " + flag);
        String value = args[++i];
        switch (flag) {
          case "--dir" -> o.dir = new File(value).getAbsoluteFile();
          case "--nodemanagers" -> o.nodeManagers = positive(flag, value, 1);
          case "--nm-memory-mb" -> o.nmMemoryMb = positive(flag, value, 256);
          case "--nm-vcores" -> o.nmVcores = positive(flag, value, 1);
          case "--nm-gpus" -> o.nmGpus = positive(flag, value, 0);
          case "--datanodes" -> o.dataNodes = positive(flag, value, 1);
          default -> usage("unknown flag " + flag);
        }
      }
      if (o.dir == null) usage("--dir is required");
      return o;
    }

    private static int positive(String flag, String value, int min) {
      try {
        int n = Integer.parseInt(value);
        if (n >= min) return n;
      } catch (NumberFormatException e) {
        // Reported below.
      }
      usage(flag + " must be an integer >= " + min + ", got '" + value + "'");
      return 0;
    }

    private static void usage(String error) {
      if (error != null) System.err.println("shoal-minicluster: error: " + error);
      System.err.println(
          "usage: ShoalMiniCluster --dir DIR [--nodemanagers N] [--nm-memory-mb MB]"
              + " [--nm-vcores N] [--nm-gpus N] [--datanodes N]");
      System.exit(error == null ? 0 : 2);
    }
  }

  static final String GPU = "yarn.io/gpu";

  public static void main(String[] args) {
    Options options = Options.parse(args);
    try {
      run(options);
    } catch (Throwable t) {
      // The daemons' non-daemon threads would keep a half-started JVM alive; exiting runs the
      // shutdown hook, which stops whatever did start.
      System.err.println("shoal-minicluster: error: failed to start");
      t.printStackTrace();
      System.exit(1);
    }
  }

  static void run(Options options) throws Exception {
    File work = new File(options.dir, "work");
    Files.createDirectories(work.toPath());

    Configuration conf = baseConfiguration(options);
    MiniDFSCluster dfs =
        new MiniDFSCluster.Builder(conf, new File(work, "dfs"))
            .numDataNodes(options.dataNodes)
            .build();
    dfs.waitActive();
    String hdfsUri = dfs.getURI().toString();
    conf.set("fs.defaultFS", hdfsUri);

    // MiniYARNCluster puts its directories under ./target/<name>, relative to the working
    // directory; cluster.sh starts us in $DIR/work.
    MiniYARNCluster yarn = new MiniYARNCluster("shoal-yarn", options.nodeManagers, 1, 1);
    int nodeManagers = options.nodeManagers;
    Runtime.getRuntime().addShutdownHook(
        new Thread(() -> stop(yarn, nodeManagers, dfs), "shoal-stop"));
    yarn.init(conf);
    yarn.start();
    if (!yarn.waitForNodeManagersToConnect(60_000)) {
      throw new IllegalStateException("NodeManagers did not register within 60 s");
    }
    WebAppPipelines.pinAll(yarn, options.nodeManagers);

    Configuration rmConf = yarn.getResourceManager().getConfig();
    writeClientConfiguration(options, dfs, rmConf, hdfsUri);
    System.out.println("ready");
    System.out.flush();
    new CountDownLatch(1).await();  // Until a signal runs the shutdown hook and exits.
  }

  /** Settings shared by HDFS and YARN, before either starts. */
  static Configuration baseConfiguration(Options o) {
    YarnConfiguration conf = new YarnConfiguration();
    // HDFS: one replica per DataNode at most; any local user may write anywhere (test cluster).
    conf.setInt("dfs.replication", Math.min(3, o.dataNodes));
    conf.setBoolean("dfs.webhdfs.enabled", true);
    conf.setBoolean("dfs.permissions.enabled", false);

    // YARN: what each NodeManager offers; requests larger than one NodeManager are refused at
    // submission (InvalidResourceRequestException) instead of waiting forever.
    conf.setInt(YarnConfiguration.NM_PMEM_MB, o.nmMemoryMb);
    conf.setInt(YarnConfiguration.NM_VCORES, o.nmVcores);
    conf.setInt(YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB, 128);
    conf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB, o.nmMemoryMb);
    conf.setInt(YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_VCORES, o.nmVcores);
    // The CapacityScheduler, configured here rather than by a capacity-scheduler.xml on the
    // classpath: one queue, `default`, with everything. Up to half the cluster may be taken
    // by application masters (default 10 %: two or three small AMs at once).
    conf.set("yarn.scheduler.capacity.root.queues", "default");
    conf.setFloat("yarn.scheduler.capacity.root.default.capacity", 100f);
    conf.setFloat("yarn.scheduler.capacity.root.default.maximum-capacity", 100f);
    conf.setFloat("yarn.scheduler.capacity.maximum-am-resource-percent", 0.5f);
    // Count vcores (and GPUs) when placing containers, not only memory.
    conf.set("yarn.scheduler.capacity.resource-calculator",
        "org.apache.hadoop.yarn.util.resource.DominantResourceCalculator");
    if (o.nmGpus > 0) {
      // Declared, not discovered: no GPU plugin, so containers get no device isolation and no
      // CUDA_VISIBLE_DEVICES; the scheduler does count and refuse GPUs.
      conf.set(YarnConfiguration.RESOURCE_TYPES, GPU);
      conf.setInt(YarnConfiguration.NM_RESOURCES_PREFIX + GPU, o.nmGpus);
    }
    // A nearly full disk would mark every NodeManager UNHEALTHY (default limit: 90 %).
    conf.setFloat(
        YarnConfiguration.NM_MAX_PER_DISK_UTILIZATION_PERCENTAGE, 99.0f);
    // Java's virtual size is several times its heap: the virtual-memory check (2.1 x the
    // container's memory) would kill every JVM container. Physical memory stays enforced.
    conf.setBoolean(YarnConfiguration.NM_PMEM_CHECK_ENABLED, true);
    conf.setBoolean(YarnConfiguration.NM_VMEM_CHECK_ENABLED, false);
    // Finished applications' container logs stay on the NodeManagers' disks, under
    // $DIR/work/target (no aggregation into HDFS).
    conf.setBoolean(YarnConfiguration.LOG_AGGREGATION_ENABLED, false);
    // On shutdown a NodeManager waits this (+ 1.25 s) for running containers to die after
    // SIGTERM; the default 5 s per NodeManager makes `cluster.sh down` slow.
    conf.setLong(YarnConfiguration.NM_PROCESS_KILL_WAIT_MS, 1000);
    conf.setBoolean(YarnConfiguration.TIMELINE_SERVICE_ENABLED, false);
    // What a real cluster's yarn-site.xml says: where Hadoop's jars and the configuration are
    // on the NodeManagers, for applications' masters (Shoal's AM reads it from the
    // ResourceManager). Here the NodeManagers are this JVM, so it is this JVM's classpath.
    conf.set(YarnConfiguration.YARN_APPLICATION_CLASSPATH, applicationClasspath(o));
    return conf;
  }

  /** The client configuration directory, this jar and its lib/ (cluster.sh's layout). */
  static String applicationClasspath(Options o) {
    File jar;
    try {
      jar = new File(ShoalMiniCluster.class.getProtectionDomain().getCodeSource().getLocation()
          .toURI());
    } catch (java.net.URISyntaxException e) {
      throw new IllegalStateException("cannot locate the mini-cluster's jar", e);
    }
    return String.join(",", new File(o.dir, "conf").getPath(), jar.getPath(),
        new File(jar.getParentFile(), "lib").getPath() + "/*");
  }

  /** Writes conf/*.xml and env under the state directory, each by an atomic rename. */
  static void writeClientConfiguration(
      Options o, MiniDFSCluster dfs, Configuration rm, String hdfsUri) throws IOException {
    File confDir = new File(o.dir, "conf");
    Files.createDirectories(confDir.toPath());

    Map<String, String> core = new LinkedHashMap<>();
    core.put("fs.defaultFS", hdfsUri);
    writeSite(new File(confDir, "core-site.xml"), core);

    InetSocketAddress nnHttp = dfs.getNameNode().getHttpAddress();
    String webhdfs = "http://" + nnHttp.getHostString() + ":" + nnHttp.getPort();
    Map<String, String> hdfs = new LinkedHashMap<>();
    hdfs.put("dfs.namenode.rpc-address",
        dfs.getNameNode().getNameNodeAddress().getHostString() + ":" + dfs.getNameNodePort());
    hdfs.put("dfs.namenode.http-address", nnHttp.getHostString() + ":" + nnHttp.getPort());
    hdfs.put("dfs.webhdfs.enabled", "true");
    hdfs.put("dfs.replication", rm.get("dfs.replication"));
    hdfs.put("dfs.permissions.enabled", "false");
    writeSite(new File(confDir, "hdfs-site.xml"), hdfs);

    Map<String, String> yarnSite = new LinkedHashMap<>();
    for (String key : List.of(
        YarnConfiguration.RM_ADDRESS,
        YarnConfiguration.RM_SCHEDULER_ADDRESS,
        YarnConfiguration.RM_RESOURCE_TRACKER_ADDRESS,
        YarnConfiguration.RM_ADMIN_ADDRESS,
        YarnConfiguration.RM_WEBAPP_ADDRESS,
        YarnConfiguration.RM_SCHEDULER_MINIMUM_ALLOCATION_MB,
        YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_MB,
        YarnConfiguration.RM_SCHEDULER_MAXIMUM_ALLOCATION_VCORES,
        YarnConfiguration.RESOURCE_TYPES,
        YarnConfiguration.YARN_APPLICATION_CLASSPATH,
        // Tells YARN's own clients (DistributedShell) that the NodeManagers share this
        // machine, so the AM's classpath can be the client's.
        YarnConfiguration.IS_MINI_YARN_CLUSTER,
        YarnConfiguration.TIMELINE_SERVICE_ENABLED)) {
      String value = rm.get(key);
      if (value != null) yarnSite.put(key, value);
    }
    writeSite(new File(confDir, "yarn-site.xml"), yarnSite);

    String rmAddress = rm.get(YarnConfiguration.RM_ADDRESS);
    StringBuilder env = new StringBuilder();
    env.append("SHOAL_YARN_RM=").append(rmAddress).append('\n');
    env.append("SHOAL_YARN_RM_SCHEDULER=")
        .append(rm.get(YarnConfiguration.RM_SCHEDULER_ADDRESS)).append('\n');
    env.append("SHOAL_YARN_RM_WEB=http://")
        .append(rm.get(YarnConfiguration.RM_WEBAPP_ADDRESS)).append('\n');
    env.append("SHOAL_YARN_NODEMANAGERS=").append(o.nodeManagers).append('\n');
    env.append("SHOAL_YARN_NM_MEMORY_MB=").append(o.nmMemoryMb).append('\n');
    env.append("SHOAL_YARN_NM_VCORES=").append(o.nmVcores).append('\n');
    env.append("SHOAL_YARN_NM_GPUS=").append(o.nmGpus).append('\n');
    env.append("SHOAL_HDFS=").append(hdfsUri).append('\n');
    env.append("SHOAL_WEBHDFS=").append(webhdfs).append('\n');
    env.append("HADOOP_CONF_DIR=").append(confDir.getPath()).append('\n');
    env.append("YARN_CONF_DIR=").append(confDir.getPath()).append('\n');
    writeAtomically(new File(o.dir, "env"), env.toString());
  }

  static void writeSite(File file, Map<String, String> properties) throws IOException {
    StringBuilder xml = new StringBuilder();
    xml.append("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    xml.append("<!-- Written by tests/yarn/cluster.sh (ShoalMiniCluster) for this run. -->\n");
    xml.append("<configuration>\n");
    for (Map.Entry<String, String> p : properties.entrySet()) {
      xml.append("  <property><name>").append(escapeXml(p.getKey())).append("</name><value>")
          .append(escapeXml(p.getValue())).append("</value></property>\n");
    }
    xml.append("</configuration>\n");
    writeAtomically(file, xml.toString());
  }

  static String escapeXml(String text) {
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;");
  }

  static void writeAtomically(File file, String text) throws IOException {
    Path tmp = file.toPath().resolveSibling(file.getName() + ".tmp");
    try (OutputStream out = Files.newOutputStream(tmp)) {
      out.write(text.getBytes(StandardCharsets.UTF_8));
    }
    Files.move(tmp, file.toPath(), StandardCopyOption.REPLACE_EXISTING,
        StandardCopyOption.ATOMIC_MOVE);
  }

  /**
   * Runs on the shutdown hook's thread: YARN first (its containers may use HDFS). The
   * NodeManagers stop in parallel: each spends seconds waiting for containers and log cleanup.
   */
  static void stop(MiniYARNCluster yarn, int nodeManagers, MiniDFSCluster dfs) {
    System.out.println("stopping");
    List<Thread> stoppers = new ArrayList<>();
    for (int i = 0; i < nodeManagers; i++) {
      NodeManager nm = yarn.getNodeManager(i);
      if (nm == null) continue;
      Thread t = new Thread(nm::stop, "shoal-stop-nm-" + i);
      t.start();
      stoppers.add(t);
    }
    for (Thread t : stoppers) {
      try {
        t.join();
      } catch (InterruptedException e) {
        Thread.currentThread().interrupt();
      }
    }
    try {
      yarn.stop();  // The ResourceManager; stopping a stopped NodeManager does nothing.
    } catch (RuntimeException e) {
      e.printStackTrace();
    }
    try {
      dfs.shutdown();
    } catch (RuntimeException e) {
      e.printStackTrace();
    }
    System.out.println("stopped");
    System.out.flush();
  }

  private ShoalMiniCluster() {}
}
