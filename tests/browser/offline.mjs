// The one rule both browser checks keep: nothing the page does may leave loopback. `guardOffline` aborts
// every other request (HTTP and WebSocket) and records it in `external`, so a check fails when it is not
// empty; a second net on `request` catches anything that bypasses the router.

// Loopback is all the page may reach. ::1 counts as loopback too.
const LOOPBACK_HOSTS = new Set(['127.0.0.1', 'localhost', '[::1]', '::1']);
// Schemes that never leave the browser process.
const LOCAL_SCHEMES = new Set(['data:', 'blob:', 'about:', 'chrome:', 'chrome-extension:', 'devtools:']);

export function isLoopback(url) {
  let u;
  try {
    u = new URL(url);
  } catch {
    return false;
  }
  if (LOCAL_SCHEMES.has(u.protocol)) return true;
  return LOOPBACK_HOSTS.has(u.hostname);
}

export async function guardOffline(context, external) {
  await context.route('**/*', (route) => {
    const url = route.request().url();
    if (isLoopback(url)) return route.continue();
    external.add(`${route.request().method()} ${url}`);
    return route.abort('blockedbyclient');
  });
  await context.routeWebSocket(/.*/, (ws) => {
    if (isLoopback(ws.url().replace(/^ws/, 'http'))) return ws.connectToServer();
    external.add(`WEBSOCKET ${ws.url()}`);
    return ws.close();
  });
  context.on('request', (req) => {
    if (!isLoopback(req.url())) external.add(`${req.method()} ${req.url()}`);
  });
}
