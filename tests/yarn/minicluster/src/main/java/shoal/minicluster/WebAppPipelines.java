package shoal.minicluster;

import java.lang.reflect.Field;
import org.apache.hadoop.service.Service;
import org.apache.hadoop.yarn.server.MiniYARNCluster;
import org.apache.hadoop.yarn.server.nodemanager.NodeManager;
import org.apache.hadoop.yarn.server.nodemanager.webapp.WebServer;
import org.apache.hadoop.yarn.server.resourcemanager.ResourceManager;
import org.apache.hadoop.yarn.webapp.WebApp;

/**
 * Makes every YARN web app in this JVM answer with its own pages and REST API.
 *
 * <p>YARN's web apps install Guice's GuiceFilter by class name, so Jetty creates it with its
 * no-argument constructor, and such a filter dispatches through one static, JVM-wide pipeline:
 * the one of the web app started last. In a MiniYARNCluster that is the last NodeManager's, and
 * the ResourceManager's /ws/v1/cluster/... answers "controller for v1 not found". Each web app
 * also holds a GuiceFilter from its own injector, bound to its own pipeline; this puts that one
 * into the web app's Jetty filter holder. Reflection on private fields of Hadoop 3.4 (WebApp,
 * ResourceManager, WebServer) and of Jetty 9.4 (FilterHolder): a Hadoop upgrade may
 * need this revisited, and {@link #pinAll} fails loudly when a field is gone.
 */
final class WebAppPipelines {
  /** REQUIRES: the cluster is started. Call once, before anything uses the web apps. */
  static void pinAll(MiniYARNCluster yarn, int nodeManagers) throws ReflectiveOperationException {
    ResourceManager rm = yarn.getResourceManager();
    pin((WebApp) field(ResourceManager.class, "webApp").get(rm), "ResourceManager");
    for (int i = 0; i < nodeManagers; i++) {
      NodeManager nm = yarn.getNodeManager(i);
      for (Service s : nm.getServices()) {
        if (s instanceof WebServer) {
          pin((WebApp) field(WebServer.class, "webApp").get(s), "NodeManager " + i);
        }
      }
    }
  }

  private static void pin(WebApp webApp, String what) throws ReflectiveOperationException {
    if (webApp == null) throw new IllegalStateException(what + " has no web app");
    Object own = field(WebApp.class, "guiceFilter").get(webApp);
    Object context = webApp.httpServer().getWebAppContext();
    Object handler = context.getClass().getMethod("getServletHandler").invoke(context);
    Object holder = handler.getClass().getMethod("getFilter", String.class).invoke(handler, "guice");
    if (own == null || holder == null) {
      throw new IllegalStateException(what + ": no Guice filter to pin");
    }
    field(holder.getClass(), "_filter").set(holder, own);
  }

  private static Field field(Class<?> type, String name) throws NoSuchFieldException {
    for (Class<?> c = type; c != null; c = c.getSuperclass()) {
      try {
        Field f = c.getDeclaredField(name);
        f.setAccessible(true);
        return f;
      } catch (NoSuchFieldException e) {
        // Look in the superclass.
      }
    }
    throw new NoSuchFieldException(type.getName() + "." + name);
  }

  private WebAppPipelines() {}
}
