// Starts GraphiQL from the settings in #graphiql's data- attributes, so the
// page needs no inline script (its Content-Security-Policy allows none).
// `defaultQuery` is what a browser with no stored tabs opens on: Stockguard's
// example operations (src/http/examples.graphql), not GraphiQL's welcome text.
(function () {
  'use strict';
  var root = document.getElementById('graphiql');
  var settings = root.dataset;
  function url(path, websocket) {
    var absolute = new URL(path, window.location.href);
    if (websocket) absolute.protocol = absolute.protocol === 'https:' ? 'wss:' : 'ws:';
    return absolute.toString();
  }
  var headers = settings.authorization ? { Authorization: settings.authorization } : undefined;
  var fetcher = GraphiQL.createFetcher({
    url: url(settings.endpoint),
    subscriptionUrl: url(settings.subscriptions, true),
    headers: headers,
    wsConnectionParams: headers,
  });
  ReactDOM.createRoot(root).render(
    React.createElement(GraphiQL, {
      fetcher: fetcher,
      defaultQuery: settings.defaultQuery,
      defaultEditorToolsVisibility: true,
    })
  );
})();
