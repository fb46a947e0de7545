"""The router's HTTP edge: the aiohttp application (routes, auth middleware, background tasks, config reload)
and the listener's connection hygiene. Wires the request path, the gateway and the shared state together."""
